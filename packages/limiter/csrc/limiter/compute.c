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
 * of the saturated GPU's work. Without the daemon the factor is 1.
 *
 * Pacing: launches may run ahead of the GPU by at most BACKLOG_NS of estimated GPU time (markers
 * tell how long kernels take), so epochs stay short for 2 µs kernels and 100 ms ones alike.
 *
 * Every wait here has a deadline: a kernel that waits on another process (NCCL) never deadlocks
 * the pod; the limiter then gives up exclusivity and charges the wall time it waited. */
#define _GNU_SOURCE
#include "compute.h"
#include "pacing.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "core.h"
#include "freeze.h"
#include "lease.h"
#include "log.h"
#include "region.h"

/* GPU time per epoch. Each hand-over to another pod leaves the GPU idle 250-370 µs on an H100
 * (the holder's last kernel to the next holder's first, read from the GPU's global timer:
 * benchmarks/handover_gpu.py), of which ~170 µs is the GPU switching contexts: at 16 ms a 20/30/50
 * set handed over 45-50 times a second and lost 1.5-1.8 % of the GPU, at 32 ms 20 times and
 * 0.6-0.7 %. Alone, each epoch costs a program whose launches are bound by its host (a JAX loop of
 * ~50 µs steps) a little time to get going again after its wait, which the epoch is charged for:
 * at 8 ms such a loop got 22.5 % at a 25 % limit, at 32 ms 25.6 %. */
#define QUANTUM_NS 32000000ULL
/* GPU time launches may run ahead. It covers launch jitter and a launching thread that sleeps
 * longer than asked (a busy host): at 4 ms a 70 % pod beside a 30 % one on a loaded 2-core
 * machine left the GPU idle for a tenth of the time; at 10 ms for 3-4 %. */
#define BACKLOG_NS 10000000ULL
/* A kernel at least this long runs one at a time (wait_for_backlog). */
#define LONG_KERNEL_NS 8000000ULL
/* The bucket holds at most L of this much wall time: enough for a pod that waited for the lease
 * (at most a QUANTUM_NS epoch of another) to lose nothing, and little enough that what a
 * pod saves while idle (compiling, loading) adds at most 0.05 L to its next 1-s window. At 100 ms,
 * a Triton loop after its compile got 82.3 % in its first second at a 75 % limit. */
#define BURST_NS 50000000ULL
/* A pod runs at its soft limit (burst) only while no other pod has wanted this GPU for this
 * long: seen waiting for the lease, or holding it. Contention is seen at the first launch of the
 * other pod that waits, so a bursting pod falls back within one contended epoch. */
#define CONTENDED_HOLD_NS 200000000ULL
/* A launch after this long without one starts a new epoch: its wait for the bucket then spreads
 * the pod's work evenly (a 25 % pod that synchronizes every 8 ms of work runs 8 ms in 32, not 32
 * in 128, so that NVML's utilization, from which the daemon estimates the boost, stays steady:
 * lumpier, a 40 µs-kernel loop at 25 % on an H100 got 22.8 % with the daemon and 25.0 % without,
 * as if charged the boost of the matmul run before it; with this pause, 23.6 % and 24.8 % once
 * the estimate had caught up).
 * While another process waits for the GPU the epoch instead goes on through such gaps (they are
 * idle, not charged: note_gap) until its quantum: a hand-over at every synchronization left the
 * GPU idle a moment each time (82 epochs a second for a 70 % matmul pod beside a 30 % one, which
 * got 0.5 points less). */
#define PAUSE_NS 2000000ULL
#define CONTENDED_PAUSE_NS 50000000ULL
#define WAIT_LIMIT_NS 500000000ULL /* the longest wait for the epoch's own work */
#define MARK_EVERY_NS 500000ULL /* launched GPU time between two markers */
#define MARKERS 64
#define RETIRE_EVERY_NS 20000ULL /* how often a launch looks for finished markers */

/* compute_state words of a region device entry: the bucket, and the pod's words about the device
 * lease (lease.h) from LEASE_WORDS on. */
enum { BUCKET = 0, REFILLED = 1, LEASE_WORDS = 2 };
_Static_assert(LEASE_WORDS + VGPU_LEASE_POD_WORDS <= 8, "compute_state words");

struct marker {
    CUevent event;
    bool pending;
    bool resume;       /* recorded when the epoch's queue had run dry (see idle_ns) */
    unsigned launches; /* launches since the previous marker */
};

