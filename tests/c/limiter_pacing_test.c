/* The compute limiter's token bucket, rate choice and gang gate (compute_bucket.c) alone: no
 * driver, no simulator, no clock; times are made up. Built with its source under ASan/UBSan by
 * nox -s sanitize and plainly by tests/limiter/test_pacing_c.py. Prints "N passed, M failed" and
 * exits non-zero on failure. */
#include "collectives.h"
#include "compute_bucket.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static int passed;
static int failed;

#define MS 1000000ULL
#define SECOND 1000000000ULL
#define T0 (1000 * SECOND) /* a monotonic time well after boot */
#define QUARTER 2500U     /* 25 % in the region's hundredths of a percent */
#define HALF 5000U

static void check_u64(uint64_t actual, uint64_t expected, int line, const char *what) {
    if (actual == expected) {
        passed++;
        return;
    }
    failed++;
    fprintf(stderr, "line %d: %s: %" PRIu64 ", expected %" PRIu64 "\n", line, what, actual,
            expected);
}

static void check_i64(int64_t actual, int64_t expected, int line, const char *what) {
    if (actual == expected) {
        passed++;
        return;
    }
    failed++;
    fprintf(stderr, "line %d: %s: %" PRId64 ", expected %" PRId64 "\n", line, what, actual,
            expected);
}

#define CHECK_U64(actual, expected) check_u64((actual), (expected), __LINE__, #actual)
#define CHECK_I64(actual, expected) check_i64((actual), (expected), __LINE__, #actual)
#define CHECK(condition) check_u64((condition) ? 1 : 0, 1, __LINE__, #condition)

/* A device entry with every word 0, as a new region has it. */
static struct vgpu_region_device device;

static void fresh_device(void) {
    memset(&device, 0, sizeof device);
}

static int64_t balance(void) {
    return (int64_t)atomic_load(&device.compute_state[VGPU_BUCKET_BALANCE]);
}

static void set_balance(int64_t value) {
    atomic_store(&device.compute_state[VGPU_BUCKET_BALANCE], (uint64_t)value);
}

static uint64_t refilled_at(void) {
    return atomic_load(&device.compute_state[VGPU_BUCKET_REFILLED_NS]);
}

/* The cap of a bucket at hard limit `hard`. */
static int64_t cap_of(uint32_t hard) {
    return (int64_t)(VGPU_BUCKET_BURST_NS * hard / VGPU_COMPUTE_UNLIMITED);
}

/* A stand-in for the device lease: says what it is told, counts the questions. */
struct lease_answer {
    bool contended;
    unsigned asked;
    uint64_t asked_at;
};

static bool answer_contended(void *context, uint64_t now) {
    struct lease_answer *answer = context;
    answer->asked++;
    answer->asked_at = now;
    return answer->contended;
}

static struct vgpu_pace choose(uint32_t limit, uint32_t soft, uint64_t effective,
                               uint64_t effective_ns, uint64_t now, struct lease_answer *answer) {
    struct vgpu_pace_limits limits = {limit, soft, effective, effective_ns, 0, 0, 0};
    return vgpu_pace_choose(&limits, now, answer_contended, answer);
}

static struct vgpu_pace choose_burst(uint32_t soft, uint64_t burst, uint64_t burst_ns,
                                     uint64_t now, struct lease_answer *answer) {
    struct vgpu_pace_limits limits = {QUARTER, soft, 0, 0, burst, burst_ns, 0};
    return vgpu_pace_choose(&limits, now, answer_contended, answer);
}

/* A pod that woke after the daemon's burst rate was written (the arbiter's newcomer_ns): the
 * rate did not count it, so the hard limit holds until a rate written since. */
static void burst_rate_older_than_a_newcomer(void) {
    struct lease_answer answer = {.contended = true};
    struct vgpu_pace_limits limits = {QUARTER, VGPU_COMPUTE_UNLIMITED, 0, 0, 7800, T0 - SECOND,
                                      T0 - SECOND / 2};
    CHECK_U64(vgpu_pace_choose(&limits, T0, answer_contended, &answer).rate, QUARTER);
    limits.burst_ns = T0 - SECOND / 4; /* written since: counted */
    CHECK_U64(vgpu_pace_choose(&limits, T0, answer_contended, &answer).rate, 7800);
    answer.contended = false; /* alone: the soft limit, as ever */
    limits.burst_ns = T0 - SECOND;
    CHECK_U64(vgpu_pace_choose(&limits, T0, answer_contended, &answer).rate,
              VGPU_COMPUTE_UNLIMITED);
}

/* Contended, a pod with a soft limit runs at the daemon's burst rate (what the other pods
 * leave), never past its soft limit, never below its hard limit, and only while it is fresh. */
