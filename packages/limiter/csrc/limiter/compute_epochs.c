/* The epochs of the compute limiter (compute_epochs.h; the design is in compute.c): events that
 * measure the GPU time of each epoch, markers that keep the work queued ahead of the GPU short,
 * and what an epoch costs the pod when it ends. */
#define _GNU_SOURCE
#include "compute_epochs.h"

#include <errno.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "compute.h"
#include "compute_gang.h"
#include "core.h"
#include "lease.h"
#include "log.h"
#include "region.h"

/* GPU time launches may run ahead. It covers launch jitter and a launching thread that sleeps
 * longer than asked (a busy host): at 4 ms a 70 % pod beside a 30 % one on a loaded 2-core
 * machine left the GPU idle for a tenth of the time; at 10 ms for 3-4 %. */
#define BACKLOG_NS 10000000ULL
/* The backlog of a process asked to yield to an urgent waiter lately (lease.h): what it queued
 * is drained before the lease goes to that pod's next burst, so it is kept short. At 10 ms a
 * bursty pod's 10-ms rounds took 20 ms beside a training pod on the simulated GPU, at 2 ms
 * 12.5. On an H100 (4096³ bf16 matmuls, 7.6-ms rounds alone), four runs each, alternating: at
 * 2 ms p50/p99 10.4-10.8/11.5-12.5 ms beside the training pod (p99 1.50-1.57 of alone in three),
 * at 1 ms 9.4-9.6/10.6-11.1 (1.34-1.43), the training pod at 74-81 % either way. */
#define URGENT_BACKLOG_NS 1000000ULL
#define URGENT_HOLD_NS 1000000000ULL
/* A kernel at least this long runs one at a time (vgpu_epoch_wait_for_backlog). */
#define LONG_KERNEL_NS 8000000ULL
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
/* How often a launch of a steady stream of launches looks for finished markers (a driver call
 * for the oldest one): a marker covers MARK_EVERY_NS of work, so looking more often finds nothing
 * new. Every 20 µs it cost a launch of empty kernels about 20 ns on an H100. A launch GAP_NS or
 * more after the one before looks anyway: the GPU may have run out of work meanwhile, and only a
 * look lets the launch see so (note_gap). */
#define RETIRE_EVERY_NS 100000ULL
#define GAP_NS 20000ULL

_Static_assert(VGPU_COMPUTE_LEASE_WORDS + VGPU_LEASE_POD_WORDS <= VGPU_COMPUTE_COLLECTIVE_NS &&
                   VGPU_COMPUTE_COLLECTIVE_NS < VGPU_COMPUTE_USE_OLDER &&
                   VGPU_COMPUTE_USE_NEWER < 8,
               "compute_state words");

_Static_assert(offsetof(struct paced_device, start) <= 3 * 64,
               "a launch's fields of struct paced_device fit three cache lines");

/* Initialized statically: a launch reads no once-control to find its device's state. */
static struct paced_device devices[VGPU_MAX_ORDINALS] = {
    [0 ... VGPU_MAX_ORDINALS - 1] = {.lock = VGPU_LOCK_INITIALIZER}};

struct paced_device *vgpu_paced_device(int ordinal) {
    return &devices[ordinal];
}

/* A forked child is another process: its pacing starts afresh, as this process's did. What it
 * inherited is its parent's: a lock another thread held at the fork (waiting for its kernels or
 * the lease, as a paced launch does) stays held for good in the child, where every launch, a
 * stream's destruction or a context's release then hung for ever; and an epoch open at the fork
 * is the parent's, which a child that released its context (a runtime's exit handler does)
 * closed and charged to the pod a second time, on the parent's events. The device's lease is
 * kept: a child takes a token and a connection to the arbiter of its own before it uses it
 * (lease.c), which also sets right a handle that a thread of the parent was changing. */
