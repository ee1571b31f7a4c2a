/* NVML's process lists in a pod. A GPU where the pod's region gives a limit is shared with other
 * pods, and the driver lists every process on it with its memory: nvidia-smi in one tenant's pod
 * showed the others' (driver 580's nvidia-smi reads nvmlDeviceGetRunningProcessDetailList). There
 * the compute, graphics and MPS lists, and the detail list of every mode, hold only the pod's own
 * processes, those whose pid is the host pid of a live slot of the region, or its pid in the
 * caller's own pid namespace (a pid means nothing in another). Any other GPU, and any process
 * whose region has no entry for it, gets the driver's lists untouched, as the memory view does
 * (view.c).
 *
 * The caller's convention is kept exactly: *infoCount is the room on the way in and the count on
 * the way out; a count short of the list is NVML_ERROR_INSUFFICIENT_SIZE with the count needed
 * (0 with NULL infos asks for it). The driver's list holds the other pods' processes too, so it
 * may need more room than the caller gives: it is read into a buffer of our own, on the stack
 * when small, else malloc'd and freed here, never past MAX_LISTED entries. The list may grow
 * between two reads: after READ_ATTEMPTS, or with no memory, the caller gets NVML_ERROR_UNKNOWN
 * (logged): the driver's own answer would show it the other pods' processes. No lock is taken:
 * the region's slots are read with atomics only. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "log.h"
#include "region.h"
#include "vgpu_proc.h"

/* The queries and the layout of their entries (nvml_abi.h): v1 without the MIG instance ids. */
#define PROCESS_QUERIES(X) \
    X(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t) \
    X(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t) \
    X(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t) \
    X(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t) \
    X(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)

/* Every layout starts with the pid: entries are filtered by size, whatever their version. */
_Static_assert(offsetof(nvmlProcessInfo_v1_t, pid) == 0, "pid first");
_Static_assert(offsetof(nvmlProcessInfo_v2_t, pid) == 0, "pid first");
_Static_assert(offsetof(nvmlProcessDetail_v1_t, pid) == 0, "pid first");
/* The largest entry: the stack buffer holds STACK_ENTRIES of any layout. */
_Static_assert(sizeof(nvmlProcessDetail_v1_t) >= sizeof(nvmlProcessInfo_v2_t), "largest");

#define STACK_ENTRIES 32   /* 1 KiB of detail entries: a whole list on most GPUs, no malloc */
#define MAX_LISTED 16384   /* about 400 KiB of v2 entries; a longer list is not read */
#define SLACK 8            /* room for processes that start between two reads */
#define READ_ATTEMPTS 4

enum query {
#define QUERY_ENUM(symbol, info_type) QUERY_##symbol,
    PROCESS_QUERIES(QUERY_ENUM)
#undef QUERY_ENUM
    QUERY_DETAIL, /* nvmlDeviceGetRunningProcessDetailList, of `mode` */
};

