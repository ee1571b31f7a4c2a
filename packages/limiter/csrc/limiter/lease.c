/* The node-wide device lease (lease.h): the daemon's arbiter when there is one (lease_seat.c),
 * else a lease file (lease_words.c) under the base path or a folder of this user's own; how a
 * process finds the one to use, follows a daemon that starts or stops, and the node file. */
#define _GNU_SOURCE
#include "lease.h"
#include "lease_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "lease_file.h"
#include "lease_seat.h"
#include "log.h"

uint64_t vgpu_monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

#define NODE_RETRY_NS 1000000000ULL /* how often a missing node file is looked for again */

/* The node's base folder, which the daemon owns (SHM_BASE_PATH, read by the configuration). */
static const char *base_path(void) {
    return vgpu_state.config.base_path;
}

/* The group's leases' folder, {base}/.devices, where every process without a daemon paces. */
static void group_folder(char *folder, size_t size) {
    snprintf(folder, size, "%.4000s/.devices", base_path());
}

/* The leases' folder when {base}/.devices is not usable: one of this user's own, which keeps
 * this user's pods apart but not other users'. */
static void private_folder(char *folder, size_t size) {
    snprintf(folder, size, "%.4000s/vgpu-devices-%u", vgpu_state.config.tmp_folder, (unsigned)geteuid());
}

/* The GPU's lease file in `path` (this user's own folder when `private`); NULL with `why`. */
static struct vgpu_device_lease *map_file(const char *path, bool private, const char *uuid,
                                          char *why, size_t why_size) {
    uid_t owner;
    int folder = vgpu_lease_folder(path, private ? VGPU_FOLDER_PRIVATE : VGPU_FOLDER_LEASES,
                                   &owner, why, why_size);
    if (folder < 0) {
        return NULL;
    }
    char reason[256];
    struct vgpu_device_lease *shared = vgpu_lease_map(folder, uuid, reason, sizeof reason);
    close(folder);
    if (shared == NULL) {
        snprintf(why, why_size, "%s/%s", path, reason);
    }
    return shared;
}

