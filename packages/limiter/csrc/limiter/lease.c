#define _GNU_SOURCE
#include "lease.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "lease_file.h"
#include "lease_seat.h"
#include "log.h"
#include "vgpu_proc.h"

uint64_t vgpu_monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

/* This process's token: nonzero, different for every process on the node (a pid plus its start
 * time and pid namespace), recomputed in a forked child. */
static uint64_t token(void) {
    static uint64_t cached;
    static int32_t cached_pid;
    int32_t pid = (int32_t)getpid();
    if (cached == 0 || cached_pid != pid) {
        uint64_t mixed = ((uint64_t)(uint32_t)pid << 32) ^ vgpu_process_start_time(pid) ^
                         (vgpu_pid_namespace() << 7);
        cached = mixed | 1;
        cached_pid = pid;
    }
    return cached;
}

#define NODE_RETRY_NS 1000000000ULL /* how often a missing node file is looked for again */
#define DISTRUST_NS 1000000000ULL    /* the first time the protocol is seen broken */
#define DISTRUST_MAX_NS 8000000000ULL

struct vgpu_lease {
    struct vgpu_device_lease *shared;
    const struct vgpu_device_node *node;
    uint64_t node_tried_ns;
    bool node_refused; /* said once why the node file is not used */
    char folder[4096];
    char node_folder[4096];
    bool private;
    char uuid[VGPU_REGION_UUID_SIZE];
    /* The daemon's arbiter (lease_seat.h): its connection and this process's seat, or -1 and
     * NULL while pacing with a lease file. */
    int socket;
    struct vgpu_lease_seat *seat;
    uint64_t request;     /* the last request made of the arbiter */
    unsigned forks;       /* the fork count when connected: a child connects again */
    uint64_t instance;    /* the daemon's instance connected to; 0: a lease file */
    uint64_t asked_ns;    /* when the daemon was last asked for another */
    bool said_daemon;     /* a failure to get the daemon's lease was said (once, as a warning) */
    /* This process's own account, which no other process can write. */
    bool exclusive;      /* this epoch holds the lease */
    bool exposed;        /* a gap in this epoch's activity let a waiter judge it stale */
    uint64_t touched_ns; /* this process's last activity */
    uint64_t drains_ns;  /* what this process last said in vgpu_lease_expect */
    uint64_t distrust_until_ns; /* until then, the lease is taken when free, never waited for */
    uint64_t distrust_ns;
    _Atomic uint64_t *pod; /* this pod's words (lease.h), or NULL */
};

enum { POD_WAITERS = 0, POD_WAITING_NS = 1, POD_HOLDER = 2 };

/* The node's base folder, which the daemon owns (SHM_BASE_PATH, read by the configuration). */
static const char *base_path(void) {
    return vgpu_state.config.base_path;
}

/* The leases' folder when {base}/.devices is not usable: one of this user's own, which keeps
 * this user's pods apart but not other users'. */
static void private_folder(char *folder, size_t size) {
    snprintf(folder, size, "%.4000s/vgpu-devices-%u", vgpu_state.config.tmp_folder, (unsigned)geteuid());
}

static struct vgpu_device_lease *map_in(struct vgpu_lease *lease, char *why, size_t why_size) {
    uid_t owner;
    int folder = vgpu_lease_folder(lease->folder,
                                   lease->private ? VGPU_FOLDER_PRIVATE : VGPU_FOLDER_LEASES,
                                   &owner, why, why_size);
    if (folder < 0) {
        return NULL;
    }
    char reason[256];
    struct vgpu_device_lease *shared = vgpu_lease_map(folder, lease->uuid, reason, sizeof reason);
    close(folder);
    if (shared == NULL) {
        snprintf(why, why_size, "%s/%s", lease->folder, reason);
    }
    return shared;
}

/* Whether this user simply has no way into the shared folder (no daemon made it, or the node
 * keeps its leases to a group this user is not in): the usual case of a user's own programs,
 * said at info level; anything refused or failing there is a warning. */
static bool shut_out(const char *folder) {
    int fd = open(folder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return false;
    }
    return errno == EACCES || errno == ENOENT;
}