struct device {
    pthread_mutex_t lock;
    bool ready;   /* events and lease set up */
    bool open;    /* an epoch is running */
    int entry;
    CUcontext context;
    struct vgpu_lease *lease;
    CUevent start;
    struct marker markers[MARKERS];
    unsigned head;    /* oldest pending marker */
    unsigned pending;
    unsigned unmarked;    /* launches after the newest marker */
    unsigned queued;      /* launches of this epoch not yet seen finished */
    CUstream stream;      /* the stream of the newest launch */
    uint64_t done_ns;     /* GPU time from the epoch's start to its newest finished marker */
    /* Of done_ns, the time the GPU sat idle within the epoch because the program fed it nothing
     * (its host thread descheduled, or busy between launches): not the pod's GPU time. */
    uint64_t idle_ns;
    uint64_t opened_ns;   /* CLOCK_MONOTONIC when the epoch started */
    uint64_t last_launch_ns;
    uint64_t retired_ns;  /* when finished markers were last looked for */
    uint64_t kernel_ns;   /* estimated GPU time of one launch (moving average) */
    _Atomic uint64_t contended_ns; /* when another pod was last seen wanting the GPU */
    uint32_t rate;        /* the refill rate the epoch runs at: the hard or the soft limit */
    uint32_t hard;        /* the hard limit then */
    bool estimated;       /* kernel_ns comes from a measurement */
    struct {              /* what pacing did, logged about once a second at debug level */
        uint64_t since_ns;
        uint64_t charged_ns;
        uint64_t capped_ns;     /* what the pod's bucket could not hold (its cap) */
        uint64_t lease_wait_ns; /* waited for the device lease */
        unsigned epochs, launches, markers, switches;
        unsigned paused, lost, quantum, synchronized; /* why epochs ended */
    } stats;
};

static struct device devices[VGPU_MAX_ORDINALS];
static pthread_once_t devices_once = PTHREAD_ONCE_INIT;
/* Bumped whenever a context goes, so that a cached device is never taken for a reused handle. */
static _Atomic unsigned contexts_gone;

static void init_devices(void) {
    for (int i = 0; i < VGPU_MAX_ORDINALS; i++) {
        pthread_mutex_init(&devices[i].lock, NULL);
    }
}

static void pause_for(uint64_t nanoseconds) {
    struct timespec delay = {(time_t)(nanoseconds / 1000000000ULL),
                             (long)(nanoseconds % 1000000000ULL)};
    while (nanosleep(&delay, &delay) != 0 && errno == EINTR) {
    }
}

/* --- the pod's token bucket (region, shared by the pod's processes) ------------------------- */

static uint32_t compute_limit(int entry) {
    uint64_t memory;
    uint32_t compute;
    vgpu_region_limits(vgpu_state.region, entry, &memory, &compute);
    return compute;
}

static bool limited(uint32_t compute) {
    return compute != 0 && compute < VGPU_COMPUTE_UNLIMITED;
}

/* Whether another pod wants the GPU now (waits for the lease or holds it), or did lately; the
 * pod's own other processes do not count. Atomic loads of the lease and the region only: nothing
 * is added per launch but them. */
static bool contended(struct device *state, uint64_t now) {
    if (state->lease == NULL) {
        return true; /* no way to know: no burst */
    }
    if (vgpu_lease_wanted_by_other_pod(state->lease, now) ||
        vgpu_lease_held_by_other_pod(state->lease)) {
        atomic_store_explicit(&state->contended_ns, now, memory_order_relaxed);
        return true;
    }
    uint64_t seen = atomic_load_explicit(&state->contended_ns, memory_order_relaxed);
    return seen != 0 && now - seen < CONTENDED_HOLD_NS;
}

/* The rate the pod's bucket refills at now: its soft limit while the GPU is uncontended, else
 * its hard limit (0: not limited). */
static uint32_t pace_rate(struct device *state, int entry, uint32_t *hard) {
    struct vgpu_region_limits limits;
    vgpu_region_read_limits(vgpu_state.region, entry, &limits);
    *hard = limits.compute_limit;
    if (!limited(limits.compute_limit)) {
        return 0;
    }
    /* Oversubscribed: the daemon's effective limit (weights), while fresh. */
    const struct vgpu_region_device *device = &vgpu_state.region->devices[entry];
    uint64_t effective = atomic_load(&device->scheduler_state[VGPU_SCHED_EFFECTIVE]);
    uint64_t stamped = atomic_load(&device->scheduler_state[VGPU_SCHED_EFFECTIVE_NS]);
    uint64_t now = vgpu_monotonic_ns();
    if (effective != 0 && effective < limits.compute_limit && stamped <= now &&
        now - stamped < VGPU_EFFECTIVE_STALE_NS) {
        limits.compute_limit = (uint32_t)effective;
        *hard = limits.compute_limit;
    }
    uint32_t soft = limits.compute_soft_limit;
    if (soft > limits.compute_limit && !contended(state, now)) {
        return soft > VGPU_COMPUTE_UNLIMITED ? VGPU_COMPUTE_UNLIMITED : soft;
    }
    return limits.compute_limit;
}

