/* Real reads of the paced launches' clock (paced_clock.h): each one checks the counter's
 * extrapolation against CLOCK_MONOTONIC and measures its rate. */
#define _GNU_SOURCE
#include "paced_clock.h"

#include <time.h>

/* How long after a real read the counter stands for the clock. Two launches' clock reads in a
 * hundred on an H100 (a paced launch every ~4 µs) are real; between them an error in the rate
 * of 1e-5 (a rate measured over CALIBRATE_NS from reads ~20 ns apart) is 1 ns. */
#define SPAN_NS 100000ULL
/* The rate is measured over at least this long, and from a newer read after RATE_AGE_NS: a
 * counter whose rate moves (a virtual machine moved to another host) is followed within it. */
#define CALIBRATE_NS 2000000ULL
#define RATE_AGE_NS 1000000000ULL
/* A real read within CHECK_SPANS spans of the base checks the extrapolation to it: more than
 * MISS_NS off, MISSES times, and the counter is not used again in this process. */
#define CHECK_SPANS 4
#define MISS_NS 1000
#define MISSES 3
/* A real read whose counter moved more than this meanwhile was interrupted (before the rate is
 * known: that many ticks, 20 µs at 3 GHz). */
#define SLOW_READ_NS 1000
#define FIRST_SLOW_READ_TICKS 65536

static void drop_counter(struct vgpu_paced_clock *clock, struct vgpu_counter_rate *rate) {
    rate->misses = MISSES;
    clock->span_ticks = 0;
}

/* Whether the counter kept time with the clock from the base to (`ticks`, `now_ns`), where that
 * can be said. */
static int kept_time(const struct vgpu_paced_clock *clock, uint64_t ticks, uint64_t now_ns) {
    if ((int64_t)(ticks - clock->base_ticks) < 0) {
        return 0; /* went back: another CPU's counter, not synchronized with this one's */
    }
    uint64_t since = ticks - clock->base_ticks;
    if (clock->span_ticks == 0 || since >= CHECK_SPANS * clock->span_ticks) {
        return 1; /* no rate yet, or too long ago for the rate's error to stay small */
    }
    uint64_t predicted = clock->base_ns + ((since * clock->ns_per_tick) >> 32);
    uint64_t error = predicted > now_ns ? predicted - now_ns : now_ns - predicted;
    return error <= MISS_NS;
}

uint64_t vgpu_paced_clock_rebase(struct vgpu_paced_clock *clock, struct vgpu_counter_rate *rate,
                                 uint64_t ticks, uint64_t now_ns) {
    if (ticks == 0 || rate->misses >= MISSES) {
        clock->span_ticks = 0; /* no counter, or one that did not keep time */
        return now_ns;
    }
    if (clock->base_ns != 0 && !kept_time(clock, ticks, now_ns) && ++rate->misses >= MISSES) {
        drop_counter(clock, rate);
        return now_ns;
    }
    if (rate->anchor_ns == 0 || ticks <= rate->anchor_ticks || now_ns <= rate->anchor_ns) {
        rate->anchor_ticks = ticks; /* the first read, or a counter that went back */
        rate->anchor_ns = now_ns;
        clock->span_ticks = 0;
    } else if (now_ns - rate->anchor_ns >= CALIBRATE_NS) {
        double ns_per_tick =
            (double)(now_ns - rate->anchor_ns) / (double)(ticks - rate->anchor_ticks);
        if (ns_per_tick > 1e-3 && ns_per_tick < 1e3) { /* 1 MHz to 1 THz */
            clock->ns_per_tick = (uint64_t)(ns_per_tick * 4294967296.0);
            clock->span_ticks = (uint64_t)((double)SPAN_NS / ns_per_tick);
        } else {
            drop_counter(clock, rate);
        }
        if (now_ns - rate->anchor_ns >= RATE_AGE_NS) {
            rate->anchor_ticks = ticks;
            rate->anchor_ns = now_ns;
        }
    }
    clock->base_ticks = ticks;
    clock->base_ns = now_ns;
    return now_ns;
}

__attribute__((cold, noinline)) uint64_t vgpu_paced_clock_read(struct vgpu_paced_clock *clock,
                                                              struct vgpu_counter_rate *rate) {
    uint64_t before = vgpu_counter_ticks();
    struct timespec clock_now;
    clock_gettime(CLOCK_MONOTONIC, &clock_now);
    uint64_t after = vgpu_counter_ticks();
    uint64_t now = (uint64_t)clock_now.tv_sec * 1000000000ULL + (uint64_t)clock_now.tv_nsec;
    /* A read that took long (the thread descheduled between the counter and the clock) pairs
     * the counter with another time: the base stays, and the next read is real again. */
    uint64_t slow = clock->span_ticks != 0 ? clock->span_ticks / (SPAN_NS / SLOW_READ_NS)
                                           : FIRST_SLOW_READ_TICKS;
    if (after - before > slow) {
        return now;
    }
    return vgpu_paced_clock_rebase(clock, rate, before + (after - before) / 2, now);
}
