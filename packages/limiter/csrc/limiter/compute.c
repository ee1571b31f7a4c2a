/* The compute limiter. A pod at limit L may use L of each GPU's wall-clock time, whatever its
 * kernels' lengths and however many processes it has.
 *
 * Metering, not guessing: a process runs its work on a limited GPU in epochs. An epoch takes the
 * node-wide device lease (lease.c), so no other limited pod's work runs meanwhile, records an
 * event before its first launch and a marker event after about every MARK_EVERY_NS of launched
 * work and at its end, and ends after QUANTUM_NS of GPU time, or earlier when the program
 * pauses (or synchronizes while another pod waits).
 * Its GPU time E is the time from the start event to the last marker, measured by the GPU
 * itself. Markers are sparse because each costs the GPU a short gap between kernels: one per
 * launch cost 20-50 µs kernels about 3 % of their throughput. E is debited from the pod's token
 * bucket in the region, which every process of the pod shares and which refills at L; a process
 * starts an epoch only when the bucket is not in debt. So the pod's GPU time is L of wall time,
 * and nothing depends on NVML seeing the pod's processes.
 *
 * Boost: a GPU that a limit leaves partly idle runs its busy time at higher clocks than when
 * saturated at its power limit (a bf16 matmul does ~11 % more work per GPU-second at a 25 %
 * limit on an H100). The node daemon publishes that factor per GPU in its node file beside the
 * device lease, from the GPU's power and utilization; E is charged times it, so L is a share
 * of the saturated GPU's work. Without the daemon the factor is 1; before a daemon's first
 * factor for the GPU, E is charged as it is and kept, and pays the factor when it comes
 * (vgpu_boosted_charge).
 *
 * Pacing: launches may run ahead of the GPU by at most BACKLOG_NS of estimated GPU time (markers
 * tell how long kernels take), so epochs stay short for 2 µs kernels and 100 ms ones alike.
 *
 * Every wait here has a deadline: a kernel that waits on another process (NCCL) never deadlocks
 * the pod; the limiter then gives up exclusivity and charges the wall time it waited.
 *
 * Collectives (NCCL's kernels, which spin until every rank's kernel of the same collective
 * runs): a process that launches them pauses only right before one, and all of the pod's ranks
 * pause for the same one until the same time (compute_gang.c says why).
 *
 * This file decides which launches are paced and takes each through an epoch, and holds the
 * launch hooks; compute_epochs.c keeps the epochs' events, markers and lease,
 * compute_bucket.c the pod's bucket and the rate it refills at, and compute_gang.c which
 * launches are collectives and how the pod's ranks pause, hand over and start together. */
#define _GNU_SOURCE
#include "compute.h"
#include "pacing.h"

#include <stdatomic.h>

#include "capture.h"
#include "compute_bucket.h"
#include "compute_credit.h"
#include "compute_epochs.h"
#include "compute_gang.h"
#include "core.h"
#include "freeze.h"
#include "lease.h"
#include "region.h"

/* --- the pod's token bucket (compute_bucket.c) at the limits the region has now ------------- */

/* Remembered for the whole pod (the region's contended_ns): a process whose pod-mate waited
 * through another pod's epoch refills the pod's bucket for that wait. The pod's own other
 * processes do not count. Atomic loads of the lease and the region only. */
bool vgpu_compute_contended(struct paced_device *state, uint64_t now) {
    return vgpu_pace_contended(vgpu_lease_wanted_by_other_pod(state->lease, now) ||
                                   vgpu_lease_held_by_other_pod(state->lease),
                               &vgpu_state.region->devices[state->entry].contended_ns, now);
}

static bool contended(void *device_state, uint64_t now) {
    struct paced_device *state = device_state;
    /* No lease, no way to know: no burst, the full cap. */
    return state->lease == NULL || vgpu_compute_contended(state, now);
}

static bool always_contended(void *unused, uint64_t now) {
    (void)unused;
    (void)now;
    return true;
}

/* The pace of the pod's bucket now: its soft limit while the GPU is uncontended (as
 * `is_contended(context, now)` says), else its hard limit (rate 0: not limited). */