/* Forks since the library was loaded: a child's connection to the arbiter is its parent's. */
static _Atomic unsigned forks;
static pthread_once_t fork_watch = PTHREAD_ONCE_INIT;
static void count_fork(void) {
    atomic_fetch_add(&forks, 1);
}
static void watch_forks(void) {
    pthread_atfork(NULL, NULL, count_fork);
}

/* The pod of this process as the arbiter is told it (its region's namespace, name and creation
 * time): the pod's processes see one another's waiting as their own. */
static uint64_t pod_key(void) {
    const struct vgpu_region *region = vgpu_state.region;
    uint64_t hash = 1469598103934665603ULL; /* FNV-1a */
    if (region == NULL) {
        return (uint64_t)getpid();
    }
    const char *parts[] = {region->pod_namespace, "/", region->pod_name};
    for (size_t part = 0; part < sizeof parts / sizeof parts[0]; part++) {
        for (size_t at = 0; at < VGPU_REGION_NAME_SIZE && parts[part][at] != '\0'; at++) {
            hash = (hash ^ (unsigned char)parts[part][at]) * 1099511628211ULL;
        }
    }
    return hash ^ atomic_load(&region->created_ns);
}

/* Connect to the daemon's arbiter; true when this lease is now arbitrated by it. `*absent`:
 * there is no daemon to ask. The old seat, if any, stays mapped: it is one page. */
static bool seat_in(struct vgpu_lease *lease, bool *absent, char *why, size_t why_size) {
    struct vgpu_lease_seat *seat = NULL;
    uint64_t instance = 0;
    int socket_fd = vgpu_seat_connect(lease->node_folder, lease->uuid, pod_key(), &seat,
                                      &instance, absent, why, why_size);
    if (socket_fd < 0) {
        return false;
    }
    if (lease->socket >= 0) {
        close(lease->socket);
    }
    lease->socket = socket_fd;
    lease->seat = seat;
    lease->instance = instance;
    lease->forks = atomic_load(&forks);
    lease->private = false;
    return true;
}

/* The daemon's arbiter, or else (no daemon) the lease file of {base}/.devices, or else one of
 * this user's own; false (and a warning) when none can be had. */
static bool map_any(struct vgpu_lease *lease) {
    char why[4400];
    bool absent = false;
    if (seat_in(lease, &absent, why, sizeof why)) {
        return true;
    }
    if (lease->shared != NULL) { /* the arbiter is gone: pace with the file mapped before */
        return true;
    }
    snprintf(lease->folder, sizeof lease->folder, "%.4000s/.devices", base_path());
    char first[4400];
    bool usual = false;
    if (absent) {
        lease->shared = map_in(lease, why, sizeof why);
        snprintf(first, sizeof first, "%s", why);
        usual = shut_out(lease->folder);
    } else {
        /* A daemon is there but did not answer (busy, or flooded with connections): not the
         * group's lease file, which any member could write under this process, but one of this
         * user's own until the daemon answers (follow_daemon asks every second). */
        snprintf(first, sizeof first, "from the daemon: %.4300s", why);
        lease->said_daemon = true;
    }
    if (lease->shared == NULL) {
        private_folder(lease->folder, sizeof lease->folder);
        lease->private = true;
        lease->shared = map_in(lease, why, sizeof why);
        vgpu_log(usual && lease->shared != NULL ? VGPU_LOG_INFO : VGPU_LOG_WARN,
                 "device lease %s; %s%s", first,
                 lease->shared != NULL ? "pods of other users are not kept apart: using " : "",
                 lease->shared != NULL ? lease->folder : why);
    }
    return lease->shared != NULL;
}

struct vgpu_lease *vgpu_lease_open(const char *uuid) {
    struct vgpu_lease *lease = calloc(1, sizeof *lease);
    if (lease == NULL) {
        return NULL;
    }
    pthread_once(&fork_watch, watch_forks);
    lease->socket = -1;
    snprintf(lease->uuid, sizeof lease->uuid, "%s", uuid);
    snprintf(lease->node_folder, sizeof lease->node_folder, "%.4000s/.node", base_path());
    lease->asked_ns = vgpu_monotonic_ns();
    if (!map_any(lease)) {
        vgpu_log(VGPU_LOG_WARN, "no device lease for %s: compute pacing without exclusivity", uuid);
        free(lease);
        return NULL;
    }
    return lease;
}

