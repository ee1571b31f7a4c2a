/* A lease file's protocol, without a daemon (vgpu_region.h, struct vgpu_device_lease): every
 * paced process of the node maps the GPU's lease and writes its words, so none of them is
 * trusted (docs/security.md, "What a lease writer can do"). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lease_internal.h"
#include "log.h"
#include "vgpu_proc.h"
#include "vgpu_urgency.h"

/* This process's token: nonzero, different for every process on the node (a pid plus its start
 * time and pid namespace), recomputed in a forked child. Asked at every launch: by the fork
 * count, not getpid(), which is a system call (60-100 ns, an eighth of the paced launch path on
 * the simulated GPU). */
static uint64_t token(void) {
    static _Atomic uint64_t cached;
    static _Atomic unsigned cached_forks;
    unsigned forks = vgpu_lease_forks();
    /* The count is stored after the token and loaded before it: a count that matches is never
     * paired with an earlier process's token. */
    bool current = atomic_load_explicit(&cached_forks, memory_order_acquire) == forks;
    uint64_t known = atomic_load_explicit(&cached, memory_order_relaxed);
    if (known == 0 || !current) {
        int32_t pid = (int32_t)getpid();
        known = (((uint64_t)(uint32_t)pid << 32) ^ vgpu_process_start_time(pid) ^
                 (vgpu_pid_namespace() << 7)) |
                1;
        atomic_store_explicit(&cached, known, memory_order_relaxed);
        atomic_store_explicit(&cached_forks, forks, memory_order_release);
    }
    return known;
}

/* Whether a waiter count is one: in range, and renewed within VGPU_LEASE_WANTED_NS of `now` (a
 * waiter killed while it waited leaves its count behind, which would otherwise keep every pod from
 * bursting and make each release wait for nobody). Either side: a caller's `now` may be from
 * before its own wait for the lease, older than a renewal made meanwhile. */
static bool waiting(uint64_t waiters, uint64_t said_ns, uint64_t now) {
    uint64_t apart = said_ns > now ? said_ns - now : now - said_ns;
    return waiters > 0 && waiters <= VGPU_LEASE_WAITERS_MAX && apart < VGPU_LEASE_WANTED_NS;
}

/* Say that this process still waits, in the lease and in the pod's words. */
static void say_waiting(struct vgpu_lease *lease, uint64_t now) {
    if (lease->pod != NULL) {
        atomic_store(&lease->pod[POD_WAITING_NS], now);
    }
    atomic_store(&lease->shared->waiting_ns, now);
}

/* Count this process in (or out of) the waiters: the pod's count first in and last out, so that
 * the node's never seems to hold more of this pod's waiters than the pod's own does. */
static void count_waiter(struct vgpu_lease *lease, bool in, uint64_t now) {
    if (in) {
        say_waiting(lease, now);
        if (lease->pod != NULL) {
            atomic_fetch_add(&lease->pod[POD_WAITERS], 1);
        }
        atomic_fetch_add(&lease->shared->waiters, 1);
    } else {
        atomic_fetch_sub(&lease->shared->waiters, 1);
        if (lease->pod != NULL) {
            atomic_fetch_sub(&lease->pod[POD_WAITERS], 1);
        }
    }
}

/* Sleep until the lease is released (or `nanoseconds` pass): a shared futex, so a release wakes
 * a waiter in another process within microseconds. */
static void wait_release(struct vgpu_device_lease *shared, uint32_t seen, uint64_t nanoseconds) {
    struct timespec timeout = {(time_t)(nanoseconds / 1000000000ULL),
                               (long)(nanoseconds % 1000000000ULL)};
    syscall(SYS_futex, (uint32_t *)&shared->releases, FUTEX_WAIT, seen, &timeout, NULL, 0);
}

static void pause_for(uint64_t nanoseconds) {
    struct timespec delay = {(time_t)(nanoseconds / 1000000000ULL), (long)(nanoseconds % 1000000000ULL)};
    while (nanosleep(&delay, &delay) != 0 && errno == EINTR) {
    }
}

/* How long a released lease is kept for processes already waiting: without it the releasing
 * process, awake, would take it back before a sleeping waiter notices. */
