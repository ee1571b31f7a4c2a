/* Real reads of the paced launches' clock (paced_clock.h): each one checks the counter's
 * extrapolation against CLOCK_MONOTONIC and measures its rate. */
#define _GNU_SOURCE
#include "paced_clock.h"

#include <stdatomic.h>
#include <sys/prctl.h>
#include <time.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

/* How long after a real read the counter stands for the clock. Two launches' clock reads in a
 * hundred on an H100 (a paced launch every ~4 µs) are real; between them an error in the rate
 * of 5e-4 (the first rate, measured over CALIBRATE_NS from reads SLOW_READ_NS wide at most) is
 * 50 ns, and of 1e-6 (the rate over a second) 0.1 ns. */
#define SPAN_NS 100000ULL
/* The rate is measured over at least this long, and from a newer read after RATE_AGE_NS: a
 * counter whose rate drifts a little is followed. One that moves more (a virtual machine moved
 * to another host) misses, and is measured again from scratch. */
#define CALIBRATE_NS 2000000ULL
#define RATE_AGE_NS 1000000000ULL
/* A real read checks the extrapolation to it: within CHECK_SPANS spans of the base it may be at
 * most MISS_NS off, further away at most GAP_TOLERANCE of the time since (the rate's error).
 * MISSES misses, and the counter is not used again in this process. */
#define CHECK_SPANS 4
#define MISS_NS 1000
#define GAP_TOLERANCE 2e-4
#define MISSES VGPU_CLOCK_MISSES
/* A real read brackets the counter between two reads of the clock, and pairs the counter with
 * their midpoint, at most half the width off: wider than this (the thread descheduled, an
 * interrupt), the pair is not used. SLOW_READS such reads in a row (a clock that is a slow
 * system call here) and the counter is not used again. At 200 ns the reads right after a real
 * driver's launch (its caches cold) were too wide on an H100's host, and the counter went
 * unused. */
#define SLOW_READ_NS 1000
#define SLOW_READS 16

static uint64_t clock_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

/* Whether this process may read the counter: on x86-64 an invariant TSC (its rate fixed through
 * power states), and one that the process has not made trap (PR_SET_TSC, as sandboxes do).
 * Asked at the first real read and again every RATE_AGE_NS. */
static bool counter_allowed(void) {
#if defined(__x86_64__)
    static _Atomic int invariant; /* 0: not asked yet; 1: yes; 2: no */
    int known = atomic_load_explicit(&invariant, memory_order_relaxed);
    if (known == 0) {
        unsigned a, b, c, d;
        bool yes = __get_cpuid(0x80000007, &a, &b, &c, &d) && (d & (1u << 8)) != 0;
        known = yes ? 1 : 2;
        atomic_store_explicit(&invariant, known, memory_order_relaxed);
    }
    int tsc = PR_TSC_ENABLE;
    return known == 1 && (prctl(PR_GET_TSC, &tsc, 0, 0, 0) != 0 || tsc == PR_TSC_ENABLE);
#else
    return vgpu_counter_ticks() != 0;
#endif
}

static void drop_counter(struct vgpu_paced_clock *clock, struct vgpu_counter_rate *rate) {
    rate->misses = MISSES;
    clock->span_ticks = 0;
}

/* Whether the counter kept time with the clock from the base to (`ticks`, `now_ns`), as far as
 * the rate known says. */
static bool kept_time(const struct vgpu_paced_clock *clock, uint64_t ticks, uint64_t now_ns) {
    if ((int64_t)(ticks - clock->base_ticks) < 0 || now_ns < clock->base_ns) {
        return false; /* went back: another CPU's counter, not synchronized with this one's */
    }
    if (clock->span_ticks == 0) {
        return true; /* no rate yet */
    }
    uint64_t since = ticks - clock->base_ticks;
    uint64_t elapsed = now_ns - clock->base_ns;
    double predicted;
    if (since < CHECK_SPANS * clock->span_ticks) {
        predicted = (double)((since * clock->ns_per_tick) >> 32);
        return predicted - (double)elapsed <= MISS_NS && (double)elapsed - predicted <= MISS_NS;
    }
    /* A gap (no launch for a while): the rate's error grows with it, a jump does not. */
    predicted = (double)since * (double)clock->ns_per_tick / 4294967296.0;
    double tolerance = GAP_TOLERANCE * (double)elapsed;
    tolerance = tolerance > MISS_NS ? tolerance : MISS_NS;
    return predicted - (double)elapsed <= tolerance && (double)elapsed - predicted <= tolerance;
}

static void anchor_at(struct vgpu_paced_clock *clock, struct vgpu_counter_rate *rate,
                      uint64_t ticks, uint64_t now_ns) {
    rate->anchor_ticks = ticks;
    rate->anchor_ns = now_ns;
    clock->span_ticks = 0; /* until the rate is measured again */
}

uint64_t vgpu_paced_clock_rebase(struct vgpu_paced_clock *clock, struct vgpu_counter_rate *rate,
                                 uint64_t ticks, uint64_t now_ns) {
    if (ticks == 0 || rate->misses >= MISSES) {
        clock->span_ticks = 0; /* no counter, or one that did not keep time */
        return now_ns;
    }
    if (clock->base_ns != 0 && !kept_time(clock, ticks, now_ns)) {
        if (++rate->misses >= MISSES) {
            drop_counter(clock, rate);
            return now_ns;
        }
        anchor_at(clock, rate, ticks, now_ns); /* nothing measured across the miss */
    } else if (rate->anchor_ns == 0) {
        anchor_at(clock, rate, ticks, now_ns); /* the first read */
    } else if (now_ns - rate->anchor_ns >= CALIBRATE_NS) {
        double ns_per_tick =
            (double)(now_ns - rate->anchor_ns) / (double)(ticks - rate->anchor_ticks);
        if (!(ns_per_tick > 1e-3 && ns_per_tick < 1e3)) { /* 1 MHz to 1 THz */
            drop_counter(clock, rate);
            return now_ns;
        }
        clock->ns_per_tick = (uint64_t)(ns_per_tick * 4294967296.0);
        clock->span_ticks = (uint64_t)((double)SPAN_NS / ns_per_tick);
        if (now_ns - rate->anchor_ns >= RATE_AGE_NS) {
            rate->anchor_ticks = ticks; /* the rate keeps what it measured until then */
            rate->anchor_ns = now_ns;
        }
    }
    clock->base_ticks = ticks;
    clock->base_ns = now_ns;
    return now_ns;
}

__attribute__((cold, noinline)) uint64_t vgpu_paced_clock_read(struct vgpu_paced_clock *clock,
                                                              struct vgpu_counter_rate *rate) {
    if (rate->misses >= MISSES) {
        return clock_ns(); /* the counter dropped: the clock alone */
    }
    if (rate->anchor_ns == 0 || clock_ns() - rate->anchor_ns >= RATE_AGE_NS) {
        if (!counter_allowed()) {
            drop_counter(clock, rate);
            return clock_ns();
        }
    }
    uint64_t before = clock_ns();
    uint64_t ticks = vgpu_counter_ticks();
    uint64_t after = clock_ns();
    if (after - before > SLOW_READ_NS) {
        if (++rate->slow_reads >= SLOW_READS) {
            drop_counter(clock, rate);
        }
        return after;
    }
    rate->slow_reads = 0;
    return vgpu_paced_clock_rebase(clock, rate, ticks, before + (after - before) / 2);
}