static void rate_burst_beside_others(void) {
    struct lease_answer answer = {.contended = true};
    struct vgpu_pace pace = choose_burst(VGPU_COMPUTE_UNLIMITED, 7800, T0 - SECOND, T0, &answer);
    CHECK_U64(pace.rate, 7800);
    CHECK_U64(pace.hard, QUARTER);
    pace = choose_burst(HALF, 7800, T0, T0, &answer); /* up to the soft limit */
    CHECK_U64(pace.rate, HALF);
    pace = choose_burst(HALF, 1000, T0, T0, &answer); /* never below the hard limit */
    CHECK_U64(pace.rate, QUARTER);
    pace = choose_burst(HALF, 4000, T0 - VGPU_EFFECTIVE_STALE_NS, T0, &answer); /* stale */
    CHECK_U64(pace.rate, QUARTER);
    pace = choose_burst(HALF, 4000, T0 + 1, T0, &answer); /* "after" now: not trusted */
    CHECK_U64(pace.rate, QUARTER);
    pace = choose_burst(QUARTER, 7800, T0, T0, &answer); /* no soft limit: no burst */
    CHECK_U64(pace.rate, QUARTER);
    answer.contended = false; /* uncontended: the soft limit, whatever the burst rate */
    pace = choose_burst(HALF, 4000, T0, T0, &answer);
    CHECK_U64(pace.rate, HALF);
}

static void limited(void) {
    CHECK(!vgpu_compute_limited(0));
    CHECK(vgpu_compute_limited(1));
    CHECK(vgpu_compute_limited(QUARTER));
    CHECK(vgpu_compute_limited(VGPU_COMPUTE_UNLIMITED - 1));
    CHECK(!vgpu_compute_limited(VGPU_COMPUTE_UNLIMITED));
    CHECK(!vgpu_compute_limited(UINT32_MAX));
}

static void contention(void) {
    _Atomic uint64_t seen = 0;
    CHECK(!vgpu_pace_contended(false, &seen, T0)); /* never seen */
    CHECK(vgpu_pace_contended(true, &seen, T0));
    CHECK_U64(atomic_load(&seen), T0);
    /* Held for VGPU_CONTENDED_HOLD_NS after the other pod was last seen, not a moment longer. */
    CHECK(vgpu_pace_contended(false, &seen, T0 + VGPU_CONTENDED_HOLD_NS - 1));
    CHECK(!vgpu_pace_contended(false, &seen, T0 + VGPU_CONTENDED_HOLD_NS));
    CHECK_U64(atomic_load(&seen), T0); /* only seeing it again moves the time */
    CHECK(vgpu_pace_contended(true, &seen, T0 + SECOND));
    CHECK_U64(atomic_load(&seen), T0 + SECOND);
    /* A clock behind the time seen: not contended (no wrap-around into "lately"). */
    CHECK(!vgpu_pace_contended(false, &seen, T0));
}

static void rate_without_limit(void) {
    struct lease_answer answer = {0};
    struct vgpu_pace pace = choose(0, 0, 0, 0, T0, &answer);
    CHECK_U64(pace.rate, 0);
    CHECK_U64(pace.hard, 0);
    pace = choose(VGPU_COMPUTE_UNLIMITED, 0, 0, 0, T0, &answer);
    CHECK_U64(pace.rate, 0);
    CHECK_U64(pace.hard, VGPU_COMPUTE_UNLIMITED);
    /* 100 % is no limit even with a fresh effective limit or a soft limit. */
    pace = choose(VGPU_COMPUTE_UNLIMITED, 20000, HALF, T0, T0, &answer);
    CHECK_U64(pace.rate, 0);
    CHECK_U64(pace.hard, VGPU_COMPUTE_UNLIMITED);
    CHECK_U64(answer.asked, 0);
}

static void rate_hard_or_burst(void) {
    struct lease_answer answer = {0};
    struct vgpu_pace pace = choose(QUARTER, 0, 0, 0, T0, &answer);
    CHECK_U64(pace.rate, QUARTER);
    CHECK_U64(pace.hard, QUARTER);
    CHECK(pace.alone); /* nobody else wants the GPU: a pod alone */
    CHECK_U64(answer.asked, 1); /* the lease is looked at whenever the limit limits */
    CHECK_U64(answer.asked_at, T0);
    pace = choose(QUARTER, QUARTER, 0, 0, T0, &answer); /* a soft limit no higher: no burst */
    CHECK_U64(pace.rate, QUARTER);
    pace = choose(QUARTER, HALF, 0, 0, T0, &answer);
    CHECK_U64(pace.rate, HALF); /* uncontended: the soft limit */
    CHECK_U64(pace.hard, QUARTER);
    CHECK(pace.alone);
    CHECK_U64(answer.asked, 3);
    answer.contended = true;
    pace = choose(QUARTER, HALF, 0, 0, T0, &answer);
    CHECK_U64(pace.rate, QUARTER); /* contended: the hard limit */
    CHECK_U64(pace.hard, QUARTER);
    CHECK(!pace.alone);
    pace = choose(QUARTER, 0, 0, 0, T0, &answer);
    CHECK(!pace.alone);
    answer.contended = false;
    pace = choose(QUARTER, 20000, 0, 0, T0, &answer); /* a soft limit past 100 % bursts at 100 % */
    CHECK_U64(pace.rate, VGPU_COMPUTE_UNLIMITED);
}

