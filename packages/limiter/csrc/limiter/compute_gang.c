/* Collectives under a compute limit (compute_gang.h).
 *
 * The ranks of a data-parallel job (one process per GPU, say) meet in collectives: NCCL's kernel
 * on one GPU spins until every rank's kernel of the same collective runs. Paced each on its own,
 * one rank pauses for its bucket while another's collective spins, that spin is GPU time its
 * rank is charged, so that rank pauses in turn while the first one's collective spins: a DDP job
 * at 50 % on two H100s ran at 1-2 % of its unlimited speed. So a process that launches
 * collectives pauses only right before one, and every rank pauses for the same collective until
 * the same time: the first rank to reach it decides, from the buckets of all the pod's GPUs that
 * run collectives, and writes the decision in the pod's gate (the region's gang_gate word); the
 * others read it there. No rank then pauses with its part of a collective in flight. The
 * ranks also end their epochs at the same collective and start the next ones together
 * (vgpu_gang_acquire), and every process of a pod counts its collectives from its start, paced
 * or not, so that the n-th is the same one for every rank. */
#define _GNU_SOURCE
#include "compute_gang.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "collectives.h"
#include "compute.h"
#include "compute_bucket.h"
#include "core.h"
#include "lease.h"
#include "log.h"
#include "region.h"

/* A member of a gang (vgpu_gang_member) pauses only before its next collective, unless its
 * bucket is deeper in debt than GANG_DEBT_MAX_NS (a step's work between two collectives is
 * then paid for at once). A gang's wait shorter than GANG_MIN_PAUSE_NS is not taken: the debt
 * is carried to a later collective rather than spend an epoch's end and a hand-over on it (a
 * rank at 70 % beside a 30 % pod, with a collective every 0.5 ms, got 59.8 % otherwise). */
#define GANG_DEBT_MAX_NS 500000000ULL
#define GANG_MIN_PAUSE_NS 2000000ULL
/* A rank that stamped its collective a moment after the decider read the clock is in. */
#define GANG_CLOCK_SLACK_NS 1000000ULL

/* The name tells (collectives.c). A launch may name a kernel by a library's CUkernel handle
 * as well as by a CUfunction: both are asked. */
static VGPU_COLD bool named_collective(CUfunction function, CUkernel kernel) {
    const char *name = NULL;
    bool named = (function != NULL && VGPU_REAL(cuFuncGetName, &name, function) == CUDA_SUCCESS) ||
                 (kernel != NULL && VGPU_REAL(cuKernelGetName, &name, kernel) == CUDA_SUCCESS);
    if (!named) {
        return false; /* a driver before 12.3, or a handle without a name */
    }
    bool collective = vgpu_collective_kernel_name(name);
    if (collective) {
        vgpu_log(VGPU_LOG_DEBUG, "collective kernel %s: the pod's ranks pause together", name);
    }
    return collective;
}

/* Functions whose names were looked at, process-wide and lock-free (the unpaced path counts
 * collectives too, without the device's lock): each slot holds a function's handle with its low
 * bit set when it is a collective's; 0 is free. Room for frameworks' thousands of kernels. */
#define KNOWN_FUNCTIONS 8192
static _Atomic uintptr_t known_functions[KNOWN_FUNCTIONS];

bool vgpu_gang_is_collective(CUfunction function, bool *first) {
    uintptr_t key = (uintptr_t)function;
    if (key == 0) {
        return false;
    }
    if ((key & 1) != 0) { /* not a handle that fits the table: asked every time */
        *first = true;
        return named_collective(function, (CUkernel)(void *)function);
    }
    uint64_t hash = ((uint64_t)key >> 4) * 0x9e3779b97f4a7c15ULL;
    unsigned start = (unsigned)(hash >> 32) % KNOWN_FUNCTIONS;
    for (unsigned probe = 0; probe < 16; probe++) {
        _Atomic uintptr_t *slot = &known_functions[(start + probe) % KNOWN_FUNCTIONS];
        uintptr_t seen = atomic_load_explicit(slot, memory_order_acquire);
        if ((seen & ~(uintptr_t)1) == key) {
            return (seen & 1) != 0;
        }
        if (VGPU_RARELY(seen == 0)) {
            *first = true;
            bool collective = named_collective(function, (CUkernel)(void *)function);
            uintptr_t free_slot = 0;
            if (atomic_compare_exchange_strong(slot, &free_slot, key | collective) ||
                (free_slot & ~(uintptr_t)1) == key) {
                return collective;
            }
        }
    }
    *first = true;
    return named_collective(function, (CUkernel)(void *)function); /* crowded */
}