/* Add what accrued since the last refill at `compute` (hundredths of a percent), capped at what
 * the hard limit `hard` saves: a pod that bursts keeps no more in hand than without. What the
 * cap cut off is added to `*capped`. */
static int64_t refill(struct vgpu_region_device *device, uint32_t compute, uint32_t hard,
                      uint64_t *capped) {
    _Atomic uint64_t *bucket = &device->compute_state[BUCKET];
    _Atomic uint64_t *refilled = &device->compute_state[REFILLED];
    uint64_t now = vgpu_monotonic_ns();
    uint64_t last = atomic_load(refilled);
    int64_t cap = (int64_t)(BURST_NS * hard / VGPU_COMPUTE_UNLIMITED);
    if (last == 0 || now - last > 10ULL * 1000000000ULL) {
        /* First use, or idle for long: start from a full-burst-free, debt-free bucket. */
        if (atomic_compare_exchange_strong(refilled, &last, now)) {
            atomic_store(bucket, 0);
        }
    } else if (now > last && atomic_compare_exchange_strong(refilled, &last, now)) {
        int64_t accrued = (int64_t)((now - last) * compute / VGPU_COMPUTE_UNLIMITED);
        uint64_t current = atomic_load(bucket);
        int64_t next;
        do {
            next = (int64_t)current + accrued;
            next = next > cap ? cap : next;
        } while (!atomic_compare_exchange_weak(bucket, &current, (uint64_t)next));
        *capped += (uint64_t)((int64_t)current + accrued - next);
    }
    return (int64_t)atomic_load(bucket);
}

/* Wait until the pod's bucket is out of debt (limits are re-read, so changes apply at once);
 * the time waited is the pod's throttled time. Sets the rate the next epoch runs at; adds what
 * the bucket's cap cut off to `*capped`. */
static void wait_for_budget(struct device *state, struct vgpu_region_device *device, int entry,
                            uint64_t *capped) {
    uint64_t began = 0;
    for (;;) {
        uint32_t hard;
        uint32_t compute = pace_rate(state, entry, &hard);
        state->rate = compute;
        state->hard = hard;
        if (!limited(compute) && compute != VGPU_COMPUTE_UNLIMITED) {
            break;
        }
        int64_t balance = refill(device, compute, hard, capped);
        if (balance >= 0) {
            break;
        }
        began = began != 0 ? began : vgpu_monotonic_ns();
        uint64_t wait = (uint64_t)(-balance) * VGPU_COMPUTE_UNLIMITED / compute;
        pause_for(wait < 20000 ? 20000 : wait > 100000000 ? 100000000 : wait);
    }
    if (began != 0) {
        atomic_fetch_add_explicit(&device->throttled_ns, vgpu_monotonic_ns() - began,
                                  memory_order_relaxed);
    }
}

static void debit(struct vgpu_region_device *device, uint64_t gpu_ns) {
    atomic_fetch_sub(&device->compute_state[BUCKET], gpu_ns);
}

/* --- epochs ---------------------------------------------------------------------------------- */

static uint64_t elapsed_ns(CUevent from, CUevent to) {
    float milliseconds = 0;
    if (VGPU_REAL(cuEventElapsedTime_v2, &milliseconds, from, to) != CUDA_SUCCESS &&
        VGPU_REAL(cuEventElapsedTime, &milliseconds, from, to) != CUDA_SUCCESS) {
        return 0;
    }
    return milliseconds > 0 ? (uint64_t)((double)milliseconds * 1e6) : 0;
}

/* Take finished markers off the ring (oldest first); with `wait`, the oldest even if not done,
 * waiting for it up to `deadline`. False when the deadline passed. */