static struct vgpu_pace pace_of(int entry, const struct vgpu_lease *lease,
                                bool (*is_contended)(void *, uint64_t), void *context) {
    struct vgpu_region_limits limits;
    vgpu_region_read_limits(vgpu_state.region, entry, &limits);
    const struct vgpu_region_device *device = &vgpu_state.region->devices[entry];
    struct vgpu_pace_limits read = {.limit = limits.compute_limit,
                                    .soft = limits.compute_soft_limit};
    /* The effective limit before its time, which is then no older than the limit read. */
    read.effective = atomic_load(&device->scheduler_state[VGPU_SCHED_EFFECTIVE]);
    read.effective_ns = atomic_load(&device->scheduler_state[VGPU_SCHED_EFFECTIVE_NS]);
    read.burst = atomic_load(&device->scheduler_state[VGPU_SCHED_BURST]);
    read.burst_ns = atomic_load(&device->scheduler_state[VGPU_SCHED_BURST_NS]);
    read.newcomer_ns = lease != NULL ? vgpu_lease_newcomer_ns(lease) : 0;
    return vgpu_pace_choose(&read, vgpu_monotonic_ns(), is_contended, context);
}

struct vgpu_pace vgpu_compute_pace(struct paced_device *state, int entry) {
    return pace_of(entry, state->lease, contended, state);
}

struct vgpu_pace vgpu_compute_hard_pace(int entry) {
    return pace_of(entry, NULL, always_contended, NULL);
}

/* Wait until the pod's bucket is out of debt (limits are re-read, so changes apply at once);
 * the time waited is the pod's throttled time. Sets the pace the next epoch runs at; adds what
 * the bucket's cap cut off to `*capped` and sets `*paused` to the time waited. Not under the
 * device's lock. */
static void wait_for_budget(struct paced_device *state, struct vgpu_region_device *device,
                            int entry, uint64_t *capped, uint64_t *paused) {
    uint64_t began = 0;
    for (;;) {
        state->pace = vgpu_compute_pace(state, entry);
        uint64_t wait = vgpu_bucket_wait_ns(device, state->pace, vgpu_monotonic_ns(), capped);
        if (wait == 0) {
            break;
        }
        began = began != 0 ? began : vgpu_monotonic_ns();
        vgpu_compute_pause(wait);
    }
    if (began != 0) {
        *paused = vgpu_monotonic_ns() - began;
        atomic_fetch_add_explicit(&device->throttled_ns, *paused, memory_order_relaxed);
    }
}

/* Whether the pod used less than half its hard limit over the last 100-200 ms (its region's
 * GPU time, all its processes'), renewing the samples it is judged by: an epoch it starts now
 * waits urgently for the lease. */
static bool light_use(struct paced_device *state, int entry, uint64_t now) {
    struct vgpu_region_device *device = &vgpu_state.region->devices[entry];
    uint64_t used = atomic_load(&device->gpu_ns);
    _Atomic uint64_t *newer = &device->compute_state[VGPU_COMPUTE_USE_NEWER];
    uint64_t last = atomic_load(newer);
    uint64_t sample = vgpu_use_sample(now, used);
    if (last == 0 || (uint32_t)((sample >> 32) - (last >> 32)) >= VGPU_USE_WINDOW_NS / 1000000) {
        if (atomic_compare_exchange_strong(newer, &last, sample)) {
            atomic_store(&device->compute_state[VGPU_COMPUTE_USE_OLDER], last);
        }
    }
    return vgpu_use_light(atomic_load(&device->compute_state[VGPU_COMPUTE_USE_OLDER]), now, used,
                          state->pace.hard);
}

/* --- which launches are paced ---------------------------------------------------------------- */

static void drop_context_events(struct paced_device *state, const void *context) {
    if (state->ready && state->context == context) {
        vgpu_epoch_release_events(state);
    }
}

void vgpu_compute_context_gone(CUcontext context) {
    atomic_fetch_add_explicit(&vgpu_state.contexts_gone, 1, memory_order_release);
    vgpu_paced_each_device(drop_context_events, context);
    vgpu_gang_forget_functions(); /* its functions' handles may be reused */
}

/* Whether any device of the pod has a compute limit: the common case has none, and then a launch
 * costs a few loads. */
static bool any_limit(void) {
    if (vgpu_state.region == NULL) {
        return false;
    }
    uint32_t count = atomic_load(&vgpu_state.region->device_count);
    for (uint32_t i = 0; i < count && i < VGPU_REGION_MAX_DEVICES; i++) {
        if (vgpu_compute_limited(atomic_load(&vgpu_state.region->devices[i].compute_limit))) {
            return true;
        }
    }
    return false;
}

typedef CUresult (*launch_fn)(void *arguments);