static void rate_effective(void) {
    struct lease_answer answer = {.contended = true};
    /* The daemon's lower effective limit, while fresh, is the hard limit. */
    struct vgpu_pace pace = choose(HALF, 0, 1000, T0 - SECOND, T0, &answer);
    CHECK_U64(pace.rate, 1000);
    CHECK_U64(pace.hard, 1000);
    pace = choose(HALF, 0, 1000, T0 - VGPU_EFFECTIVE_STALE_NS + 1, T0, &answer);
    CHECK_U64(pace.hard, 1000);
    pace = choose(HALF, 0, 1000, T0 - VGPU_EFFECTIVE_STALE_NS, T0, &answer); /* stale */
    CHECK_U64(pace.hard, HALF);
    pace = choose(HALF, 0, 1000, T0 + 1, T0, &answer); /* written "after" now: not trusted */
    CHECK_U64(pace.hard, HALF);
    pace = choose(HALF, 0, 8000, T0, T0, &answer); /* never raises the limit */
    CHECK_U64(pace.hard, HALF);
    pace = choose(HALF, 0, 0, T0, T0, &answer); /* 0: none */
    CHECK_U64(pace.hard, HALF);
    /* Burst is measured from the effective limit: a soft limit above it still bursts. */
    answer.contended = false;
    pace = choose(HALF, HALF, 1000, T0, T0, &answer);
    CHECK_U64(pace.rate, HALF);
    CHECK_U64(pace.hard, 1000);
}

static void refill_accrues_up_to_cap(void) {
    fresh_device();
    struct vgpu_pace quarter = {QUARTER, QUARTER, false, false};
    uint64_t capped = 0;
    /* The first refill starts the bucket: empty, refilled now. */
    CHECK_I64(vgpu_bucket_refill(&device, quarter, T0, &capped), 0);
    CHECK_U64(refilled_at(), T0);
    /* 25 % of 1 ms. */
    CHECK_I64(vgpu_bucket_refill(&device, quarter, T0 + MS, &capped), (int64_t)(MS / 4));
    CHECK_U64(refilled_at(), T0 + MS);
    CHECK_I64(vgpu_bucket_refill(&device, quarter, T0 + 3 * MS, &capped), (int64_t)(3 * MS / 4));
    CHECK_I64(vgpu_bucket_refill(&device, quarter, T0 + 3 * MS, &capped), (int64_t)(3 * MS / 4));
    CHECK_U64(capped, 0);
    /* A second more would be 250 ms: the bucket keeps 25 % of the 50 ms burst, the rest is cut. */
    CHECK_I64(vgpu_bucket_refill(&device, quarter, T0 + 3 * MS + SECOND, &capped), cap_of(QUARTER));
    CHECK_U64(capped, 3 * MS / 4 + SECOND / 4 - (uint64_t)cap_of(QUARTER));
}

/* A gang's bucket (a job's ranks, which end epochs only at collectives) holds twice as much. */
static void a_gang_holds_twice_as_much(void) {
    fresh_device();
    struct vgpu_pace gang = {QUARTER, QUARTER, true, false};
    uint64_t capped = 0;
    vgpu_bucket_refill(&device, gang, T0, &capped);
    CHECK_I64(vgpu_bucket_refill(&device, gang, T0 + SECOND, &capped), 2 * cap_of(QUARTER));
    CHECK_U64(capped, SECOND / 4 - 2 * (uint64_t)cap_of(QUARTER));
    CHECK_I64(vgpu_bucket_peek(&device, gang, T0 + 2 * SECOND), 2 * cap_of(QUARTER));
    /* Another process of the pod, no rank, refills at the single cap: what is held stays, and
     * only what accrued is counted as cut. */
    struct vgpu_pace plain = {QUARTER, QUARTER, false, false};
    capped = 0;
    CHECK_I64(vgpu_bucket_peek(&device, plain, T0 + 2 * SECOND), 2 * cap_of(QUARTER));
    CHECK_I64(vgpu_bucket_refill(&device, plain, T0 + 2 * SECOND, &capped), 2 * cap_of(QUARTER));
    CHECK_U64(capped, SECOND / 4);
}

/* A pod no other pod contends with waits for no lease: its bucket keeps only what the hard
 * limit saves in VGPU_BUCKET_ALONE_NS. What it saved while contended stays when the others stop;
 * only what accrues is cut. */
