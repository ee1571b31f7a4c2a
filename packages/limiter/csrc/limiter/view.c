/* The virtual GPU: on a device with a memory limit, the program sees a device of the limit's
 * size with the pod's usage, through CUDA and through NVML (so nvidia-smi run under the library
 * shows used / limit). Devices without a limit are passed through untouched. A pod that the
 * daemon made keeps to its GPUs: on any other no context can be made (context.c). */
#define _GNU_SOURCE
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>

#include "core.h"
#include "log.h"
#include "region.h"

static uint64_t minimum(uint64_t a, uint64_t b) {
    return a < b ? a : b;
}

bool vgpu_pod_confined(void) {
    const struct vgpu_region *region = vgpu_state.region;
    /* The daemon names every pod it makes and lists its GPUs in the region at once; a pod named
     * by POD_NAME alone gets the GPUs its first CUDA process saw. Private and unnamed (SHM_PATH)
     * regions are never confined. */
    return region != NULL && region->pod_name[0] != '\0' &&
           atomic_load(&region->device_count) > 0;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    result = VGPU_REAL(cuMemGetInfo_v2, free, total);
    int entry = result == CUDA_SUCCESS ? vgpu_current_entry() : -1;
    uint64_t limit = entry >= 0 ? vgpu_memory_limit(entry) : 0;
    if (limit != 0) {
        uint64_t used = vgpu_memory_used(entry);
        /* Never more than the device really has free (other pods share it). */
        *free = minimum(used < limit ? limit - used : 0, *free);
        *total = limit;
    }
    return result;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    result = VGPU_REAL(cuDeviceTotalMem_v2, bytes, dev);
    int entry = result == CUDA_SUCCESS ? vgpu_entry_of(dev) : -1;
    uint64_t limit = entry >= 0 ? vgpu_memory_limit(entry) : 0;
    if (limit != 0) {
        *bytes = minimum(limit, *bytes);
    }
    return result;
}

/* The CUDA 2.0 forms take unsigned int sizes: the same view, and over 4 GiB the most an
 * unsigned int holds, as the driver gives it. */
static unsigned int clamped(size_t bytes) {
    return bytes > UINT_MAX ? UINT_MAX : (unsigned int)bytes;
}

CUresult cuMemGetInfo(unsigned int *free, unsigned int *total) {
    if (free == NULL || total == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t free_bytes;
    size_t total_bytes;
    CUresult result = cuMemGetInfo_v2(&free_bytes, &total_bytes);
    if (result == CUDA_SUCCESS) {
        *free = clamped(free_bytes);
        *total = clamped(total_bytes);
    }
    return result;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    if (bytes == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t total;
    CUresult result = cuDeviceTotalMem_v2(&total, dev);
    if (result == CUDA_SUCCESS) {
        *bytes = clamped(total);
    }
    return result;
}

/* The region entry of an NVML device, or -1. A process that only uses NVML (nvidia-smi) maps
 * the devices through the driver first when its limits are keyed by index. */
int vgpu_nvml_entry(nvmlDevice_t device) {
    char uuid[96];
    if (vgpu_real.nvmlDeviceGetUUID == NULL ||
        vgpu_real.nvmlDeviceGetUUID(device, uuid, sizeof uuid) != NVML_SUCCESS) {
        return -1;
    }
    int entry = vgpu_region_device(vgpu_state.region, uuid, false);
    if (entry < 0 && vgpu_state.config.count > 0 && vgpu_cuda_ready() == CUDA_SUCCESS &&
        VGPU_REAL(cuInit, 0) == CUDA_SUCCESS && vgpu_map_devices() == CUDA_SUCCESS) {
        entry = vgpu_region_device(vgpu_state.region, uuid, false);
    }
    return entry;
}

/* NVML_SUCCESS with the limit and usage to show, or an error; *limit 0 means pass through. */
static nvmlReturn_t nvml_view(nvmlDevice_t device, uint64_t *limit, uint64_t *used) {
    *limit = 0;
    if (vgpu_ready() != CUDA_SUCCESS) {
        return NVML_ERROR_UNKNOWN; /* fail closed; the reason is in the log */
    }
    if (!vgpu_load_nvml()) {
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    int entry = vgpu_nvml_entry(device);
    if (entry >= 0) {
        *limit = vgpu_memory_limit(entry);
        *used = vgpu_memory_used(entry);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    uint64_t limit;
    uint64_t used;
    nvmlReturn_t result = nvml_view(device, &limit, &used);
    if (result != NVML_SUCCESS) {
        return result;
    }
    result = vgpu_real.nvmlDeviceGetMemoryInfo != NULL
                 ? vgpu_real.nvmlDeviceGetMemoryInfo(device, memory)
                 : NVML_ERROR_FUNCTION_NOT_FOUND;
    if (result == NVML_SUCCESS && limit != 0) {
        memory->total = limit;
        memory->used = minimum(used, limit);
        memory->free = limit - memory->used;
    }
    return result;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    uint64_t limit;
    uint64_t used;
    nvmlReturn_t result = nvml_view(device, &limit, &used);
    if (result != NVML_SUCCESS) {
        return result;
    }
    result = vgpu_real.nvmlDeviceGetMemoryInfo_v2 != NULL
                 ? vgpu_real.nvmlDeviceGetMemoryInfo_v2(device, memory)
                 : NVML_ERROR_FUNCTION_NOT_FOUND;
    if (result == NVML_SUCCESS && limit != 0) {
        memory->total = limit;
        memory->reserved = 0;
        memory->used = minimum(used, limit);
        memory->free = limit - memory->used;
    }
    return result;
}
