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

/* The child's ledger has none of its parent's pools; and a thread of the parent that held the
 * lock at the fork (allocating from a pool) left it held for good in the child, whose every
 * synchronize then hung. */
void vgpu_pools_forget_in_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pool_lock = fresh;
    atomic_store(&pools_known, 0);
}

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

/* Pools are synchronized in batches of the lowest keys above the last batch's: however many
 * pools the program has, each is synchronized, with no list of them to keep. */
#define POOL_BATCH 64

struct pool_batch {
    uint64_t after;
    uint64_t keys[POOL_BATCH]; /* ascending */
    unsigned count;
};

static void collect_pool(const struct vgpu_record *record, void *data) {
    struct pool_batch *batch = data;
    if (record->kind != VGPU_RECORD_POOL || record->key <= batch->after ||
        (batch->count == POOL_BATCH && record->key >= batch->keys[POOL_BATCH - 1])) {
        return;
    }
    unsigned at = batch->count < POOL_BATCH ? batch->count++ : POOL_BATCH - 1;
    for (; at > 0 && batch->keys[at - 1] > record->key; at--) {
        batch->keys[at] = batch->keys[at - 1];
    }
    batch->keys[at] = record->key;
}

static void sync_all_pools(void) {
    if (atomic_load(&pools_known) == 0) {
        return;
    }
    struct pool_batch batch = {.after = 0};
    pthread_mutex_lock(&pool_lock);
    do {
        batch.count = 0;
        vgpu_ledger_each(collect_pool, &batch);
        for (unsigned i = 0; i < batch.count; i++) {
            sync_pool(batch.keys[i]);
        }
        batch.after = batch.count > 0 ? batch.keys[batch.count - 1] : batch.after;
    } while (batch.count == POOL_BATCH);
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

/* The device a stream's work runs on: that of its context, made current for the question (the
 * legacy and per-thread streams are the current context's). */
static bool stream_device(CUstream stream, CUdevice *device) {
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
        return VGPU_REAL(cuCtxGetDevice, device) == CUDA_SUCCESS;
    }
    CUcontext context = NULL;
    if (VGPU_REAL(cuStreamGetCtx, stream, &context) != CUDA_SUCCESS ||
        VGPU_REAL(cuCtxPushCurrent_v2, context) != CUDA_SUCCESS) {
        return false;
    }
    bool known = VGPU_REAL(cuCtxGetDevice, device) == CUDA_SUCCESS;
    VGPU_REAL(cuCtxPopCurrent_v2, &context);
    return known;
}

/* The device whose default pool `pool` is; -1 for none's. Asked once per pool, at its first
 * allocation: it is recorded then. */
static CUdevice default_pool_device(CUmemoryPool pool) {
    int count = 0;
    if (VGPU_REAL(cuDeviceGetCount, &count) != CUDA_SUCCESS) {
        return -1;
    }
    for (CUdevice device = 0; device < count; device++) {
        CUmemoryPool found = NULL;
        if (VGPU_REAL(cuDeviceGetDefaultMemPool, &found, device) == CUDA_SUCCESS &&
            found == pool) {
            return device;
        }
    }
    return -1;
}

/* The region entry a pool's memory is charged to: the device the pool lives on. A pool made
 * through cuMemPoolCreate was recorded with its location, and a device's default pool is that
 * device's (first used from another device's stream, it was charged to the stream's device);
 * any other is taken to be on the stream's device, whose current pool cuMemAllocAsync takes from
 * (left in *pool). -1 when there is nothing to charge. */
static int pool_entry(CUmemoryPool *pool, CUstream stream, bool from_pool) {
    struct vgpu_record record;
    if (from_pool && vgpu_ledger_get((uint64_t)(uintptr_t)*pool, &record)) {
        return record.entry;
    }
    CUdevice device = from_pool ? default_pool_device(*pool) : -1;
    if (device >= 0) {
        return vgpu_entry_of(device);
    }
    if (!stream_device(stream, &device)) {
        return -1; /* no context or no stream: the real call reports it */
    }
    if (!from_pool && VGPU_REAL(cuDeviceGetMemPool, pool, device) != CUDA_SUCCESS) {
        *pool = NULL;
        return -1;
    }
    if (!from_pool && vgpu_ledger_get((uint64_t)(uintptr_t)*pool, &record)) {
        return record.entry;
    }
    return vgpu_entry_of(device);
}