static void a_pod_alone_holds_less(void) {
    fresh_device();
    struct vgpu_pace alone = {HALF, HALF, false, true};
    struct vgpu_pace contended = {HALF, HALF, false, false};
    int64_t alone_cap = (int64_t)(VGPU_BUCKET_ALONE_NS * HALF / VGPU_COMPUTE_UNLIMITED);
    CHECK(alone_cap < cap_of(HALF));
    uint64_t capped = 0;
    vgpu_bucket_refill(&device, alone, T0, &capped);
    /* 10 ms at 50 % is 5 ms: under the cap. */
    CHECK_I64(vgpu_bucket_refill(&device, alone, T0 + 10 * MS, &capped), (int64_t)(5 * MS));
    /* A second idle, starting up: 8 ms kept, the rest cut. */
    CHECK_I64(vgpu_bucket_refill(&device, alone, T0 + SECOND, &capped), alone_cap);
    CHECK_U64(capped, SECOND / 2 - (uint64_t)alone_cap);
    CHECK_I64(vgpu_bucket_peek(&device, alone, T0 + 2 * SECOND), alone_cap);
    /* Contended, it saves up to the full cap (what a wait for another pod's epoch accrues). */
    CHECK_I64(vgpu_bucket_peek(&device, contended, T0 + 2 * SECOND), cap_of(HALF));
    CHECK_I64(vgpu_bucket_refill(&device, contended, T0 + 2 * SECOND, &capped), cap_of(HALF));
    /* Alone again: what it holds stays; what accrues meanwhile is cut. */
    capped = 0;
    CHECK_I64(vgpu_bucket_refill(&device, alone, T0 + 2 * SECOND + 4 * MS, &capped), cap_of(HALF));
    CHECK_U64(capped, 2 * MS);
    /* Spent below the cap, it refills to the smaller one. */
    set_balance(0);
    CHECK_I64(vgpu_bucket_refill(&device, alone, T0 + 3 * SECOND, &capped), alone_cap);
    /* A gang's cap is twice the full one, alone or not. */
    struct vgpu_pace gang = {HALF, HALF, true, true};
    CHECK_I64(vgpu_bucket_refill(&device, gang, T0 + 4 * SECOND, &capped), 2 * cap_of(HALF));
}

static void refill_pays_debt_at_rate(void) {
    fresh_device();
    uint64_t capped = 0;
    vgpu_bucket_refill(&device, (struct vgpu_pace){HALF, HALF, false, false}, T0, &capped);
    set_balance(-(int64_t)(10 * MS));
    CHECK_I64(vgpu_bucket_refill(&device, (struct vgpu_pace){HALF, HALF, false, false}, T0 + 4 * MS, &capped),
              -(int64_t)(8 * MS));
    /* Bursting: it accrues at the soft limit, but the cap is the hard limit's. */
    struct vgpu_pace burst = {HALF, QUARTER, false, false};
    CHECK_I64(vgpu_bucket_refill(&device, burst, T0 + 20 * MS, &capped), 0);
    CHECK_I64(vgpu_bucket_refill(&device, burst, T0 + SECOND, &capped), cap_of(QUARTER));
    CHECK(cap_of(QUARTER) < cap_of(HALF));
}

static void refill_after_idle_or_clock_back(void) {
    fresh_device();
    struct vgpu_pace quarter = {QUARTER, QUARTER, false, false};
    uint64_t capped = 0;
    vgpu_bucket_refill(&device, quarter, T0, &capped);
    set_balance(-(int64_t)SECOND);
    /* Exactly VGPU_BUCKET_IDLE_NS later still accrues (10 s at 25 % pays the debt, then the cap). */
    CHECK_I64(vgpu_bucket_refill(&device, quarter, T0 + VGPU_BUCKET_IDLE_NS, &capped),
              cap_of(QUARTER));
    /* Idle longer: the bucket starts afresh, out of debt but with nothing saved. */
    set_balance(-(int64_t)SECOND);
    uint64_t later = T0 + 2 * VGPU_BUCKET_IDLE_NS + 1;
    CHECK_I64(vgpu_bucket_refill(&device, quarter, later, &capped), 0);
    CHECK_U64(refilled_at(), later);
    /* A time a little before the last refill (read before another process refilled): nothing
     * accrues and the debt stays. Far before it (a scribbled word, another boot's region):
     * afresh. */
    set_balance(-(int64_t)SECOND);
    CHECK_I64(vgpu_bucket_refill(&device, quarter, later - MS, &capped), -(int64_t)SECOND);
    CHECK_U64(refilled_at(), later);
    CHECK_I64(vgpu_bucket_refill(&device, quarter, later - 2 * VGPU_BUCKET_IDLE_NS, &capped), 0);
    CHECK_U64(refilled_at(), later - 2 * VGPU_BUCKET_IDLE_NS);
    /* The largest gap: no overflow, a fresh bucket. */
    set_balance(-(int64_t)SECOND);
    capped = 0;
    CHECK_I64(vgpu_bucket_refill(&device, quarter, UINT64_MAX, &capped), 0);
    CHECK_U64(capped, 0);
    /* The largest gap that accrues, at 100 %: 10 s, cut to the cap, without overflow. */
    struct vgpu_pace full = {VGPU_COMPUTE_UNLIMITED, 9999, false, false};
    fresh_device();
    vgpu_bucket_refill(&device, full, T0, &capped);
    capped = 0;
    CHECK_I64(vgpu_bucket_refill(&device, full, T0 + VGPU_BUCKET_IDLE_NS, &capped), cap_of(9999));
    CHECK_U64(capped, VGPU_BUCKET_IDLE_NS - (uint64_t)cap_of(9999));
}

