/* The paced launches' clock (paced_clock.h, paced_clock.c): a counter of a known rate, driven
 * through real reads by hand, stands for the clock only within its span after each, only once
 * its rate is measured, and is dropped for good after a few extrapolations that missed the
 * clock (a counter of another rate, one that goes back); then, with the CPU's own counter, every
 * time the clock gives lies between real reads of CLOCK_MONOTONIC around it. Built with its
 * source under ASan/UBSan (nox -s sanitize) and plainly by the test suite. Prints "N passed, M
 * failed" and exits non-zero on failure. */
#define _GNU_SOURCE
#include "paced_clock.h"
#include "unit_check.h"

#include <stdio.h>
#include <time.h>

#define START_NS 5000000000ULL
#define TICKS_PER_NS 3 /* a 3 GHz counter */

/* A real read at `ns`, with the counter at `ticks`. */
static void read_at(struct vgpu_paced_clock *clock, struct vgpu_counter_rate *rate, uint64_t ns,
                    uint64_t ticks) {
    CHECK(vgpu_paced_clock_rebase(clock, rate, ticks, ns) == ns);
}

static uint64_t ticks_at(uint64_t ns) {
    return 1000 + (ns - START_NS) * TICKS_PER_NS;
}

static void near(uint64_t value, uint64_t expected, uint64_t within, int line) {
    uint64_t off = value > expected ? value - expected : expected - value;
    check(off <= within, line, "within");
    if (off > within) {
        fprintf(stderr, "  %llu against %llu\n", (unsigned long long)value,
                (unsigned long long)expected);
    }
}

static void measured_rate(void) {
    struct vgpu_paced_clock clock = {0};
    struct vgpu_counter_rate rate = {0};
    CHECK(vgpu_paced_clock_extrapolate(&clock, 12345) == 0); /* nothing known: a real read */
    read_at(&clock, &rate, START_NS, ticks_at(START_NS));
    CHECK(clock.span_ticks == 0); /* one read says nothing of the rate */
    read_at(&clock, &rate, START_NS + 1000000, ticks_at(START_NS + 1000000));
    CHECK(clock.span_ticks == 0); /* 1 ms: too short to measure it over */
    uint64_t base = START_NS + 2000000;
    read_at(&clock, &rate, base, ticks_at(base));
    near(clock.span_ticks, 100000 * TICKS_PER_NS, 2, __LINE__);
    near(vgpu_paced_clock_extrapolate(&clock, ticks_at(base + 50000)), base + 50000, 1, __LINE__);
    near(vgpu_paced_clock_extrapolate(&clock, ticks_at(base + 99990)), base + 99990, 1, __LINE__);
    CHECK(vgpu_paced_clock_extrapolate(&clock, ticks_at(base)) == base);
    CHECK(vgpu_paced_clock_extrapolate(&clock, ticks_at(base + 100001)) == 0); /* past the span */
    CHECK(vgpu_paced_clock_extrapolate(&clock, ticks_at(base) - 1) == 0); /* behind the base */
    /* Real reads at the ends of spans go on, and it keeps standing for the clock. */
    for (uint64_t ns = base + 100000; ns < base + 3000000000ULL; ns += 100000) {
        read_at(&clock, &rate, ns, ticks_at(ns));
    }
    CHECK(rate.misses == 0);
    CHECK(clock.span_ticks != 0);
    near(vgpu_paced_clock_extrapolate(&clock, clock.base_ticks + 30000), clock.base_ns + 10000, 1,
         __LINE__);
    /* A long pause, then launches again: no check across it, the span as before. */
    uint64_t later = clock.base_ns + 60000000000ULL;
    read_at(&clock, &rate, later, ticks_at(later));
    CHECK(rate.misses == 0 && clock.span_ticks != 0);
}

/* Reads every `step` ns of the clock, the counter running at `ticks_per_ns`; how many until it
 * was dropped (0: never, in `reads`). */