#define YIELD_NS 150000ULL
#define DISTRUST_NS 1000000000ULL /* the first time the protocol is seen broken */
#define DISTRUST_MAX_NS 8000000000ULL

/* A holder's activity says it is gone: too old, or in the future (no clock of this node
 * writes that). */
static bool stale(uint64_t activity, uint64_t now) {
    return activity > now || now - activity > VGPU_LEASE_STALE_NS;
}

/* Whether a holder that said its work drains at `drains` has left the GPU idle a while. */
static bool drained_at(uint64_t drains, uint64_t now) {
    return now > drains && now - drains > VGPU_LEASE_DRAINED_NS && now - drains < VGPU_LEASE_HOLD_NS;
}

/* The protocol was seen broken: for a while, take the lease when it is free or stale but never
 * wait for it, so that whoever scribbles it costs this process at most one wait. Longer each
 * time it happens again soon. */
static void distrust(struct vgpu_lease *lease, uint64_t now, const char *what) {
    bool again = now < lease->distrust_until_ns + lease->distrust_ns;
    lease->distrust_ns = !again ? DISTRUST_NS
                         : lease->distrust_ns * 2 > DISTRUST_MAX_NS ? DISTRUST_MAX_NS
                                                                    : lease->distrust_ns * 2;
    lease->distrust_until_ns = now + lease->distrust_ns;
    vgpu_log(VGPU_LOG_WARN, "device lease of %s %s; not waiting for it for %llu s", lease->uuid,
             what, (unsigned long long)(lease->distrust_ns / 1000000000ULL));
}

/* Take the lease from `owner`. The activity is written first: a waiter that sees the new owner
 * never pairs it with the old holder's activity and takes the lease from a fresh holder. */
static bool take(struct vgpu_device_lease *shared, uint64_t owner, uint64_t me, uint64_t now) {
    atomic_store(&shared->activity_ns, now);
    atomic_store(&shared->drains_ns, 0);
    return atomic_compare_exchange_strong(&shared->owner, &owner, me);
}

/* take(), saying first in the pod's words that this process takes it: a process of the pod that
 * then sees it the owner knows it for the pod's own (vgpu_lease_touch says so again while it
 * holds, should a pod-mate's failed claim have overwritten it). */
static bool claim(struct vgpu_lease *lease, uint64_t owner, uint64_t me, uint64_t now) {
    if (lease->pod != NULL) {
        atomic_store(&lease->pod[POD_HOLDER], me);
    }
    return take(lease->shared, owner, me, now);
}

/* Take the lease from `owner` if it stopped launching (or died), left the GPU idle by its own
 * word, or is `overdue`; whether this process took it. */
static bool take_over(struct vgpu_lease *lease, uint64_t owner, uint64_t activity, uint64_t drains,
                      bool overdue, bool trusting, uint64_t now) {
    struct vgpu_device_lease *shared = lease->shared;
    /* A holder whose work is done, by its own word, and that launched nothing since. */
    bool drained = drains != 0 && drains >= activity && drained_at(drains, now);
    /* Drained is judged on the holder's latest word: it must not have launched since. */
    bool unchanged = !drained || stale(activity, now) || overdue ||
                     atomic_compare_exchange_strong(&shared->activity_ns, &activity, now);
    if (!(stale(activity, now) || overdue || drained) || !unchanged ||
        !claim(lease, owner, token(), now)) {
        return false;
    }
    atomic_fetch_add(&shared->takeovers, 1);
    if (drained) {
        atomic_store(&shared->drained_owner, owner); /* so it knows why */
    }
    if (overdue && !stale(activity, now) && !drained && trusting) {
        distrust(lease, now, "was held past any epoch with activity going on");
    }
    return true;
}

/* Sleep until the lease is released, and at most until its holder could be stale, idle or
 * overdue (`holder_seen_ns` + the hold; 0: overdue already). */