static struct vgpu_device_lease *map_in(struct vgpu_lease *lease, char *why, size_t why_size) {
    return map_file(lease->folder, lease->private, lease->uuid, why, why_size);
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

/* Forks since the library was loaded: a child's connection to the arbiter is its parent's, and
 * its token (lease_words.c) its own. */
static _Atomic unsigned forks;

unsigned vgpu_lease_forks(void) {
    return atomic_load_explicit(&forks, memory_order_relaxed);
}
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
    /* `private` is left as it is: it tells what `shared` maps, the file paced with once this
     * connection ends (seat_gone), and follow_daemon must know it for one of this user's own. */
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
    group_folder(lease->folder, sizeof lease->folder);
    lease->private = false; /* of a private file that could not be mapped before */
    char first[4400];
    bool usual = false;
    if (absent) {
        lease->shared = map_in(lease, why, sizeof why);
        snprintf(first, sizeof first, "%s", why);
        usual = shut_out(lease->folder);
    } else {
        /* A daemon is there but did not answer (busy, or flooded with connections): not the
         * group's lease file, which any member could write under this process, but one of this
         * user's own until the daemon answers (follow_daemon asks every second), or is found
         * gone (then the group's file: leave_own_lease). */
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

/* A lease of this user's own "for now" (a daemon was there but did not answer) while there is
 * no daemon any more: the group's lease file, as map_any takes without a daemon. A daemon going
 * away accepts a connection and closes it unanswered while it stops: a process whose connection
 * ended then (seat_gone) took a lease of its own, while those that came a moment later found no
 * daemon and took the group's file; they would not exclude each other for as long as no daemon
 * came back (a 30/70 pair at 13/63 %). Called between epochs, the lease not held: no word of
 * the old file is ours to give back. The old file stays mapped (one page): a thread reading
 * outside the device's lock (compute.c) may still hold the pointer. Where the group's file
 * cannot be had, the lease of this user's own is kept, as map_any would keep it. */
static void leave_own_lease(struct vgpu_lease *lease) {
    char folder[sizeof lease->folder];
    group_folder(folder, sizeof folder);
    char why[4400];
    struct vgpu_device_lease *group = map_file(folder, false, lease->uuid, why, sizeof why);
    lease->said_daemon = false; /* no longer "for now"; a daemon that fails later is said again */
    if (group == NULL) {
        vgpu_log(shut_out(folder) ? VGPU_LOG_INFO : VGPU_LOG_WARN,
                 "device lease %s; no daemon, keeping %s", why, lease->folder);
        return;
    }
    snprintf(lease->folder, sizeof lease->folder, "%s", folder);
    lease->private = false;
    __atomic_store_n(&lease->shared, group, __ATOMIC_RELEASE); /* mapped and stamped first */
    vgpu_log(VGPU_LOG_INFO, "device lease of %s: no daemon; using %s", lease->uuid, folder);
}

/* Between epochs, at most every NODE_RETRY_NS: when the daemon's node file names an arbiter
 * other than the one connected to (the daemon restarted, or started after this process), connect
 * to it, so that every paced process of the GPU is arbitrated together again; and a lease of
 * this user's own for now goes to the group's file once no daemon is there (leave_own_lease). */
static void follow_daemon(struct vgpu_lease *lease, uint64_t now) {
    if (now - lease->asked_ns < NODE_RETRY_NS) {
        return;
    }
    lease->asked_ns = now;
    const struct vgpu_device_node *node = node_of(lease, now);
    uint64_t named = node != NULL ? atomic_load(&node->lease_instance) : 0;
    /* A lease of this user's own while a daemon is there: ask again even if the node file
     * names nothing new (a flood may have kept the daemon from answering). */
    bool own_for_now = lease->private && lease->said_daemon && !arbitrated(lease);
    if (named == 0 && own_for_now) { /* no daemon names an arbiter of this GPU: none to wait for */
        leave_own_lease(lease);
        return;
    }
    if (named == 0 || (named == lease->instance && (arbitrated(lease) || !own_for_now))) {
        return;
    }
    char why[4400];
    bool absent = false;
    if (!seat_in(lease, &absent, why, sizeof why)) { /* said once: this runs every second */
        vgpu_log(absent || lease->said_daemon ? VGPU_LOG_DEBUG : VGPU_LOG_WARN,
                 "device lease from the daemon: %s", why);
        if (absent && own_for_now) { /* the daemon is gone (no socket, or nobody listening) */
            leave_own_lease(lease);
            return;
        }
        lease->said_daemon = lease->said_daemon || !absent;
        return;
    }
    vgpu_log(VGPU_LOG_INFO, "device lease of %s: the daemon's, instance %llu", lease->uuid,
             (unsigned long long)lease->instance);
}

/* The arbiter's connection broke (the daemon stopped): pace with a lease file until a daemon
 * names itself again in the node file. A daemon that stops may still accept the connection
 * made again here and close it unanswered: that is taken, as anywhere, for a daemon that is
 * there but did not answer (a lease of this user's own), not for none, since a flood of
 * connections looks the same; follow_daemon takes the group's file once the daemon is gone,
 * within a second or two. */
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
static bool acquire_seat(struct vgpu_lease *lease, bool urgent, uint64_t started);

void vgpu_lease_attach_pod(struct vgpu_lease *lease, _Atomic uint64_t *pod_words) {
    lease->pod = pod_words;
}

/* In a forked child, the connection and the seat are its parent's: it takes its own. Where it
 * cannot, the parent's seat stays mapped, unused (the socket says the lease is not arbitrated):
 * a thread reading whether other pods want the GPU outside the device's lock (compute.c) may
 * still hold the pointer. */
static void reseat_child(struct vgpu_lease *lease) {
    close(lease->socket);
    lease->socket = -1;
    lease->exclusive = false;
    char why[4400];
    bool absent = false;
    if (!seat_in(lease, &absent, why, sizeof why)) {
        seat_gone(lease);
    }
}

static bool acquire_seat(struct vgpu_lease *lease, bool urgent, uint64_t started) {
    uint64_t request = ++lease->request;
    int granted = vgpu_seat_acquire(lease->socket, request, urgent, started + WAIT_MAX_NS);
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

bool vgpu_lease_acquire(struct vgpu_lease *lease, bool urgent) {
    uint64_t started = vgpu_monotonic_ns();
    if (arbitrated(lease) && lease->forks != atomic_load(&forks)) {
        reseat_child(lease);
    }
    follow_daemon(lease, started);
    if (arbitrated(lease)) {
        return acquire_seat(lease, urgent, started);
    }
    if (lease->shared == NULL) { /* neither the arbiter nor a file: without exclusivity */
        lease->exclusive = false;
        return false;
    }
    return vgpu_words_acquire(lease, urgent, started);
}

bool vgpu_lease_lost(struct vgpu_lease *lease, uint64_t now) {
    if (arbitrated(lease)) { /* only the daemon takes it, and only rightly */
        bool lost = lease->exclusive && atomic_load(&lease->seat->granted) != lease->request;
        lease->exclusive = lease->exclusive && !lost;
        return lost;
    }
    return lease->shared != NULL && vgpu_words_lost(lease, now);
}

/* Whether this process may write its seat: not a forked child's copy of its parent's. */
static bool own_seat(const struct vgpu_lease *lease) {
    return lease->exclusive && lease->forks == atomic_load(&forks);
}

void vgpu_lease_touch(struct vgpu_lease *lease, uint64_t now) {
    if (arbitrated(lease)) {
        lease->touched_ns = now;
        if (own_seat(lease)) {
            atomic_store(&lease->seat->activity_ns, now);
        }
    } else if (lease->shared != NULL) {
        vgpu_words_touch(lease, now);
    }
}

void vgpu_lease_expect(struct vgpu_lease *lease, uint64_t drains_ns) {
    if (arbitrated(lease)) {
        lease->drains_ns = drains_ns;
        if (own_seat(lease)) {
            atomic_store(&lease->seat->drains_ns, drains_ns);
        }
    } else if (lease->shared != NULL) {
        vgpu_words_expect(lease, drains_ns);
    }
}

void vgpu_lease_release(struct vgpu_lease *lease, uint64_t busy_ns) {
    if (arbitrated(lease)) {
        lease->exclusive = false;
        if (lease->forks == atomic_load(&forks) &&
            !vgpu_seat_release(lease->socket, lease->request, busy_ns)) {
            seat_gone(lease);
        }
    } else if (lease->shared != NULL) {
        vgpu_words_release(lease, busy_ns);
    }
}

bool vgpu_lease_yield_asked(struct vgpu_lease *lease, uint64_t now) {
    if (arbitrated(lease)) {
        return lease->exclusive && atomic_load(&lease->seat->yield_request) == lease->request;
    }
    return lease->shared != NULL && vgpu_words_yield_asked(lease, now);
}

bool vgpu_lease_held_by_other_pod(const struct vgpu_lease *lease) {
    if (arbitrated(lease)) {
        return atomic_load(&lease->seat->other_pod_holds) != 0;
    }
    return lease->shared != NULL && vgpu_words_held_by_other_pod(lease);
}

uint64_t vgpu_lease_newcomer_ns(const struct vgpu_lease *lease) {
    return arbitrated(lease) ? atomic_load(&lease->seat->newcomer_ns) : 0;
}

bool vgpu_lease_wanted(const struct vgpu_lease *lease, uint64_t now) {
    if (arbitrated(lease)) {
        return atomic_load(&lease->seat->waiters) != 0;
    }
    return lease->shared != NULL && vgpu_words_wanted(lease, now);
}

bool vgpu_lease_wanted_by_other_pod(const struct vgpu_lease *lease, uint64_t now) {
    if (arbitrated(lease)) {
        return atomic_load(&lease->seat->other_pod_waiters) != 0;
    }
    return lease->shared != NULL && vgpu_words_wanted_by_other_pod(lease, now);
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
        return 0;
    }
    return boost < VGPU_BOOST_ONE ? VGPU_BOOST_ONE : boost > VGPU_BOOST_MAX ? VGPU_BOOST_MAX : boost;
}
