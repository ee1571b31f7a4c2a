/* Simulated driver: memory pools and stream-ordered allocation. A pool keeps freed memory
 * reserved on its device; a synchronize releases what exceeds the pool's release threshold
 * (0 by default), cuMemPoolTrimTo releases on request. Allocations are usable at once. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "cuda_sim.h"

#define MAX_POOLS 256

static struct CUmemPoolHandle_st default_pools[SIM_MAX_DEVICES];
static struct CUmemPoolHandle_st *current_pools[SIM_MAX_DEVICES];
static struct CUmemPoolHandle_st *created_pools[MAX_POOLS];

/* Under the driver lock. */
static struct CUmemPoolHandle_st *default_pool(int device) {
    struct CUmemPoolHandle_st *pool = &default_pools[device];
    if (pool->magic != SIM_POOL) {
        pool->magic = SIM_POOL;
        pool->device = device;
        pool->is_default = true;
    }
    return pool;
}

static struct CUmemPoolHandle_st *current_pool(int device) {
    return current_pools[device] != NULL ? current_pools[device] : default_pool(device);
}

/* Release reserved but unused memory down to max(used, keep). Under the driver lock. */
static void trim(struct CUmemPoolHandle_st *pool, uint64_t keep) {
    uint64_t floor = pool->used > keep ? pool->used : keep;
    if (pool->reserved > floor) {
        sim_memory_release(pool->device, pool->reserved - floor);
        pool->reserved = floor;
    }
}

void sim_pool_returned(struct CUmemPoolHandle_st *pool, uint64_t bytes) {
    pool->used -= bytes < pool->used ? bytes : pool->used;
    if (pool->destroyed) {
        trim(pool, 0);
    }
}

void sim_pools_release_unused(void) {
    pthread_mutex_lock(&sim_driver_lock);
    for (int i = 0; i < SIM_MAX_DEVICES; i++) {
        if (default_pools[i].magic == SIM_POOL) {
            trim(&default_pools[i], default_pools[i].release_threshold);
        }
    }
    for (int i = 0; i < MAX_POOLS; i++) {
        if (created_pools[i] != NULL) {
            trim(created_pools[i], created_pools[i]->release_threshold);
        }
    }
    pthread_mutex_unlock(&sim_driver_lock);
}

static CUresult pool_allocate(CUdeviceptr *dptr, size_t bytesize, struct CUmemPoolHandle_st *pool,
                              struct CUstream_st *stream) {
    if (dptr == NULL || bytesize == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t size = sim_round_up(bytesize, SIM_PAGE_SIZE);
    pthread_mutex_lock(&sim_driver_lock);
    if (pool == NULL) {
        pool = current_pool(stream->context->device);
    }
    CUresult result = CUDA_SUCCESS;
    uint64_t idle = pool->reserved - pool->used;
    if (pool->magic != SIM_POOL || pool->destroyed) {
        result = CUDA_ERROR_INVALID_VALUE;
    } else if (idle < size && !sim_memory_reserve(pool->device, size - idle)) {
        result = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        pool->reserved += idle < size ? size - idle : 0;
        pool->used += size;
        pool->reserved_high = pool->reserved > pool->reserved_high ? pool->reserved : pool->reserved_high;
        pool->used_high = pool->used > pool->used_high ? pool->used : pool->used_high;
        struct sim_allocation record = {
            .key = sim_address_space(size, SIM_PAGE_SIZE),
            .size = size,
            .requested = bytesize,
            .kind = SIM_ALLOC_POOL,
            .device = pool->device,
            .context = stream->context,
            .pool = pool,
        };
        if (sim_allocation_insert(&record)) {
            *dptr = record.key;
        } else {
            sim_pool_returned(pool, size);
            result = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    return result != CUDA_SUCCESS ? result : pool_allocate(dptr, bytesize, NULL, stream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return cuMemAllocAsync(dptr, bytesize, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(pool, SIM_POOL)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return pool_allocate(dptr, bytesize, pool, stream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream) {
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct sim_allocation *record = sim_allocation_find(dptr);
    if (record != NULL && record->kind == SIM_ALLOC_POOL) {
        sim_allocation_free(record);
    } else if (record != NULL && record->kind == SIM_ALLOC_DEVICE) {
        sim_allocation_free(record); /* allowed for cuMemAlloc memory too */
    } else {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    return cuMemFreeAsync(dptr, hStream);
}

/* The physical device a pool's properties name, or -1. */
static int pool_location(const CUmemLocation *location) {
    return location->type == CU_MEM_LOCATION_TYPE_DEVICE ? sim_physical_device(location->id) : -1;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (pool == NULL || poolProps == NULL || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    int device = pool_location(&poolProps->location);
    if (device < 0) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    struct CUmemPoolHandle_st *created = calloc(1, sizeof *created);
    if (created == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    created->magic = SIM_POOL;
    created->device = device;
    pthread_mutex_lock(&sim_driver_lock);
    result = CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < MAX_POOLS; i++) {
        if (created_pools[i] == NULL) {
            created_pools[i] = created;
            result = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&sim_driver_lock);
    if (result != CUDA_SUCCESS) {
        free(created);
        return result;
    }
    *pool = created;
    return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(pool, SIM_POOL) || pool->is_default || pool->destroyed) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    /* Outstanding allocations stay valid; their memory goes back when they are freed. */
    pool->destroyed = true;
    trim(pool, 0);
    if (current_pools[pool->device] == pool) {
        current_pools[pool->device] = NULL;
    }
    for (int i = 0; i < MAX_POOLS; i++) {
        if (created_pools[i] == pool && pool->used == 0) {
            created_pools[i] = NULL;
            pool->magic = 0;
        }
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(pool, SIM_POOL)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    trim(pool, minBytesToKeep);
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(pool, SIM_POOL) || value == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        break; /* reuse policies do not change what is held */
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        memcpy(&pool->release_threshold, value, sizeof pool->release_threshold);
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        pool->reserved_high = pool->reserved; /* only a reset is allowed */
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        pool->used_high = pool->used;
        break;
    default:
        result = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(pool, SIM_POOL) || value == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t number = 0;
    int flag = 1;
    bool is_flag = false;
    pthread_mutex_lock(&sim_driver_lock);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        is_flag = true;
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: number = pool->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: number = pool->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: number = pool->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: number = pool->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: number = pool->used_high; break;
    default: result = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    if (result == CUDA_SUCCESS && is_flag) {
        memcpy(value, &flag, sizeof flag);
    } else if (result == CUDA_SUCCESS) {
        memcpy(value, &number, sizeof number);
    }
    return result;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    int device;
    CUresult result = sim_device_argument(dev, &device);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (pool_out == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    *pool_out = default_pool(device);
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    int device;
    CUresult result = sim_device_argument(dev, &device);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (pool == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    *pool = current_pool(device);
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    int device;
    CUresult result = sim_device_argument(dev, &device);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(pool, SIM_POOL) || pool->device != device || pool->destroyed) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    current_pools[device] = pool->is_default ? NULL : pool;
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}