static void sleep_for_holder(struct vgpu_device_lease *shared, uint32_t seen, uint64_t activity,
                             uint64_t drains, uint64_t holder_seen_ns, uint64_t now) {
    uint64_t stale_in = stale(activity, now) ? 0 : activity + VGPU_LEASE_STALE_NS - now;
    uint64_t left = holder_seen_ns == 0 ? 0 : holder_seen_ns + VGPU_LEASE_HOLD_NS - now;
    left = left < stale_in ? left : stale_in;
    if (drains >= activity && drains > now && drains - now < left) {
        left = drains + VGPU_LEASE_DRAINED_NS - now; /* look again once it may be idle */
    }
    left += 10000;
    wait_release(shared, seen, left < VGPU_LEASE_WAITING_EVERY_NS ? left : VGPU_LEASE_WAITING_EVERY_NS);
}

bool vgpu_words_acquire(struct vgpu_lease *lease, bool urgent, uint64_t started) {
    struct vgpu_device_lease *shared = lease->shared;
    uint64_t me = token();
    bool trusting = started >= lease->distrust_until_ns;
    bool waiting = false;
    bool held = false;
    uint32_t waited_from = 0; /* the release count when this process began to wait */
    uint64_t holder = 0;
    uint32_t holder_releases = 0;
    uint64_t holder_seen_ns = started; /* when this holding began, as far as this process saw */
    for (;;) {
        uint32_t seen = atomic_load(&shared->releases);
        uint64_t owner = atomic_load(&shared->owner);
        uint64_t activity = atomic_load(&shared->activity_ns);
        uint64_t drains = atomic_load(&shared->drains_ns);
        uint64_t until = atomic_load(&shared->yield_until_ns);
        /* The clock is read after the times: a holder's own are then never in the future. */
        uint64_t now = vgpu_monotonic_ns();
        if (owner == me) {
            held = true;
            break;
        }
        if (owner != holder || seen != holder_releases) {
            holder = owner;
            holder_releases = seen;
            holder_seen_ns = now;
        }
        /* A released lease goes first to those that waited before the release. */
        bool yielding = until > now && until - now <= YIELD_NS;
        bool first = waiting && seen != waited_from;
        if (owner == 0 && (first || !yielding || !trusting) && claim(lease, owner, me, now)) {
            held = true;
            break;
        }
        /* A holder that stopped launching (or died) loses the lease; so does one that keeps it,
         * by this process's clock, longer than any epoch without a release, and any holder once
         * this process has waited several such times (releases can be scribbled too). */
        bool overdue = now - holder_seen_ns > VGPU_LEASE_HOLD_NS ||
                       now - started > WAIT_MAX_NS;
        if (owner != 0 && take_over(lease, owner, activity, drains, overdue, trusting, now)) {
            held = true;
            break;
        }
        if (!trusting) {
            break; /* the epoch runs without it */
        }
        if (!waiting) {
            count_waiter(lease, true, now);
            waiting = true;
            waited_from = seen;
            if (urgent && owner != 0) {
                atomic_store(&shared->urgent_ns, now);
            }
        } else {
            /* At least every VGPU_LEASE_WAITING_EVERY_NS: the sleeps below are no longer. */
            say_waiting(lease, now);
        }
        if (owner == 0) {
            pause_for(20000); /* free but kept for earlier waiters a moment */
        } else {
            sleep_for_holder(shared, seen, activity, drains, overdue ? 0 : holder_seen_ns, now);
        }
    }
    if (waiting) {
        count_waiter(lease, false, 0);
    }
    uint64_t now = vgpu_monotonic_ns();
    if (held) {
        atomic_fetch_add(&shared->epochs, 1);
    }
    lease->exclusive = held;
    lease->exposed = false;
    lease->drains_ns = 0;
    lease->touched_ns = now;
    lease->held_ns = now;
    return held;
}

bool vgpu_words_yield_asked(struct vgpu_lease *lease, uint64_t now) {
    uint64_t asked = atomic_load(&lease->shared->urgent_ns);
    return lease->exclusive && asked > lease->held_ns && asked <= now &&
           vgpu_words_wanted_by_other_pod(lease, now) &&
           vgpu_urgency_honoured(lease->yielded_ns, now);
}

