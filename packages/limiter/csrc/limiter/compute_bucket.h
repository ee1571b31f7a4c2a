/* The pod's token bucket and the rate it refills at (compute.c paces launches by it). Arithmetic
 * over a region device entry's words and a time the caller read: no driver, no clock, no sleep,
 * so that it can be tested alone (tests/c/limiter_pacing_test.c). Rates and limits are in
 * hundredths of a percent, as in the region; times are CLOCK_MONOTONIC nanoseconds. */
#ifndef VGPU_LIMITER_COMPUTE_BUCKET_H
#define VGPU_LIMITER_COMPUTE_BUCKET_H

#include <stdbool.h>
#include <stdint.h>

#include "vgpu_region.h"

/* compute_state words of a region device entry: the bucket (signed nanoseconds of GPU time the
 * pod may still use; negative: its debt), when it was last refilled, from
 * VGPU_COMPUTE_LEASE_WORDS on the pod's words about the device lease (lease.h), and when a
 * process of the pod last launched a collective's kernel on the GPU (compute_gang.c). */
enum {
    VGPU_BUCKET_BALANCE = 0,
    VGPU_BUCKET_REFILLED_NS = 1,
    VGPU_COMPUTE_LEASE_WORDS = 2,
    VGPU_COMPUTE_COLLECTIVE_NS = 5,
    VGPU_COMPUTE_USE_OLDER = 6, /* two samples of the pod's use (vgpu_use_sample) */
    VGPU_COMPUTE_USE_NEWER = 7
};

/* The bucket holds at most the hard limit's share of this much wall time (compute_bucket.c),
 * a gang's twice as much, and a pod that no other pod contends with only VGPU_BUCKET_ALONE_NS's
 * share. */
#define VGPU_BUCKET_BURST_NS 50000000ULL
#define VGPU_BUCKET_ALONE_NS 16000000ULL
/* A refill after this long starts the bucket afresh, empty and out of debt. */
#define VGPU_BUCKET_IDLE_NS 10000000000ULL
/* A wait for the bucket is at least this, and at most this before the limits are read again. */
#define VGPU_BUCKET_WAIT_MIN_NS 20000ULL
#define VGPU_BUCKET_WAIT_MAX_NS 100000000ULL
/* How long a pod stays contended after another pod was last seen wanting the GPU. */
#define VGPU_CONTENDED_HOLD_NS 200000000ULL

/* Whether a compute limit limits: 0 and VGPU_COMPUTE_UNLIMITED (and above) do not. */
bool vgpu_compute_limited(uint32_t compute);

/* What the choice of a rate reads: the region's limits of the device and the node daemon's
 * scheduler words (VGPU_SCHED_EFFECTIVE and VGPU_SCHED_EFFECTIVE_NS). */
struct vgpu_pace_limits {
    uint32_t limit;        /* compute_limit, the hard limit */
    uint32_t soft;         /* compute_soft_limit, burst: 0 or not above `limit` is none */
    uint64_t effective;    /* the daemon's effective limit when oversubscribed; 0: none */
    uint64_t effective_ns; /* when the daemon wrote it */
    uint64_t burst;        /* the daemon's burst rate while contended (VGPU_SCHED_BURST); 0: none */
    uint64_t burst_ns;     /* when the daemon wrote it */
    uint64_t newcomer_ns;  /* when another pod began to want the GPU (the lease's seat); 0 */
};

/* The rate an epoch runs at (the bucket refills at it) and the hard limit then. rate 0: not
 * limited. rate above hard: bursting at the soft limit. */
struct vgpu_pace {
    uint32_t rate;
    uint32_t hard;
    /* The pace of a job's rank (compute_gang.h): its bucket holds twice as much. */
    bool gang;
    /* No other pod wanted the GPU lately (vgpu_pace_contended): the pod waits for no lease, and
     * its bucket holds less (VGPU_BUCKET_ALONE_NS). */
    bool alone;
};

/* Whether another pod wants the GPU: `wanted_now` (it waits for or holds the device lease at
 * `now`, which is then remembered in `*seen_ns`, the region's contended_ns, which every process
 * of the pod writes), or it was last seen less than VGPU_CONTENDED_HOLD_NS before `now`. A `now`
 * before `*seen_ns` is not contended. */
