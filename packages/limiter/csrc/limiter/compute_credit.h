/* A thread's credit of paced launches (compute.c only). A launch that went the whole paced path
 * in an open epoch, with room, lets its thread make its next few launches on the same stream
 * and context without it: no lock, no clock, no look at the epoch. Each such launch costs a load
 * of the device state's generation and a read of the CPU's counter, where the whole path cost
 * 150-230 ns on an H100's host (docs/limiter.md), most of it cache misses the driver's own
 * launch leaves behind. The thread's next whole launch on the device, or its next
 * synchronization, counts them into the epoch.
 *
 * The credit holds while:
 * - the epoch it was given in goes on on that stream: the device state's generation moves first
 *   thing at every epoch's end (its quantum, a lost lease, a freeze, a yield, a pause), stream
 *   switch and stream's destruction, and when the events go, so the marker each of those records
 *   comes after the credit's launches;
 * - the thread launches again soon: each launch within GAP_TICKS of the one before (20 µs at
 *   1 GHz, less on faster counters): a launch after a gap goes the whole way, which sees whether
 *   the GPU ran dry (note_gap);
 * - for CREDIT_LAUNCHES launches, while the epoch's kernels are CREDIT_KERNEL_NS or less on
 *   average: what they queue (about 0.35 ms of GPU time) is well within the backlog and a
 *   marker's 0.5 ms, and a lease lost meanwhile is seen that much later per thread (a look
 *   every 50 µs sees it no sooner).
 * Until CREDIT_SPAN_NS after the credit was given, the epoch knows launches not counted yet may
 * come (credited_until_ns): its end and a stream switch record a marker even with none counted
 * since the last, and no launch of another thread takes the GPU for idle (note_gap).
 * A freeze is still seen at every launch (hold_while_frozen, before). A launch that raced with
 * another thread's end of the epoch (the generation read just before it moved) runs in no epoch:
 * one short kernel at most per thread. A thread that ends with launches not counted leaves them
 * measured (its markers cover them) but not counted: the estimate of a kernel's length reads a
 * little long. Where no suitable counter exists (not x86-64), there is no credit: every launch
 * goes the whole way. */
#ifndef VGPU_LIMITER_COMPUTE_CREDIT_H
#define VGPU_LIMITER_COMPUTE_CREDIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "compute_epochs.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#define VGPU_CREDIT 1
#define CREDIT_COUNTER() __rdtsc()
#else
#define VGPU_CREDIT 0
#define CREDIT_COUNTER() 0ULL
#endif

#define CREDIT_LAUNCHES 7
#define CREDIT_KERNEL_NS 50000ULL
/* 20 µs at 1 GHz; every invariant TSC runs faster (at the CPU's base clock). */
#define GAP_TICKS 20000ULL
/* How long after the launch that gave it a credit's launches may come, at most. */
#define CREDIT_SPAN_NS (CREDIT_LAUNCHES * GAP_TICKS)
/* A thread keeps a credit per device (by ordinal, these many): one that launches on several
 * GPUs in turn counts its launches on each. */
#define CREDIT_SLOTS 8

struct launch_credit {
    struct paced_device *state; /* NULL: none */
    CUstream stream;
    CUcontext context;
    uint32_t generation;
    unsigned left;  /* launches it may still make */
    unsigned made;  /* launches made through it, not yet counted in the epoch */
    uint64_t ticks; /* the counter at the newest launch */
};

/* initial-exec: a preloaded library has static TLS (compute.c's cached_device says why). */
static __thread __attribute__((tls_model("initial-exec"))) struct launch_credit
    credits[CREDIT_SLOTS];

static inline struct launch_credit *credit_of(int ordinal) {
    return &credits[(unsigned)ordinal % CREDIT_SLOTS];
}

/* Whether this launch may go without the paced path: then it is counted as made. */
static inline bool credit_serves(int ordinal, struct paced_device *state, CUstream stream,
                                 CUcontext context) {
    struct launch_credit *credit = credit_of(ordinal);
    if (!VGPU_CREDIT || credit->left == 0 || credit->state != state ||
        credit->stream != stream || credit->context != context ||
        atomic_load_explicit(&state->generation, memory_order_acquire) != credit->generation) {
        return false;
    }
    uint64_t now = CREDIT_COUNTER();
    if (now - credit->ticks > GAP_TICKS) {
        return false;
    }
    credit->ticks = now;
    credit->left--;
    return true;
}

/* After a launch the credit let through: a failed one is not counted, and ends the credit. */
static inline void credit_launched(int ordinal, CUresult result) {
    struct launch_credit *credit = credit_of(ordinal);
    if (result == CUDA_SUCCESS) {
        credit->made++;
    } else {
        credit->left = 0;
    }
}

/* Under the device's lock, before the paced path or a synchronization's marker: the launches
 * the thread made on credit are the epoch's, when it is the one they were made in (else its end
 * covered them with its last marker, and they count no more). True when they were made up to a
 * moment ago: no gap before this launch. The credit is spent either way. */
static inline bool credit_fold(int ordinal, struct paced_device *state) {
    struct launch_credit *credit = credit_of(ordinal);
    bool recent = false;
    if (credit->state == state && credit->made > 0) {
        if (atomic_load_explicit(&state->generation, memory_order_relaxed) ==
            credit->generation) {
            state->unmarked += credit->made;
            state->launches += credit->made;
            state->queued += credit->made;
            state->stats.credited += credit->made;
            recent = CREDIT_COUNTER() - credit->ticks <= GAP_TICKS;
        }
        credit->made = 0;
    }
    credit->left = 0;
    return recent;
}

/* Under the device's lock, after a launch that went the paced path in the open epoch: the
 * next few of the thread's, when the epoch's kernels are short and known to be. */
static inline void credit_give(int ordinal, struct paced_device *state, CUstream stream,
                               CUcontext context, CUresult result) {
    if (!VGPU_CREDIT || result != CUDA_SUCCESS || !state->open || state->blocking ||
        !state->estimated || state->kernel_ns > CREDIT_KERNEL_NS || state->stream != stream) {
        return;
    }
    struct launch_credit *credit = credit_of(ordinal);
    *credit = (struct launch_credit){
        .state = state,
        .stream = stream,
        .context = context,
        .generation = atomic_load_explicit(&state->generation, memory_order_relaxed),
        .left = CREDIT_LAUNCHES,
        .ticks = CREDIT_COUNTER(),
    };
    uint64_t until = state->last_launch_ns + CREDIT_SPAN_NS;
    state->credited_until_ns = until > state->credited_until_ns ? until : state->credited_until_ns;
}

#endif
