/* NVML enumeration in a pod that keeps to its GPUs (view.c: vgpu_pod_confined): the device count
 * is the pod's GPUs and index i is the pod's i-th GPU in the node's NVML order, so nvidia-smi or
 * pynvml under the library list only those, and nvmlDeviceGetIndex of such a GPU is its index in
 * that list. Any other process sees NVML unchanged. Handles got by UUID, PCI bus id or serial
 * are not touched, nor is the index of a GPU outside the pod: the pod cannot see other GPUs
 * listed, and no context can be made on them (context.c). */
#define _GNU_SOURCE
#include <stdatomic.h>

#include "core.h"
#include "log.h"
#include "region.h"

#define MAX_NVML_DEVICES VGPU_MAX_ORDINALS

struct pod_gpus {
    bool confined;
    unsigned count;                  /* the pod's GPUs when confined */
    unsigned node[MAX_NVML_DEVICES]; /* node index of the pod's i-th GPU */
};

/* Computed once, once NVML is initialized. Published without a lock so that a fork while another
 * thread publishes leaves nothing held: PUBLISHING stays set in such a child, which then computes
 * its own copy per call (still correct, only less cheap). */
enum { NOT_YET, PUBLISHING, PUBLISHED };
static atomic_int published = NOT_YET;
static struct pod_gpus shared_gpus;

static nvmlReturn_t real_count(unsigned int *count) {
    if (vgpu_real.nvmlDeviceGetCount_v2 != NULL) {
        return vgpu_real.nvmlDeviceGetCount_v2(count);
    }
    return vgpu_real.nvmlDeviceGetCount != NULL ? vgpu_real.nvmlDeviceGetCount(count)
                                                : NVML_ERROR_FUNCTION_NOT_FOUND;
}

static nvmlReturn_t real_handle(unsigned int index, nvmlDevice_t *device) {
    if (vgpu_real.nvmlDeviceGetHandleByIndex_v2 != NULL) {
        return vgpu_real.nvmlDeviceGetHandleByIndex_v2(index, device);
    }
    return vgpu_real.nvmlDeviceGetHandleByIndex != NULL
               ? vgpu_real.nvmlDeviceGetHandleByIndex(index, device)
               : NVML_ERROR_FUNCTION_NOT_FOUND;
}

/* The pod's GPUs among the node's, in the node's order; an NVML error (not initialized) leaves
 * nothing decided, so the next call tries again. */
static nvmlReturn_t compute(struct pod_gpus *gpus) {
    gpus->count = 0;
    gpus->confined = vgpu_pod_confined();
    if (!gpus->confined) {
        return NVML_SUCCESS;
    }
    unsigned int count = 0;
    nvmlReturn_t result = real_count(&count);
    if (result != NVML_SUCCESS) {
        return result;
    }
    for (unsigned int index = 0; index < count && index < MAX_NVML_DEVICES; index++) {
        nvmlDevice_t device;
        char uuid[96];
        result = real_handle(index, &device);
        if (result == NVML_SUCCESS) {
            result = vgpu_real.nvmlDeviceGetUUID != NULL
                         ? vgpu_real.nvmlDeviceGetUUID(device, uuid, sizeof uuid)
                         : NVML_ERROR_FUNCTION_NOT_FOUND;
        }
        if (result == NVML_ERROR_NO_PERMISSION) {
            continue; /* a GPU this process may not talk to is none of its pod's to show */
        }
        if (result != NVML_SUCCESS) {
            return result;
        }
        if (vgpu_region_device(vgpu_state.region, uuid, false) >= 0) {
            gpus->node[gpus->count++] = index;
        }
    }
    vgpu_log(VGPU_LOG_DEBUG, "NVML lists %u of the node's %u GPUs: those of pod %s/%s",
             gpus->count, count, vgpu_state.region->pod_namespace, vgpu_state.region->pod_name);
    return NVML_SUCCESS;
}

/* The pod's GPUs, from the published copy or computed into *local. */
static nvmlReturn_t pod_gpus(struct pod_gpus *local, const struct pod_gpus **gpus) {
    if (atomic_load_explicit(&published, memory_order_acquire) == PUBLISHED) {
        *gpus = &shared_gpus;
        return NVML_SUCCESS;
    }
    if (vgpu_ready() != CUDA_SUCCESS) {
        return NVML_ERROR_UNKNOWN; /* fail closed, as the memory view; the reason is in the log */
    }
    if (!vgpu_load_nvml()) {
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    nvmlReturn_t result = compute(local);
    if (result != NVML_SUCCESS) {
        return result;
    }
    int expected = NOT_YET;
    if (atomic_compare_exchange_strong(&published, &expected, PUBLISHING)) {
        shared_gpus = *local;
        atomic_store_explicit(&published, PUBLISHED, memory_order_release);
    }
    *gpus = local;
    return NVML_SUCCESS;
}

static nvmlReturn_t count_of(unsigned int *count, bool v2) {
    struct pod_gpus local;
    const struct pod_gpus *gpus;
    nvmlReturn_t result = pod_gpus(&local, &gpus);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if (!gpus->confined) {
        __typeof__(nvmlDeviceGetCount) *real =
            v2 ? vgpu_real.nvmlDeviceGetCount_v2 : vgpu_real.nvmlDeviceGetCount;
        return real != NULL ? real(count) : NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    if (count == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *count = gpus->count;
    return NVML_SUCCESS;
}

static nvmlReturn_t handle_of(unsigned int index, nvmlDevice_t *device, bool v2) {
    struct pod_gpus local;
    const struct pod_gpus *gpus;
    nvmlReturn_t result = pod_gpus(&local, &gpus);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if (!gpus->confined) {
        __typeof__(nvmlDeviceGetHandleByIndex) *real =
            v2 ? vgpu_real.nvmlDeviceGetHandleByIndex_v2 : vgpu_real.nvmlDeviceGetHandleByIndex;
        return real != NULL ? real(index, device) : NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    if (device == NULL || index >= gpus->count) {
        return NVML_ERROR_INVALID_ARGUMENT; /* what NVML answers for an index past its count */
    }
    return real_handle(gpus->node[index], device);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    return count_of(deviceCount, true);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
    return count_of(deviceCount, false);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle_of(index, device, true);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle_of(index, device, false);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    struct pod_gpus local;
    const struct pod_gpus *gpus;
    nvmlReturn_t result = pod_gpus(&local, &gpus);
    if (result != NVML_SUCCESS) {
        return result;
    }
    result = vgpu_real.nvmlDeviceGetIndex != NULL ? vgpu_real.nvmlDeviceGetIndex(device, index)
                                                  : NVML_ERROR_FUNCTION_NOT_FOUND;
    if (result != NVML_SUCCESS || !gpus->confined) {
        return result;
    }
    for (unsigned i = 0; i < gpus->count; i++) {
        if (gpus->node[i] == *index) {
            *index = i;
            break;
        }
    }
    return result;
}