/* initial-exec: a preloaded library has static TLS, and this needs no __tls_get_addr (which
 * would make ld.so a dependency). */
static __thread __attribute__((tls_model("initial-exec"))) struct {
    CUcontext context;
    CUdevice ordinal;
    unsigned generation;
} cached_device;

/* The current context and its device (cached per thread: one driver call per launch fewer). */
static bool current_device(CUcontext *context, CUdevice *ordinal) {
    if (VGPU_REAL(cuCtxGetCurrent, context) != CUDA_SUCCESS || *context == NULL) {
        return false;
    }
    unsigned generation = atomic_load_explicit(&vgpu_state.contexts_gone, memory_order_acquire);
    if (cached_device.context != *context || cached_device.generation != generation) {
        if (VGPU_REAL(cuCtxGetDevice, ordinal) != CUDA_SUCCESS) {
            return false;
        }
        cached_device.context = *context;
        cached_device.ordinal = *ordinal;
        cached_device.generation = generation;
    }
    *ordinal = cached_device.ordinal;
    return true;
}

/* The region entry of the current context's device; -1 when not known. Only while frozen. */
static int frozen_entry(void) {
    CUcontext context;
    CUdevice ordinal;
    if (!current_device(&context, &ordinal) || ordinal < 0 || ordinal >= VGPU_MAX_ORDINALS) {
        return -1;
    }
    return vgpu_entry_of(ordinal);
}

static void close_for_freeze(struct paced_device *state, const void *unused) {
    (void)unused;
    if (state->open) {
        vgpu_epoch_close(state, true); /* its queued work is charged; the lease goes to others */
    }
}

/* The pod is frozen: wait if the freeze holds this GPU, every epoch closed first. */
static VGPU_COLD void hold_frozen(void) {
    if (vgpu_freeze_holds(frozen_entry())) {
        vgpu_paced_each_device(close_for_freeze, NULL);
        vgpu_freeze_wait();
    }
}

/* While the daemon freezes the pod on this GPU: trap and wait. No lock or lease is held
 * meanwhile, so other threads (synchronizing, say) and other pods go on. */
static void hold_while_frozen(void) {
    if (VGPU_RARELY(vgpu_frozen())) {
        hold_frozen();
    }
}

/* The context, device and region entry a launch on `stream` is paced on; false when it is not
 * paced: no limit on its device, or a stream being captured (the graph's launch is paced). */
static bool paced_device_of(CUstream stream, CUcontext *context, CUdevice *ordinal, int *entry) {
    if (!any_limit() || !current_device(context, ordinal) || *ordinal < 0 ||
        *ordinal >= VGPU_MAX_ORDINALS || vgpu_capturing(stream)) {
        return false;
    }
    *entry = vgpu_entry_of(*ordinal);
    /* The limit word alone, not the seqlocked set of limits: one cache line per launch. */
    return *entry >= 0 && *entry < VGPU_REGION_MAX_DEVICES &&
           vgpu_compute_limited(atomic_load_explicit(
               &vgpu_state.region->devices[*entry].compute_limit, memory_order_relaxed));
}

/* --- a launch in an epoch -------------------------------------------------------------------- */

/* An epoch for the launch being made, when none is open: wait for the pod's bucket (the lock let
 * go meanwhile), then open one unless another thread did meanwhile. `*now` is set to the clock
 * after the wait. False when the device's context went while the lock was let go and no events
 * could be made in this one. */
static VGPU_COLD bool start_epoch(struct paced_device *state, CUstream stream, int ordinal,
                                  int entry, CUcontext context, uint64_t *now) {
    vgpu_lock_give(&state->lock);
    uint64_t capped = 0;
    uint64_t paused = 0;
    if (!vgpu_gang_defers(state, entry, &capped)) {
        wait_for_budget(state, &vgpu_state.region->devices[entry], entry, &capped, &paused);
    }
    /* Frozen during the wait (seconds at a low limit): held here, before the lease is taken. */
    hold_while_frozen();
    vgpu_lock_take(&state->lock);
    *now = vgpu_monotonic_ns(); /* after the wait, and another thread's launches */
    /* A pod that just waited for its bucket is at its limit, not under it, however little it
     * used lately (its wait): not urgent. light_use first: it also renews the pod's use
     * samples. */
    state->urgent = light_use(state, entry, *now) && paused == 0;
    state->stats.capped_ns += capped;
    state->stats.paused_ns += paused;
    if (!vgpu_epoch_set_up(state, ordinal, entry, context)) { /* a context went */
        return false;
    }
    if (!state->open) {
        vgpu_epoch_open(state, stream, entry, vgpu_gang_member(state, vgpu_monotonic_ns()));
    }
    return true;
}

