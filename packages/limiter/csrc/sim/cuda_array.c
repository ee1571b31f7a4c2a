/* Simulated driver: CUDA arrays and mipmapped arrays, charged by their element storage. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "cuda_sim.h"
#include "vgpu_cuda_sizes.h"

struct CUarray_st {
    uint32_t magic;
};

struct CUmipmappedArray_st {
    uint32_t magic;
};

static CUresult create(void *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels) {
    int device;
    struct CUctx_st *context;
    CUresult result = sim_current_device(&device, &context);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (desc->Width == 0 || levels == 0 ||
        vgpu_array_element_bytes(desc->Format, desc->NumChannels) == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t bytes = vgpu_array_bytes(desc, levels);
    uint64_t size = sim_round_up(bytes, SIM_PAGE_SIZE);
    if (bytes == 0 || size < bytes) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!sim_memory_reserve(device, size)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct sim_allocation record = {
        .key = (uint64_t)(uintptr_t)handle,
        .size = size,
        .requested = bytes,
        .kind = SIM_ALLOC_ARRAY,
        .device = device,
        .context = context,
    };
    pthread_mutex_lock(&sim_driver_lock);
    bool stored = sim_allocation_insert(&record);
    pthread_mutex_unlock(&sim_driver_lock);
    if (!stored) {
        sim_memory_release(device, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

static CUresult new_array(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    struct CUarray_st *array = calloc(1, sizeof *array);
    if (array == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result = create(array, desc, 1);
    if (result != CUDA_SUCCESS) {
        free(array);
        return result;
    }
    array->magic = SIM_ARRAY;
    *pHandle = array;
    return CUDA_SUCCESS;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray) {
    if (pHandle == NULL || pAllocateArray == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUDA_ARRAY3D_DESCRIPTOR desc = {
        .Width = pAllocateArray->Width,
        .Height = pAllocateArray->Height,
        .Format = pAllocateArray->Format,
        .NumChannels = pAllocateArray->NumChannels,
    };
    return new_array(pHandle, &desc);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray) {
    if (pHandle == NULL || pAllocateArray == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return new_array(pHandle, pAllocateArray);
}

/* The legacy descriptors: 32-bit sizes, the same arrays. */
CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray) {
    const CUDA_ARRAY_DESCRIPTOR_v1 *d = pAllocateArray;
    CUDA_ARRAY_DESCRIPTOR desc = {0};
    if (d != NULL) {
        desc = (CUDA_ARRAY_DESCRIPTOR){d->Width, d->Height, d->Format, d->NumChannels};
    }
    return cuArrayCreate_v2(pHandle, d != NULL ? &desc : NULL);
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray) {
    const CUDA_ARRAY3D_DESCRIPTOR_v1 *d = pAllocateArray;
    CUDA_ARRAY3D_DESCRIPTOR desc = {0};
    if (d != NULL) {
        desc = (CUDA_ARRAY3D_DESCRIPTOR){d->Width,  d->Height,      d->Depth,
                                         d->Format, d->NumChannels, d->Flags};
    }
    return cuArray3DCreate_v2(pHandle, d != NULL ? &desc : NULL);
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (pHandle == NULL || pMipmappedArrayDesc == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUmipmappedArray_st *array = calloc(1, sizeof *array);
    if (array == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result = create(array, pMipmappedArrayDesc, numMipmapLevels);
    if (result != CUDA_SUCCESS) {
        free(array);
        return result;
    }
    array->magic = SIM_ARRAY;
    *pHandle = array;
    return CUDA_SUCCESS;
}

static CUresult destroy(void *handle) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(handle, SIM_ARRAY)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct sim_allocation *record = sim_allocation_find((uint64_t)(uintptr_t)handle);
    if (record != NULL) {
        sim_allocation_free(record);
    }
    *(uint32_t *)handle = 0;
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuArrayDestroy(CUarray hArray) {
    return destroy(hArray);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    return destroy(hMipmappedArray);
}
