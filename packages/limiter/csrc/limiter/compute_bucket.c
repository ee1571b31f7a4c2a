/* The pod's token bucket and its rate (compute_bucket.h). The bucket lives in the pod's region,
 * shared by all the pod's processes: a process starts an epoch only when it is not in debt, and
 * each epoch's GPU time is debited from it, so the pod gets its limit of each GPU's time however
 * many processes it has.
 *
 * The cap, VGPU_BUCKET_BURST_NS of the hard limit: enough for a pod that waited for the lease (at
 * most a 32 ms epoch of another) to lose nothing, and little enough that what a pod saves while
 * idle (compiling, loading) adds at most 0.05 L to its next 1-s window. At 100 ms, a Triton loop
 * after its compile got 82.3 % in its first second at a 75 % limit.
 *
 * A pod no other pod contends with waits for no lease, so that reason for the cap is gone: its
 * bucket holds VGPU_BUCKET_ALONE_NS of the hard limit, half an epoch, which still keeps what
 * host gaps shorter than that save. At 50 ms a PyTorch loop alone at 50 % got 52.8-54.8 % of
 * its first second: while cuBLAS loaded, the bucket filled to 25 ms (2.5 points of it). What is
 * saved while contended is kept when the others stop; only what accrues is capped.
 *
 * Burst: a pod runs at its soft limit only while no other pod has wanted this GPU for
 * VGPU_CONTENDED_HOLD_NS: seen waiting for the lease, or holding it. Contention is seen at the
 * first launch of the other pod that waits, so a bursting pod falls back within one contended
 * epoch.
 *
 * A gang's bucket (the ranks of a job that runs collectives) holds twice as much: its epochs end
 * only at a collective, and another pod's gang may hold a GPU up to twice the quantum while it
 * waits. At the single cap the 70 % job of a 30/70 pair of DDP jobs on two H200s was charged
 * 61-62 % of the GPUs' time, paused 14 % of it for a bucket the cap had cut short, and ran at
 * 61-62 % of its speed alone; at twice the cap it was charged 68-70 % and ran at 65-66 %. */
#include "compute_bucket.h"

#include <stdatomic.h>

bool vgpu_compute_limited(uint32_t compute) {
    return compute != 0 && compute < VGPU_COMPUTE_UNLIMITED;
}

bool vgpu_pace_contended(bool wanted_now, _Atomic uint64_t *seen_ns, uint64_t now) {
    if (wanted_now) {
        atomic_store_explicit(seen_ns, now, memory_order_relaxed);
        return true;
    }
    uint64_t seen = atomic_load_explicit(seen_ns, memory_order_relaxed);
    return seen != 0 && now - seen < VGPU_CONTENDED_HOLD_NS;
}

struct vgpu_pace vgpu_pace_choose(const struct vgpu_pace_limits *limits, uint64_t now,
                                  bool (*contended)(void *context, uint64_t now), void *context) {
    struct vgpu_pace pace = {.rate = 0, .hard = limits->limit};
    if (!vgpu_compute_limited(limits->limit)) {
        return pace;
    }
    /* Oversubscribed: the daemon's effective limit (weights), while fresh. */
    if (limits->effective != 0 && limits->effective < limits->limit &&
        limits->effective_ns <= now && now - limits->effective_ns < VGPU_EFFECTIVE_STALE_NS) {
        pace.hard = (uint32_t)limits->effective;
    }
    pace.rate = pace.hard;
    bool others = contended(context, now);
    pace.alone = !others;
    if (limits->soft <= pace.hard) {
        return pace;
    }
    uint32_t soft = limits->soft > VGPU_COMPUTE_UNLIMITED ? VGPU_COMPUTE_UNLIMITED : limits->soft;
    if (!others) {
        pace.rate = soft;
    } else if (limits->burst > pace.hard && limits->burst_ns <= now &&
               now - limits->burst_ns < VGPU_EFFECTIVE_STALE_NS &&
               limits->burst_ns >= limits->newcomer_ns) {
        /* Contended: what the other pods leave, as the daemon last measured it, unless a pod
         * woke since, which that measure did not count (the hard limit until it does). */
        pace.rate = limits->burst < soft ? (uint32_t)limits->burst : soft;
    }
    return pace;
}

/* What a refill at `now` of a bucket last refilled at `last` does (the one rule of refill and
 * peek). */
enum refill { KEEP, AFRESH, ACCRUE };

static enum refill refill_at(uint64_t last, uint64_t now) {
    if (last != 0 && now <= last && last - now <= VGPU_BUCKET_IDLE_NS) {
        /* A time up to VGPU_BUCKET_IDLE_NS before the last refill is a reading taken before
         * another process's refill (or this one's, before a wait): nothing accrues, and the debt
         * stays. */
        return KEEP;
    }
    /* First use, idle for long, or a clock far behind the last refill (a scribbled word, a
     * region from another boot): a full-burst-free, debt-free bucket. */
    return last == 0 || now - last > VGPU_BUCKET_IDLE_NS ? AFRESH : ACCRUE;
}