bool vgpu_gang_launches_collective(CUfunction function, CUgraphExec graph, bool *first) {
    return function != NULL ? vgpu_gang_is_collective(function, first)
                            : vgpu_gang_graph_is_collective(graph);
}

void vgpu_gang_forget_functions(void) {
    for (unsigned i = 0; i < KNOWN_FUNCTIONS; i++) {
        atomic_store_explicit(&known_functions[i], 0, memory_order_relaxed);
    }
}

#define COLLECTIVE_GRAPHS 256
static _Atomic(uintptr_t) collective_graphs[COLLECTIVE_GRAPHS];
static _Atomic unsigned collective_graph_count; /* 0: a graph launch looks no further */

/* Whether one of the graph's kernel nodes is a collective's (child graphs are not looked in). */
static bool graph_has_collective(CUgraph graph) {
    size_t count = 0;
    if (VGPU_REAL(cuGraphGetNodes, graph, NULL, &count) != CUDA_SUCCESS || count == 0) {
        return false;
    }
    CUgraphNode *nodes = calloc(count, sizeof *nodes);
    if (nodes == NULL || VGPU_REAL(cuGraphGetNodes, graph, nodes, &count) != CUDA_SUCCESS) {
        free(nodes);
        return false;
    }
    bool found = false;
    for (size_t i = 0; i < count && !found; i++) {
        CUgraphNodeType type;
        CUDA_KERNEL_NODE_PARAMS_v2 params;
        found = VGPU_REAL(cuGraphNodeGetType, nodes[i], &type) == CUDA_SUCCESS &&
                type == CU_GRAPH_NODE_TYPE_KERNEL &&
                VGPU_REAL(cuGraphKernelNodeGetParams_v2, nodes[i], &params) == CUDA_SUCCESS &&
                named_collective(params.func, params.kern);
    }
    free(nodes);
    return found;
}

void vgpu_gang_note_graph(CUgraphExec exec, CUgraph graph) {
    if (exec == NULL || graph == NULL || !graph_has_collective(graph)) {
        return;
    }
    for (unsigned i = 0; i < COLLECTIVE_GRAPHS; i++) {
        uintptr_t free_slot = 0;
        if (atomic_compare_exchange_strong(&collective_graphs[i], &free_slot, (uintptr_t)exec)) {
            atomic_fetch_add(&collective_graph_count, 1);
            return;
        }
    }
    vgpu_log(VGPU_LOG_WARN, "more than %d graphs with collectives: this one is paced as a plain "
                            "graph, its ranks each on their own", COLLECTIVE_GRAPHS);
}

void vgpu_gang_forget_graph(CUgraphExec exec) {
    for (unsigned i = 0; i < COLLECTIVE_GRAPHS && exec != NULL; i++) {
        uintptr_t known = (uintptr_t)exec;
        if (atomic_compare_exchange_strong(&collective_graphs[i], &known, 0)) {
            atomic_fetch_sub(&collective_graph_count, 1);
        }
    }
}

bool vgpu_gang_graph_is_collective(CUgraphExec exec) {
    if (atomic_load_explicit(&collective_graph_count, memory_order_relaxed) == 0) {
        return false; /* the common case: one load per graph launch */
    }
    for (unsigned i = 0; i < COLLECTIVE_GRAPHS && exec != NULL; i++) {
        if (atomic_load_explicit(&collective_graphs[i], memory_order_relaxed) == (uintptr_t)exec) {
            return true;
        }
    }
    return false;
}