static CUresult allocate(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream,
                         bool from_pool) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    int entry = pool_entry(&pool, stream, from_pool);
    if (entry == VGPU_ENTRY_OUTSIDE) {
        vgpu_log(VGPU_LOG_INFO, "no pool allocation on a GPU that is not one of the pod's");
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (pool == NULL || entry < 0) {
        return from_pool ? VGPU_REAL(cuMemAllocFromPoolAsync, dptr, bytesize, pool, stream)
                         : VGPU_REAL(cuMemAllocAsync, dptr, bytesize, stream);
    }
    uint64_t key = (uint64_t)(uintptr_t)pool;
    pthread_mutex_lock(&pool_lock);
    if (!know_pool(pool, entry)) {
        pthread_mutex_unlock(&pool_lock);
        vgpu_log(VGPU_LOG_WARN, "out of memory recording a memory pool: its allocation is "
                 "refused, as it could not be charged");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
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
        /* Its size is kept (not charged: the pool is) for the pool's destruction, after which
         * the allocation is charged on its own until freed. */
        struct vgpu_record pooled = {.key = *dptr,
                                     .kind = VGPU_RECORD_POOLED,
                                     .entry = entry,
                                     .bytes = vgpu_round_up(bytesize, VGPU_PAGE_SIZE),
                                     .link = key};
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

/* Free host-backed memory (managed memory the limiter served past the limit, which a stream
 * ordered free does not take) the way it was allocated, once the stream's earlier work is done. */
static CUresult free_host_backed(CUdeviceptr dptr, CUstream stream) {
    CUresult result = VGPU_REAL(cuStreamSynchronize, stream);
    return result == CUDA_SUCCESS ? VGPU_REAL(cuMemFree_v2, dptr) : result;
}

static CUresult free_async(CUdeviceptr dptr, CUstream stream) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    /* Freed pool memory stays reserved in its pool until a synchronize or trim. Memory from
     * cuMemAlloc may be freed here too and is given back at once, as device or host-backed
     * memory, whichever it was charged as. */
    struct vgpu_record record;
    bool known = vgpu_ledger_take(dptr, &record);
    result = known && record.kind == VGPU_RECORD_HOST ? free_host_backed(dptr, stream)
                                                       : VGPU_REAL(cuMemFreeAsync, dptr, stream);
    if (known && result != CUDA_SUCCESS) {
        vgpu_ledger_put(&record);
    } else if (known) {
        vgpu_record_give_back(&record);
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

/* A pool is recorded at its creation with the device it is on, which its allocations are
 * charged to whatever the stream; none is made on a GPU outside the pod. */
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    int entry = vgpu_entry_at(poolProps != NULL ? &poolProps->location : NULL);
    if (entry == VGPU_ENTRY_OUTSIDE) {
        vgpu_log(VGPU_LOG_INFO, "no memory pool on device %d: not one of the pod's GPUs",
                 poolProps->location.id);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    result = VGPU_REAL(cuMemPoolCreate, pool, poolProps);
    if (result == CUDA_SUCCESS && pool != NULL) {
        pthread_mutex_lock(&pool_lock);
        /* A handle the driver reuses is a new pool: its old record (if any) is gone with the
         * old pool's destruction, so this one starts from nothing. */
        if (!know_pool(*pool, entry)) {
            vgpu_log(VGPU_LOG_WARN, "out of memory recording a memory pool");
        }
        pthread_mutex_unlock(&pool_lock);
    }
    return result;
}

struct orphans {
    uint64_t pool;
    uint64_t charge; /* what the pool's charge still has to cover */
};

static bool allocated_from(const struct vgpu_record *record, void *data) {
    return record->kind == VGPU_RECORD_POOLED && record->link == ((struct orphans *)data)->pool;
}

/* A destroyed pool's allocations that are still live stay valid (the driver frees the pool's
 * memory as they are freed): each is charged on its own from the pool's charge, as memory that
 * its free gives back. Under pool_lock. */
static void keep_orphans(struct orphans *orphans) {
    struct vgpu_record records[64];
    unsigned taken;
    do {
        taken = vgpu_ledger_take_if(allocated_from, orphans, records, 64);
        for (unsigned i = 0; i < taken; i++) {
            records[i].kind = VGPU_RECORD_MEMORY;
            records[i].bytes = records[i].bytes < orphans->charge ? records[i].bytes
                                                                  : orphans->charge;
            records[i].link = 0;
            orphans->charge -= records[i].bytes;
            if (!vgpu_ledger_put(&records[i])) {
                vgpu_log(VGPU_LOG_WARN, "out of memory recording an allocation; it stays "
                         "charged");
            }
        }
    } while (taken == 64);
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    uint64_t key = (uint64_t)(uintptr_t)pool;
    pthread_mutex_lock(&pool_lock);
    sync_pool(key);
    result = VGPU_REAL(cuMemPoolDestroy, pool);
    struct vgpu_record record;
    /* The pool's idle memory is given back with it; what its live allocations hold is not. */
    if (result == CUDA_SUCCESS && vgpu_ledger_take(key, &record)) {
        struct orphans orphans = {.pool = key, .charge = record.bytes};
        keep_orphans(&orphans);
        vgpu_uncharge(record.entry, orphans.charge);
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