static const struct vgpu_device_node *node_of(struct vgpu_lease *lease, uint64_t now);

/* Whether this lease is the arbiter's now (else a lease file's, or none: see `shared`). */
static bool arbitrated(const struct vgpu_lease *lease) {
    return lease->socket >= 0;
}

/* Between epochs, at most every NODE_RETRY_NS: when the daemon's node file names an arbiter
 * other than the one connected to (the daemon restarted, or started after this process), connect
 * to it, so that every paced process of the GPU is arbitrated together again. */
static void follow_daemon(struct vgpu_lease *lease, uint64_t now) {
    if (now - lease->asked_ns < NODE_RETRY_NS) {
        return;
    }
    lease->asked_ns = now;
    const struct vgpu_device_node *node = node_of(lease, now);
    uint64_t named = node != NULL ? atomic_load(&node->lease_instance) : 0;
    /* A lease of this user's own while a daemon is there: ask again even if the node file
     * names nothing new (a flood may have kept the daemon from answering). */
    bool own_for_now = lease->private && lease->said_daemon;
    if (named == 0 || (named == lease->instance && (arbitrated(lease) || !own_for_now))) {
        return;
    }
    char why[4400];
    bool absent = false;
    if (!seat_in(lease, &absent, why, sizeof why)) { /* said once: this runs every second */
        vgpu_log(absent || lease->said_daemon ? VGPU_LOG_DEBUG : VGPU_LOG_WARN,
                 "device lease from the daemon: %s", why);
        lease->said_daemon = lease->said_daemon || !absent;
        return;
    }
    vgpu_log(VGPU_LOG_INFO, "device lease of %s: the daemon's, instance %llu", lease->uuid,
             (unsigned long long)lease->instance);
}

/* The arbiter's connection broke (the daemon stopped): pace with a lease file until a daemon
 * names itself again in the node file. */
static void seat_gone(struct vgpu_lease *lease) {
    close(lease->socket);
    lease->socket = -1;
    vgpu_log(VGPU_LOG_INFO, "device lease of %s: the daemon stopped arbitrating it",
             lease->uuid);
    if (lease->shared == NULL && !map_any(lease)) {
        vgpu_log(VGPU_LOG_WARN, "device lease of %s: none to pace with; without exclusivity",
                 lease->uuid);
    }
}

/* vgpu_lease_acquire through the arbiter: it waits no longer than for a lease file. */
static bool acquire_seat(struct vgpu_lease *lease, uint64_t started);