/* A pod that used less than its share waits with a short burst: its wait is one drain of this
 * epoch's backlog, not the rest of the epoch. */
static VGPU_COLD void yield_epoch(struct paced_device *state, uint64_t now) {
    state->stats.yielded++;
    state->yield_asked_ns = now;
    vgpu_epoch_close(state, true);
}

/* The epoch has had its share of GPU time: the launch belongs to the next one. */
static VGPU_COLD void end_quantum(struct paced_device *state) {
    state->stats.quantum++;
    vgpu_epoch_close(state, true);
}

/* Under the device's lock (let go while the bucket is waited for): an open epoch that the next
 * launch on `stream` belongs to, with room for it. `recent`: the thread launched on credit up
 * to a moment ago (compute_credit.h), so this launch comes after no gap. False when the
 * device's context went while the lock was let go and no events could be made in this one:
 * the launch goes unpaced. Its common case, an open epoch with room, runs straight through;
 * the rest is out of its way. */
static bool enter_epoch(struct paced_device *state, CUstream stream, int ordinal, int entry,
                        CUcontext context, bool recent) {
    for (;;) {
        uint64_t now = vgpu_monotonic_ns();
        if (recent) {
            state->last_launch_ns = now > state->last_launch_ns ? now : state->last_launch_ns;
            recent = false;
        }
        vgpu_epoch_look(state, now);
        vgpu_epoch_end_paused_or_lost(state, now);
        if (VGPU_RARELY(state->looking) && state->open && state->lease != NULL &&
            vgpu_lease_yield_asked(state->lease, now)) {
            yield_epoch(state, now);
        }
        if (VGPU_RARELY(!state->open) &&
            !start_epoch(state, stream, ordinal, entry, context, &now)) {
            return false;
        }
        vgpu_epoch_switch_stream(state, stream);
        uint64_t entered = vgpu_epoch_wait_for_backlog(state, now);
        /* Only another pod waiting ends a burst (the pod's own processes share its bucket). */
        if (VGPU_RARELY(state->looking) && state->lease != NULL) {
            vgpu_compute_contended(state, now); /* remembered: read when burst is chosen */
        }
        if (VGPU_RARELY(state->done_ns >= vgpu_gang_quantum(state, now))) {
            end_quantum(state);
            continue;
        }
        /* An epoch opened meanwhile (after waiting for the lease, maybe) began later. */
        state->entered_ns = entered > state->opened_ns ? entered : state->opened_ns;
        return true;
    }
}

/* A collective launched unpaced (no limit on its GPU now) is counted all the same: every rank
 * counts the pod's collectives from its start, so that a limit set while a job runs finds every
 * rank's n-th collective the same one. Counted from the limit on, ranks a few collectives apart
 * would count differently for good, pause at different collectives, and spin through each
 * other's pauses. A collective captured into a graph counts when the graph is launched. */
static VGPU_COLD void count_unpaced(CUstream stream) {
    CUcontext context;
    CUdevice ordinal;
    if (!current_device(&context, &ordinal) || ordinal < 0 || ordinal >= VGPU_MAX_ORDINALS ||
        vgpu_capturing(stream)) {
        return;
    }
    struct paced_device *state = vgpu_paced_device(ordinal);
    vgpu_lock_take(&state->lock);
    state->collectives++;
    vgpu_lock_give(&state->lock);
}

/* Run one launch (a kernel, `function`, or a graph, `graph`; NULL for the other, or both for a
 * deprecated entry point) under the pod's compute limit. */