/* Its bit in the pod's gang_waiting word: set while this rank waits for the lease of `entry`. */
static void say_waiting(int entry, bool waiting) {
    uint64_t bit = 1ULL << entry;
    if (waiting) {
        atomic_fetch_or(&vgpu_state.region->gang_waiting, bit);
    } else {
        atomic_fetch_and(&vgpu_state.region->gang_waiting, ~bit);
    }
}

/* Why the ranks start together: when a pod's ranks hand their GPUs to another pod's, that pod's
 * ranks get them a little apart (one rank reaches the hand-over a little after the other), and
 * its first rank to start runs into its next collective and spins there until the last one
 * starts, charged; its own hand-over is as far apart in turn, so that the gap never closed: a
 * 30/70 pair of DDP jobs on two H200s got 27.6/62.3 % of a job alone. Waiting with the lease
 * and no work queued, the GPU is idle for that moment instead, charged to no one, and the pod's
 * ranks start, and hand over, together. The lease is touched meanwhile: a holder that seems to
 * have stopped loses it. */
void vgpu_gang_acquire(struct paced_device *state, int entry) {
    if (entry < 0 || entry >= 64) {
        vgpu_lease_acquire(state->lease, state->urgent);
        return;
    }
    say_waiting(entry, true);
    vgpu_lease_acquire(state->lease, state->urgent);
    say_waiting(entry, false);
    _Atomic uint64_t *waiting = &vgpu_state.region->gang_waiting;
    uint64_t others = ~(1ULL << entry);
    uint64_t stuck = atomic_load(waiting) & others; /* set all along so far */
    uint64_t began = vgpu_monotonic_ns();
    uint64_t now = began;
    /* A lease taken back or a yield asked meanwhile is seen at the epoch's first launches. */
    while (stuck != 0 && now - began < VGPU_GANG_START_MAX_NS) {
        vgpu_lease_touch(state->lease, now);
        vgpu_compute_pause(20000);
        now = vgpu_monotonic_ns();
        uint64_t set = atomic_load(waiting) & others;
        stuck &= set;
        if (set == 0) {
            break;
        }
    }
    if (stuck != 0 && now - began >= VGPU_GANG_START_MAX_NS) {
        /* Set the whole wait: a rank killed while it waited for its lease left its bit, and
         * every start would wait the whole time for it. A live rank that still waits sets its
         * bit again at its next wait: cleared, only this start goes without it. */
        atomic_fetch_and(waiting, ~stuck);
    }
    state->stats.gang_start_ns += now - began;
}

struct vgpu_gang_decision vgpu_gang_until(uint64_t *seq, unsigned *late, uint64_t now,
                                          struct vgpu_gang_decision (*decide)(void *,
                                                                              uint64_t *now),
                                          void *context) {
    _Atomic uint64_t *gate = &vgpu_state.region->gang_gate;
    uint64_t word = atomic_load(gate);
    struct vgpu_gang_decision decision = {0, false};
    switch (vgpu_gang_read(word, *seq, now, vgpu_state.started_ns, &decision)) {
    case VGPU_GANG_FOLLOW:
        *late = 0;
        return decision;
    case VGPU_GANG_LATE:
        /* A rank that lags is no rank astray: counted as such, a rank a few collectives behind
         * (whose leader decides each collective, most without a pause, so that the gate is
         * always ahead of it) took the gate's number and paused at other collectives than the
         * others, whose collectives then spun through its pauses, charged: a DDP job at 50 % on
         * two H200s ran at 2 % of its speed. It still ends its epoch where the decider ended
         * its own, which the gate may no longer say. */
        *late = 0;
        decision.handover = vgpu_gang_read(atomic_load(&vgpu_state.region->gang_handover), *seq,
                                           now, vgpu_state.started_ns,
                                           &decision) == VGPU_GANG_FOLLOW;
        decision.until_ns = 0;
        return decision;
    case VGPU_GANG_ASTRAY:
        if (++*late >= VGPU_GANG_RESYNC) {
            *seq += (word - *seq) & ((1ULL << VGPU_GANG_SEQ_BITS) - 1);
            *late = 0;
            vgpu_log(VGPU_LOG_DEBUG, "collectives: this rank's count was astray; it takes the "
                                     "gang's number %llu", (unsigned long long)*seq);
        }
        return decision;
    case VGPU_GANG_DECIDE:
        *late = 0;
        break;
    }
    decision = decide(context, &now);
    if (decision.handover) {
        atomic_store(&vgpu_state.region->gang_handover, vgpu_gang_pack(*seq, decision));
    }
    /* Published unless another rank decided this collective (or a later one) meanwhile; a word
     * about an earlier one is replaced. */
    for (int attempt = 0; attempt < 8; attempt++) {
        if (atomic_compare_exchange_strong(gate, &word, vgpu_gang_pack(*seq, decision))) {
            return decision;
        }
        struct vgpu_gang_decision theirs = {0, false};
        switch (vgpu_gang_read(word, *seq, now, vgpu_state.started_ns, &theirs)) {
        case VGPU_GANG_FOLLOW:
            /* Its epoch already ended, if the rank's own decision said so. */
            theirs.handover = theirs.handover || decision.handover;
            return theirs;
        case VGPU_GANG_LATE:
        case VGPU_GANG_ASTRAY:
            /* The gang is past this collective already: no pause alone here (the peers'
             * collectives would spin through it); its epoch ended, if the decision said so. */
            return (struct vgpu_gang_decision){0, decision.handover};
        case VGPU_GANG_DECIDE:
            break;
        }
    }
    return decision;
}

