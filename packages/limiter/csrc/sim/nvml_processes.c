/* Processes on a device. A compute process is one with a context or memory on the device
 * (after dead processes are reaped); usedGpuMemory is all it holds there, its context overhead
 * included. The simulator has no graphics or MPS clients: those lists are always empty.
 * Size protocol of the real API: *infoCount smaller than the list (0 with infos NULL to ask)
 * gives NVML_ERROR_INSUFFICIENT_SIZE and the needed count; an empty list is NVML_SUCCESS. */
#define _GNU_SOURCE
#include <string.h>

#include "nvml_sim.h"

#define NO_INSTANCE 0xFFFFFFFFU /* gpuInstanceId / computeInstanceId outside MIG */

enum process_kind { COMPUTE, NONE };
enum info_layout { INFO_V1, INFO_V2 };

struct process_entry {
    int32_t pid;
    uint64_t memory;
};

static unsigned collect_locked(struct sim_state *state, unsigned index,
                               struct process_entry entries[SIM_MAX_PROCESSES]) {
    unsigned count = 0;
    sim_reap_locked(state);
    for (unsigned i = 0; i < SIM_MAX_PROCESSES; i++) {
        const struct sim_process *process = &state->processes[i];
        if (process->pid != 0 && (process->contexts[index] > 0 || process->memory[index] > 0)) {
            entries[count++] = (struct process_entry){process->pid, process->memory[index]};
        }
    }
    return count;
}

static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos,
                                   enum process_kind kind, enum info_layout layout) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if (infoCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    struct process_entry entries[SIM_MAX_PROCESSES];
    unsigned count = 0;
    if (kind == COMPUTE) {
        sim_lock(state);
        count = collect_locked(state, index, entries);
        sim_unlock(state);
    }
    if (*infoCount < count) {
        *infoCount = count;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (infos == NULL && count > 0) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned i = 0; i < count; i++) {
        if (layout == INFO_V1) {
            nvmlProcessInfo_v1_t *info = (nvmlProcessInfo_v1_t *)infos + i;
            memset(info, 0, sizeof *info);
            info->pid = (unsigned)entries[i].pid;
            info->usedGpuMemory = entries[i].memory;
        } else {
            nvmlProcessInfo_v2_t *info = (nvmlProcessInfo_v2_t *)infos + i;
            memset(info, 0, sizeof *info);
            info->pid = (unsigned)entries[i].pid;
            info->usedGpuMemory = entries[i].memory;
            info->gpuInstanceId = NO_INSTANCE;
            info->computeInstanceId = NO_INSTANCE;
        }
    }
    *infoCount = count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos) {
    return list_processes(device, infoCount, infos, COMPUTE, INFO_V1);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos) {
    return list_processes(device, infoCount, infos, COMPUTE, INFO_V2);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    return list_processes(device, infoCount, infos, COMPUTE, INFO_V2);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                   nvmlProcessInfo_v1_t *infos) {
    return list_processes(device, infoCount, infos, NONE, INFO_V1);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_v2_t *infos) {
    return list_processes(device, infoCount, infos, NONE, INFO_V2);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    return list_processes(device, infoCount, infos, NONE, INFO_V2);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos) {
    return list_processes(device, infoCount, infos, NONE, INFO_V2);
}