static void time_to_budget(void) {
    CHECK_U64(vgpu_bucket_time_to_budget(0, QUARTER), 0);
    CHECK_U64(vgpu_bucket_time_to_budget((int64_t)MS, QUARTER), 0);
    /* The debt over the rate: 1 ms of debt at 25 % takes 4 ms, at 50 % 2 ms. */
    CHECK_U64(vgpu_bucket_time_to_budget(-(int64_t)MS, QUARTER), 4 * MS);
    CHECK_U64(vgpu_bucket_time_to_budget(-(int64_t)MS, HALF), 2 * MS);
    CHECK_U64(vgpu_bucket_time_to_budget(-(int64_t)(2 * MS), QUARTER), 8 * MS);
    CHECK_U64(vgpu_bucket_time_to_budget(-(int64_t)MS, VGPU_COMPUTE_UNLIMITED), MS);
    /* At least VGPU_BUCKET_WAIT_MIN_NS, at most VGPU_BUCKET_WAIT_MAX_NS (limits are re-read). */
    CHECK_U64(vgpu_bucket_time_to_budget(-1, QUARTER), VGPU_BUCKET_WAIT_MIN_NS);
    CHECK_U64(vgpu_bucket_time_to_budget(-(int64_t)SECOND, QUARTER), VGPU_BUCKET_WAIT_MAX_NS);
    CHECK_U64(vgpu_bucket_time_to_budget(-(int64_t)(25 * MS), QUARTER), VGPU_BUCKET_WAIT_MAX_NS);
    CHECK_U64(vgpu_bucket_time_to_budget(-(int64_t)(25 * MS) + 1, QUARTER),
              VGPU_BUCKET_WAIT_MAX_NS - 4);
    /* The largest debts: no overflow (UBSan would stop here), the longest wait. */
    CHECK_U64(vgpu_bucket_time_to_budget(INT64_MIN, 1), VGPU_BUCKET_WAIT_MAX_NS);
    CHECK_U64(vgpu_bucket_time_to_budget(INT64_MIN + 1, VGPU_COMPUTE_UNLIMITED),
              VGPU_BUCKET_WAIT_MAX_NS);
    CHECK_U64(vgpu_bucket_time_to_budget(-(int64_t)MS, 0), 0); /* a rate of 0 never refills */
}

static void wait_for_budget(void) {
    fresh_device();
    uint64_t capped = 0;
    /* Not limited: no wait, and the bucket is not even looked at. */
    CHECK_U64(vgpu_bucket_wait_ns(&device, (struct vgpu_pace){0, 0, false, false}, T0, &capped), 0);
    CHECK_U64(refilled_at(), 0);
    struct vgpu_pace quarter = {QUARTER, QUARTER, false, false};
    CHECK_U64(vgpu_bucket_wait_ns(&device, quarter, T0, &capped), 0); /* a fresh bucket */
    set_balance(-(int64_t)MS);
    /* 1 ms of debt, 0.25 ms paid back in the last ms: 3 ms to wait. */
    CHECK_U64(vgpu_bucket_wait_ns(&device, quarter, T0 + MS, &capped), 3 * MS);
    CHECK_U64(vgpu_bucket_wait_ns(&device, quarter, T0 + 4 * MS, &capped), 0);
    CHECK_I64(balance(), 0);
    /* At 100 % (a soft limit's burst) the bucket is still paced: a debt is waited for. */
    struct vgpu_pace full = {VGPU_COMPUTE_UNLIMITED, QUARTER, false, false};
    set_balance(-(int64_t)(2 * MS));
    CHECK_U64(vgpu_bucket_wait_ns(&device, full, T0 + 5 * MS, &capped), MS);
}

static void charge(void) {
    fresh_device();
    struct vgpu_pace quarter = {QUARTER, QUARTER, false, false};
    vgpu_bucket_charge(&device, 3 * MS, quarter);
    CHECK_I64(balance(), -(int64_t)(3 * MS));
    CHECK_U64(atomic_load(&device.gpu_ns), 3 * MS);
    CHECK_U64(atomic_load(&device.burst_ns), 0);
    /* At 50 % over a 25 % hard limit, half of the GPU time was burst. */
    vgpu_bucket_charge(&device, 4 * MS, (struct vgpu_pace){HALF, QUARTER, false, false});
    CHECK_I64(balance(), -(int64_t)(7 * MS));
    CHECK_U64(atomic_load(&device.gpu_ns), 7 * MS);
    CHECK_U64(atomic_load(&device.burst_ns), 2 * MS);
    /* At 100 % over 25 %: three quarters. */
    vgpu_bucket_charge(&device, 4 * MS, (struct vgpu_pace){VGPU_COMPUTE_UNLIMITED, QUARTER, false, false});
    CHECK_U64(atomic_load(&device.burst_ns), 5 * MS);
    /* No hard limit known: no burst counted. */
    vgpu_bucket_charge(&device, MS, (struct vgpu_pace){HALF, 0, false, false});
    CHECK_U64(atomic_load(&device.burst_ns), 5 * MS);
    CHECK_U64(atomic_load(&device.gpu_ns), 12 * MS);
    CHECK_I64(balance(), -(int64_t)(12 * MS));
}

