/* The paced launches' clock (paced_clock.h, paced_clock.c): a counter of a known rate, driven
 * through real reads by hand, stands for the clock only within its span after each and only
 * once its rate is measured; a read it misses (a counter of a new rate, one ahead or behind,
 * one that ran on while the clock stood) is not measured across, and the rate is measured again;
 * a counter that keeps missing is dropped for good. Then, with the CPU's own counter, every
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
    /* A long pause, then launches again: checked to the rate's error, the span as before. */
    uint64_t later = clock.base_ns + 60000000000ULL;
    read_at(&clock, &rate, later, ticks_at(later));
    CHECK(rate.misses == 0 && clock.span_ticks != 0);
}

/* A clock whose rate is measured at 3 GHz, its base at `*ns`. */
static void measured(struct vgpu_paced_clock *clock, struct vgpu_counter_rate *rate, uint64_t *ns) {
    for (*ns = START_NS; *ns <= START_NS + 3000000; *ns += 100000) {
        read_at(clock, rate, *ns, ticks_at(*ns));
    }
    *ns -= 100000;
    CHECK(clock->span_ticks != 0 && rate->misses == 0);
}

/* Reads every 100 µs of the clock for `reads` reads, the counter running at `ticks_per_ns`
 * after the rate was measured at 3 GHz: the misses, and the extrapolation's error half a span
 * after the last read. */
static unsigned misses_at(double ticks_per_ns, int reads, uint64_t *error) {
    struct vgpu_paced_clock clock = {0};
    struct vgpu_counter_rate rate = {0};
    uint64_t ns;
    measured(&clock, &rate, &ns);
    uint64_t ticks = ticks_at(ns);
    for (int i = 0; i < reads; i++) {
        ns += 100000;
        ticks += (uint64_t)(100000 * ticks_per_ns);
        read_at(&clock, &rate, ns, ticks);
    }
    uint64_t at = vgpu_paced_clock_extrapolate(&clock, ticks + (uint64_t)(50000 * ticks_per_ns));
    *error = at > ns + 50000 ? at - ns - 50000 : ns + 50000 - at;
    return rate.misses;
}

static void rates_that_change(void) {
    uint64_t error;
    CHECK(misses_at(3.0, 1000, &error) == 0 && error <= 1);
    /* 5 % slower: the extrapolation misses by 5 µs once, and the new rate is measured. */
    CHECK(misses_at(2.85, 1000, &error) == 1 && error <= 1);
    /* 5e-4 faster: 50 ns in a span, no miss; the rate follows as it is measured again. */
    CHECK(misses_at(3.0015, 40000, &error) == 0 && error <= 3);
}

static void counter_that_goes_back(void) {
    struct vgpu_paced_clock clock = {0};
    struct vgpu_counter_rate rate = {0};
    uint64_t ns;
    measured(&clock, &rate, &ns);
    /* Reads on a CPU whose counter is 1 ms behind, between reads on the first: three misses. */
    for (int i = 0; i < 3; i++) {
        ns += 100000;
        read_at(&clock, &rate, ns, ticks_at(ns) - 3000000);
        ns += 100000;
        read_at(&clock, &rate, ns, ticks_at(ns));
    }
    CHECK(rate.misses >= 3);
    /* Dropped for good: a counter that keeps time again is not taken back. */
    for (int i = 0; i < 100; i++) {
        ns += 100000;
        read_at(&clock, &rate, ns, ticks_at(ns));
        CHECK(clock.span_ticks == 0);
        CHECK(vgpu_paced_clock_extrapolate(&clock, ticks_at(ns) + 1) == 0);
    }
}

static void nothing_measured_across_a_miss(void) {
    struct vgpu_paced_clock clock = {0};
    struct vgpu_counter_rate rate = {0};
    uint64_t ns;
    measured(&clock, &rate, &ns);
    /* 50 µs on, the counter reads 1 ms ahead (another CPU's): a miss, and no rate until it is
     * measured again from there over 2 ms. */
    ns += 50000;
    read_at(&clock, &rate, ns, ticks_at(ns) + 3000000);
    CHECK(rate.misses == 1 && clock.span_ticks == 0);
    CHECK(vgpu_paced_clock_extrapolate(&clock, ticks_at(ns) + 3000001) == 0);
    for (int i = 0; i < 10; i++) {
        ns += 100000;
        read_at(&clock, &rate, ns, ticks_at(ns) + 3000000);
        CHECK(clock.span_ticks == 0); /* 1 ms of reads: not yet */
    }
    for (int i = 0; i < 11; i++) {
        ns += 100000;
        read_at(&clock, &rate, ns, ticks_at(ns) + 3000000);
    }
    CHECK(rate.misses == 1);
    near(clock.span_ticks, 100000 * TICKS_PER_NS, 2, __LINE__);
}

static void jumps_across_gaps(void) {
    /* No launch for 0.5 ms (past the spans checked to the microsecond), and the counter 1 ms
     * ahead when they come back: a miss all the same. */
    struct vgpu_paced_clock clock = {0};
    struct vgpu_counter_rate rate = {0};
    uint64_t ns;
    measured(&clock, &rate, &ns);
    ns += 500000;
    read_at(&clock, &rate, ns, ticks_at(ns) + 3000000);
    CHECK(rate.misses == 1 && clock.span_ticks == 0);
    /* The counter went on for 10 s while the clock stood (a suspended machine): a miss. */
    struct vgpu_paced_clock suspended = {0};
    struct vgpu_counter_rate suspended_rate = {0};
    measured(&suspended, &suspended_rate, &ns);
    read_at(&suspended, &suspended_rate, ns + 1000000, ticks_at(ns + 1000000) + 30000000000ULL);
    CHECK(suspended_rate.misses == 1 && suspended.span_ticks == 0);
    /* A quiet second with a counter that kept time: no miss. */
    struct vgpu_paced_clock quiet = {0};
    struct vgpu_counter_rate quiet_rate = {0};
    measured(&quiet, &quiet_rate, &ns);
    read_at(&quiet, &quiet_rate, ns + 1000000000ULL, ticks_at(ns + 1000000000ULL));
    CHECK(quiet_rate.misses == 0 && quiet.span_ticks != 0);
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
    CHECK(slow.span_ticks == 0 && slow_rate.misses >= 3); /* dropped for good */
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
    rates_that_change();
    counter_that_goes_back();
    nothing_measured_across_a_miss();
    jumps_across_gaps();
    no_counter_or_no_rate();
    real_counter();
    return unit_report();
}