static int dropped_after(double ticks_per_ns, uint64_t step, int reads) {
    struct vgpu_paced_clock clock = {0};
    struct vgpu_counter_rate rate = {0};
    for (uint64_t ns = START_NS; ns <= START_NS + 3000000; ns += 100000) {
        read_at(&clock, &rate, ns, ticks_at(ns)); /* measured at 3 GHz */
    }
    uint64_t ns = clock.base_ns, ticks = clock.base_ticks;
    for (int i = 1; i <= reads; i++) {
        ns += step;
        ticks += (uint64_t)((double)step * ticks_per_ns);
        read_at(&clock, &rate, ns, ticks);
        if (clock.span_ticks == 0) {
            /* Dropped for good: a counter that keeps time again is not taken back. */
            for (int j = 0; j < 100; j++) {
                ns += 100000;
                ticks += 100000 * TICKS_PER_NS;
                read_at(&clock, &rate, ns, ticks);
                CHECK(clock.span_ticks == 0);
                CHECK(vgpu_paced_clock_extrapolate(&clock, ticks + 1) == 0);
            }
            return i;
        }
    }
    return 0;
}

static void missed_extrapolations(void) {
    CHECK(dropped_after(3.0, 100000, 1000) == 0);
    /* 5 % slow over a span: the extrapolation misses by 5 µs, three times, and it is dropped. */
    CHECK(dropped_after(2.85, 100000, 1000) == 3);
    /* A rate that moved a little (1 ns in a span) is followed as it is measured again. */
    CHECK(dropped_after(3.00003, 100000, 5000) == 0);
}

static void counter_that_goes_back(void) {
    struct vgpu_paced_clock clock = {0};
    struct vgpu_counter_rate rate = {0};
    uint64_t ns = START_NS;
    for (; ns <= START_NS + 3000000; ns += 100000) {
        read_at(&clock, &rate, ns, ticks_at(ns));
    }
    CHECK(clock.span_ticks != 0);
    /* Each read on a CPU whose counter is 1 ms behind, then on the first again. */
    for (int i = 0; i < 3; i++) {
        ns += 100000;
        read_at(&clock, &rate, ns, ticks_at(ns) - 3000000);
        ns += 100000;
        read_at(&clock, &rate, ns, ticks_at(ns));
    }
    CHECK(rate.misses >= 3);
    CHECK(clock.span_ticks == 0);
}

static void no_counter_or_no_rate(void) {
    struct vgpu_paced_clock clock = {0};
    struct vgpu_counter_rate rate = {0};
    for (uint64_t ns = START_NS; ns <= START_NS + 5000000; ns += 100000) {
        read_at(&clock, &rate, ns, 0); /* an architecture without a counter this code reads */
    }
    CHECK(clock.span_ticks == 0);
    /* A counter of 1 tick in 10 ms: no rate believed, dropped. */
    struct vgpu_paced_clock slow = {0};
    struct vgpu_counter_rate slow_rate = {0};
    for (uint64_t ns = START_NS; ns <= START_NS + 50000000; ns += 10000000) {
        read_at(&slow, &slow_rate, ns, 1 + (ns - START_NS) / 10000000);
    }
    CHECK(slow.span_ticks == 0);
}

static uint64_t monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

/* The CPU's own counter for 200 ms: every time given lies between the real reads around it
 * (within the 1 µs a miss is allowed), and times never go back by more than that. */
static void real_counter(void) {
    struct vgpu_paced_clock clock = {0};
    struct vgpu_counter_rate rate = {0};
    uint64_t start = monotonic_ns(), last = 0;
    long outside = 0, backwards = 0, extrapolated = 0, reads = 0;
    while (monotonic_ns() - start < 200000000ULL) {
        uint64_t before = monotonic_ns();
        uint64_t now = vgpu_paced_now(&clock, &rate);
        uint64_t after = monotonic_ns();
        outside += now + 1000 < before || now > after + 1000;
        backwards += now + 1000 < last;
        last = now > last ? now : last;
        extrapolated += clock.span_ticks != 0;
        reads++;
    }
    CHECK(outside == 0);
    CHECK(backwards == 0);
    printf("real counter: %ld of %ld reads with a rate, %u misses%s\n", extrapolated, reads,
           rate.misses, vgpu_counter_ticks() == 0 ? " (no counter here)" : "");
}

int main(void) {
    measured_rate();
    missed_extrapolations();
    counter_that_goes_back();
    no_counter_or_no_rate();
    real_counter();
    return unit_report();
}