/* --- one pause for all the pod's ranks ------------------------------------------------------ */

bool vgpu_gang_member(const struct paced_device *state, uint64_t now) {
    return state->collective_ns != 0 && now - state->collective_ns < VGPU_GANG_HOLD_NS;
}

struct gang_decision {
    struct paced_device *state;
    int entry;
};

/* The longest wait among the buckets of the pod's GPUs that ran a collective lately: every
 * rank pauses that long, so that all are out of debt after (each rank's whole debt: a pause
 * bounded by the bucket's 100 ms left debt that made ranks pause mid-step). Other GPUs' buckets
 * are read, not refilled, at their hard limits (their burst is not known here). */
static uint64_t gang_wait(struct paced_device *state, int own, uint64_t now) {
    uint64_t longest = 0;
    uint32_t count = atomic_load(&vgpu_state.region->device_count);
    for (uint32_t i = 0; i < count && i < VGPU_REGION_MAX_DEVICES; i++) {
        struct vgpu_region_device *device = &vgpu_state.region->devices[i];
        uint64_t seen = atomic_load(&device->compute_state[VGPU_COMPUTE_COLLECTIVE_NS]);
        if ((int)i != own &&
            (seen > now + GANG_CLOCK_SLACK_NS || seen + VGPU_GANG_HOLD_NS <= now)) {
            continue;
        }
        struct vgpu_pace pace = (int)i == own ? vgpu_compute_pace(state, own)
                                              : vgpu_compute_hard_pace((int)i);
        pace.gang = true;
        int64_t balance = (int)i == own
                              ? vgpu_bucket_refill(device, pace, now, &state->stats.capped_ns)
                              : vgpu_bucket_peek(device, pace, now);
        uint64_t wait = vgpu_gang_wait_ns(balance, pace.rate);
        longest = wait > longest ? wait : longest;
    }
    return longest < GANG_MIN_PAUSE_NS ? 0 : longest;
}

/* The first rank at a collective decides. Its epoch ends here when it has had its quantum (a
 * hand-over: every rank's ends here too, so that another pod's ranks get all the GPUs at once)
 * or when any bucket is in debt (its GPU time is then in its bucket, and the wait is read
 * again). */
static struct vgpu_gang_decision decide_gang_pause(void *context, uint64_t *now) {
    struct gang_decision *decision = context;
    struct paced_device *state = decision->state;
    uint64_t wait = gang_wait(state, decision->entry, *now);
    bool handover = state->open && (wait > 0 || state->done_ns >= QUANTUM_NS);
    if (handover) {
        state->stats.gang++;
        vgpu_epoch_close(state, true);
        *now = vgpu_monotonic_ns();
        wait = gang_wait(state, decision->entry, *now);
    }
    return (struct vgpu_gang_decision){*now + wait, handover || wait > 0};
}