/* The real detail list of `mode` as a list query: *count entries of room in, the count out. */
static nvmlReturn_t real_detail(nvmlDevice_t device, unsigned mode, unsigned int *count,
                                void *infos) {
    if (vgpu_real.nvmlDeviceGetRunningProcessDetailList == NULL) {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    nvmlProcessDetailList_t list = {nvmlProcessDetailList_v1, mode, *count, infos};
    nvmlReturn_t result = vgpu_real.nvmlDeviceGetRunningProcessDetailList(device, &list);
    *count = list.numProcArrayEntries;
    return result;
}

/* The real query, called with its own prototype (the buffer converts from void *). */
static nvmlReturn_t real_query(enum query query, unsigned mode, nvmlDevice_t device,
                               unsigned int *count, void *infos) {
    switch (query) {
    case QUERY_DETAIL:
        return real_detail(device, mode, count, infos);
#define QUERY_CALL(symbol, info_type) \
    case QUERY_##symbol: \
        return vgpu_real.symbol != NULL ? vgpu_real.symbol(device, count, infos) \
                                        : NVML_ERROR_FUNCTION_NOT_FOUND;
        PROCESS_QUERIES(QUERY_CALL)
#undef QUERY_CALL
    }
    return NVML_ERROR_FUNCTION_NOT_FOUND;
}

/* Whether the device's lists are the pod's: it has a region entry with a limit. An entry without
 * one is a GPU an unnamed pod's process merely saw, as the memory view leaves it. */
static bool pod_device(nvmlDevice_t device, int *entry) {
    if (vgpu_state.region == NULL) {
        return false;
    }
    *entry = vgpu_nvml_entry(device);
    if (*entry < 0) {
        return false;
    }
    uint64_t memory;
    uint32_t compute;
    vgpu_region_limits(vgpu_state.region, *entry, &memory, &compute);
    return memory != 0 || compute != 0;
}

/* Whether a pid NVML lists is a live process of the pod. A slot's host pid (written by the
 * daemon) is the node's; its own pid counts only where the caller's pid namespace is the slot's,
 * as it is without containers (and the driver then lists the same numbers). */
static bool pod_process(struct vgpu_region *region, uint64_t pid_namespace, unsigned pid) {
    for (unsigned i = 0; i < VGPU_REGION_MAX_PROCESSES; i++) {
        struct vgpu_region_process *slot = &region->processes[i];
        int32_t own = atomic_load(&slot->pid);
        if (own <= 0) {
            continue; /* free, or being claimed or reclaimed */
        }
        int32_t host = atomic_load(&slot->host_pid);
        if ((host > 0 && (unsigned)host == pid) ||
            ((unsigned)own == pid && slot->pid_namespace == pid_namespace)) {
            return true;
        }
    }
    return false;
}

/* The driver's whole list into *listed (`stack`, or a buffer the caller frees) with its count.
 * NVML_SUCCESS; the driver's error; or NVML_ERROR_INSUFFICIENT_SIZE when it could not be read
 * whole (too long, no memory, or still growing). */
static nvmlReturn_t read_list(enum query query, unsigned mode, nvmlDevice_t device, size_t size,
                              void *stack, void **listed, unsigned *count) {
    unsigned room = STACK_ENTRIES;
    *listed = stack;
    for (int attempt = 0; attempt < READ_ATTEMPTS; attempt++) {
        unsigned got = room;
        nvmlReturn_t result = real_query(query, mode, device, &got, *listed);
        if (result == NVML_SUCCESS) {
            *count = got < room ? got : room; /* never trust a count past the room */
            return NVML_SUCCESS;
        }
        if (*listed != stack) {
            free(*listed);
            *listed = stack;
        }
        /* A driver that asks for no more room than it had would do so again. */
        if (result != NVML_ERROR_INSUFFICIENT_SIZE || got <= room || got > MAX_LISTED - SLACK) {
            return result;
        }
        room = got + SLACK;
        *listed = malloc((size_t)room * size);
        if (*listed == NULL) {
            *listed = stack;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
    }
    return NVML_ERROR_INSUFFICIENT_SIZE;
}

static nvmlReturn_t list_processes(enum query query, unsigned mode, nvmlDevice_t device,
                                   unsigned int *infoCount, void *infos, size_t size) {
    if (vgpu_ready() != CUDA_SUCCESS) {
        return NVML_ERROR_UNKNOWN; /* fail closed, as the memory view; the reason is in the log */
    }
    if (!vgpu_load_nvml()) {
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    int entry = -1;
    if (infoCount == NULL || !pod_device(device, &entry)) {
        return real_query(query, mode, device, infoCount, infos);
    }
    _Alignas(nvmlProcessDetail_v1_t) unsigned char
        stack[STACK_ENTRIES * sizeof(nvmlProcessDetail_v1_t)];
    void *listed;
    unsigned count = 0;
    nvmlReturn_t result = read_list(query, mode, device, size, stack, &listed, &count);
    if (result == NVML_ERROR_INSUFFICIENT_SIZE) {
        /* Closed, as the memory view fails: the driver's list is every pod's. */
        vgpu_log(VGPU_LOG_WARN, "the process list of region entry %d could not be read whole "
                 "(too long, no memory, or still growing): not given", entry);
        return NVML_ERROR_UNKNOWN;
    }
    if (result != NVML_SUCCESS) {
        return result;
    }
    vgpu_region_sweep(vgpu_state.region); /* a dead process's slot, reused pid and all, is gone */
    uint64_t pid_namespace = vgpu_pid_namespace();
    unsigned char *entries = listed;
    unsigned kept = 0;
    for (unsigned i = 0; i < count; i++) {
        unsigned pid;
        memcpy(&pid, entries + (size_t)i * size, sizeof pid);
        if (pod_process(vgpu_state.region, pid_namespace, pid)) {
            if (kept != i) {
                memcpy(entries + (size_t)kept * size, entries + (size_t)i * size, size);
            }
            kept++;
        }
    }
    if (*infoCount < kept) {
        result = NVML_ERROR_INSUFFICIENT_SIZE;
    } else if (kept > 0 && infos == NULL) {
        result = NVML_ERROR_INVALID_ARGUMENT; /* room claimed with no buffer, as NVML answers */
    } else if (kept > 0) {
        memcpy(infos, entries, (size_t)kept * size);
    }
    if (result != NVML_ERROR_INVALID_ARGUMENT) {
        *infoCount = kept;
    }
    if (listed != stack) {
        free(listed);
    }
    return result;
}

#define QUERY_HOOK(symbol, info_type) \
    nvmlReturn_t symbol(nvmlDevice_t device, unsigned int *infoCount, info_type *infos) { \
        return list_processes(QUERY_##symbol, 0, device, infoCount, infos, sizeof(info_type)); \
    }
PROCESS_QUERIES(QUERY_HOOK)
#undef QUERY_HOOK

/* The detail list's own struct: its room and count in numProcArrayEntries, a NULL procArray
 * asking for the count as a room of 0 does. A version this library does not know is refused
 * on the pod's GPUs: its layout cannot be filtered, and the driver's list is every pod's. */
nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device,
                                                   nvmlProcessDetailList_t *plist) {
    if (plist == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT; /* as NVML answers */
    }
    if (plist->version != nvmlProcessDetailList_v1) {
        if (vgpu_ready() != CUDA_SUCCESS) {
            return NVML_ERROR_UNKNOWN;
        }
        if (!vgpu_load_nvml() || vgpu_real.nvmlDeviceGetRunningProcessDetailList == NULL) {
            return NVML_ERROR_FUNCTION_NOT_FOUND;
        }
        int entry = -1;
        return pod_device(device, &entry)
                   ? NVML_ERROR_ARGUMENT_VERSION_MISMATCH
                   : vgpu_real.nvmlDeviceGetRunningProcessDetailList(device, plist);
    }
    unsigned room = plist->procArray == NULL ? 0 : plist->numProcArrayEntries;
    nvmlReturn_t result = list_processes(QUERY_DETAIL, plist->mode, device, &room,
                                         plist->procArray, sizeof(nvmlProcessDetail_v1_t));
    plist->numProcArrayEntries = room;
    return result;
}
