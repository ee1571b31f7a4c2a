/* Simulated driver: virtual memory management (cuMemCreate physical memory, address ranges,
 * mappings). Physical memory is charged at cuMemCreate and given back when it has been
 * released and every mapping of it removed, as with the real driver. */
#define _GNU_SOURCE
#include "cuda_sim.h"

/* Valid allocation properties name a device; its physical index, or -1. */
static int property_device(const CUmemAllocationProp *prop) {
    if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
        return -1;
    }
    return sim_physical_device(prop->location.id);
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (granularity == NULL || property_device(prop) < 0 ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *granularity = SIM_PAGE_SIZE;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    int device = property_device(prop);
    if (handle == NULL || device < 0 || flags != 0 || size == 0 || size % SIM_PAGE_SIZE != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_memory_reserve(device, size)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&sim_driver_lock);
    static uint64_t next_handle = 0x1000;
    struct sim_allocation record = {
        .key = next_handle++,
        .size = size,
        .requested = size,
        .kind = SIM_ALLOC_VMM,
        .device = device,
    };
    bool stored = sim_allocation_insert(&record);
    pthread_mutex_unlock(&sim_driver_lock);
    if (!stored) {
        sim_memory_release(device, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = record.key;
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct sim_allocation *record = sim_allocation_find(handle);
    if (record == NULL || record->kind != SIM_ALLOC_VMM || record->vmm_released) {
        result = CUDA_ERROR_INVALID_VALUE;
    } else if (record->vmm_mappings == 0) {
        sim_allocation_free(record);
    } else {
        record->vmm_released = true; /* freed by the last unmap */
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    (void)addr; /* a hint the driver may ignore */
    if (ptr == NULL || size == 0 || size % SIM_PAGE_SIZE != 0 || flags != 0 ||
        (alignment & (alignment - 1)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct sim_allocation record = {
        .key = sim_address_space(size, alignment > SIM_PAGE_SIZE ? alignment : SIM_PAGE_SIZE),
        .requested = size,
        .kind = SIM_ALLOC_RESERVED_RANGE,
        .device = -1,
    };
    bool stored = sim_allocation_insert(&record);
    pthread_mutex_unlock(&sim_driver_lock);
    if (!stored) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = record.key;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct sim_allocation *record = sim_allocation_find(ptr);
    if (record == NULL || record->kind != SIM_ALLOC_RESERVED_RANGE || record->requested != size) {
        result = CUDA_ERROR_INVALID_VALUE;
    } else {
        sim_allocation_free(record);
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

struct range_search {
    uint64_t start;
    uint64_t end;
    bool found;
};

static void find_reserved_range(struct sim_allocation *record, void *data) {
    struct range_search *search = data;
    if (record->kind == SIM_ALLOC_RESERVED_RANGE && search->start >= record->key &&
        search->end <= record->key + record->requested) {
        search->found = true;
    }
}

/* Mapping records are keyed by address | 1: addresses are page-aligned, so a mapping never
 * shares a key with the reserved range that starts at the same address. */
static uint64_t mapping_key(CUdeviceptr ptr) {
    return ptr | 1;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (flags != 0 || size == 0 || ptr % SIM_PAGE_SIZE != 0 || size % SIM_PAGE_SIZE != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct sim_allocation *physical = sim_allocation_find(handle);
    struct range_search search = {ptr, ptr + size, false};
    sim_allocations_each(find_reserved_range, &search);
    if (physical == NULL || physical->kind != SIM_ALLOC_VMM || physical->vmm_released ||
        offset > physical->size || size > physical->size - offset || !search.found) {
        result = CUDA_ERROR_INVALID_VALUE;
    } else if (sim_allocation_find(mapping_key(ptr)) != NULL) {
        result = CUDA_ERROR_ALREADY_MAPPED;
    } else {
        struct sim_allocation mapping = {
            .key = mapping_key(ptr),
            .requested = size,
            .kind = SIM_ALLOC_MAPPING,
            .device = physical->device,
            .mapped_handle = handle,
        };
        if (sim_allocation_insert(&mapping)) {
            physical->vmm_mappings++;
        } else {
            result = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

struct unmap_request {
    uint64_t start;
    uint64_t end;
    unsigned removed;
};

static void unmap_in_range(struct sim_allocation *record, void *data) {
    struct unmap_request *request = data;
    uint64_t address = record->key & ~1ULL;
    if (record->kind != SIM_ALLOC_MAPPING || address < request->start || address >= request->end) {
        return;
    }
    struct sim_allocation *physical = sim_allocation_find(record->mapped_handle);
    sim_allocation_remove(record->key);
    request->removed++;
    if (physical != NULL && physical->vmm_mappings > 0 && --physical->vmm_mappings == 0 &&
        physical->vmm_released) {
        sim_allocation_free(physical);
    }
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct unmap_request request = {ptr, ptr + size, 0};
    sim_allocations_each(unmap_in_range, &request);
    pthread_mutex_unlock(&sim_driver_lock);
    return request.removed > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (desc == NULL || count == 0 || size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            sim_physical_device(desc[i].location.id) < 0) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
    }
    pthread_mutex_lock(&sim_driver_lock);
    bool mapped = sim_allocation_find(mapping_key(ptr)) != NULL;
    pthread_mutex_unlock(&sim_driver_lock);
    return mapped ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