static CUresult paced(CUstream stream, bool per_thread, CUfunction function, CUgraphExec graph,
                      launch_fn launch, void *arguments) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    hold_while_frozen();
    CUcontext context;
    CUdevice ordinal;
    int entry;
    stream = vgpu_stream_named(stream, per_thread); /* also the stream events are recorded on */
    bool first = false;
    bool collective =
        vgpu_state.region != NULL && vgpu_gang_launches_collective(function, graph, &first);
    if (!paced_device_of(stream, &context, &ordinal, &entry)) {
        if (VGPU_RARELY(collective)) {
            count_unpaced(stream);
        }
        return launch(arguments);
    }
    struct paced_device *state = vgpu_paced_device(ordinal);
    bool plain = !collective && !first && graph == NULL; /* may go on credit */
    if (plain && credit_serves(ordinal, state, stream, context)) {
        result = launch(arguments);
        credit_launched(ordinal, result);
        return result;
    }
    vgpu_lock_take(&state->lock);
    bool recent = credit_fold(ordinal, state);
    bool ready = vgpu_epoch_set_up(state, ordinal, entry, context);
    if (VGPU_RARELY(collective)) {
        if (ready) {
            vgpu_gang_pause(state, entry); /* counts it */
        } else {
            state->collectives++;
        }
    }
    if (VGPU_RARELY(!ready) ||
        VGPU_RARELY(!enter_epoch(state, stream, ordinal, entry, context, recent))) {
        vgpu_lock_give(&state->lock);
        return launch(arguments);
    }
    /* Frozen while the launch waited (for the lease, or for another thread's epoch): held
     * before it runs, its epoch closed. Before, only the entry was checked, and a launch that
     * waited through the freeze ran up to 0.4 s after it. */
    while (VGPU_RARELY(vgpu_frozen()) && vgpu_freeze_holds(entry)) {
        vgpu_lock_give(&state->lock);
        hold_frozen();
        vgpu_lock_take(&state->lock);
        if (VGPU_RARELY(!vgpu_epoch_set_up(state, ordinal, entry, context)) ||
            VGPU_RARELY(!enter_epoch(state, stream, ordinal, entry, context, false))) {
            vgpu_lock_give(&state->lock);
            return launch(arguments);
        }
    }
    vgpu_epoch_before_launch(state);
    result = launch(arguments);
    if (VGPU_RARELY(first || graph != NULL || state->blocking)) {
        /* A launch that may have blocked (a kernel's first, which may load its module; a
         * graph's upload; every launch under CUDA_LAUNCH_BLOCKING) ended later than it began. */
        state->entered_ns = vgpu_monotonic_ns();
    }
    vgpu_epoch_after_launch(state, result);
    if (plain) {
        credit_give(ordinal, state, stream, context, result);
    }
    vgpu_lock_give(&state->lock);
    return result;
}

void vgpu_compute_quiesce(void) {
    if (!any_limit()) {
        return;
    }
    for (int i = 0; i < VGPU_MAX_ORDINALS; i++) {
        struct paced_device *state = vgpu_paced_device(i);
        if (state->open && vgpu_lock_try(&state->lock)) {
            (void)credit_fold(i, state); /* the marker below covers them, counted */
            /* The program waited for its work: a good moment to hand the GPU to a waiting pod,
             * once the epoch has had its quantum. Shorter epochs multiply the hand-overs,
             * each of which leaves the GPU idle a moment: closing at every synchronization cost
             * a 70 % pod beside a 30 % one 1-4 points. Alone, the epoch goes on (a pause closes
             * it anyway; a holder that stops launching loses the lease once drained). */
            if (state->open &&
                (state->lease == NULL || vgpu_lease_wanted(state->lease, vgpu_monotonic_ns())) &&
                (vgpu_epoch_retire(state, false, 0), state->done_ns >= QUANTUM_NS)) {
                state->stats.synchronized++;
                vgpu_epoch_close(state, true);
            } else if (state->open) {
                /* The epoch goes on: a marker now ends its launches so far, so that the gap
                 * until the program's next launch is seen as idle (note_gap). Unmarked, the
                 * last launches before the synchronization share a marker with the first ones
                 * after it, and the gap between them is charged. */
                vgpu_epoch_mark(state);
            }
            vgpu_lock_give(&state->lock);
        }
    }
}

static void mark_stream(struct paced_device *state, const void *stream) {
    if (state->open && state->stream == stream) {
        /* First: no launch on credit follows the marker (a stream made next may even have
         * the same handle). */
        atomic_fetch_add_explicit(&state->generation, 1, memory_order_release);
        vgpu_epoch_mark(state);
        state->stream = NULL; /* never recorded on again */
    }
}

/* A stream about to be destroyed: its launches that no marker covers yet get one now, while
 * the stream exists (markers are recorded on the launches' own stream). */
CUresult cuStreamDestroy_v2(CUstream hStream) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (any_limit()) {
        vgpu_paced_each_device(mark_stream, hStream);
    }
    return VGPU_REAL(cuStreamDestroy_v2, hStream);
}

/* --- the launch hooks ------------------------------------------------------------------------ */