void vgpu_paced_forget_in_child(void) {
    for (int i = 0; i < VGPU_MAX_ORDINALS; i++) {
        /* The generation goes on: the forking thread's credit was given in the parent. */
        uint32_t generation = atomic_load(&devices[i].generation) + 1;
        devices[i] = (struct paced_device){.lock = VGPU_LOCK_INITIALIZER,
                                           .lease = devices[i].lease};
        atomic_store(&devices[i].generation, generation);
    }
}

void vgpu_paced_each_device(void (*visit)(struct paced_device *, const void *),
                            const void *handle) {
    for (int i = 0; i < VGPU_MAX_ORDINALS; i++) {
        vgpu_lock_take(&devices[i].lock);
        visit(&devices[i], handle);
        vgpu_lock_give(&devices[i].lock);
    }
}

void vgpu_compute_pause(uint64_t nanoseconds) {
    struct timespec delay = {(time_t)(nanoseconds / 1000000000ULL),
                             (long)(nanoseconds % 1000000000ULL)};
    while (nanosleep(&delay, &delay) != 0 && errno == EINTR) {
    }
}

static uint64_t elapsed_ns(CUevent from, CUevent to) {
    float milliseconds = 0;
    if (VGPU_REAL(cuEventElapsedTime_v2, &milliseconds, from, to) != CUDA_SUCCESS &&
        VGPU_REAL(cuEventElapsedTime, &milliseconds, from, to) != CUDA_SUCCESS) {
        return 0;
    }
    return milliseconds > 0 ? (uint64_t)((double)milliseconds * 1e6) : 0;
}

/* A finished marker, `done` after the epoch's start: the time since the newest finished marker
 * was idle (a resume marker), or ran its launches, which tells how long one takes. */
static void count_marker(struct paced_device *state, const struct marker *marker, uint64_t done) {
    state->queued -= marker->launches < state->queued ? marker->launches : state->queued;
    if (marker->resume && done > state->done_ns) {
        /* From the newest finished marker to this one the GPU had none of the epoch's work. */
        state->idle_ns += done - state->done_ns;
        state->done_ns = done;
    } else if (done > state->done_ns) {
        /* What one launch takes on the GPU: the time since the previous marker. A marker of
         * no counted launches covers launches made on credit, counted later: no sample. */
        if (marker->launches > 0) {
            uint64_t sample = (done - state->done_ns) / marker->launches;
            state->kernel_ns = state->estimated ? (state->kernel_ns * 7 + sample) / 8 : sample;
            state->estimated = true;
        }
        state->done_ns = done;
    }
}

VGPU_COLD bool vgpu_epoch_retire(struct paced_device *state, bool wait, uint64_t deadline) {
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
            vgpu_compute_pause(step < 5000 ? 5000 : step > 50000 ? 50000 : step);
            continue;
        }
        count_marker(state, marker,
                     result == CUDA_SUCCESS ? elapsed_ns(state->start, marker->event) : 0);
        marker->pending = false;
        state->head = (state->head + 1) % MARKERS;
        state->pending--;
        wait = false; /* only the oldest is waited for */
    }
    return true;
}

/* Whether a thread's launches on credit may still come, not counted yet (compute_credit.h). */
static bool credit_may_come(const struct paced_device *state) {
    return state->credited_until_ns != 0 && vgpu_monotonic_ns() < state->credited_until_ns;
}