static bool retire(struct device *state, bool wait, uint64_t deadline) {
    while (state->pending > 0) {
        struct marker *marker = &state->markers[state->head];
        CUresult result = VGPU_REAL(cuEventQuery, marker->event);
        if (result == CUDA_ERROR_NOT_READY) {
            if (!wait) {
                return true;
            }
            if (vgpu_monotonic_ns() > deadline) {
                return false;
            }
            /* Fine enough that the GPU never waits long for the next launch. */
            uint64_t step = state->kernel_ns / 20;
            pause_for(step < 5000 ? 5000 : step > 50000 ? 50000 : step);
            continue;
        }
        uint64_t done = result == CUDA_SUCCESS ? elapsed_ns(state->start, marker->event) : 0;
        state->queued -= marker->launches < state->queued ? marker->launches : state->queued;
        if (marker->resume && done > state->done_ns) {
            /* From the newest finished marker to this one the GPU had none of the epoch's work. */
            state->idle_ns += done - state->done_ns;
            state->done_ns = done;
        } else if (done > state->done_ns && marker->launches > 0) {
            /* What one launch takes on the GPU: the time since the previous marker. */
            uint64_t sample = (done - state->done_ns) / marker->launches;
            state->kernel_ns = state->estimated ? (state->kernel_ns * 7 + sample) / 8 : sample;
            state->estimated = true;
            state->done_ns = done;
        }
        marker->pending = false;
        state->head = (state->head + 1) % MARKERS;
        state->pending--;
        wait = false; /* only the oldest is waited for */
    }
    return true;
}

/* Record a marker after the launches not yet covered by one. False when the ring is full or
 * the record failed; those launches then count with the next marker. */
static bool mark(struct device *state) {
    if (state->unmarked == 0 || state->pending >= MARKERS) {
        return state->unmarked == 0;
    }
    struct marker *marker = &state->markers[(state->head + state->pending) % MARKERS];
    if (VGPU_REAL(cuEventRecord, marker->event, state->stream) != CUDA_SUCCESS) {
        return false;
    }
    marker->pending = true;
    marker->resume = false;
    marker->launches = state->unmarked;
    state->stats.markers++;
    state->pending++;
    state->unmarked = 0;
    return true;
}

/* Before a launch of an epoch whose earlier work the GPU has all finished (as last seen): the
 * GPU is idle now, and a resume marker lets retire() count the time since the newest finished
 * marker as idle. A launching thread that sleeps longer than the backlog lasts (descheduled on a
 * busy host, or the program busy between launches) leaves such gaps; charged, they cost a pod
 * several points of its limit. Only then is an event recorded: on an idle GPU. */
static void note_gap(struct device *state) {
    struct marker *marker = &state->markers[state->head];
    if (VGPU_REAL(cuEventRecord, marker->event, state->stream) == CUDA_SUCCESS) {
        marker->pending = true;
        marker->resume = true;
        marker->launches = 0;
        state->pending = 1;
    }
}

static void log_stats(struct device *state, uint64_t charged) {
    state->stats.epochs++;
    state->stats.charged_ns += charged;
    uint64_t now = vgpu_monotonic_ns();
    if (now - state->stats.since_ns < 1000000000ULL) {
        return;
    }
    if (state->stats.since_ns != 0) {
        vgpu_log(VGPU_LOG_DEBUG,
                 "pacing: %u epochs (ended: %u quantum, %u synchronized, %u paused, %u lease "
                 "lost), %u launches, %u markers, %u stream switches, %llu us of GPU time "
                 "charged, %llu us waited for the lease, %llu us beyond the bucket's cap in %llu "
                 "ms",
                 state->stats.epochs, state->stats.quantum, state->stats.synchronized,
                 state->stats.paused, state->stats.lost, state->stats.launches,
                 state->stats.markers, state->stats.switches,
                 (unsigned long long)(state->stats.charged_ns / 1000),
                 (unsigned long long)(state->stats.lease_wait_ns / 1000),
                 (unsigned long long)(state->stats.capped_ns / 1000),
                 (unsigned long long)((now - state->stats.since_ns) / 1000000));
    }
    memset(&state->stats, 0, sizeof state->stats);
    state->stats.since_ns = now;
}

/* Wait for the epoch's work until `deadline`; false when it did not finish. The polls run without
 * the thread's timer slack (50 µs by default), restored after: each poll's sleep would otherwise
 * add that much to the GPU's idle time before the next epoch, this pod's or another's, starts. */
static bool drain_all(struct device *state, uint64_t deadline) {
    if (state->pending == 0) {
        return true;
    }
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack > 1) {
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    }
    bool finished = true;
    while (state->pending > 0 && finished) {
        finished = retire(state, true, deadline);
    }
    if (slack > 1) {
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
    }
    return finished;
}

/* End the epoch: its GPU time is debited and the lease given back. With `drain`, the epoch's
 * work is waited for first (bounded); a holder that lost its lease charges what is done. */