struct kernel_launch {
    CUfunction f;
    unsigned int grid[3];
    unsigned int block[3];
    unsigned int shared;
    CUstream stream;
    void **params;
    void **extra;
    const CUlaunchConfig *config;
    CUgraphExec graph;
};

/* Each hook has its own way to the driver (rather than one switch over the kinds, whose jump
 * table is one more cache line a launch touches). */
#define VGPU_KERNEL_HOOK(symbol, per_thread)                                                   \
    static CUresult launch_##symbol(void *arguments) {                                         \
        struct kernel_launch *a = arguments;                                                   \
        return VGPU_REAL(symbol, a->f, a->grid[0], a->grid[1], a->grid[2], a->block[0],        \
                         a->block[1], a->block[2], a->shared, a->stream, a->params, a->extra); \
    }                                                                                          \
    CUresult symbol(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,                \
                    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,     \
                    unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,     \
                    void **kernelParams, void **extra) {                                        \
        struct kernel_launch a = {f, {gridDimX, gridDimY, gridDimZ},                            \
                                  {blockDimX, blockDimY, blockDimZ}, sharedMemBytes, hStream,   \
                                  kernelParams, extra, NULL, NULL};                            \
        return paced(hStream, per_thread, f, NULL, launch_##symbol, &a);                       \
    }

VGPU_KERNEL_HOOK(cuLaunchKernel, false)
VGPU_KERNEL_HOOK(cuLaunchKernel_ptsz, true)

#define VGPU_COOPERATIVE_HOOK(symbol, per_thread)                                              \
    static CUresult launch_##symbol(void *arguments) {                                         \
        struct kernel_launch *a = arguments;                                                   \
        return VGPU_REAL(symbol, a->f, a->grid[0], a->grid[1], a->grid[2], a->block[0],        \
                         a->block[1], a->block[2], a->shared, a->stream, a->params);           \
    }                                                                                          \
    CUresult symbol(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,                \
                    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,     \
                    unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,     \
                    void **kernelParams) {                                                      \
        struct kernel_launch a = {f, {gridDimX, gridDimY, gridDimZ},                            \
                                  {blockDimX, blockDimY, blockDimZ}, sharedMemBytes, hStream,   \
                                  kernelParams, NULL, NULL, NULL};                             \
        return paced(hStream, per_thread, f, NULL, launch_##symbol, &a);                       \
    }

VGPU_COOPERATIVE_HOOK(cuLaunchCooperativeKernel, false)
VGPU_COOPERATIVE_HOOK(cuLaunchCooperativeKernel_ptsz, true)

#define VGPU_EX_HOOK(symbol, per_thread)                                                       \
    static CUresult launch_##symbol(void *arguments) {                                         \
        struct kernel_launch *a = arguments;                                                   \
        return VGPU_REAL(symbol, a->config, a->f, a->params, a->extra);                        \
    }                                                                                          \
    CUresult symbol(const CUlaunchConfig *config, CUfunction f, void **kernelParams,           \
                    void **extra) {                                                             \
        struct kernel_launch a = {.f = f, .params = kernelParams, .extra = extra,              \
                                  .config = config};                                           \
        return paced(config != NULL ? config->hStream : NULL, per_thread, f, NULL,             \
                     launch_##symbol, &a);                                                     \
    }

VGPU_EX_HOOK(cuLaunchKernelEx, false)
VGPU_EX_HOOK(cuLaunchKernelEx_ptsz, true)

#define VGPU_GRAPH_HOOK(symbol, per_thread)                                                    \
    static CUresult launch_##symbol(void *arguments) {                                         \
        struct kernel_launch *a = arguments;                                                   \
        return VGPU_REAL(symbol, a->graph, a->stream);                                         \
    }                                                                                          \
    CUresult symbol(CUgraphExec hGraphExec, CUstream hStream) {                                \
        struct kernel_launch a = {.graph = hGraphExec, .stream = hStream};                     \
        return paced(hStream, per_thread, NULL, hGraphExec, launch_##symbol, &a);              \
    }

VGPU_GRAPH_HOOK(cuGraphLaunch, false)
VGPU_GRAPH_HOOK(cuGraphLaunch_ptsz, true)

/* For the deprecated launch entry points (legacy.c): a launch paced as these are. */
CUresult vgpu_compute_paced(CUstream stream, bool per_thread, CUresult (*launch)(void *),
                            void *arguments) {
    return paced(stream, per_thread, NULL, NULL, launch, arguments);
}
