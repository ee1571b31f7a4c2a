/* Variables of other GPU-sharing systems (vgpu-manager, vcuda-hook, HAMi-core) that the limiter
 * recognises but does not apply yet. Each one set is a warning naming it, never a limit the
 * user believes in and does not get. Supporting one means giving it a loader and taking it out
 * of this table. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config_internal.h"

struct foreign {
    const char *name;   /* the whole name, or a prefix when `indexed` */
    bool indexed;       /* NAME and NAME_<suffix> */
    const char *system; /* whose variable it is */
    const char *instead; /* what to use meanwhile */
};

#define MEMORY_INSTEAD "TENSOR_FUSION_CUDA_MEM_LIMIT or CUDA_DEVICE_MEMORY_LIMIT[_i]"
#define COMPUTE_INSTEAD "TENSOR_FUSION_CUDA_UP_LIMIT or CUDA_DEVICE_SM_LIMIT[_i]"
#define POD_INSTEAD "POD_NAME, POD_NAMESPACE, CONTAINER_NAME or SHM_PATH"

static const struct foreign table[] = {
    {"CUDA_MEM_LIMIT", true, "vgpu-manager", MEMORY_INSTEAD},
    {"CUDA_MEM_RATIO", true, "vgpu-manager", MEMORY_INSTEAD},
    {"CUDA_CORE_LIMIT", true, "vgpu-manager", COMPUTE_INSTEAD},
    {"CUDA_CORE_SOFT_LIMIT", true, "vgpu-manager", COMPUTE_INSTEAD},
    {"CUDA_MEMORY_OVERSUBSCRIBE", false, "vgpu-manager", "nothing yet, no memory oversubscription"},
    {"CUDA_MEM_OVERSOLD", true, "vgpu-manager", "nothing yet, no memory oversubscription"},
    {"GPU_DEVICES_UUID", false, "vgpu-manager", "UUID keys in " MEMORY_INSTEAD},
    {"VGPU_POD_NAME", false, "vgpu-manager", POD_INSTEAD},
    {"VGPU_POD_NAMESPACE", false, "vgpu-manager", POD_INSTEAD},
    {"VGPU_POD_UID", false, "vgpu-manager", POD_INSTEAD},
    {"VGPU_CONTAINER_NAME", false, "vgpu-manager", POD_INSTEAD},
    {"LOGGER_LEVEL", false, "vgpu-manager", "TF_LOG_LEVEL"},
    {"VCUDA_MEMORY_LIMIT", false, "vcuda-hook", MEMORY_INSTEAD},
    {"VCUDA_LOG_LEVEL", false, "vcuda-hook", "TF_LOG_LEVEL"},
    {"CUDA_DEVICE_MEMORY_SHARED_CACHE", false, "HAMi-core", "SHM_PATH"},
    {"GPU_CORE_UTILIZATION_POLICY", false, "HAMi-core", COMPUTE_INSTEAD},
};

static const struct foreign *recognise(const char *entry, size_t name_length) {
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        size_t length = strlen(table[i].name);
        if (strncmp(entry, table[i].name, length) != 0) {
            continue;
        }
        if (name_length == length || (table[i].indexed && entry[length] == '_')) {
            return &table[i];
        }
    }
    return NULL;
}

void vgpu_config_check_foreign(struct vgpu_config *config) {
    for (char **entry = environ; entry != NULL && *entry != NULL; entry++) {
        const char *equals = strchr(*entry, '=');
        if (equals == NULL || equals[1] == '\0') {
            continue;
        }
        size_t name_length = (size_t)(equals - *entry);
        const struct foreign *foreign = recognise(*entry, name_length);
        if (foreign == NULL) {
            continue;
        }
        char name[VGPU_CONFIG_SOURCE_SIZE];
        snprintf(name, sizeof name, "%.*s", (int)name_length, *entry);
        vgpu_config_warn(config, name, equals + 1,
                         "%s's variable, not supported: ignored (instead: %s)", foreign->system,
                         foreign->instead);
    }
}