bool vgpu_words_lost(struct vgpu_lease *lease, uint64_t now) {
    if (!lease->exclusive || atomic_load(&lease->shared->owner) == token()) {
        return false;
    }
    lease->exclusive = false;
    if (lease->exposed || now - lease->touched_ns > VGPU_LEASE_STALE_NS / 2 ||
        (lease->drains_ns != 0 && now > lease->drains_ns) ||
        atomic_load(&lease->shared->drained_owner) == token()) {
        return true; /* a waiter may rightly have judged this process stale or idle */
    }
    if (now >= lease->distrust_until_ns) {
        distrust(lease, now, "was taken from this active process");
    }
    return false;
}

void vgpu_words_touch(struct vgpu_lease *lease, uint64_t now) {
    if (now - lease->touched_ns > VGPU_LEASE_STALE_NS / 2 ||
        (lease->drains_ns != 0 && now > lease->drains_ns &&
         now - lease->drains_ns > VGPU_LEASE_DRAINED_NS / 2)) {
        lease->exposed = true; /* stale or drained for a while: a waiter may take the lease */
    }
    lease->touched_ns = now;
    if (lease->exclusive) {
        atomic_store(&lease->shared->activity_ns, now);
        if (lease->pod != NULL && atomic_load(&lease->pod[POD_HOLDER]) != token()) {
            atomic_store(&lease->pod[POD_HOLDER], token());
        }
    }
}

void vgpu_words_expect(struct vgpu_lease *lease, uint64_t drains_ns) {
    lease->drains_ns = drains_ns;
    if (lease->exclusive) {
        atomic_store(&lease->shared->drains_ns, drains_ns);
    }
}

void vgpu_words_release(struct vgpu_lease *lease, uint64_t busy_ns) {
    uint64_t me = token();
    /* With or without the lease, the epoch's work ran on the GPU. */
    atomic_fetch_add_explicit(&lease->shared->busy_ns, busy_ns, memory_order_relaxed);
    lease->exclusive = false;
    if (lease->pod != NULL) {
        uint64_t mine = me;
        atomic_compare_exchange_strong(&lease->pod[POD_HOLDER], &mine, 0);
    }
    uint64_t now = vgpu_monotonic_ns();
    if (atomic_compare_exchange_strong(&lease->shared->owner, &me, 0) &&
        vgpu_words_wanted(lease, now)) {
        atomic_store(&lease->shared->yield_until_ns, now + YIELD_NS);
        atomic_fetch_add(&lease->shared->releases, 1);
        syscall(SYS_futex, (uint32_t *)&lease->shared->releases, FUTEX_WAKE, 1, NULL, NULL, 0);
    }
}

bool vgpu_words_held_by_other_pod(const struct vgpu_lease *lease) {
    uint64_t owner = atomic_load(&lease->shared->owner);
    return owner != 0 && owner != token() &&
           (lease->pod == NULL || owner != atomic_load(&lease->pod[POD_HOLDER]));
}

bool vgpu_words_wanted(const struct vgpu_lease *lease, uint64_t now) {
    return waiting(atomic_load(&lease->shared->waiters), atomic_load(&lease->shared->waiting_ns),
                   now);
}

bool vgpu_words_wanted_by_other_pod(const struct vgpu_lease *lease, uint64_t now) {
    uint64_t waiters = atomic_load(&lease->shared->waiters);
    uint64_t said = atomic_load(&lease->shared->waiting_ns);
    if (!waiting(waiters, said, now)) {
        return false;
    }
    if (lease->pod == NULL) {
        return true;
    }
    /* The lease's latest word that someone waits is this pod's own (say_waiting writes the same
     * time in both): no waiter of another pod has said so since, and one says so at least every
     * VGPU_LEASE_WAITING_EVERY_NS. Without it, a count left in `waiters` by a waiter killed or
     * stopped while it waited (no daemon resets it), kept fresh by this pod's own waiters (one
     * waits while the other holds), looked like another pod waiting for good, and a pod of two
     * processes never burst. */
    if (said == atomic_load(&lease->pod[POD_WAITING_NS])) {
        return false;
    }
    uint64_t ours = atomic_load(&lease->pod[POD_WAITERS]);
    if (!waiting(ours, atomic_load(&lease->pod[POD_WAITING_NS]), now)) {
        ours = 0;
    }
    return waiters > ours;
}
