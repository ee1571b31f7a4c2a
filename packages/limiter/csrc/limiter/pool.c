/* Hooks of stream-ordered allocation. A memory pool keeps freed memory reserved on the device
 * until a synchronize releases what exceeds its release threshold, or a trim: so the pod is
 * charged what each pool really has reserved (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), brought up
 * to date around every pool allocation and at every synchronize the program makes. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>

#include "compute.h"
#include "core.h"
#include "ledger.h"
#include "log.h"
#include "vgpu_cuda_sizes.h"

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint pools_known; /* synchronizes cost nothing until a pool is used */

static uint64_t pool_attribute(CUmemoryPool pool, CUmemPool_attribute attribute) {
    cuuint64_t value = 0;
    return VGPU_REAL(cuMemPoolGetAttribute, pool, attribute, &value) == CUDA_SUCCESS ? value : 0;
}

static void set_bytes(struct vgpu_record *record, void *data) {
    record->bytes = *(uint64_t *)data;
}

/* Bring a pool's charge to what it has reserved now; false when its growth does not fit. Under
 * pool_lock. */
static bool sync_pool(uint64_t key) {
    struct vgpu_record record;
    if (!vgpu_ledger_get(key, &record)) {
        return true;
    }
    uint64_t reserved = pool_attribute((CUmemoryPool)(uintptr_t)key,
                                       CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    if (reserved < record.bytes) {
        vgpu_uncharge(record.entry, record.bytes - reserved);
    } else if (reserved > record.bytes && !vgpu_charge(record.entry, reserved - record.bytes)) {
        return false;
    }
    vgpu_ledger_update(key, set_bytes, &reserved);
    return true;
}

static void collect_pool(const struct vgpu_record *record, void *data) {
    uint64_t **cursor = data;
    if (record->kind == VGPU_RECORD_POOL) {
        *(*cursor)++ = record->key;
    }
}

static void sync_all_pools(void) {
    if (atomic_load(&pools_known) == 0) {
        return;
    }
    uint64_t keys[64] = {0};
    uint64_t *cursor = keys;
    pthread_mutex_lock(&pool_lock);
    vgpu_ledger_each(collect_pool, &cursor);
    for (uint64_t *key = keys; key < cursor && key < keys + 64; key++) {
        sync_pool(*key);
    }
    pthread_mutex_unlock(&pool_lock);
}

/* The pool's record, created (charged what it already holds) on first sight. Under pool_lock. */
static bool know_pool(CUmemoryPool pool, int entry) {
    struct vgpu_record record;
    if (vgpu_ledger_get((uint64_t)(uintptr_t)pool, &record)) {
        return true;
    }
    record = (struct vgpu_record){
        .key = (uint64_t)(uintptr_t)pool, .kind = VGPU_RECORD_POOL, .entry = entry};
    if (!vgpu_ledger_put(&record)) {
        return false;
    }
    atomic_fetch_add(&pools_known, 1);
    return true;
}

static CUresult allocate(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream,
                         bool from_pool) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    CUdevice device = -1;
    if (VGPU_REAL(cuCtxGetDevice, &device) != CUDA_SUCCESS ||
        (!from_pool && VGPU_REAL(cuDeviceGetMemPool, &pool, device) != CUDA_SUCCESS)) {
        pool = NULL; /* no context or no pool: the real call reports it */
    }
    int entry = vgpu_entry_of(device);
    if (pool == NULL || entry < 0) {
        return from_pool ? VGPU_REAL(cuMemAllocFromPoolAsync, dptr, bytesize, pool, stream)
                         : VGPU_REAL(cuMemAllocAsync, dptr, bytesize, stream);
    }
    uint64_t key = (uint64_t)(uintptr_t)pool;
    pthread_mutex_lock(&pool_lock);
    know_pool(pool, entry);
    sync_pool(key);
    /* Charge what the pool must grow by: the request beyond its idle reserved memory. */
    uint64_t idle = pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) -
                    pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    uint64_t growth = bytesize > idle ? vgpu_round_up(bytesize - idle, VGPU_PAGE_SIZE) : 0;
    struct vgpu_record record;
    if (!vgpu_charge(entry, growth)) {
        pthread_mutex_unlock(&pool_lock);
        vgpu_log(VGPU_LOG_INFO, "a pool allocation of %zu bytes does not fit the pod's limit",
                 bytesize);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (vgpu_ledger_get(key, &record)) {
        uint64_t bytes = record.bytes + growth;
        vgpu_ledger_update(key, set_bytes, &bytes);
    }
    result = from_pool ? VGPU_REAL(cuMemAllocFromPoolAsync, dptr, bytesize, pool, stream)
                       : VGPU_REAL(cuMemAllocAsync, dptr, bytesize, stream);
    if (result == CUDA_SUCCESS) {
        struct vgpu_record pooled = {
            .key = *dptr, .kind = VGPU_RECORD_POOLED, .entry = entry, .link = key};
        vgpu_ledger_put(&pooled);
        if (!sync_pool(key)) {
            /* The pool grew more than asked and that does not fit: undo the allocation. */
            VGPU_REAL(cuMemFreeAsync, *dptr, stream);
            vgpu_ledger_take(*dptr, &pooled);
            result = CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else {
        sync_pool(key);
    }
    pthread_mutex_unlock(&pool_lock);
    return result;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return allocate(dptr, bytesize, NULL, hStream, false);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return allocate(dptr, bytesize, NULL, hStream, false);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream) {
    return allocate(dptr, bytesize, pool, hStream, true);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream) {
    return allocate(dptr, bytesize, pool, hStream, true);
}

static CUresult free_async(CUdeviceptr dptr, CUstream stream) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    /* Freed pool memory stays reserved in its pool until a synchronize or trim. Memory from
     * cuMemAlloc may be freed here too and is given back at once. */
    struct vgpu_record record;
    bool known = vgpu_ledger_take(dptr, &record);
    result = VGPU_REAL(cuMemFreeAsync, dptr, stream);
    if (known && result != CUDA_SUCCESS) {
        vgpu_ledger_put(&record);
    } else if (known && record.kind != VGPU_RECORD_POOLED) {
        vgpu_uncharge(record.entry, record.bytes);
    }
    return result;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    return free_async(dptr, hStream);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    return free_async(dptr, hStream);
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    result = VGPU_REAL(cuMemPoolTrimTo, pool, minBytesToKeep);
    pthread_mutex_lock(&pool_lock);
    sync_pool((uint64_t)(uintptr_t)pool);
    pthread_mutex_unlock(&pool_lock);
    return result;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&pool_lock);
    result = VGPU_REAL(cuMemPoolDestroy, pool);
    struct vgpu_record record;
    /* Memory still allocated from a destroyed pool is given back with the pool. */
    if (result == CUDA_SUCCESS && vgpu_ledger_take((uint64_t)(uintptr_t)pool, &record)) {
        vgpu_uncharge(record.entry, record.bytes);
        atomic_fetch_sub(&pools_known, 1);
    }
    pthread_mutex_unlock(&pool_lock);
    return result;
}

