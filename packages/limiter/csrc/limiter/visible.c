/* A confined pod's program sees only the pod's GPUs through CUDA too. NVML already lists only
 * them (nvml_gpus.c); CUDA, left alone, enumerated every GPU of the node. PyTorch counts devices
 * through NVML, so a pod given the node's second GPU saw one device, used CUDA ordinal 0 (the
 * node's first GPU, where the pod may make no context) and could not use its own GPU.
 *
 * Before the driver's first cuInit, when the program has not set CUDA_VISIBLE_DEVICES itself,
 * it is set to the pod's GPUs by UUID, as `tf-limiter run --pod` sets it. Remapping ordinals in
 * cuDeviceGet instead breaks the CUDA runtime, which checks its devices by other paths. A value
 * the program set is kept: a wider one still gets no context outside the pod (context.c). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "log.h"

static pthread_once_t shown = PTHREAD_ONCE_INIT;

static void show_pod_gpus(void) {
    const struct vgpu_region *region = vgpu_state.region;
    if (getenv("CUDA_VISIBLE_DEVICES") != NULL || !vgpu_pod_confined()) {
        return;
    }
    char list[VGPU_REGION_MAX_DEVICES * (VGPU_REGION_UUID_SIZE + 1)] = "";
    size_t length = 0;
    uint32_t count = atomic_load(&region->device_count);
    for (uint32_t i = 0; i < count && i < VGPU_REGION_MAX_DEVICES; i++) {
        char uuid[VGPU_REGION_UUID_SIZE];
        memcpy(uuid, region->devices[i].uuid, sizeof uuid);
        uuid[sizeof uuid - 1] = '\0';
        size_t size = strlen(uuid);
        if (size == 0 || length + size + 2 > sizeof list) {
            continue;
        }
        if (length > 0) {
            list[length++] = ',';
        }
        memcpy(list + length, uuid, size + 1);
        length += size;
    }
    if (length > 0 && setenv("CUDA_VISIBLE_DEVICES", list, 0) == 0) {
        vgpu_log(VGPU_LOG_DEBUG, "CUDA_VISIBLE_DEVICES=%s: the GPUs of pod %s/%s", list,
                 region->pod_namespace, region->pod_name);
    }
}

void vgpu_show_only_pod_gpus(void) {
    pthread_once(&shown, show_pod_gpus);
}