void vgpu_gang_lost(struct paced_device *state, uint64_t now) {
    if (!vgpu_gang_member(state, now) || state->lease == NULL ||
        !(vgpu_lease_held_by_other_pod(state->lease) ||
          vgpu_lease_wanted_by_other_pod(state->lease, now))) {
        return; /* a process of the pod took it: the pod keeps its GPUs */
    }
    _Atomic uint64_t *lost = &vgpu_state.region->gang_lost_ns;
    uint64_t seen = atomic_load(lost);
    while ((seen < now || seen > now + VGPU_GANG_HOLD_NS) &&
           !atomic_compare_exchange_weak(lost, &seen, now)) {
    }
}

/* Whether another rank of the pod lost its lease to another pod since `opened_ns`: a time in
 * the future, or older than VGPU_GANG_HOLD_NS, is a scribble or another boot's, and ignored. */
static bool gang_lost_since(uint64_t opened_ns, uint64_t now) {
    uint64_t lost = atomic_load(&vgpu_state.region->gang_lost_ns);
    return lost > opened_ns && lost <= now && now - lost < VGPU_GANG_HOLD_NS;
}

/* Before a collective's kernel, under the device's lock (let go while pausing): the pod's
 * decision for this collective, taken. */
void vgpu_gang_pause(struct paced_device *state, int entry) {
    uint64_t now = vgpu_monotonic_ns();
    if (state->open && gang_lost_since(state->opened_ns, now)) {
        state->stats.gang++; /* another rank's lease was taken during this epoch */
        vgpu_epoch_close(state, true);
        now = vgpu_monotonic_ns();
    }
    state->collective_ns = now;
    struct vgpu_region_device *device = &vgpu_state.region->devices[entry];
    atomic_store(&device->compute_state[VGPU_COMPUTE_COLLECTIVE_NS], now);
    struct gang_decision context = {state, entry};
    ++state->collectives;
    struct vgpu_gang_decision decision = vgpu_gang_until(
        &state->collectives, &state->gang_late, now, decide_gang_pause, &context);
    now = vgpu_monotonic_ns();
    bool pause = decision.until_ns > now + GANG_MIN_PAUSE_NS;
    if (state->open && (pause || decision.handover)) {
        /* A follower's epoch: ends where the decider's did, its work so far done first. */
        state->stats.gang++;
        vgpu_epoch_close(state, true);
        now = vgpu_monotonic_ns();
    }
    if (!pause) {
        return;
    }
    vgpu_lock_give(&state->lock);
    uint64_t paused = 0;
    if (decision.until_ns > now) {
        vgpu_compute_pause(decision.until_ns - now);
        paused = vgpu_monotonic_ns() - now;
        atomic_fetch_add_explicit(&device->throttled_ns, paused, memory_order_relaxed);
    }
    vgpu_lock_take(&state->lock);
    state->stats.paused_ns += paused;
}

/* The GPU time an epoch runs before it ends for its quantum. The epochs of a process that runs
 * collectives end at a collective instead (decide_gang_pause), up to twice as long: there all
 * the pod's ranks end theirs together. Ended mid-step, one rank's GPU went to another pod a few
 * milliseconds before the other's, and each pod's collectives spun that long at every
 * hand-over, charged: a 30/70 pair of DDP jobs on two H200s got 24.6/58.9 % of a job alone. */
uint64_t vgpu_gang_quantum(const struct paced_device *state, uint64_t now) {
    return vgpu_gang_member(state, now) ? 2 * QUANTUM_NS : QUANTUM_NS;
}

/* Whether a new epoch of a process that runs collectives starts without waiting for the
 * bucket (its debt is paid before its next collective); sets the epoch's pace when it does. */
bool vgpu_gang_defers(struct paced_device *state, int entry, uint64_t *capped) {
    uint64_t now = vgpu_monotonic_ns(); /* after the drains and closes before it */
    if (!vgpu_gang_member(state, now)) {
        return false;
    }
    state->pace = vgpu_compute_pace(state, entry);
    state->pace.gang = true;
    return vgpu_bucket_refill(&vgpu_state.region->devices[entry], state->pace, now, capped) >
           -(int64_t)GANG_DEBT_MAX_NS;
}