/* Synchronize calls: the moments the driver gives pool memory back. */
#define VGPU_SYNC_HOOK(symbol, params, args)                                                   \
    CUresult symbol params {                                                                   \
        CUresult result = vgpu_cuda_ready();                                                   \
        if (result != CUDA_SUCCESS) {                                                          \
            return result;                                                                     \
        }                                                                                      \
        result = VGPU_REAL(symbol, VGPU_UNPACK args);                                          \
        sync_all_pools();                                                                      \
        vgpu_compute_quiesce();                                                                \
        return result;                                                                         \
    }
#define VGPU_UNPACK(...) __VA_ARGS__

VGPU_SYNC_HOOK(cuStreamSynchronize, (CUstream hStream), (hStream))
VGPU_SYNC_HOOK(cuStreamSynchronize_ptsz, (CUstream hStream), (hStream))
VGPU_SYNC_HOOK(cuCtxSynchronize_v2, (CUcontext ctx), (ctx))
VGPU_SYNC_HOOK(cuEventSynchronize, (CUevent hEvent), (hEvent))

CUresult cuCtxSynchronize(void) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    result = vgpu_real.cuCtxSynchronize != NULL ? vgpu_real.cuCtxSynchronize()
                                                : CUDA_ERROR_NOT_FOUND;
    sync_all_pools();
    vgpu_compute_quiesce();
    return result;
}