VGPU_COLD bool vgpu_epoch_mark(struct paced_device *state) {
    bool owed = state->unmarked > 0 || credit_may_come(state);
    if (!owed || state->pending >= MARKERS) {
        return !owed;
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
 * GPU is idle now, and a resume marker lets retire count the time since the newest finished
 * marker as idle. A launching thread that sleeps longer than the backlog lasts (descheduled on a
 * busy host, or the program busy between launches) leaves such gaps; charged, they cost a pod
 * several points of its limit. Only then is an event recorded: on an idle GPU. */
static VGPU_COLD void note_gap(struct paced_device *state) {
    struct marker *marker = &state->markers[state->head];
    if (VGPU_REAL(cuEventRecord, marker->event, state->stream) == CUDA_SUCCESS) {
        marker->pending = true;
        marker->resume = true;
        marker->launches = 0;
        state->pending = 1;
    }
}

static VGPU_COLD void log_stats(struct paced_device *state, uint64_t charged) {
    state->stats.epochs++;
    state->stats.charged_ns += charged;
    uint64_t now = vgpu_monotonic_ns();
    if (now - state->stats.since_ns < 1000000000ULL) {
        return;
    }
    if (state->stats.since_ns != 0) {
        vgpu_log(VGPU_LOG_DEBUG,
                 "pacing: %u epochs (ended: %u quantum, %u synchronized, %u paused, %u lease "
                 "lost, %u for a collective, %u yielded; %u urgent), %u launches (%u on credit), "
                 "%u markers, "
                 "%u stream switches, %llu us of GPU time charged, %llu us waited for the lease "
                 "(%llu us of it for the gang's other ranks), %llu us paused for the limit, %llu "
                 "us beyond the bucket's cap in %llu ms; %llu collectives so far",
                 state->stats.epochs, state->stats.quantum, state->stats.synchronized,
                 state->stats.paused, state->stats.lost, state->stats.gang, state->stats.yielded,
                 state->stats.urgent,
                 state->launches, state->stats.credited,
                 state->stats.markers, state->stats.switches,
                 (unsigned long long)(state->stats.charged_ns / 1000),
                 (unsigned long long)(state->stats.lease_wait_ns / 1000),
                 (unsigned long long)(state->stats.gang_start_ns / 1000),
                 (unsigned long long)(state->stats.paused_ns / 1000),
                 (unsigned long long)(state->stats.capped_ns / 1000),
                 (unsigned long long)((now - state->stats.since_ns) / 1000000),
                 (unsigned long long)state->collectives);
    }
    memset(&state->stats, 0, sizeof state->stats);
    state->launches = 0;
    state->stats.since_ns = now;
}

/* Wait for the epoch's work until `deadline`; false when it did not finish. The polls run without
 * the thread's timer slack (50 µs by default), restored after: each poll's sleep would otherwise
 * add that much to the GPU's idle time before the next epoch, this pod's or another's, starts. */
static VGPU_COLD bool drain_all(struct paced_device *state, uint64_t deadline) {
    if (state->pending == 0) {
        return true;
    }
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack > 1) {
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    }
    bool finished = true;
    while (state->pending > 0 && finished) {
        finished = vgpu_epoch_retire(state, true, deadline);
    }
    if (slack > 1) {
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
    }
    return finished;
}

/* The epoch's GPU time as measured, without the time the GPU sat idle for want of its work; the
 * wall time since it opened when its work did not finish (`finished` false). */
static uint64_t measured_ns(const struct paced_device *state, bool finished) {
    uint64_t charged = state->done_ns -
                       (state->idle_ns < state->done_ns ? state->idle_ns : state->done_ns);
    if (!finished) {
        /* Our own work did not finish in time (a kernel waiting on another process): charge
         * the wall time and let others run rather than wait forever. */
        uint64_t wall = vgpu_monotonic_ns() - state->opened_ns;
        charged = charged > wall ? charged : wall;
        vgpu_log(VGPU_LOG_INFO, "an epoch's work did not finish in %llu ms; pacing goes on",
                 (unsigned long long)(WAIT_LIMIT_NS / 1000000));
    }
    return charged;
}

VGPU_COLD void vgpu_epoch_close(struct paced_device *state, bool drain) {
    /* First: a thread's credit ends before the last marker, which then covers its launches. */
    atomic_fetch_add_explicit(&state->generation, 1, memory_order_release);
    uint64_t deadline = vgpu_monotonic_ns() + WAIT_LIMIT_NS;
    vgpu_epoch_mark(state); /* the epoch's last launches are measured too */
    bool finished = !drain || drain_all(state, deadline);
    vgpu_epoch_retire(state, false, 0);
    uint64_t busy = measured_ns(state, finished); /* the GPU time itself, for the lease */
    uint64_t charged = busy;
    if (state->lease != NULL) {
        /* As the saturated GPU's time: what idle time lets GPU Boost add is not free. */
        charged = vgpu_boosted_charge(&state->unboosted, busy, vgpu_lease_boost(state->lease),
                                      vgpu_monotonic_ns());
    }
    vgpu_bucket_charge(&vgpu_state.region->devices[state->entry], charged, state->pace);
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

VGPU_COLD void vgpu_epoch_release_events(struct paced_device *state) {
    if (state->open) {
        vgpu_epoch_close(state, true);
    }
    VGPU_REAL(cuEventDestroy_v2, state->start);
    for (unsigned i = 0; i < MARKERS; i++) {
        VGPU_REAL(cuEventDestroy_v2, state->markers[i].event);
    }
    state->ready = false;
    state->context = NULL;
    atomic_fetch_add_explicit(&state->generation, 1, memory_order_release);
}

/* The start event and every marker's, all or none. */
static VGPU_COLD bool create_events(struct paced_device *state) {
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
    }
    return made;
}

/* Whether every launch waits for its kernel (CUDA_LAUNCH_BLOCKING=1); read as the events are
 * made, so that a launch reads a field of its device's state rather than a word of its own. */
static bool launches_block(void) {
    const char *setting = getenv("CUDA_LAUNCH_BLOCKING");
    return setting != NULL && strcmp(setting, "1") == 0;
}

static VGPU_COLD bool set_up_events(struct paced_device *state, int ordinal, int entry,
                                    CUcontext context) {
    if (state->ready) {
        vgpu_epoch_release_events(state);
    }
    if (!create_events(state)) {
        vgpu_log(VGPU_LOG_ERROR, "cannot create events on device %d; its launches go unpaced",
                 ordinal);
        return false;
    }
    if (state->lease == NULL) {
        state->lease = vgpu_lease_open(vgpu_state.region->devices[entry].uuid);
        if (state->lease != NULL) {
            vgpu_lease_attach_pod(
                state->lease,
                &vgpu_state.region->devices[entry].compute_state[VGPU_COMPUTE_LEASE_WORDS]);
        }
    }
    state->entry = entry;
    state->context = context;
    /* Unknown: assume long (past the backlog, so one at a time) until the first marker returns. */
    state->kernel_ns = BACKLOG_NS + 1;
    state->estimated = false;
    state->blocking = launches_block();
    state->ready = true;
    vgpu_log(VGPU_LOG_DEBUG, "compute pacing on device %d", ordinal);
    return true;
}

bool vgpu_epoch_set_up(struct paced_device *state, int ordinal, int entry, CUcontext context) {
    return (state->ready && state->context == context) ||
           set_up_events(state, ordinal, entry, context);
}

void vgpu_epoch_look(struct paced_device *state, uint64_t now) {
    state->looking = state->looked_ns == 0 || now < state->looked_ns ||
                     now - state->looked_ns >= VGPU_LEASE_LOOK_EVERY_NS;
    state->looked_ns = state->looking ? now : state->looked_ns;
}

/* End the open epoch: it paused, or its lease was taken. */
static VGPU_COLD void end_paused_or_lost(struct paced_device *state, uint64_t now, bool paused) {
    /* Paused: what is still queued (up to a backlog) is the pod's, and charged when done.
     * The lease taken: charge what ran. */
    state->stats.paused += paused;
    state->stats.lost += !paused;
    if (!paused) {
        vgpu_gang_lost(state, now);
        vgpu_log(VGPU_LOG_DEBUG,
                 "lease taken back: %llu us after the last launch, %u queued, epoch of %llu "
                 "us, at %llu ms",
                 (unsigned long long)((now - state->last_launch_ns) / 1000), state->queued,
                 (unsigned long long)((now - state->opened_ns) / 1000),
                 (unsigned long long)(now / 1000000));
    }
    vgpu_epoch_close(state, paused);
}

void vgpu_epoch_end_paused_or_lost(struct paced_device *state, uint64_t now) {
    bool paused = state->open && VGPU_RARELY(now - state->last_launch_ns > PAUSE_NS) &&
                  (now - state->last_launch_ns > CONTENDED_PAUSE_NS || state->lease == NULL ||
                   !vgpu_lease_wanted(state->lease, now));
    if (VGPU_RARELY(state->open && (paused || (state->looking && state->lease != NULL &&
                                               vgpu_lease_lost(state->lease, now))))) {
        end_paused_or_lost(state, now, paused);
    }
}

VGPU_COLD void vgpu_epoch_open(struct paced_device *state, CUstream stream, int entry, bool gang) {
    if (state->lease != NULL) {
        uint64_t asked = vgpu_monotonic_ns();
        /* A wait for another pod is remembered: what the pod's bucket accrues meanwhile is
         * kept at its next refill (the full cap, compute_bucket.h), whichever process makes it. */
        vgpu_compute_contended(state, asked);
        state->stats.urgent += state->urgent;
        uint64_t for_ranks = state->stats.gang_start_ns;
        if (gang) {
            vgpu_gang_acquire(state, entry); /* with the pod's other ranks */
        } else {
            vgpu_lease_acquire(state->lease, state->urgent); /* without it when scribbled */
        }
        uint64_t waited = vgpu_monotonic_ns() - asked;
        state->stats.lease_wait_ns += waited;
        waited -= state->stats.gang_start_ns - for_ranks; /* the pod's own ranks: not throttled */
        if (waited > 20000) { /* waited for another pod, not just taken */
            atomic_fetch_add_explicit(&vgpu_state.region->devices[entry].throttled_ns, waited,
                                      memory_order_relaxed);
        }
        if (waited > QUANTUM_NS / 2) {
            /* Where a bursty pod's slow rounds come from, beside the clock of other logs. */
            vgpu_log(VGPU_LOG_DEBUG, "waited %llu ms for the lease (%s) until %llu ms",
                     (unsigned long long)(waited / 1000000),
                     state->urgent ? "urgent" : "not urgent",
                     (unsigned long long)(vgpu_monotonic_ns() / 1000000));
        }
    }
    /* Once per epoch rather than per launch: a program that allocated at its start and has
     * launched since is not shown as idle since its last allocation. */
    vgpu_region_heartbeat(vgpu_state.region);
    VGPU_REAL(cuEventRecord, state->start, stream);
    state->stream = stream;
    state->open = true;
    state->done_ns = 0;
    state->idle_ns = 0;
    state->opened_ns = vgpu_monotonic_ns();
    state->last_launch_ns = state->opened_ns;
    state->launched = false;
    /* Its first launch says it is active, and the next one reads the lease's words (a lease
     * taken back or a yield asked while it started). */
    state->looked_ns = 0;
    state->looking = true;
    state->expected_ns = 0;
    atomic_fetch_add_explicit(&state->generation, 1, memory_order_release);
}

void vgpu_epoch_switch_stream(struct paced_device *state, CUstream stream) {
    if (VGPU_RARELY(state->stream != stream)) {
        atomic_fetch_add_explicit(&state->generation, 1, memory_order_release); /* first */
        vgpu_epoch_mark(state); /* a marker covers the launches of one stream */
        state->stats.switches++;
        state->stream = stream;
    }
}

/* Whether the epoch's queue is past `backlog`. Short kernels keep two launches in flight, so
 * the GPU never waits for the next one; long ones (and kernels of unknown length, assumed longer
 * than the backlog) one, so that an epoch is not stretched past its quantum by a second long
 * kernel. */
static bool over_backlog(const struct paced_device *state, uint64_t backlog) {
    unsigned in_flight = state->kernel_ns < LONG_KERNEL_NS ? 2 : 1;
    return state->pending >= MARKERS - 1 ||
           (state->queued >= in_flight && (uint64_t)state->queued * state->kernel_ns > backlog);
}

/* Wait for the epoch's work until its queue is back within `backlog`; the clock after. */
static VGPU_COLD uint64_t drain_to_backlog(struct paced_device *state, uint64_t backlog) {
    uint64_t deadline = vgpu_monotonic_ns() + WAIT_LIMIT_NS;
    /* Only what a marker covers can be waited for. */
    while (over_backlog(state, backlog) && (state->pending > 0 || vgpu_epoch_mark(state)) &&
           vgpu_epoch_retire(state, true, deadline)) {
    }
    return vgpu_monotonic_ns();
}

uint64_t vgpu_epoch_wait_for_backlog(struct paced_device *state, uint64_t now) {
    if (VGPU_RARELY(now - state->retired_ns >= RETIRE_EVERY_NS ||
                    now - state->last_launch_ns >= GAP_NS)) {
        vgpu_epoch_retire(state, false, 0);
        state->retired_ns = now;
    }
    bool beside_urgent = state->yield_asked_ns != 0 && now >= state->yield_asked_ns &&
                         now - state->yield_asked_ns < URGENT_HOLD_NS;
    uint64_t backlog = beside_urgent ? URGENT_BACKLOG_NS : BACKLOG_NS;
    return VGPU_RARELY(over_backlog(state, backlog)) ? drain_to_backlog(state, backlog) : now;
}

void vgpu_epoch_before_launch(struct paced_device *state) {
    if (VGPU_RARELY(state->launched && state->pending == 0 && state->queued == 0 &&
                    state->unmarked == 0 && state->entered_ns >= state->credited_until_ns)) {
        note_gap(state);
    }
}

/* Tell the lease that the epoch launched now and when its queued work (`backlog`) drains. Told
 * after the launch: one that blocked (a module loaded lazily, a graph's first upload) would
 * otherwise say its work drains before it was even queued, and lose the lease. */
static VGPU_COLD void tell_lease(struct paced_device *state, uint64_t backlog) {
    state->last_launch_ns = vgpu_monotonic_ns();
    uint64_t drains = state->last_launch_ns + backlog;
    vgpu_lease_touch(state->lease, state->last_launch_ns);
    vgpu_lease_expect(state->lease, drains);
    state->expected_ns = drains;
}

void vgpu_epoch_after_launch(struct paced_device *state, CUresult result) {
    if (result == CUDA_SUCCESS) {
        state->unmarked++;
        state->launches++;
        state->queued++;
        /* kernel_ns starts at the quantum, so the first launches are marked one by one. */
        if (VGPU_RARELY((uint64_t)state->unmarked * state->kernel_ns >= MARK_EVERY_NS)) {
            vgpu_epoch_mark(state);
        }
    }
    /* The clock read before the launch stands for its end, unless the lease is told (below).
     * With the limit read as one word and the markers at the end of this state, a paced launch
     * of an empty kernel on an H100 added 202-256 ns (median 231) instead of 258-368 (346),
     * four runs each, alternating. */
    /* Never back: another thread's launch may have entered after this one. */
    state->last_launch_ns =
        state->entered_ns > state->last_launch_ns ? state->entered_ns : state->last_launch_ns;
    state->launched = true;
    if (state->lease == NULL) {
        return;
    }
    /* What is queued should be done by then: a thread kept from launching longer (asleep on a
     * busy host) lets a waiting pod have the idle GPU. Written when the launch looks, or when
     * it moved the time on by more than a quarter of what the arbiter allows a drained holder:
     * a few long kernels launched between two looks must not make the holder seem drained while
     * they run. */
    uint64_t backlog = (uint64_t)state->queued * state->kernel_ns;
    backlog = backlog < VGPU_LEASE_HOLD_NS ? backlog : VGPU_LEASE_HOLD_NS;
    if (VGPU_RARELY(state->looking || state->last_launch_ns + backlog >
                                          state->expected_ns + VGPU_LEASE_DRAINED_NS / 4)) {
        tell_lease(state, backlog);
    }
}
