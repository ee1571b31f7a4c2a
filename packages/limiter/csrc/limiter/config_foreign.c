/* Variables of other GPU-sharing systems that the limiter recognises but does not apply: each one
 * set is a warning naming it, never a limit the user believes in and does not get. Supporting
 * one means giving it a loader and taking it out of this table. */
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

/* vgpu.rs (NexusGPU's limiter, whose TENSOR_FUSION_CUDA_* limits and TF_CUDA_LIB_PATH,
 * TF_NVML_LIB_PATH, SHM_PATH, TF_SHM_FILE and CONTAINER_NAME are read as ours): the rest of its
 * variables switch things this limiter does not have. */
static const struct foreign table[] = {
    {"HYPERVISOR_IP", false, "vgpu.rs", "nothing: the limits come from the pod region and "
                                        "this environment, not over HTTP"},
    {"HYPERVISOR_PORT", false, "vgpu.rs", "nothing: the limits come from the pod region and "
                                          "this environment, not over HTTP"},
    {"ENABLE_NVML_HOOKS", false, "vgpu.rs", "nothing: the NVML view follows the memory limit"},
    {"ENABLE_CUDA_HOOKS", false, "vgpu.rs", "LD_PRELOAD without libcuda_limiter.so"},
    {"TF_SKIP_HOOKS_IF_NO_LIMIT", false, "vgpu.rs",
     "nothing: a device without a limit is already passed through"},
    {"TF_VISIBLE_DEVICES", false, "vgpu.rs", "CUDA_VISIBLE_DEVICES"},
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