static int64_t cap_of(struct vgpu_pace pace) {
    uint64_t span = pace.gang    ? 2 * VGPU_BUCKET_BURST_NS
                    : pace.alone ? VGPU_BUCKET_ALONE_NS
                                 : VGPU_BUCKET_BURST_NS;
    return (int64_t)(span * pace.hard / VGPU_COMPUTE_UNLIMITED);
}

/* Below VGPU_BUCKET_IDLE_NS at no more than 100 %: far from overflowing. */
static int64_t accrued_since(uint64_t last, uint64_t now, struct vgpu_pace pace) {
    return (int64_t)((now - last) * pace.rate / VGPU_COMPUTE_UNLIMITED);
}

int64_t vgpu_bucket_refill(struct vgpu_region_device *device, struct vgpu_pace pace, uint64_t now,
                           uint64_t *capped) {
    _Atomic uint64_t *bucket = &device->compute_state[VGPU_BUCKET_BALANCE];
    _Atomic uint64_t *refilled = &device->compute_state[VGPU_BUCKET_REFILLED_NS];
    uint64_t last = atomic_load(refilled);
    int64_t cap = cap_of(pace);
    enum refill kind = refill_at(last, now);
    if (kind == AFRESH) {
        if (atomic_compare_exchange_strong(refilled, &last, now)) {
            atomic_store(bucket, 0);
        }
    } else if (kind == ACCRUE && atomic_compare_exchange_strong(refilled, &last, now)) {
        int64_t accrued = accrued_since(last, now, pace);
        uint64_t current = atomic_load(bucket);
        int64_t next;
        do {
            /* What is held already stays: only what accrues is capped. */
            int64_t most = (int64_t)current > cap ? (int64_t)current : cap;
            next = (int64_t)current + accrued;
            next = next > most ? most : next;
        } while (!atomic_compare_exchange_weak(bucket, &current, (uint64_t)next));
        *capped += (uint64_t)((int64_t)current + accrued - next);
    }
    return (int64_t)atomic_load(bucket);
}

#define MS 1000000ULL

uint64_t vgpu_use_sample(uint64_t now_ns, uint64_t gpu_ns) {
    return (uint64_t)(uint32_t)(now_ns / MS) << 32 | (uint32_t)(gpu_ns / MS);
}

bool vgpu_use_light(uint64_t older, uint64_t now_ns, uint64_t gpu_ns, uint32_t hard) {
    if (!vgpu_compute_limited(hard)) {
        return false;
    }
    if (older == 0) {
        return false; /* not known yet: a pod starting may be a busy one */
    }
    uint64_t now = vgpu_use_sample(now_ns, gpu_ns);
    uint64_t window = (uint32_t)((now >> 32) - (older >> 32)); /* ms, modulo 2^32 */
    uint64_t used = (uint32_t)((uint32_t)now - (uint32_t)older);
    if (window == 0 || used > window) {
        return false; /* too soon to tell, or a scribble */
    }
    /* used / window < hard / 2, in integers: both below 2^32, hard below 10^4. */
    return used * 2 * VGPU_COMPUTE_UNLIMITED < window * hard;
}

int64_t vgpu_bucket_peek(const struct vgpu_region_device *device, struct vgpu_pace pace,
                         uint64_t now) {
    uint64_t last = atomic_load(&device->compute_state[VGPU_BUCKET_REFILLED_NS]);
    int64_t balance = (int64_t)atomic_load(&device->compute_state[VGPU_BUCKET_BALANCE]);
    switch (refill_at(last, now)) {
    case KEEP:
        return balance;
    case AFRESH:
        return 0;
    case ACCRUE:
        break;
    }
    int64_t most = balance > cap_of(pace) ? balance : cap_of(pace);
    int64_t next = balance + accrued_since(last, now, pace);
    return next > most ? most : next;
}

uint64_t vgpu_gang_wait_ns(int64_t balance, uint32_t rate) {
    if (balance >= 0 || rate == 0) {
        return 0;
    }
    uint64_t debt = 0 - (uint64_t)balance;
    uint64_t limit = VGPU_GANG_WAIT_MAX_NS * rate / VGPU_COMPUTE_UNLIMITED;
    return debt >= limit ? VGPU_GANG_WAIT_MAX_NS : debt * VGPU_COMPUTE_UNLIMITED / rate;
}

uint64_t vgpu_bucket_time_to_budget(int64_t balance, uint32_t rate) {
    if (balance >= 0 || rate == 0) {
        return 0;
    }
    /* Negated as unsigned: defined for the most negative balance too. */
    uint64_t debt = 0 - (uint64_t)balance;
    uint64_t wait = debt > UINT64_MAX / VGPU_COMPUTE_UNLIMITED
                        ? UINT64_MAX
                        : debt * VGPU_COMPUTE_UNLIMITED / rate;
    return wait < VGPU_BUCKET_WAIT_MIN_NS   ? VGPU_BUCKET_WAIT_MIN_NS
           : wait > VGPU_BUCKET_WAIT_MAX_NS ? VGPU_BUCKET_WAIT_MAX_NS
                                            : wait;
}