static void close_epoch(struct device *state, bool drain) {
    uint64_t deadline = vgpu_monotonic_ns() + WAIT_LIMIT_NS;
    mark(state); /* the epoch's last launches are measured too */
    bool finished = !drain || drain_all(state, deadline);
    retire(state, false, 0);
    uint64_t charged = state->done_ns - (state->idle_ns < state->done_ns ? state->idle_ns : state->done_ns);
    if (!finished) {
        /* Our own work did not finish in time (a kernel waiting on another process): charge
         * the wall time and let others run rather than wait forever. */
        uint64_t wall = vgpu_monotonic_ns() - state->opened_ns;
        charged = charged > wall ? charged : wall;
        vgpu_log(VGPU_LOG_INFO, "an epoch's work did not finish in %llu ms; pacing goes on",
                 (unsigned long long)(WAIT_LIMIT_NS / 1000000));
    }
    uint64_t busy = charged; /* the GPU time itself, for the lease's busy_ns */
    if (state->lease != NULL) {
        /* As the saturated GPU's time: what idle time lets GPU Boost add is not free. */
        charged = charged * vgpu_lease_boost(state->lease) / VGPU_BOOST_ONE;
    }
    struct vgpu_region_device *device = &vgpu_state.region->devices[state->entry];
    debit(device, charged);
    atomic_fetch_add_explicit(&device->gpu_ns, charged, memory_order_relaxed);
    if (state->rate > state->hard && state->hard != 0) {
        /* Run at the soft limit: the part above the hard limit was burst. */
        atomic_fetch_add_explicit(&device->burst_ns,
                                  charged * (state->rate - state->hard) / state->rate,
                                  memory_order_relaxed);
    }
    log_stats(state, charged);
    /* Markers still pending belong to no epoch now: forget them. */
    for (unsigned i = 0; i < MARKERS; i++) {
        state->markers[i].pending = false;
    }
    state->pending = 0;
    state->head = 0;
    state->unmarked = 0;
    state->queued = 0;
    if (state->lease != NULL) {
        vgpu_lease_release(state->lease, busy);
    }
    state->open = false;
}

/* Destroy the device's events (their context still exists) and forget the context. */
static void release_events(struct device *state) {
    if (state->open) {
        close_epoch(state, true);
    }
    VGPU_REAL(cuEventDestroy_v2, state->start);
    for (unsigned i = 0; i < MARKERS; i++) {
        VGPU_REAL(cuEventDestroy_v2, state->markers[i].event);
    }
    state->ready = false;
    state->context = NULL;
}

/* Events in the launching context. A launch from another context than the one the events
 * belong to (a second context on the device) closes the epoch and moves them: correct, if slow
 * for a program that alternates contexts launch by launch. */