/* A pod that always has work, run for `seconds` of made-up time in epochs of `epoch_ns` at
 * `pace`: the GPU time it was charged. */
static uint64_t busy_pod(struct vgpu_pace pace, uint64_t epoch_ns, uint64_t seconds) {
    fresh_device();
    uint64_t now = T0;
    uint64_t capped = 0;
    uint64_t used = 0;
    while (now < T0 + seconds * SECOND) {
        uint64_t wait = vgpu_bucket_wait_ns(&device, pace, now, &capped);
        if (wait == 0) {
            vgpu_bucket_charge(&device, epoch_ns, pace);
            used += epoch_ns;
            now += epoch_ns;
        } else {
            now += wait;
        }
    }
    return used;
}

static void pod_gets_its_limit(void) {
    /* 25 % of 10 s is 2.5 s, give or take an epoch and what the bucket starts with. */
    uint64_t used = busy_pod((struct vgpu_pace){QUARTER, QUARTER, false, false}, 32 * MS, 10);
    CHECK(used >= 10 * SECOND / 4 - 32 * MS && used <= 10 * SECOND / 4 + 32 * MS);
    used = busy_pod((struct vgpu_pace){7000, 7000, false, false}, 2 * MS, 10);
    CHECK(used >= 7 * SECOND - 2 * MS && used <= 7 * SECOND + 2 * MS);
    CHECK_U64(atomic_load(&device.gpu_ns), used);
}

