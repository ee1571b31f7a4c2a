/* Simulated driver: device, pitched, managed and host memory, advice on managed memory, and the
 * memory info query. Device allocations are rounded up to 2 MiB pages and charged to the node
 * state. Managed memory counts as resident on its device (as if touched there) until advice
 * prefers the host for the whole allocation; then it lives in host memory and the device is
 * not charged, until the preference goes back to the device. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "cuda_sim.h"

/* Charge `bytes` (page-rounded) to the current device and record an allocation at a fresh
 * device address (below 4 GiB for the legacy 32-bit entry points), or at `host` for managed
 * memory. */
static CUresult allocate(CUdeviceptr *dptr, size_t bytes, enum sim_allocation_kind kind,
                         void *host, bool legacy) {
    int device;
    struct CUctx_st *context;
    CUresult result = sim_current_device(&device, &context);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    uint64_t size = sim_round_up(bytes, SIM_PAGE_SIZE);
    if (size < bytes) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!sim_memory_reserve(device, size)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct sim_allocation record = {
        .key = host != NULL ? (uint64_t)(uintptr_t)host
               : legacy     ? sim_legacy_address_space(size)
                            : sim_address_space(size, SIM_PAGE_SIZE),
        .size = size,
        .requested = bytes,
        .kind = kind,
        .device = device,
        .context = context,
    };
    bool stored = record.key != 0 && sim_allocation_insert(&record);
    pthread_mutex_unlock(&sim_driver_lock);
    if (!stored) {
        sim_memory_release(device, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = record.key;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (dptr == NULL || bytesize == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return allocate(dptr, bytesize, SIM_ALLOC_DEVICE, NULL, false);
}

static CUresult allocate_pitch(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                               size_t Height, unsigned int ElementSizeBytes, bool legacy) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (dptr == NULL || pPitch == NULL || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* Rows are padded to 512 bytes: the pitch × height is what the device really holds. */
    size_t pitch = (size_t)sim_round_up(WidthInBytes, 512);
    if (pitch < WidthInBytes || Height > SIZE_MAX / pitch) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result = allocate(dptr, pitch * Height, SIM_ALLOC_DEVICE, NULL, legacy);
    if (result == CUDA_SUCCESS) {
        *pPitch = pitch;
    }
    return result;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                            size_t Height, unsigned int ElementSizeBytes) {
    return allocate_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes, false);
}

/* The legacy entry points: 32-bit pointers and sizes, the same memory. */
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (dptr == NULL || bytesize == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUdeviceptr address = 0;
    result = allocate(&address, bytesize, SIM_ALLOC_DEVICE, NULL, true);
    if (result == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)address;
    }
    return result;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (dptr == NULL || pPitch == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUdeviceptr address = 0;
    size_t pitch = 0;
    result = allocate_pitch(&address, &pitch, WidthInBytes, Height, ElementSizeBytes, true);
    if (result == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)address;
        *pPitch = (unsigned int)pitch;
    }
    return result;
}

CUresult cuMemFree(CUdeviceptr_v1 dptr) {
    return cuMemFree_v2(dptr);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (dptr == NULL || bytesize == 0 ||
        (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* Host-backed so the program may touch it; charged to the device like device memory. */
    void *host = mmap(NULL, bytesize, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (host == MAP_FAILED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result = allocate(dptr, bytesize, SIM_ALLOC_MANAGED, host, false);
    if (result != CUDA_SUCCESS) {
        munmap(host, bytesize);
    }
    return result;
}

struct containing {
    uint64_t address;
    struct sim_allocation *found;
};

static void find_containing(struct sim_allocation *record, void *data) {
    struct containing *search = data;
    if (record->kind == SIM_ALLOC_MANAGED && search->address >= record->key &&
        search->address - record->key < record->requested) {
        search->found = record;
    }
}

/* Where advice points: the host (true) or a device; false from *valid for a bad location. */
static bool advice_on_host(CUmemLocation location, bool *valid) {
    *valid = true;
    if (location.type == CU_MEM_LOCATION_TYPE_HOST ||
        location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
        location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
        return true;
    }
    int physical;
    *valid = location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
             sim_device_argument(location.id, &physical) == CUDA_SUCCESS;
    return false;
}

static CUresult advise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                       CUmemLocation location) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    bool valid;
    bool host = advice_on_host(location, &valid);
    if (count == 0 || advice < CU_MEM_ADVISE_SET_READ_MOSTLY ||
        advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY ||
        (!valid && advice != CU_MEM_ADVISE_SET_READ_MOSTLY &&
         advice != CU_MEM_ADVISE_UNSET_READ_MOSTLY &&
         advice != CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct containing search = {.address = devPtr};
    sim_allocations_each(find_containing, &search);
    struct sim_allocation *record = search.found;
    if (record == NULL || count > record->requested - (devPtr - record->key)) {
        result = CUDA_ERROR_INVALID_VALUE; /* not managed memory, or past its end */
    } else if (devPtr == record->key && count == record->requested) {
        /* Only advice on a whole allocation moves it; a part of one stays where it is. */
        bool to_host = advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION && host;
        bool to_device = (advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION && !host) ||
                         advice == CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION;
        if (to_host && !record->on_host) {
            sim_memory_release(record->device, record->size);
            record->on_host = true;
        } else if (to_device && record->on_host &&
                   sim_memory_reserve(record->device, record->size)) {
            record->on_host = false; /* a full device leaves it on the host, as a real one would */
        }
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device) {
    CUmemLocation location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device};
    if (device == CU_DEVICE_CPU) {
        location = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_HOST};
    }
    return advise(devPtr, count, advice, location);
}

CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                        CUmemLocation location) {
    return advise(devPtr, count, advice, location);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (dptr == 0) {
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct sim_allocation *record = sim_allocation_find(dptr);
    if (record != NULL && (record->kind == SIM_ALLOC_DEVICE || record->kind == SIM_ALLOC_MANAGED ||
                           record->kind == SIM_ALLOC_POOL)) {
        sim_allocation_free(record);
    } else {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

static CUresult host_allocate(void **pp, size_t bytesize) {
    CUresult result = sim_initialized();
    struct CUctx_st *context;
    if (result != CUDA_SUCCESS || (result = sim_current_context(&context)) != CUDA_SUCCESS) {
        return result;
    }
    if (pp == NULL || bytesize == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    void *host = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct sim_allocation record = {
        .key = (uint64_t)(uintptr_t)host,
        .requested = bytesize,
        .kind = SIM_ALLOC_HOST,
        .device = -1,
        .context = context,
    };
    pthread_mutex_lock(&sim_driver_lock);
    bool stored = sim_allocation_insert(&record);
    pthread_mutex_unlock(&sim_driver_lock);
    if (!stored) {
        munmap(host, bytesize);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = host;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
    return host_allocate(pp, bytesize);
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    if (Flags > 0xf) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return host_allocate(pp, bytesize);
}

CUresult cuMemFreeHost(void *p) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct sim_allocation *record = sim_allocation_find((uint64_t)(uintptr_t)p);
    if (record != NULL && record->kind == SIM_ALLOC_HOST) {
        sim_allocation_free(record);
    } else {
        result = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    int device;
    CUresult result = sim_current_device(&device, NULL);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (free == NULL || total == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct sim_state *state = sim_driver_state();
    sim_lock(state);
    sim_reap_locked(state); /* the driver frees a process's memory when it exits */
    const struct sim_device *target = &state->devices[device];
    *total = target->config.total_memory;
    *free = target->config.total_memory - target->used_memory;
    sim_unlock(state);
    return CUDA_SUCCESS;
}

/* The CUDA 2.0 form: sizes over 4 GiB read as the most an unsigned int holds. */
CUresult cuMemGetInfo(unsigned int *free, unsigned int *total) {
    if (free == NULL || total == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t free_bytes;
    size_t total_bytes;
    CUresult result = cuMemGetInfo_v2(&free_bytes, &total_bytes);
    if (result == CUDA_SUCCESS) {
        *free = free_bytes > UINT_MAX ? UINT_MAX : (unsigned int)free_bytes;
        *total = total_bytes > UINT_MAX ? UINT_MAX : (unsigned int)total_bytes;
    }
    return result;
}