static bool set_up(struct device *state, int ordinal, int entry, CUcontext context) {
    if (state->ready && state->context == context) {
        return true;
    }
    if (state->ready) {
        release_events(state);
    }
    unsigned created = 0;
    bool started = VGPU_REAL(cuEventCreate, &state->start, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
    bool made = started;
    while (made && created < MARKERS) {
        made = VGPU_REAL(cuEventCreate, &state->markers[created].event, CU_EVENT_DEFAULT) ==
               CUDA_SUCCESS;
        created += made;
    }
    if (!made) {
        for (unsigned i = 0; i < created; i++) {
            VGPU_REAL(cuEventDestroy_v2, state->markers[i].event);
        }
        if (started) {
            VGPU_REAL(cuEventDestroy_v2, state->start);
        }
        vgpu_log(VGPU_LOG_ERROR, "cannot create events on device %d; its launches go unpaced",
                 ordinal);
        return false;
    }
    if (state->lease == NULL) {
        state->lease = vgpu_lease_open(vgpu_state.region->devices[entry].uuid);
        if (state->lease != NULL) {
            vgpu_lease_attach_pod(state->lease,
                                  &vgpu_state.region->devices[entry].compute_state[LEASE_WORDS]);
        }
    }
    state->entry = entry;
    state->context = context;
    /* Unknown: assume long (past the backlog, so one at a time) until the first marker returns. */
    state->kernel_ns = BACKLOG_NS + 1;
    state->estimated = false;
    state->ready = true;
    vgpu_log(VGPU_LOG_DEBUG, "compute pacing on device %d", ordinal);
    return true;
}

/* Run `visit` on every device's state, each under its lock. */
static void each_device(void (*visit)(struct device *, const void *), const void *handle) {
    pthread_once(&devices_once, init_devices);
    for (int i = 0; i < VGPU_MAX_ORDINALS; i++) {
        pthread_mutex_lock(&devices[i].lock);
        visit(&devices[i], handle);
        pthread_mutex_unlock(&devices[i].lock);
    }
}

static void drop_context_events(struct device *state, const void *context) {
    if (state->ready && state->context == context) {
        release_events(state);
    }
}

void vgpu_compute_context_gone(CUcontext context) {
    atomic_fetch_add_explicit(&contexts_gone, 1, memory_order_release);
    each_device(drop_context_events, context);
}

/* Whether any device of the pod has a compute limit: the common case has none, and then a launch
 * costs a few loads. */
static bool any_limit(void) {
    if (vgpu_state.region == NULL) {
        return false;
    }
    uint32_t count = atomic_load(&vgpu_state.region->device_count);
    for (uint32_t i = 0; i < count && i < VGPU_REGION_MAX_DEVICES; i++) {
        if (limited(atomic_load(&vgpu_state.region->devices[i].compute_limit))) {
            return true;
        }
    }
    return false;
}

/* The stream events are recorded on: the per-thread default stream for a _ptsz call's 0. */
static CUstream marker_stream(CUstream stream, bool per_thread) {
    return stream == NULL && per_thread ? CU_STREAM_PER_THREAD : stream;
}

/* Keep the work queued ahead of the GPU short: wait for old markers past the backlog. Short
 * kernels keep two launches in flight, so the GPU never waits for the next one; long ones (and
 * kernels of unknown length, assumed longer than the backlog) one, so that an epoch is not
 * stretched past its quantum by a second long kernel. */
static void wait_for_backlog(struct device *state, uint64_t now) {
    if (now - state->retired_ns >= RETIRE_EVERY_NS) {
        retire(state, false, 0); /* a driver call: not at every launch of tiny kernels */
        state->retired_ns = now;
    }
    uint64_t deadline = 0;
    for (;;) {
        unsigned in_flight = state->kernel_ns < LONG_KERNEL_NS ? 2 : 1;
        bool over = state->pending >= MARKERS - 1 ||
                    (state->queued >= in_flight &&
                     (uint64_t)state->queued * state->kernel_ns > BACKLOG_NS);
        /* Only what a marker covers can be waited for. */
        if (!over || (state->pending == 0 && !mark(state))) {
            return;
        }
        deadline = deadline != 0 ? deadline : vgpu_monotonic_ns() + WAIT_LIMIT_NS;
        if (!retire(state, true, deadline)) {
            return;
        }
    }
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
    unsigned generation = atomic_load_explicit(&contexts_gone, memory_order_acquire);
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

static void close_for_freeze(struct device *state, const void *unused) {
    (void)unused;
    if (state->open) {
        close_epoch(state, true); /* its queued work is charged; the lease goes to others */
    }
}

/* Run one launch (a kernel or a graph) under the pod's compute limit. */
static CUresult paced(CUstream stream, bool per_thread, launch_fn launch, void *arguments) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (vgpu_frozen() && vgpu_freeze_holds(frozen_entry())) {
        /* Trap and wait: no lock or lease is held meanwhile, so other threads (synchronizing,
         * say) and other pods go on. */
        each_device(close_for_freeze, NULL);
        vgpu_freeze_wait();
    }
    CUdevice ordinal;
    CUcontext context;
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    stream = marker_stream(stream, per_thread);
    if (!any_limit() || !current_device(&context, &ordinal) || ordinal < 0 ||
        ordinal >= VGPU_MAX_ORDINALS ||
        VGPU_REAL(cuStreamIsCapturing, stream, &capture) != CUDA_SUCCESS ||
        capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        return launch(arguments); /* unlimited, or captured: the graph's launch is paced */
    }
    int entry = vgpu_entry_of(ordinal);
    if (entry < 0 || !limited(compute_limit(entry))) {
        return launch(arguments);
    }
    pthread_once(&devices_once, init_devices);
    struct device *state = &devices[ordinal];
    pthread_mutex_lock(&state->lock);
    if (!set_up(state, ordinal, entry, context)) {
        pthread_mutex_unlock(&state->lock);
        return launch(arguments);
    }
    for (;;) {
        uint64_t now = vgpu_monotonic_ns();
        bool paused = state->open && now - state->last_launch_ns > PAUSE_NS &&
                      (now - state->last_launch_ns > CONTENDED_PAUSE_NS || state->lease == NULL ||
                       !vgpu_lease_wanted(state->lease, now));
        if (state->open &&
            (paused || (state->lease != NULL && vgpu_lease_lost(state->lease, now)))) {
            /* Paused: what is still queued (up to a backlog) is the pod's, and charged when done.
             * The lease taken: charge what ran. */
            state->stats.paused += paused;
            state->stats.lost += !paused;
            close_epoch(state, paused);
        }
        if (!state->open) {
            pthread_mutex_unlock(&state->lock);
            uint64_t capped = 0;
            wait_for_budget(state, &vgpu_state.region->devices[entry], entry, &capped);
            pthread_mutex_lock(&state->lock);
            state->stats.capped_ns += capped;
            if (!set_up(state, ordinal, entry, context)) { /* a context went meanwhile */
                pthread_mutex_unlock(&state->lock);
                return launch(arguments);
            }
        }
        if (!state->open) {
            if (state->lease != NULL) {
                uint64_t asked = vgpu_monotonic_ns();
                vgpu_lease_acquire(state->lease); /* without it when it is being scribbled */
                uint64_t waited = vgpu_monotonic_ns() - asked;
                state->stats.lease_wait_ns += waited;
                if (waited > 20000) { /* waited for another pod, not just taken */
                    atomic_fetch_add_explicit(&vgpu_state.region->devices[entry].throttled_ns,
                                              waited, memory_order_relaxed);
                }
            }
            VGPU_REAL(cuEventRecord, state->start, stream);
            state->stream = stream;
            state->open = true;
            state->done_ns = 0;
            state->idle_ns = 0;
            state->opened_ns = vgpu_monotonic_ns();
            state->last_launch_ns = state->opened_ns;
        }
        if (state->stream != stream) {
            mark(state); /* a marker covers the launches of one stream */
            state->stats.switches++;
            state->stream = stream;
        }
        wait_for_backlog(state, now);
        /* Only another pod waiting ends a burst (the pod's own processes share its bucket). */
        if (state->lease != NULL && vgpu_lease_wanted_by_other_pod(state->lease, now)) {
            atomic_store_explicit(&state->contended_ns, now, memory_order_relaxed);
        }
        if (state->done_ns < QUANTUM_NS) {
            break;
        }
        /* The epoch has had its share of GPU time: this launch belongs to the next one. */
        state->stats.quantum++;
        close_epoch(state, true);
    }
    if (state->last_launch_ns != state->opened_ns && state->pending == 0 && state->queued == 0 &&
        state->unmarked == 0) {
        note_gap(state);
    }
    result = launch(arguments);
    if (result == CUDA_SUCCESS) {
        state->unmarked++;
        state->stats.launches++;
        state->queued++;
        /* kernel_ns starts at the quantum, so the first launches are marked one by one. */
        if ((uint64_t)state->unmarked * state->kernel_ns >= MARK_EVERY_NS) {
            mark(state);
        }
    }
    state->last_launch_ns = vgpu_monotonic_ns();
    if (state->lease != NULL) {
        vgpu_lease_touch(state->lease, state->last_launch_ns);
        /* What is queued should be done by then: a thread kept from launching longer (asleep
         * on a busy host) lets a waiting pod have the idle GPU. */
        uint64_t backlog = (uint64_t)state->queued * state->kernel_ns;
        vgpu_lease_expect(state->lease, state->last_launch_ns + (backlog < VGPU_LEASE_HOLD_NS
                                                                     ? backlog
                                                                     : VGPU_LEASE_HOLD_NS));
    }
    pthread_mutex_unlock(&state->lock);
    return result;
}

void vgpu_compute_quiesce(void) {
    if (!any_limit()) {
        return;
    }
    pthread_once(&devices_once, init_devices);
    for (int i = 0; i < VGPU_MAX_ORDINALS; i++) {
        struct device *state = &devices[i];
        if (state->open && pthread_mutex_trylock(&state->lock) == 0) {
            /* The program waited for its work: a good moment to hand the GPU to a waiting pod,
             * once the epoch has had its quantum. Shorter epochs multiply the hand-overs,
             * each of which leaves the GPU idle a moment: closing at every synchronization cost
             * a 70 % pod beside a 30 % one 1-4 points. Alone, the epoch goes on (a pause closes
             * it anyway; a holder that stops launching loses the lease once drained). */
            if (state->open &&
                (state->lease == NULL || vgpu_lease_wanted(state->lease, vgpu_monotonic_ns())) &&
                (retire(state, false, 0), state->done_ns >= QUANTUM_NS)) {
                state->stats.synchronized++;
                close_epoch(state, true);
            } else if (state->open) {
                /* The epoch goes on: a marker now ends its launches so far, so that the gap
                 * until the program's next launch is seen as idle (note_gap). Unmarked, the
                 * last launches before the synchronization share a marker with the first ones
                 * after it, and the gap between them is charged. */
                mark(state);
            }
            pthread_mutex_unlock(&state->lock);
        }
    }
}

static void mark_stream(struct device *state, const void *stream) {
    if (state->open && state->stream == stream) {
        mark(state);
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
        each_device(mark_stream, hStream);
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
    int kind; /* 0 kernel, 1 kernel _ptsz, 2 Ex, 3 Ex _ptsz, 4 cooperative, 5 coop _ptsz,
                 6 graph, 7 graph _ptsz */
};

static CUresult launch_real(void *arguments) {
    struct kernel_launch *a = arguments;
    switch (a->kind) {
    case 0: return VGPU_REAL(cuLaunchKernel, a->f, a->grid[0], a->grid[1], a->grid[2], a->block[0], a->block[1], a->block[2], a->shared, a->stream, a->params, a->extra);
    case 1: return VGPU_REAL(cuLaunchKernel_ptsz, a->f, a->grid[0], a->grid[1], a->grid[2], a->block[0], a->block[1], a->block[2], a->shared, a->stream, a->params, a->extra);
    case 2: return VGPU_REAL(cuLaunchKernelEx, a->config, a->f, a->params, a->extra);
    case 3: return VGPU_REAL(cuLaunchKernelEx_ptsz, a->config, a->f, a->params, a->extra);
    case 4: return VGPU_REAL(cuLaunchCooperativeKernel, a->f, a->grid[0], a->grid[1], a->grid[2], a->block[0], a->block[1], a->block[2], a->shared, a->stream, a->params);
    case 5: return VGPU_REAL(cuLaunchCooperativeKernel_ptsz, a->f, a->grid[0], a->grid[1], a->grid[2], a->block[0], a->block[1], a->block[2], a->shared, a->stream, a->params);
    case 6: return VGPU_REAL(cuGraphLaunch, a->graph, a->stream);
    default: return VGPU_REAL(cuGraphLaunch_ptsz, a->graph, a->stream);
    }
}

#define VGPU_KERNEL_HOOK(symbol, kind_value, per_thread)                                       \
    CUresult symbol(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,                \
                    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,     \
                    unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,     \
                    void **kernelParams, void **extra) {                                        \
        struct kernel_launch a = {f, {gridDimX, gridDimY, gridDimZ},                            \
                                  {blockDimX, blockDimY, blockDimZ}, sharedMemBytes, hStream,   \
                                  kernelParams, extra, NULL, NULL, kind_value};                \
        return paced(hStream, per_thread, launch_real, &a);                                    \
    }

VGPU_KERNEL_HOOK(cuLaunchKernel, 0, false)
VGPU_KERNEL_HOOK(cuLaunchKernel_ptsz, 1, true)

#define VGPU_COOPERATIVE_HOOK(symbol, kind_value, per_thread)                                  \
    CUresult symbol(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,                \
                    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,     \
                    unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,     \
                    void **kernelParams) {                                                      \
        struct kernel_launch a = {f, {gridDimX, gridDimY, gridDimZ},                            \
                                  {blockDimX, blockDimY, blockDimZ}, sharedMemBytes, hStream,   \
                                  kernelParams, NULL, NULL, NULL, kind_value};                 \
        return paced(hStream, per_thread, launch_real, &a);                                    \
    }

VGPU_COOPERATIVE_HOOK(cuLaunchCooperativeKernel, 4, false)
VGPU_COOPERATIVE_HOOK(cuLaunchCooperativeKernel_ptsz, 5, true)

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra) {
    struct kernel_launch a = {.f = f, .params = kernelParams, .extra = extra, .config = config,
                              .kind = 2};
    return paced(config != NULL ? config->hStream : NULL, false, launch_real, &a);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra) {
    struct kernel_launch a = {.f = f, .params = kernelParams, .extra = extra, .config = config,
                              .kind = 3};
    return paced(config != NULL ? config->hStream : NULL, true, launch_real, &a);
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    struct kernel_launch a = {.graph = hGraphExec, .stream = hStream, .kind = 6};
    return paced(hStream, false, launch_real, &a);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    struct kernel_launch a = {.graph = hGraphExec, .stream = hStream, .kind = 7};
    return paced(hStream, true, launch_real, &a);
}

/* For the deprecated launch entry points (legacy.c): a launch paced as these are. */
CUresult vgpu_compute_paced(CUstream stream, bool per_thread, CUresult (*launch)(void *),
                            void *arguments) {
    return paced(stream, per_thread, launch, arguments);
}
