/* The limiter's per-process state: configuration, the pod region, and which region entry each
 * device the program sees maps to. Set up on the first CUDA or NVML call, never at load. */
#ifndef VGPU_LIMITER_CORE_H
#define VGPU_LIMITER_CORE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "hooks.h"
#include "vgpu_region.h"

#define VGPU_MAX_ORDINALS 64

/* The layout of the launch path: every launch runs its common case, and a launch's rare work (an
 * epoch's start or end, a wait, a first sight of a kernel) lies outside the cache lines that case
 * runs through. A real driver's launch leaves the CPU's caches cold, so each line of code a
 * launch passes costs it a miss: laid out by the compiler's guesses, a paced launch ran through
 * 56 lines of the library's code. */
#define VGPU_RARELY(condition) __builtin_expect(!!(condition), 0)
#define VGPU_COLD __attribute__((cold, noinline))

struct vgpu_state {
    struct vgpu_config config;
    /* From here, what every launch reads, in one cache line: a real driver's launch leaves the
     * CPU's caches cold, and each line a launch touches then costs it a miss. With this line,
     * the paced device state's launch fields in three and no jump table or once-control on the
     * way, a paced launch on an H100 added a median 183 ns instead of 218 (four runs each,
     * alternating), an unpaced one 42 instead of 48. */
    _Alignas(64) struct vgpu_region *region;
    bool cuda_ready; /* vgpu_cuda_ready succeeded, as it then always will (atomic builtins) */
    bool mapped;     /* vgpu_map_devices succeeded (atomic builtins) */
    _Atomic unsigned contexts_gone; /* bumped whenever a context goes (compute.c) */
    _Atomic int captures_open;      /* stream captures the process may have open (capture.c) */
    int ordinal_count;
    /* Region entry by CUDA ordinal, -1 when none, VGPU_ENTRY_OUTSIDE for a GPU the pod does
     * not have (no context may be made on it). The first ones share the line above. */
    int entries[VGPU_MAX_ORDINALS];
    uint64_t context_overhead; /* device memory each context is charged */
    /* CLOCK_MONOTONIC at setup, the process's first hooked call: before any collective of a job
     * it is a rank of (NCCL's communicator needs every rank's CUDA first). */
    uint64_t started_ns;
};

extern struct vgpu_state vgpu_state;

/* Setup on first use: configuration, log, region. CUDA_SUCCESS, or the error that every hooked
 * call then returns (fail closed: a bad limit never silently disappears). */
CUresult vgpu_ready(void);

/* vgpu_ready and the real driver loaded. */
CUresult vgpu_cuda_ready(void);

/* Call a real driver function that an old driver may lack. */
#define VGPU_REAL(symbol, ...) \
    (vgpu_real.symbol != NULL ? vgpu_real.symbol(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND)

/* After the real cuInit succeeded: map the visible devices to region entries and seed their
 * limits from the environment. Idempotent; returns the failure to report from cuInit. */
CUresult vgpu_map_devices(void);

/* A GPU outside a confined pod (view.c). */
#define VGPU_ENTRY_OUTSIDE (-2)

/* Whether the pod keeps to the GPUs its region lists (view.c): a named pod whose region already
 * has device entries when this process maps its devices, as every pod the daemon makes. A
 * private or unnamed region, or one without entries yet, is not confined. */
bool vgpu_pod_confined(void);

/* In a confined pod whose program set no CUDA_VISIBLE_DEVICES, set it to the pod's GPUs, once,
 * before the driver's cuInit (visible.c). */
void vgpu_show_only_pod_gpus(void);

/* Region entry of a CUDA ordinal, or of the current context's device; -1 when unknown (and
 * VGPU_ENTRY_OUTSIDE, also negative, for a GPU outside a confined pod). */
int vgpu_entry_of(int ordinal);
int vgpu_current_entry(void);
/* Region entry of the memory a location names (cuMemCreate's, a pool's): its device's, as
 * vgpu_entry_of; -1 for memory elsewhere (the host) or none named. */
int vgpu_entry_at(const CUmemLocation *location);

/* Region entry of an NVML device, or -1 (view.c); needs vgpu_ready and NVML loaded. */
int vgpu_nvml_entry(nvmlDevice_t device);

/* The memory limit of an entry (0 = none) and what the pod holds there. */
uint64_t vgpu_memory_limit(int entry);
uint64_t vgpu_memory_used(int entry);

/* What a forked child forgets of its parent, in core.c's fork handler (the child's only thread
 * then): the locks of stream-ordered allocation (pool.c), of the primary contexts with what
 * they were retained (context.c), and of cuCtxSetLimit (limits.c). */
void vgpu_pools_forget_in_child(void);
void vgpu_contexts_forget_in_child(void);
void vgpu_limits_forget_in_child(void);

/* Charge or give back device memory of this process to the pod. A charge refused at the limit
 * is counted in the region as a refused allocation; vgpu_try_charge is for callers that have
 * a way on when it does not fit (host-backed memory, a later resync), so nothing is counted. */
bool vgpu_charge(int entry, uint64_t bytes);
bool vgpu_try_charge(int entry, uint64_t bytes);
void vgpu_uncharge(int entry, uint64_t bytes);

#endif