uint64_t vgpu_bucket_wait_ns(struct vgpu_region_device *device, struct vgpu_pace pace,
                             uint64_t now, uint64_t *capped) {
    if (!vgpu_compute_limited(pace.rate) && pace.rate != VGPU_COMPUTE_UNLIMITED) {
        return 0;
    }
    return vgpu_bucket_time_to_budget(vgpu_bucket_refill(device, pace, now, capped), pace.rate);
}

void vgpu_bucket_charge(struct vgpu_region_device *device, uint64_t gpu_ns, struct vgpu_pace pace) {
    atomic_fetch_sub(&device->compute_state[VGPU_BUCKET_BALANCE], gpu_ns);
    atomic_fetch_add_explicit(&device->gpu_ns, gpu_ns, memory_order_relaxed);
    if (pace.rate > pace.hard && pace.hard != 0) {
        /* Run at the soft limit: the part above the hard limit was burst. */
        atomic_fetch_add_explicit(&device->burst_ns, gpu_ns * (pace.rate - pace.hard) / pace.rate,
                                  memory_order_relaxed);
    }
}

uint64_t vgpu_boosted_charge(struct vgpu_unboosted *kept, uint64_t busy_ns, uint32_t boost,
                             uint64_t now) {
    if (boost == 0) {
        if (now < kept->since_ns || now - kept->since_ns >= VGPU_UNBOOSTED_SLOT_NS) {
            /* A new slot; the one before is kept when it ended just now. A clock behind the
             * slot's start (a scribble, another boot) keeps nothing older. */
            bool adjacent =
                now >= kept->since_ns && now - kept->since_ns < 2 * VGPU_UNBOOSTED_SLOT_NS;
            kept->older_ns = adjacent ? kept->gpu_ns : 0;
            kept->gpu_ns = 0;
            kept->since_ns = now;
        }
        kept->gpu_ns += busy_ns;
        return busy_ns;
    }
    boost = boost < VGPU_BOOST_ONE ? VGPU_BOOST_ONE : boost;
    uint64_t owed = kept->gpu_ns + kept->older_ns;
    kept->gpu_ns = 0;
    kept->older_ns = 0;
    /* busy_ns at the boost, and what was charged 1.0 of `owed` topped up to it. Both below a
     * few seconds of nanoseconds, times at most VGPU_BOOST_MAX: far from overflowing. */
    return (busy_ns + owed) * boost / VGPU_BOOST_ONE - owed;
}

#define GANG_SEQ_MASK ((1ULL << VGPU_GANG_SEQ_BITS) - 1)
#define GANG_HANDOVER (1ULL << VGPU_GANG_SEQ_BITS)
#define GANG_TIME_AT (VGPU_GANG_SEQ_BITS + 1)
#define GANG_TIME_SHIFT 10 /* units of 1024 ns: 47 bits last 4 years of uptime */

uint64_t vgpu_gang_pack(uint64_t seq, struct vgpu_gang_decision decision) {
    return (decision.until_ns >> GANG_TIME_SHIFT) << GANG_TIME_AT |
           (decision.handover ? GANG_HANDOVER : 0) | (seq & GANG_SEQ_MASK);
}

enum vgpu_gang_verdict vgpu_gang_read(uint64_t word, uint64_t seq, uint64_t now, uint64_t since,
                                      struct vgpu_gang_decision *decision) {
    uint64_t decided = (word >> GANG_TIME_AT) << GANG_TIME_SHIFT;
    /* The time is kept in units of 1024 ns: one taken at `since` may read up to 1023 ns before. */
    bool before_since = decided + (1ULL << GANG_TIME_SHIFT) <= since;
    if (word == 0 || decided + VGPU_GANG_STALE_NS < now || before_since) {
        /* Never decided, or by an earlier run of the job: a job started in the pod right after
         * another read that one's gate, counted itself far behind it and ran unpaced until the
         * gate went stale, 2 s. */
        return VGPU_GANG_DECIDE;
    }
    /* How far `seq` is past the word's collective, modulo the bits kept. */
    uint64_t ahead = (seq - word) & GANG_SEQ_MASK;
    if (ahead == 0) {
        decision->until_ns =
            decided > now + VGPU_GANG_WAIT_MAX_NS ? now + VGPU_GANG_WAIT_MAX_NS : decided;
        decision->handover = (word & GANG_HANDOVER) != 0;
        return VGPU_GANG_FOLLOW;
    }
    if (ahead < (GANG_SEQ_MASK + 1) / 2) {
        return VGPU_GANG_DECIDE;
    }
    return GANG_SEQ_MASK + 1 - ahead <= VGPU_GANG_LAG_MAX ? VGPU_GANG_LATE : VGPU_GANG_ASTRAY;
}