bool vgpu_pace_contended(bool wanted_now, _Atomic uint64_t *seen_ns, uint64_t now);

/* The pace at `now`: hard is the pod's limit, or the daemon's effective limit when that is lower
 * and written less than VGPU_EFFECTIVE_STALE_NS before `now`; the rate is that hard limit, 0
 * when the pod's limit does not limit, or with a soft limit above the hard limit: the soft limit
 * (at most VGPU_COMPUTE_UNLIMITED) when `contended(context, now)` says no other pod wants the
 * GPU, else the daemon's fresh burst rate (what the others leave) up to the soft limit. The pace
 * is `alone` when the limit limits and `contended` says no. `contended` is called only when the
 * limit limits (it may look at the device lease): when a pace is chosen (before an epoch, at
 * each wait for the bucket, at a gang's collective), never per launch. */
struct vgpu_pace vgpu_pace_choose(const struct vgpu_pace_limits *limits, uint64_t now,
                                  bool (*contended)(void *context, uint64_t now), void *context);

/* Add to the bucket what accrued at `pace.rate` since its last refill, capped at what the hard
 * limit saves in VGPU_BUCKET_BURST_NS, a gang's twice that, a pod alone's in
 * VGPU_BUCKET_ALONE_NS (a pod that bursts keeps no more in hand than without); what the cap cut
 * off is added to `*capped`. A balance above the cap (a gang's, refilled by another process of
 * its pod on the same GPU; one saved while contended) is kept, not cut. The first refill, one
 * after VGPU_BUCKET_IDLE_NS, and one with `now` more than that before the last refill empty the
 * bucket instead; a `now` less than that before it changes nothing (a reading older than another
 * process's refill must not forgive the pod's debt). Returns the balance. Safe against the pod's
 * other processes refilling and debiting at the same time. */
int64_t vgpu_bucket_refill(struct vgpu_region_device *device, struct vgpu_pace pace, uint64_t now,
                           uint64_t *capped);

/* The pod's use of a GPU, sampled into one word (the time and its GPU time so far, each in
 * milliseconds modulo 2^32), in two words of its region's entry that every process of the pod
 * renews: the newer one every VGPU_USE_WINDOW_NS, the older one taking its place. */
#define VGPU_USE_WINDOW_NS 100000000ULL
uint64_t vgpu_use_sample(uint64_t now_ns, uint64_t gpu_ns);

/* Whether the pod, whose GPU time is `gpu_ns` at `now_ns`, used less than half its hard limit
 * `hard` since the `older` sample (0: none yet, not known, not light): a burst of work it
 * starts now is to wait as little as can be (VGPU_ARBITER_URGENT). Its bucket cannot tell: a
 * pod's bucket fills while it waits for the lease, a busy pod's too. */
bool vgpu_use_light(uint64_t older, uint64_t now_ns, uint64_t gpu_ns, uint32_t hard);

/* The balance the bucket would have if refilled at `now` with `pace` (vgpu_bucket_refill),
 * without writing it: another GPU's bucket, read by a rank deciding for the pod's gang. */
int64_t vgpu_bucket_peek(const struct vgpu_region_device *device, struct vgpu_pace pace,
                         uint64_t now);

/* How long a bucket at `balance` refilling at `rate` takes to get out of debt, for a gang's
 * pause: not bounded by VGPU_BUCKET_WAIT_MAX_NS but by VGPU_GANG_WAIT_MAX_NS; 0 when not in debt
 * or `rate` is 0. */
uint64_t vgpu_gang_wait_ns(int64_t balance, uint32_t rate);

/* How long a bucket at `balance` takes to get out of debt at `rate` (not 0), bounded by
 * VGPU_BUCKET_WAIT_MIN_NS and VGPU_BUCKET_WAIT_MAX_NS; 0 when it is not in debt. */
uint64_t vgpu_bucket_time_to_budget(int64_t balance, uint32_t rate);

/* Before an epoch: 0 when it may start now (the pace does not limit, or the bucket, refilled at
 * `now`, is not in debt), else how long to wait before asking again. */
uint64_t vgpu_bucket_wait_ns(struct vgpu_region_device *device, struct vgpu_pace pace,
                             uint64_t now, uint64_t *capped);

