#define _GNU_SOURCE
#include "lease.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
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

static bool make_folder(const char *folder) {
    char path[4096];
    snprintf(path, sizeof path, "%s", folder);
    for (char *cursor = path + 1; *cursor != '\0'; cursor++) {
        if (*cursor == '/') {
            *cursor = '\0';
            mkdir(path, 0777);
            *cursor = '/';
        }
    }
    if (mkdir(path, 0777) == 0) {
        chmod(path, 01777); /* shared by the node's users, like /tmp */
        return true;
    }
    return errno == EEXIST;
}

static struct vgpu_device_lease *map_in(const char *folder, const char *uuid) {
    char path[4200];
    if (!make_folder(folder) || snprintf(path, sizeof path, "%s/%s", folder, uuid) >= (int)sizeof path) {
        return NULL;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        return NULL;
    }
    fchmod(fd, 0666);
    struct vgpu_device_lease *lease = MAP_FAILED;
    /* A new file is all zeros, which is a free lease; only the magic is written once. An
     * existing file is never shrunk. */
    off_t size = lseek(fd, 0, SEEK_END);
    if (size >= (off_t)sizeof *lease || ftruncate(fd, sizeof *lease) == 0) {
        lease = mmap(NULL, sizeof *lease, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (lease == MAP_FAILED) {
        return NULL;
    }
    if (lease->magic == 0) {
        lease->version = VGPU_LEASE_VERSION;
        lease->magic = VGPU_LEASE_MAGIC;
    }
    if (lease->magic != VGPU_LEASE_MAGIC || lease->version != VGPU_LEASE_VERSION) {
        munmap(lease, sizeof *lease);
        return NULL;
    }
    return lease;
}

struct vgpu_device_lease *vgpu_lease_open(const char *uuid) {
    char folder[4096];
    snprintf(folder, sizeof folder, "%.*s/.devices", (int)(sizeof folder - sizeof "/.devices"),
             vgpu_state.config.base_path);
    struct vgpu_device_lease *lease = map_in(folder, uuid);
    if (lease == NULL) {
        const char *tmp = getenv("TMPDIR");
        snprintf(folder, sizeof folder, "%s/vgpu-devices", tmp != NULL && tmp[0] == '/' ? tmp : "/tmp");
        lease = map_in(folder, uuid);
    }
    if (lease == NULL) {
        vgpu_log(VGPU_LOG_WARN, "no device lease for %s: compute pacing without exclusivity", uuid);
    }
    return lease;
}

/* Sleep until the lease is released (or `nanoseconds` pass): a shared futex, so a release wakes
 * a waiter in another process within microseconds. */
static void wait_release(struct vgpu_device_lease *lease, uint32_t seen, uint64_t nanoseconds) {
    struct timespec timeout = {(time_t)(nanoseconds / 1000000000ULL),
                               (long)(nanoseconds % 1000000000ULL)};
    syscall(SYS_futex, (uint32_t *)&lease->releases, FUTEX_WAIT, seen, &timeout, NULL, 0);
}

static void pause_for(uint64_t nanoseconds) {
    struct timespec delay = {(time_t)(nanoseconds / 1000000000ULL), (long)(nanoseconds % 1000000000ULL)};
    while (nanosleep(&delay, &delay) != 0 && errno == EINTR) {
    }
}

/* How long a released lease is kept for processes already waiting: without it the releasing
 * process, awake, would take it back before a sleeping waiter notices. */
#define YIELD_NS 150000ULL

void vgpu_lease_acquire(struct vgpu_device_lease *lease) {
    uint64_t me = token();
    bool waiting = false;
    for (;;) {
        uint32_t seen = atomic_load(&lease->releases);
        uint64_t owner = atomic_load(&lease->owner);
        uint64_t now = vgpu_monotonic_ns();
        if (owner == me) {
            break;
        }
        bool yielding = now < atomic_load(&lease->yield_until_ns);
        if (owner == 0 && (waiting || !yielding) &&
            atomic_compare_exchange_strong(&lease->owner, &owner, me)) {
            break;
        }
        /* A holder that stopped launching (or died) loses the lease. */
        uint64_t activity = atomic_load(&lease->activity_ns);
        if (owner != 0 && now > activity + VGPU_LEASE_STALE_NS &&
            atomic_compare_exchange_strong(&lease->owner, &owner, me)) {
            atomic_fetch_add(&lease->takeovers, 1);
            break;
        }
        if (!waiting) {
            atomic_fetch_add(&lease->waiters, 1);
            waiting = true;
        }
        if (owner == 0) {
            pause_for(20000); /* free but kept for earlier waiters a moment */
        } else {
            /* Until released, and at most until the holder could be stale. */
            uint64_t activity = atomic_load(&lease->activity_ns);
            uint64_t stale_at = activity + VGPU_LEASE_STALE_NS;
            wait_release(lease, seen, stale_at > now ? stale_at - now + 10000 : 10000);
        }
    }
    if (waiting) {
        atomic_fetch_sub(&lease->waiters, 1);
    }
    atomic_store(&lease->activity_ns, vgpu_monotonic_ns());
    atomic_fetch_add(&lease->epochs, 1);
}

bool vgpu_lease_held(struct vgpu_device_lease *lease) {
    return atomic_load(&lease->owner) == token();
}

void vgpu_lease_touch(struct vgpu_device_lease *lease) {
    atomic_store(&lease->activity_ns, vgpu_monotonic_ns());
}

void vgpu_lease_release(struct vgpu_device_lease *lease) {
    uint64_t me = token();
    if (atomic_compare_exchange_strong(&lease->owner, &me, 0) &&
        atomic_load(&lease->waiters) > 0) {
        atomic_store(&lease->yield_until_ns, vgpu_monotonic_ns() + YIELD_NS);
        atomic_fetch_add(&lease->releases, 1);
        syscall(SYS_futex, (uint32_t *)&lease->releases, FUTEX_WAKE, 1, NULL, NULL, 0);
    }
}

bool vgpu_lease_wanted(struct vgpu_device_lease *lease) {
    return atomic_load(&lease->waiters) > 0;
}

uint32_t vgpu_lease_boost(struct vgpu_device_lease *lease) {
    uint32_t boost = atomic_load(&lease->boost);
    uint64_t written = atomic_load(&lease->boost_ns);
    uint64_t now = vgpu_monotonic_ns();
    if (boost == 0 || written > now || now - written > VGPU_BOOST_STALE_NS) {
        return VGPU_BOOST_ONE;
    }
    return boost < VGPU_BOOST_ONE ? VGPU_BOOST_ONE : boost > VGPU_BOOST_MAX ? VGPU_BOOST_MAX : boost;
}
