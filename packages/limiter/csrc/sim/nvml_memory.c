/* Device memory as NVML reports it. Used memory is everything processes hold, their context
 * overheads included; memory of dead processes is given back first, as the real driver frees
 * it when a process exits. v2 reports reserved = 0: the simulator sets nothing aside for
 * itself, and context overheads belong to processes (they also appear in usedGpuMemory),
 * so v1 and v2 agree on used and free. */
#define _GNU_SOURCE
#include "nvml_sim.h"

struct memory_view {
    uint64_t total;
    uint64_t used;
};

/* Checks the call like the real API (initialized, valid handle, output given), then reads. */
static nvmlReturn_t read_memory(nvmlDevice_t device, const void *out, const unsigned *version,
                                struct memory_view *view) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if (out == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (version != NULL && *version != nvmlMemory_v2) {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    sim_lock(state);
    sim_reap_locked(state);
    const struct sim_device *target = &state->devices[index];
    view->total = target->config.total_memory;
    view->used = target->used_memory < view->total ? target->used_memory : view->total;
    sim_unlock(state);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    struct memory_view view;
    nvmlReturn_t result = read_memory(device, memory, NULL, &view);
    if (result == NVML_SUCCESS) {
        memory->total = view.total;
        memory->used = view.used;
        memory->free = view.total - view.used;
    }
    return result;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    struct memory_view view;
    nvmlReturn_t result =
        read_memory(device, memory, memory != NULL ? &memory->version : NULL, &view);
    if (result == NVML_SUCCESS) {
        memory->total = view.total;
        memory->reserved = 0;
        memory->used = view.used;
        memory->free = view.total - view.used;
    }
    return result;
}