/* After an epoch run at `pace`: `gpu_ns` of GPU time is debited from the bucket and added to the
 * pod's gpu_ns, and the part of it above the hard limit to its burst_ns. */
void vgpu_bucket_charge(struct vgpu_region_device *device, uint64_t gpu_ns, struct vgpu_pace pace);

/* GPU time that ran while the daemon's boost was not known (vgpu_lease_boost 0: a daemon serves
 * the GPU but has not estimated it yet, which takes it about a second of a new load), kept to be
 * charged the boost once it is. Charged 1.0 meanwhile, a pod at 25 % on a fresh daemon ran
 * 30.7 % of an H100's matmul work in its first second. Only the last one to two slots of
 * VGPU_UNBOOSTED_SLOT_NS are kept: a daemon that publishes late (or never: boost correction off)
 * charges no more than that. */
struct vgpu_unboosted {
    uint64_t gpu_ns;   /* kept in the slot that began at since_ns */
    uint64_t older_ns; /* kept in the slot before it */
    uint64_t since_ns;
};
#define VGPU_UNBOOSTED_SLOT_NS 1000000000ULL

/* What an epoch of `busy_ns` of GPU time, ending at `now`, is charged at `boost` (parts per
 * VGPU_BOOST_ONE; 0: not known yet): busy_ns times the boost, plus the boost's part of what
 * `kept` holds, once the boost is known; busy_ns, which `kept` keeps, while it is not. */
uint64_t vgpu_boosted_charge(struct vgpu_unboosted *kept, uint64_t busy_ns, uint32_t boost,
                             uint64_t now);

/* The pod's gang gate (the region's gang_gate word): for the pod's collective number `seq`
 * (counted by each process on each GPU, so that every rank's n-th collective is the same one),
 * until when every rank pauses before launching it. The first rank to reach a collective decides
 * for all (compute_gang.c); the word packs the number's low VGPU_GANG_SEQ_BITS bits, whether the
 * decider ended its epoch there (every rank then ends its own: a hand-over), and the time in
 * microseconds-ish units of 1024 ns. */
#define VGPU_GANG_SEQ_BITS 16
/* A decision older than this is from another run of the job (its counters began again). */
#define VGPU_GANG_STALE_NS 2000000000ULL
/* The longest pause one decision makes: a step's whole debt (a rank's GPU time between two
 * collectives, less what its limit refilled meanwhile, over that limit) is paid at once, so
 * that no rank pauses in the middle of a step. */
#define VGPU_GANG_WAIT_MAX_NS 1000000000ULL
/* How far behind the gate a rank's number may be and still be a rank that lags: one rank's
 * launches may run a step or more behind another's, and a data-parallel step can hold hundreds
 * of collectives (a bucket of gradients each, a layer each for sharded parameters). Farther
 * behind, its count went astray (a rank of an earlier run, or one that missed collectives). */
#define VGPU_GANG_LAG_MAX 4096

enum vgpu_gang_verdict {
    VGPU_GANG_DECIDE, /* the first to reach it: decide, and publish with vgpu_gang_pack */
    VGPU_GANG_FOLLOW, /* decided by another rank: pause until until_ns, hand over if told */
    VGPU_GANG_LATE,   /* the gang is already past it (the rank lags): no pause */
    VGPU_GANG_ASTRAY  /* past it by more than VGPU_GANG_LAG_MAX: no pause, the count is off */
};

/* One collective's decision: until when its ranks pause, and whether they end their epochs. */
struct vgpu_gang_decision {
    uint64_t until_ns;
    bool handover;
};

uint64_t vgpu_gang_pack(uint64_t seq, struct vgpu_gang_decision decision);

/* What a rank at collective `seq` makes of the gate's `word` at `now` (and, when it follows, the
 * decision). A decision that reaches further than VGPU_GANG_WAIT_MAX_NS past `now` is a
 * scribble: followed only that far. One taken before `since` (the reading process's start) is
 * another job's, whose ranks are gone: no decision. */
enum vgpu_gang_verdict vgpu_gang_read(uint64_t word, uint64_t seq, uint64_t now, uint64_t since,
                                      struct vgpu_gang_decision *decision);

#endif