void vgpu_lease_attach_pod(struct vgpu_lease *lease, _Atomic uint64_t *pod_words) {
    lease->pod = pod_words;
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
/* The longest wait for the lease, whoever holds it: a few holds past any epoch. */
#define WAIT_MAX_NS (4 * VGPU_LEASE_HOLD_NS)

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

/* In a forked child, the connection and the seat are its parent's: it takes its own. */
static void reseat_child(struct vgpu_lease *lease) {
    close(lease->socket);
    lease->socket = -1;
    lease->exclusive = false;
    char why[4400];
    bool absent = false;
    if (!seat_in(lease, &absent, why, sizeof why)) {
        lease->seat = NULL;
        seat_gone(lease);
    }
}

static bool acquire_seat(struct vgpu_lease *lease, uint64_t started) {
    uint64_t request = ++lease->request;
    int granted = vgpu_seat_acquire(lease->socket, request, started + WAIT_MAX_NS);
    uint64_t now = vgpu_monotonic_ns();
    lease->exclusive = granted > 0;
    lease->exposed = false;
    lease->drains_ns = 0;
    lease->touched_ns = now;
    if (granted > 0) {
        atomic_store(&lease->seat->drains_ns, 0);
        atomic_store(&lease->seat->activity_ns, now);
    } else if (granted < 0) {
        seat_gone(lease);
    }
    return granted > 0;
}

bool vgpu_lease_acquire(struct vgpu_lease *lease) {
    uint64_t started = vgpu_monotonic_ns();
    if (arbitrated(lease) && lease->forks != atomic_load(&forks)) {
        reseat_child(lease);
    }
    follow_daemon(lease, started);
    if (arbitrated(lease)) {
        return acquire_seat(lease, started);
    }
    if (lease->shared == NULL) { /* neither the arbiter nor a file: without exclusivity */
        lease->exclusive = false;
        return false;
    }
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
        /* A holder whose work is done, by its own word, and that launched nothing since. */
        bool drained = drains != 0 && drains >= activity && drained_at(drains, now);
        /* Drained is judged on the holder's latest word: it must not have launched since. */
        bool unchanged = !drained || stale(activity, now) || overdue ||
                         atomic_compare_exchange_strong(&shared->activity_ns, &activity, now);
        if (owner != 0 && (stale(activity, now) || overdue || drained) && unchanged &&
            claim(lease, owner, me, now)) {
            atomic_fetch_add(&shared->takeovers, 1);
            if (drained) {
                atomic_store(&shared->drained_owner, owner); /* so it knows why */
            }
            if (overdue && !stale(activity, now) && !drained && trusting) {
                distrust(lease, now, "was held past any epoch with activity going on");
            }
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
        } else {
            /* At least every VGPU_LEASE_WAITING_EVERY_NS: the sleeps below are no longer. */
            say_waiting(lease, now);
        }
        if (owner == 0) {
            pause_for(20000); /* free but kept for earlier waiters a moment */
        } else {
            /* Until released, and at most until the holder could be stale or overdue. */
            uint64_t stale_in = stale(activity, now) ? 0 : activity + VGPU_LEASE_STALE_NS - now;
            uint64_t left = overdue ? 0 : holder_seen_ns + VGPU_LEASE_HOLD_NS - now;
            left = left < stale_in ? left : stale_in;
            if (drains >= activity && drains > now && drains - now < left) {
                left = drains + VGPU_LEASE_DRAINED_NS - now; /* look again once it may be idle */
            }
            left += 10000;
            wait_release(shared, seen,
                         left < VGPU_LEASE_WAITING_EVERY_NS ? left : VGPU_LEASE_WAITING_EVERY_NS);
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
    return held;
}

bool vgpu_lease_lost(struct vgpu_lease *lease, uint64_t now) {
    if (arbitrated(lease)) { /* only the daemon takes it, and only rightly */
        bool lost = lease->exclusive && atomic_load(&lease->seat->granted) != lease->request;
        lease->exclusive = lease->exclusive && !lost;
        return lost;
    }
    if (lease->shared == NULL) {
        return false;
    }
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

void vgpu_lease_touch(struct vgpu_lease *lease, uint64_t now) {
    if (now - lease->touched_ns > VGPU_LEASE_STALE_NS / 2 ||
        (lease->drains_ns != 0 && now > lease->drains_ns &&
         now - lease->drains_ns > VGPU_LEASE_DRAINED_NS / 2)) {
        lease->exposed = true; /* stale or drained for a while: a waiter may take the lease */
    }
    lease->touched_ns = now;
    if (arbitrated(lease)) {
        if (lease->exclusive && lease->forks == atomic_load(&forks)) {
            atomic_store(&lease->seat->activity_ns, now);
        }
        return;
    }
    if (lease->shared == NULL) {
        return;
    }
    if (lease->exclusive) {
        atomic_store(&lease->shared->activity_ns, now);
        if (lease->pod != NULL && atomic_load(&lease->pod[POD_HOLDER]) != token()) {
            atomic_store(&lease->pod[POD_HOLDER], token());
        }
    }
}

void vgpu_lease_expect(struct vgpu_lease *lease, uint64_t drains_ns) {
    lease->drains_ns = drains_ns;
    if (arbitrated(lease)) {
        if (lease->exclusive && lease->forks == atomic_load(&forks)) {
            atomic_store(&lease->seat->drains_ns, drains_ns);
        }
        return;
    }
    if (lease->shared == NULL) {
        return;
    }
    if (lease->exclusive) {
        atomic_store(&lease->shared->drains_ns, drains_ns);
    }
}

void vgpu_lease_release(struct vgpu_lease *lease, uint64_t busy_ns) {
    if (arbitrated(lease)) {
        lease->exclusive = false;
        if (lease->forks == atomic_load(&forks) &&
            !vgpu_seat_release(lease->socket, lease->request, busy_ns)) {
            seat_gone(lease);
        }
        return;
    }
    if (lease->shared == NULL) {
        return;
    }
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
        vgpu_lease_wanted(lease, now)) {
        atomic_store(&lease->shared->yield_until_ns, now + YIELD_NS);
        atomic_fetch_add(&lease->shared->releases, 1);
        syscall(SYS_futex, (uint32_t *)&lease->shared->releases, FUTEX_WAKE, 1, NULL, NULL, 0);
    }
}

bool vgpu_lease_held_by_other_pod(const struct vgpu_lease *lease) {
    if (arbitrated(lease)) {
        return atomic_load(&lease->seat->other_pod_holds) != 0;
    }
    if (lease->shared == NULL) {
        return false;
    }
    uint64_t owner = atomic_load(&lease->shared->owner);
    return owner != 0 && owner != token() &&
           (lease->pod == NULL || owner != atomic_load(&lease->pod[POD_HOLDER]));
}

bool vgpu_lease_wanted(const struct vgpu_lease *lease, uint64_t now) {
    if (arbitrated(lease)) {
        return atomic_load(&lease->seat->waiters) != 0;
    }
    if (lease->shared == NULL) {
        return false;
    }
    return waiting(atomic_load(&lease->shared->waiters), atomic_load(&lease->shared->waiting_ns),
                   now);
}

bool vgpu_lease_wanted_by_other_pod(const struct vgpu_lease *lease, uint64_t now) {
    if (arbitrated(lease)) {
        return atomic_load(&lease->seat->other_pod_waiters) != 0;
    }
    if (lease->shared == NULL) {
        return false;
    }
    uint64_t waiters = atomic_load(&lease->shared->waiters);
    if (!waiting(waiters, atomic_load(&lease->shared->waiting_ns), now)) {
        return false;
    }
    if (lease->pod == NULL) {
        return true;
    }
    uint64_t ours = atomic_load(&lease->pod[POD_WAITERS]);
    if (!waiting(ours, atomic_load(&lease->pod[POD_WAITING_NS]), now)) {
        ours = 0;
    }
    return waiters > ours;
}

/* The daemon's node file, looked for at most every NODE_RETRY_NS while missing. */
static const struct vgpu_device_node *node_of(struct vgpu_lease *lease, uint64_t now) {
    if (lease->node != NULL || now - lease->node_tried_ns < NODE_RETRY_NS) {
        return lease->node;
    }
    lease->node_tried_ns = now;
    char why[4400];
    uid_t owner;
    int folder = vgpu_lease_folder(lease->node_folder, VGPU_FOLDER_NODE, &owner, why, sizeof why);
    if (folder >= 0) {
        char reason[256];
        lease->node = vgpu_lease_map_node(folder, owner, lease->uuid, reason, sizeof reason);
        snprintf(why, sizeof why, "%s/%s", lease->node_folder, reason);
        close(folder);
    }
    /* No daemon (no file) is the plain case; a file refused is said once. */
    if (lease->node == NULL && !lease->node_refused && strstr(why, ": missing") == NULL &&
        strstr(why, "No such file") == NULL) {
        lease->node_refused = true;
        vgpu_log(VGPU_LOG_WARN, "node file %s; the GPU's boost is not applied", why);
    }
    return lease->node;
}

uint32_t vgpu_lease_boost(struct vgpu_lease *lease) {
    uint64_t now = vgpu_monotonic_ns();
    const struct vgpu_device_node *node = node_of(lease, now);
    if (node == NULL || atomic_load(&node->magic) != VGPU_NODE_MAGIC) {
        return VGPU_BOOST_ONE;
    }
    uint32_t boost = atomic_load(&node->boost);
    uint64_t written = atomic_load(&node->boost_ns);
    if (boost == 0 || written > now || now - written > VGPU_BOOST_STALE_NS) {
        return VGPU_BOOST_ONE;
    }
    return boost < VGPU_BOOST_ONE ? VGPU_BOOST_ONE : boost > VGPU_BOOST_MAX ? VGPU_BOOST_MAX : boost;
}
