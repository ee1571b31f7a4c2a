/* Processes on a device. A compute process is one with a context or memory on the device
 * (after dead processes are reaped); usedGpuMemory is all it holds there, its context overhead
 * included. The simulator has no graphics or MPS clients: those lists are always empty.
 * Size protocol of the real API: *infoCount smaller than the list (0 with infos NULL to ask)
 * gives NVML_ERROR_INSUFFICIENT_SIZE and the needed count; an empty list is NVML_SUCCESS. */
#define _GNU_SOURCE
#include <stddef.h>
#include <string.h>

#include "nvml_sim.h"

#define NO_INSTANCE 0xFFFFFFFFU /* gpuInstanceId / computeInstanceId outside MIG */
_Static_assert(offsetof(nvmlProcessDetail_v1_t, computeInstanceId) ==
                   offsetof(nvmlProcessInfo_v2_t, computeInstanceId),
               "a detail entry begins as a v2 one");

enum process_kind { COMPUTE, NONE };
enum info_layout { INFO_V1, INFO_V2, INFO_DETAIL };

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
    size_t size = layout == INFO_V1       ? sizeof(nvmlProcessInfo_v1_t)
                  : layout == INFO_DETAIL ? sizeof(nvmlProcessDetail_v1_t)
                                          : sizeof(nvmlProcessInfo_v2_t);
    for (unsigned i = 0; i < count; i++) {
        unsigned char *out = (unsigned char *)infos + (size_t)i * size;
        memset(out, 0, size);
        if (layout == INFO_V1) {
            nvmlProcessInfo_v1_t info = {(unsigned)entries[i].pid, entries[i].memory};
            memcpy(out, &info, sizeof info);
        } else { /* a detail entry begins as a v2 one; the rest (protected memory) is 0 */
            nvmlProcessInfo_v2_t info = {(unsigned)entries[i].pid, entries[i].memory, NO_INSTANCE,
                                         NO_INSTANCE};
            memcpy(out, &info, sizeof info);
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

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v1_t *infos) {
    return list_processes(device, infoCount, infos, NONE, INFO_V1);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_v2_t *infos) {
    return list_processes(device, infoCount, infos, NONE, INFO_V2);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                        unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos) {
    return list_processes(device, infoCount, infos, NONE, INFO_V2);
}

/* The list nvidia-smi reads (R550 on): one call for every mode, a struct of its own versioned. */
nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device,
                                                   nvmlProcessDetailList_t *plist) {
    if (plist == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (plist->version != nvmlProcessDetailList_v1) {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    enum process_kind kind = plist->mode == NVML_PROCESS_MODE_COMPUTE ? COMPUTE : NONE;
    unsigned room = plist->procArray == NULL ? 0 : plist->numProcArrayEntries;
    nvmlReturn_t result = list_processes(device, &room, plist->procArray, kind, INFO_DETAIL);
    plist->numProcArrayEntries = room;
    return result;
}
