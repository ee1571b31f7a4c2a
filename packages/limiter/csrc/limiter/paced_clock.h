/* The clock a paced launch reads: CLOCK_MONOTONIC, extrapolated from the CPU's own counter (the
 * TSC on x86-64, the generic timer on Arm) for a short span after each real read. Every paced
 * launch reads the time once; clock_gettime through the vDSO, with its sequence-counter loop
 * and scaling, cost a launch of empty kernels on an H100 about 20 ns of the ~170 its paced path
 * took, a counter read and one multiplication a few.
 *
 * The counter only stands for the clock between real reads, at most SPAN_NS apart
 * (paced_clock.c), and each real read checks the extrapolation: a counter that does not keep
 * time with the clock (not invariant, not synchronized across the CPUs a thread runs on, made
 * to trap) is dropped for good after a few misses, and every read is then a real one. A time it
 * gives may be up to a microsecond behind or ahead of a real read made next to it, so a
 * difference between the two is taken with vgpu_elapsed (lease.h), never a bare subtraction.
 * One per paced device, under its lock. */
#ifndef VGPU_LIMITER_PACED_CLOCK_H
#define VGPU_LIMITER_PACED_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

/* What a launch reads: in the paced device state's launch lines. */
struct vgpu_paced_clock {
    uint64_t base_ticks;  /* the counter at the last real read */
    uint64_t base_ns;     /* CLOCK_MONOTONIC then */
    uint64_t span_ticks;  /* counter ticks within which it stands for the clock; 0: none */
    uint64_t ns_per_tick; /* 32.32 fixed point */
};

/* What only real reads use: the counter's rate, measured between two of them. */
struct vgpu_counter_rate {
    uint64_t anchor_ticks, anchor_ns; /* the real read the rate is measured from */
    unsigned misses;     /* real reads that the extrapolation missed (paced_clock.c) */
    unsigned slow_reads; /* real reads in a row too wide to pair the counter with the clock */
};

/* Real reads that missed the extrapolation (paced_clock.c) after which the counter is not used
 * again. */
#define VGPU_CLOCK_MISSES 3

/* Whether the counter is still in use (or its rate being measured), not dropped. */
static inline bool vgpu_paced_clock_counting(const struct vgpu_counter_rate *rate) {
    return rate->misses < VGPU_CLOCK_MISSES;
}

/* The CPU's counter, or 0 where there is none this code knows. */
static inline uint64_t vgpu_counter_ticks(void) {
#if defined(__x86_64__)
    return __rdtsc();
#elif defined(__aarch64__)
    uint64_t ticks;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(ticks));
    return ticks;
#else
    return 0;
#endif
}

/* Read the clock for real, and measure the counter against it (paced_clock.c). */
uint64_t vgpu_paced_clock_read(struct vgpu_paced_clock *clock, struct vgpu_counter_rate *rate);
/* A real read's logic at counter `ticks` and clock `now_ns` (the tests drive it): checks the
 * extrapolation against the clock, measures the rate, moves the base; answers `now_ns`. */
uint64_t vgpu_paced_clock_rebase(struct vgpu_paced_clock *clock, struct vgpu_counter_rate *rate,
                                 uint64_t ticks, uint64_t now_ns);

/* Where the counter stands for the clock at `ticks`: the time it gives, else 0. */
static inline uint64_t vgpu_paced_clock_extrapolate(const struct vgpu_paced_clock *clock,
                                                    uint64_t ticks) {
    uint64_t since = ticks - clock->base_ticks; /* a counter behind the base wraps: past span */
    if (__builtin_expect(since < clock->span_ticks, 1)) {
        return clock->base_ns + ((since * clock->ns_per_tick) >> 32);
    }
    return 0;
}

static inline uint64_t vgpu_paced_now(struct vgpu_paced_clock *clock,
                                      struct vgpu_counter_rate *rate) {
    uint64_t now = vgpu_paced_clock_extrapolate(clock, vgpu_counter_ticks());
    return __builtin_expect(now != 0, 1) ? now : vgpu_paced_clock_read(clock, rate);
}

#endif