static void collective_names(void) {
    CHECK(vgpu_collective_kernel_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
    /* As cuFuncGetName gives them: mangled. */
    CHECK(vgpu_collective_kernel_name(
        "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"));
    CHECK(vgpu_collective_kernel_name("_Z35ncclKernel_AllReduce_RING_LL_Sum_fP11ncclDevComm"));
    CHECK(!vgpu_collective_kernel_name("ampere_sgemm_128x64_nn"));
    CHECK(!vgpu_collective_kernel_name("_Z10ncclHelperv")); /* not a collective's */
    CHECK(!vgpu_collective_kernel_name("_Z5ncclDevKernel_x")); /* length cut: "nccl" only */
    CHECK(!vgpu_collective_kernel_name("_Zx"));
    CHECK(!vgpu_collective_kernel_name(""));
    CHECK(!vgpu_collective_kernel_name(NULL));
}

static void light_use(void) {
    /* 10 ms of GPU time in 100 ms is 10 %: light for a 50 % pod, not for a 15 % one. */
    uint64_t older = vgpu_use_sample(T0, 5 * SECOND);
    CHECK(vgpu_use_light(older, T0 + 100 * MS, 5 * SECOND + 10 * MS, HALF));
    CHECK(!vgpu_use_light(older, T0 + 100 * MS, 5 * SECOND + 10 * MS, 1500));
    /* At 50 %, 25 ms in 100 ms is the line: half its limit is not light. */
    CHECK(!vgpu_use_light(older, T0 + 100 * MS, 5 * SECOND + 25 * MS, HALF));
    CHECK(vgpu_use_light(older, T0 + 100 * MS, 5 * SECOND + 24 * MS, HALF));
    /* No sample yet: not known (a pod starting may be a busy one). Without a limit, nothing is
     * urgent. */
    CHECK(!vgpu_use_light(0, T0, 0, HALF));
    CHECK(!vgpu_use_light(0, T0, 0, 0) && !vgpu_use_light(0, T0, 0, VGPU_COMPUTE_UNLIMITED));
    /* Too soon to tell, and more used than elapsed (a scribble): not light. */
    CHECK(!vgpu_use_light(older, T0, 5 * SECOND, HALF));
    CHECK(!vgpu_use_light(older, T0 + 10 * MS, 5 * SECOND + 20 * MS, HALF));
    /* The samples' milliseconds wrap at 2^32 (49 days): the difference still holds. */
    uint64_t wrap = 4294967295ULL * MS;
    older = vgpu_use_sample(wrap, wrap);
    CHECK(vgpu_use_light(older, wrap + 100 * MS, wrap + 10 * MS, HALF));
}

static uint64_t gate(uint64_t seq, uint64_t until_ns, bool handover) {
    return vgpu_gang_pack(seq, (struct vgpu_gang_decision){until_ns, handover});
}

static void gang_gate(void) {
    struct vgpu_gang_decision got = {0, false};
    /* Nobody decided yet: the first rank decides. */
    CHECK(vgpu_gang_read(0, 1, T0, 0, &got) == VGPU_GANG_DECIDE);
    /* Decided for collective 7 until T0 + 5 ms: rank at 7 follows, at 6 is late, at 8 decides. */
    uint64_t word = gate(7, T0 + 5 * MS, false);
    CHECK(vgpu_gang_read(word, 7, T0 + MS, 0, &got) == VGPU_GANG_FOLLOW);
    CHECK(got.until_ns <= T0 + 5 * MS && got.until_ns + 1024 > T0 + 5 * MS && !got.handover);
    CHECK(vgpu_gang_read(word, 6, T0 + MS, 0, &got) == VGPU_GANG_LATE);
    CHECK(vgpu_gang_read(word, 8, T0 + MS, 0, &got) == VGPU_GANG_DECIDE);
    /* The decider ended its epoch there: its followers are told to, its time kept whole. */
    CHECK(vgpu_gang_read(gate(7, T0 + 5 * MS, true), 7, T0 + MS, 0, &got) == VGPU_GANG_FOLLOW);
    CHECK(got.handover && got.until_ns <= T0 + 5 * MS && got.until_ns + 1024 > T0 + 5 * MS);
    /* A rank a step's collectives behind lags; thousands behind, its count went astray. */
    word = gate(5000, T0 + 5 * MS, false);
    CHECK(vgpu_gang_read(word, 5000 - 300, T0 + MS, 0, &got) == VGPU_GANG_LATE);
    CHECK(vgpu_gang_read(word, 5000 - VGPU_GANG_LAG_MAX, T0 + MS, 0, &got) == VGPU_GANG_LATE);
    CHECK(vgpu_gang_read(word, 5000 - VGPU_GANG_LAG_MAX - 1, T0 + MS, 0, &got) ==
          VGPU_GANG_ASTRAY);
    CHECK(vgpu_gang_read(gate(2, T0, false), 65535, T0, 0, &got) == VGPU_GANG_LATE);
    /* The numbers wrap: 65536 + 3 is past 65535. */
    word = gate(65535, T0, true);
    CHECK(vgpu_gang_read(word, 65536 + 3, T0, 0, &got) == VGPU_GANG_DECIDE);
    CHECK(vgpu_gang_read(word, 65534, T0, 0, &got) == VGPU_GANG_LATE);
    /* A decision of an earlier run (seconds old) is no one's: decide afresh. */
    word = gate(5000, T0, false);
    CHECK(vgpu_gang_read(word, 1, T0 + 3 * SECOND, 0, &got) == VGPU_GANG_DECIDE);
    CHECK(vgpu_gang_read(word, 1, T0 + 10 * MS, 0, &got) == VGPU_GANG_ASTRAY);
    /* One taken before the reading process started is another job's, however recent: a job
     * started right after another in the pod decides afresh, not lags behind the gone one. */
    word = gate(1111, T0, false);
    CHECK(vgpu_gang_read(word, 3, T0 + 10 * MS, T0 + 5 * MS, &got) == VGPU_GANG_DECIDE);
    CHECK(vgpu_gang_read(word, 3, T0 + 10 * MS, T0 - 5 * MS, &got) == VGPU_GANG_LATE);
    /* Kept in units of 1024 ns: a decision at the start itself still counts. */
    CHECK(vgpu_gang_read(gate(3, T0, false), 3, T0 + MS, T0, &got) == VGPU_GANG_FOLLOW);
    /* A decision reaching past the longest wait is a scribble: followed that far only. */
    word = gate(9, T0 + 60 * SECOND, false);
    CHECK(vgpu_gang_read(word, 9, T0, 0, &got) == VGPU_GANG_FOLLOW);
    CHECK_U64(got.until_ns, T0 + VGPU_GANG_WAIT_MAX_NS);
    /* A gang's pause pays the whole debt (past the bucket's 100-ms wait), up to its own bound. */
    CHECK_U64(vgpu_gang_wait_ns(-(int64_t)(60 * MS), QUARTER), 240 * MS);
    CHECK_U64(vgpu_gang_wait_ns(-(int64_t)SECOND, QUARTER), VGPU_GANG_WAIT_MAX_NS);
    CHECK_U64(vgpu_gang_wait_ns(INT64_MIN, 1), VGPU_GANG_WAIT_MAX_NS);
    CHECK_U64(vgpu_gang_wait_ns(5, QUARTER), 0);
    CHECK_U64(vgpu_gang_wait_ns(-5, 0), 0);
}

static void peek(void) {
    fresh_device();
    struct vgpu_pace quarter = {QUARTER, QUARTER, false, false};
    uint64_t capped = 0;
    CHECK_I64(vgpu_bucket_peek(&device, quarter, T0), 0); /* never refilled */
    vgpu_bucket_refill(&device, quarter, T0, &capped);
    set_balance(-(int64_t)(100 * MS));
    /* 100 ms later at 25 %: 25 ms accrued, as a refill would; nothing written. */
    CHECK_I64(vgpu_bucket_peek(&device, quarter, T0 + 100 * MS), -(int64_t)(75 * MS));
    CHECK_U64(refilled_at(), T0);
    CHECK_I64(balance(), -(int64_t)(100 * MS));
    /* A reading from before the last refill: the balance as it is. Up to the cap only. */
    CHECK_I64(vgpu_bucket_peek(&device, quarter, T0 - MS), -(int64_t)(100 * MS));
    CHECK_I64(vgpu_bucket_peek(&device, quarter, T0 + 9 * SECOND), cap_of(QUARTER));
}

/* GPU time run before the daemon's boost was known is charged the boost once it is; only the
 * last one to two slots of it. */
static void boost_charged_once_known(void) {
    struct vgpu_unboosted kept = {0, 0, 0};
    uint32_t boost = VGPU_BOOST_ONE + VGPU_BOOST_ONE / 5; /* 1.2 */
    /* Known from the start: each epoch at the boost, nothing kept. */
    CHECK_U64(vgpu_boosted_charge(&kept, 10 * MS, boost, T0), 12 * MS);
    CHECK_U64(kept.gpu_ns + kept.older_ns, 0);
    /* Not known: charged as is, and kept. */
    CHECK_U64(vgpu_boosted_charge(&kept, 10 * MS, 0, T0 + SECOND / 10), 10 * MS);
    CHECK_U64(vgpu_boosted_charge(&kept, 20 * MS, 0, T0 + SECOND / 5), 20 * MS);
    CHECK_U64(kept.gpu_ns + kept.older_ns, 30 * MS);
    /* Known again: this epoch at 1.2, and 0.2 of the 30 ms kept. */
    CHECK_U64(vgpu_boosted_charge(&kept, 10 * MS, boost, T0 + SECOND / 2), 12 * MS + 6 * MS);
    CHECK_U64(kept.gpu_ns + kept.older_ns, 0);
    CHECK_U64(vgpu_boosted_charge(&kept, 10 * MS, boost, T0 + SECOND), 12 * MS);
    /* A boost of 1 (the load gains nothing from the headroom) charges nothing more. */
    vgpu_boosted_charge(&kept, 10 * MS, 0, T0 + 2 * SECOND);
    CHECK_U64(vgpu_boosted_charge(&kept, 10 * MS, VGPU_BOOST_ONE, T0 + 3 * SECOND), 10 * MS);
    /* Across slots: what the slot before the current one kept is charged too. */
    vgpu_boosted_charge(&kept, 10 * MS, 0, T0 + 4 * SECOND);
    vgpu_boosted_charge(&kept, 20 * MS, 0, T0 + 5 * SECOND + SECOND / 2);
    CHECK_U64(vgpu_boosted_charge(&kept, 0, boost, T0 + 6 * SECOND), 6 * MS);
    /* Never known for long (boost correction off): only the last one to two slots are kept,
     * so that a daemon that starts publishing later charges at most that. */
    for (uint64_t at = 0; at < 10 * SECOND; at += SECOND / 10) {
        vgpu_boosted_charge(&kept, 10 * MS, 0, T0 + 10 * SECOND + at);
    }
    uint64_t owed = kept.gpu_ns + kept.older_ns;
    CHECK(owed >= 10 * 10 * MS && owed <= 20 * 10 * MS);
    CHECK_U64(vgpu_boosted_charge(&kept, 0, boost, T0 + 20 * SECOND), owed / 5);
    /* A slot left long ago is not the one before: its time is dropped. */
    vgpu_boosted_charge(&kept, 10 * MS, 0, T0 + 30 * SECOND);
    vgpu_boosted_charge(&kept, 10 * MS, 0, T0 + 35 * SECOND);
    CHECK_U64(kept.gpu_ns + kept.older_ns, 10 * MS);
    /* A clock behind the slot's start (another boot's, a scribble): nothing older is kept. */
    vgpu_boosted_charge(&kept, 10 * MS, 0, T0 + 34 * SECOND);
    CHECK_U64(kept.gpu_ns + kept.older_ns, 10 * MS);
}

int main(void) {
    collective_names();
    light_use();
    gang_gate();
    peek();
    limited();
    contention();
    rate_without_limit();
    rate_hard_or_burst();
    rate_burst_beside_others();
    burst_rate_older_than_a_newcomer();
    rate_effective();
    refill_accrues_up_to_cap();
    a_gang_holds_twice_as_much();
    a_pod_alone_holds_less();
    refill_pays_debt_at_rate();
    refill_after_idle_or_clock_back();
    time_to_budget();
    wait_for_budget();
    charge();
    pod_gets_its_limit();
    boost_charged_once_known();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
