/* See vgpu_region.h for the layout and the lock-free protocols implemented here. Structural
 * changes (creating the file, adding a device entry) are rare and take flock on the file,
 * which the kernel releases if the holder dies. flock belongs to the open file description,
 * which fork shares, so a forked child opens the file afresh (vgpu_region_forget_in_child). */
#define _GNU_SOURCE
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "vgpu_proc.h"

static int region_fd = -1;
static struct vgpu_region_process *self_slot;
static int32_t self_pid;

/* A description of its own of the file open at `fd` (the same file, whatever its name is now):
 * /proc/self/fd opens it anew where dup would share the description. The path is put together
 * by hand, as only async-signal-safe calls may follow a fork. */
static int open_again(int fd) {
    static const char prefix[] = "/proc/self/fd/";
    char path[sizeof prefix + 10], digits[10];
    size_t at = sizeof prefix - 1, length = 0;
    memcpy(path, prefix, at);
    for (unsigned value = (unsigned)fd; length == 0 || value != 0; value /= 10) {
        digits[length++] = (char)('0' + value % 10);
    }
    while (length > 0) {
        path[at++] = digits[--length];
    }
    path[at] = '\0';
    return open(path, O_RDWR | O_CLOEXEC);
}

/* The writers' lock; retried on EINTR so that no writer ever runs without it. False where it
 * cannot be taken (a child that could not open the file afresh): the caller writes nothing. */
static bool lock_writers(void) {
    while (flock(region_fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            return false;
        }
    }
    return true;
}

static void unlock_writers(void) {
    flock(region_fd, LOCK_UN);
}

static uint64_t realtime_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

void vgpu_region_format(struct vgpu_region *region, const char *pod_namespace,
                        const char *pod_name, const struct vgpu_region_limits *devices,
                        unsigned device_count) {
    region->magic = VGPU_REGION_MAGIC;
    region->version = VGPU_REGION_VERSION;
    region->header_size = (uint32_t)offsetof(struct vgpu_region, devices);
    region->total_size = sizeof *region;
    atomic_store(&region->created_ns, realtime_ns());
    atomic_store(&region->qos, VGPU_QOS_MEDIUM); /* the default class until the daemon says */
    snprintf(region->pod_namespace, sizeof region->pod_namespace, "%s", pod_namespace);
    snprintf(region->pod_name, sizeof region->pod_name, "%s", pod_name);
    for (unsigned i = 0; i < device_count && i < VGPU_REGION_MAX_DEVICES; i++) {
        vgpu_region_add_device(region, &devices[i]);
    }
}

struct vgpu_region *vgpu_region_open(const char *folder, const char *pod_namespace,
                                     const char *pod_name, bool create, char *error,
                                     size_t error_size) {
    int fd = vgpu_region_open_file(folder, "shm", true, error, error_size);
    if (fd < 0 && create &&
        vgpu_region_create(folder, pod_namespace, pod_name, NULL, 0, VGPU_OWNER_KEEP,
                           VGPU_OWNER_KEEP, error, error_size) >= 0) {
        fd = vgpu_region_open_file(folder, "shm", true, error, error_size);
    }
    if (fd < 0) {
        return NULL;
    }
    /* The file's size was checked, and its space allocated when it was made. */
    struct vgpu_region *region =
        mmap(NULL, sizeof *region, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (region == MAP_FAILED) {
        snprintf(error, error_size, "%.300s/shm: cannot map the pod region: %s", folder,
                 strerror(errno));
        close(fd);
        return NULL;
    }
    /* The writers' flock goes on a description that no mapping holds: a mapping keeps its
     * file's description, and a flock on it, for as long as it lasts, in every child forked
     * with it, whatever descriptors the child closes. Where /proc cannot open the file again,
     * the lock goes on the mapped one. */
    int lock_fd = open_again(fd);
    if (lock_fd >= 0) {
        close(fd);
        fd = lock_fd;
    }
    region_fd = fd; /* kept for flock */
    return region;
}

static int find_device(const struct vgpu_region *region, const char *uuid) {
    uint32_t count = atomic_load(&((struct vgpu_region *)region)->device_count);
    for (uint32_t i = 0; i < count && i < VGPU_REGION_MAX_DEVICES; i++) {
        if (strcasecmp(region->devices[i].uuid, uuid) == 0) {
            return (int)i;
        }
    }
    return -1;
}

static void write_limits(struct vgpu_region_device *device,
                         const struct vgpu_region_limits *limits) {
    atomic_store(&device->memory_limit, limits->memory_limit);
    atomic_store(&device->compute_limit, limits->compute_limit);
    atomic_store(&device->compute_soft_limit, limits->compute_soft_limit);
    atomic_store(&device->device_flags, limits->device_flags);
}

int vgpu_region_add_device(struct vgpu_region *region, const struct vgpu_region_limits *limits) {
    const char *uuid = limits->uuid;
    if (find_device(region, uuid) >= 0) {
        return VGPU_REGION_EXISTS;
    }
    uint32_t count = atomic_load(&region->device_count);
    if (count >= VGPU_REGION_MAX_DEVICES) {
        return VGPU_REGION_FULL;
    }
    /* "GPU-" and lower-case hex, as NVML prints it (the callers pass that form). */
    struct vgpu_region_device *device = &region->devices[count];
    /* Not published yet: no reader to order the stores for (an odd generation is a writer
     * that died here before; readers must not wait on it). */
    atomic_store(&device->generation, atomic_load(&device->generation) & ~1U);
    write_limits(device, limits);
    snprintf(device->uuid, sizeof device->uuid, "%.*s", (int)sizeof device->uuid - 1, uuid);
    atomic_store(&region->device_count, count + 1); /* published after the entry */
    return (int)count;
}

int vgpu_region_device(struct vgpu_region *region, const char *uuid, bool create) {
    int found = find_device(region, uuid);
    if (found >= 0 || !create) {
        return found;
    }
    struct vgpu_region_limits none = {0};
    snprintf(none.uuid, sizeof none.uuid, "%s", uuid);
    if (!lock_writers()) {
        return VGPU_REGION_ERROR;
    }
    found = vgpu_region_add_device(region, &none);
    if (found == VGPU_REGION_EXISTS) {
        found = find_device(region, uuid);
    }
    unlock_writers();
    return found == VGPU_REGION_FULL ? found : found < 0 ? VGPU_REGION_ERROR : found;
}

/* A reader retries while a change is being written. A writer preempted in the middle of one (a
 * busy host) keeps the generation odd for milliseconds: 1000 quick attempts ran out first there
 * and returned a torn pair, so past READ_SPINS the reader yields, for up to READ_PATIENCE_NS. A
 * writer that died mid-change keeps it odd until the next writer (or the daemon) settles it: the
 * reader then takes the values as they are (each a whole value), and remembers that generation
 * of that entry so as not to wait for it again. */
#define READ_SPINS 1000
#define READ_PATIENCE_NS 20000000ULL
static _Atomic(uintptr_t) stuck_entry;
static _Atomic uint32_t stuck_generation;

static uint64_t monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

void vgpu_region_read_limits(const struct vgpu_region *region, int entry,
                             struct vgpu_region_limits *limits) {
    struct vgpu_region_device *device = (struct vgpu_region_device *)&region->devices[entry];
    uint64_t deadline = 0;
    for (unsigned attempt = 0;; attempt++) {
        uint32_t before = atomic_load(&device->generation);
        limits->memory_limit = atomic_load(&device->memory_limit);
        limits->compute_limit = atomic_load(&device->compute_limit);
        limits->compute_soft_limit = atomic_load(&device->compute_soft_limit);
        limits->device_flags = atomic_load(&device->device_flags);
        uint32_t after = atomic_load(&device->generation);
        if ((before & 1) == 0 && before == after) {
            return;
        }
        if (attempt < READ_SPINS) {
            continue;
        }
        if (atomic_load(&stuck_entry) == (uintptr_t)device &&
            atomic_load(&stuck_generation) == after) {
            return; /* waited for this one before: its writer is gone */
        }
        uint64_t now = monotonic_ns();
        if (deadline == 0) {
            deadline = now + READ_PATIENCE_NS;
        } else if (now > deadline) {
            atomic_store(&stuck_generation, after);
            atomic_store(&stuck_entry, (uintptr_t)device);
            return;
        }
        sched_yield();
    }
}

void vgpu_region_limits(const struct vgpu_region *region, int entry, uint64_t *memory_limit,
                        uint32_t *compute_limit) {
    struct vgpu_region_limits limits;
    vgpu_region_read_limits(region, entry, &limits);
    *memory_limit = limits.memory_limit;
    *compute_limit = limits.compute_limit;
}

void vgpu_region_store_limits(struct vgpu_region *region, unsigned entry,
                              const struct vgpu_region_limits *limits) {
    if (entry >= VGPU_REGION_MAX_DEVICES) {
        return;
    }
    struct vgpu_region_device *device = &region->devices[entry];
    uint32_t generation = atomic_load(&device->generation);
    /* Odd under the writers' lock: left by a writer that died; start from even. */
    atomic_store(&device->generation, (generation | 1U));
    write_limits(device, limits);
    atomic_store(&device->generation, (generation | 1U) + 1U);
}

void vgpu_region_seed_limits(struct vgpu_region *region, int entry,
                             const struct vgpu_region_limits *seed) {
    if (!lock_writers()) { /* one writer at a time, as the seqlock needs */
        return;
    }
    struct vgpu_region_limits now;
    vgpu_region_read_limits(region, entry, &now);
    struct vgpu_region_limits next = now;
    next.memory_limit = now.memory_limit != 0 ? now.memory_limit : seed->memory_limit;
    next.compute_limit = now.compute_limit != 0 ? now.compute_limit : seed->compute_limit;
    next.compute_soft_limit =
        now.compute_soft_limit != 0 ? now.compute_soft_limit : seed->compute_soft_limit;
    next.device_flags = now.device_flags != 0 ? now.device_flags : seed->device_flags;
    if (memcmp(&next, &now, sizeof next) != 0) {
        vgpu_region_store_limits(region, (unsigned)entry, &next);
    }
    unlock_writers();
}

void vgpu_region_forget_in_child(void) {
    self_slot = NULL;
    if (region_fd >= 0) {
        /* The descriptor inherited shares the parent's description, and with it the writers'
         * flock: the child got in while its parent (or a sibling) was inside, its unlock let go
         * of the parent's lock, and a parent killed inside left the lock held for as long as a
         * child forked before lived. Closing the inherited copy lets go of nothing: the parent
         * has its own. Where the file cannot be opened again, the child has no writers' lock
         * and writes nothing that needs it (a GPU the environment limits and the region has no
         * entry for then fails vgpu_map_devices: closed, as for a full region). */
        int fresh = open_again(region_fd);
        close(region_fd);
        region_fd = fresh;
    }
}

struct vgpu_region_process *vgpu_region_self(struct vgpu_region *region) {
    int32_t pid = (int32_t)getpid();
    struct vgpu_region_process *slot = self_slot;
    if (slot != NULL && self_pid == pid) {
        return slot;
    }
    uint64_t start_time = vgpu_process_start_time(pid);
    uint64_t pid_namespace = vgpu_pid_namespace();
    for (int attempt = 0; attempt < 2; attempt++) {
        for (unsigned i = 0; i < VGPU_REGION_MAX_PROCESSES; i++) {
            struct vgpu_region_process *candidate = &region->processes[i];
            int32_t expected = VGPU_SLOT_FREE;
            if (!atomic_compare_exchange_strong(&candidate->pid, &expected, VGPU_SLOT_CLAIMING)) {
                continue;
            }
            candidate->pid_namespace = pid_namespace;
            candidate->start_time = start_time;
            atomic_store(&candidate->host_pid, 0);
            for (unsigned d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
                atomic_store(&candidate->memory[d], 0);
                atomic_store(&candidate->host_memory[d], 0);
            }
            atomic_store(&candidate->heartbeat_ns, realtime_ns());
            atomic_store(&candidate->pid, pid); /* published last */
            self_slot = candidate;
            self_pid = pid;
            return candidate;
        }
        vgpu_region_reap(region); /* full: make room from processes that are gone */
    }
    return NULL;
}

bool vgpu_region_reclaim_process(struct vgpu_region *region, unsigned slot, int32_t pid,
                                 uint64_t pid_namespace, uint64_t start_time) {
    if (slot >= VGPU_REGION_MAX_PROCESSES || pid <= 0) {
        return false;
    }
    struct vgpu_region_process *process = &region->processes[slot];
    int32_t expected = pid;
    if (!atomic_compare_exchange_strong(&process->pid, &expected, VGPU_SLOT_RECLAIMING)) {
        return false; /* someone else reclaimed it */
    }
    if (process->pid_namespace != pid_namespace || process->start_time != start_time) {
        atomic_store(&process->pid, pid); /* another process with that pid number: leave it */
        return false;
    }
    for (unsigned d = 0; d < VGPU_REGION_MAX_DEVICES; d++) {
        uint64_t held = atomic_exchange(&process->memory[d], 0);
        if (held != 0) {
            atomic_fetch_sub(&region->devices[d].memory_used, held);
        }
        held = atomic_exchange(&process->host_memory[d], 0);
        if (held != 0) {
            atomic_fetch_sub(&region->devices[d].host_memory_used, held);
        }
    }
    atomic_store(&process->pid, VGPU_SLOT_FREE);
    return true;
}

unsigned vgpu_region_reap(struct vgpu_region *region) {
    uint64_t pid_namespace = vgpu_pid_namespace();
    unsigned reclaimed = 0;
    for (unsigned i = 0; i < VGPU_REGION_MAX_PROCESSES; i++) {
        struct vgpu_region_process *process = &region->processes[i];
        int32_t pid = atomic_load(&process->pid);
        uint64_t start_time = process->start_time;
        /* Only processes of our own pid namespace can be judged from here; the daemon judges
         * the others by their host pid. */
        if (pid > 0 && process->pid_namespace == pid_namespace &&
            !vgpu_process_alive(pid, start_time) &&
            vgpu_region_reclaim_process(region, i, pid, pid_namespace, start_time)) {
            reclaimed++;
        }
    }
    return reclaimed;
}

void vgpu_region_sweep(struct vgpu_region *region) {
    static _Atomic uint64_t next_ns;
    uint64_t now_ns = monotonic_ns();
    uint64_t due = atomic_load(&next_ns);
    if (now_ns >= due && atomic_compare_exchange_strong(&next_ns, &due, now_ns + 1000000000ULL)) {
        vgpu_region_reap(region);
    }
}

static bool try_reserve(struct vgpu_region *region, int entry, uint64_t bytes) {
    uint64_t limit;
    uint32_t compute;
    vgpu_region_limits(region, entry, &limit, &compute);
    struct vgpu_region_device *device = &region->devices[entry];
    uint64_t used = atomic_load(&device->memory_used);
    do {
        if (limit != 0 && (bytes > limit || used > limit - bytes)) {
            return false;
        }
    } while (!atomic_compare_exchange_weak(&device->memory_used, &used, used + bytes));
    return true;
}

/* Whether a refused reservation should look for dead processes' memory: never for more than
 * the limit, and at most once a millisecond per process, since a reap reads /proc for every
 * process of the pod (a refused allocation in a pod of 65 processes cost 582 µs when each one
 * reaped; a dead process's memory is still back within a millisecond of the next attempt). */
static bool worth_reaping(const struct vgpu_region *region, int entry, uint64_t bytes) {
    static _Atomic uint64_t next_ns;
    uint64_t limit;
    uint32_t compute;
    vgpu_region_limits(region, entry, &limit, &compute);
    if (limit != 0 && bytes > limit) {
        return false;
    }
    uint64_t now_ns = monotonic_ns();
    uint64_t due = atomic_load(&next_ns);
    return now_ns >= due && atomic_compare_exchange_strong(&next_ns, &due, now_ns + 1000000ULL);
}

bool vgpu_region_reserve(struct vgpu_region *region, int entry, uint64_t bytes,
                         bool count_refusal) {
    struct vgpu_region_process *self = vgpu_region_self(region);
    if (self == NULL) {
        return false;
    }
    vgpu_region_sweep(region);
    if (!try_reserve(region, entry, bytes) &&
        (!worth_reaping(region, entry, bytes) || vgpu_region_reap(region) == 0 ||
         !try_reserve(region, entry, bytes))) {
        if (count_refusal) {
            /* Only for the daemon's reports: relaxed, and nothing on the way that fits. */
            struct vgpu_region_device *device = &region->devices[entry];
            atomic_store_explicit(&device->refused_bytes_last, bytes, memory_order_relaxed);
            atomic_fetch_add_explicit(&device->refusals, 1, memory_order_relaxed);
        }
        return false;
    }
    /* The pod total first, then the slot: a process killed in between leaks its reservation
     * rather than letting the pod pass its limit. */
    atomic_fetch_add(&self->memory[entry], bytes);
    atomic_store(&self->heartbeat_ns, realtime_ns());
    return true;
}

void vgpu_region_heartbeat(struct vgpu_region *region) {
    struct vgpu_region_process *self = vgpu_region_self(region);
    if (self != NULL) {
        atomic_store_explicit(&self->heartbeat_ns, realtime_ns(), memory_order_relaxed);
    }
}

void vgpu_region_release(struct vgpu_region *region, int entry, uint64_t bytes) {
    struct vgpu_region_process *self = vgpu_region_self(region);
    if (self == NULL) {
        return;
    }
    uint64_t held = atomic_load(&self->memory[entry]);
    bytes = bytes < held ? bytes : held;
    atomic_fetch_sub(&self->memory[entry], bytes);
    atomic_fetch_sub(&region->devices[entry].memory_used, bytes);
}

bool vgpu_region_reserve_host(struct vgpu_region *region, int entry, uint64_t bytes) {
    struct vgpu_region_process *self = vgpu_region_self(region);
    if (self == NULL) {
        return false;
    }
    struct vgpu_region_device *device = &region->devices[entry];
    uint64_t used = atomic_load(&device->host_memory_used);
    do {
        if (bytes > UINT64_MAX - used) {
            return false;
        }
    } while (!atomic_compare_exchange_weak(&device->host_memory_used, &used, used + bytes));
    atomic_fetch_add(&self->host_memory[entry], bytes);
    atomic_store(&self->heartbeat_ns, realtime_ns());
    return true;
}

void vgpu_region_release_host(struct vgpu_region *region, int entry, uint64_t bytes) {
    struct vgpu_region_process *self = vgpu_region_self(region);
    if (self == NULL) {
        return;
    }
    uint64_t held = atomic_load(&self->host_memory[entry]);
    bytes = bytes < held ? bytes : held;
    atomic_fetch_sub(&self->host_memory[entry], bytes);
    atomic_fetch_sub(&region->devices[entry].host_memory_used, bytes);
}

void vgpu_region_read_device(const struct vgpu_region *region, unsigned entry,
                             struct vgpu_region_device_view *view) {
    const struct vgpu_region_device *device = &region->devices[entry];
    struct vgpu_region_device *live = (struct vgpu_region_device *)device;
    struct vgpu_region_limits limits;
    vgpu_region_read_limits(region, (int)entry, &limits);
    view->memory_limit = limits.memory_limit;
    view->compute_limit = limits.compute_limit;
    view->compute_soft_limit = limits.compute_soft_limit;
    view->device_flags = limits.device_flags;
    view->generation = atomic_load(&live->generation);
    view->memory_used = atomic_load(&live->memory_used);
    view->host_memory_used = atomic_load(&live->host_memory_used);
    view->gpu_ns = atomic_load(&live->gpu_ns);
    view->throttled_ns = atomic_load(&live->throttled_ns);
    view->burst_ns = atomic_load(&live->burst_ns);
    view->refusals = atomic_load(&live->refusals);
    view->refused_bytes_last = atomic_load(&live->refused_bytes_last);
    memcpy(view->uuid, device->uuid, sizeof view->uuid);
    view->uuid[sizeof view->uuid - 1] = '\0';
}

static bool same_process(const struct vgpu_region_process *process, int32_t pid,
                         uint64_t pid_namespace, uint64_t start_time) {
    return atomic_load(&((struct vgpu_region_process *)process)->pid) == pid &&
           process->pid_namespace == pid_namespace && process->start_time == start_time;
}

int vgpu_region_set_host_pid(struct vgpu_region *region, unsigned slot, int32_t pid,
                             uint64_t pid_namespace, uint64_t start_time, int32_t host_pid) {
    if (slot >= VGPU_REGION_MAX_PROCESSES || pid <= 0) {
        return VGPU_REGION_STALE;
    }
    struct vgpu_region_process *process = &region->processes[slot];
    if (!same_process(process, pid, pid_namespace, start_time)) {
        return VGPU_REGION_STALE;
    }
    atomic_store(&process->host_pid, host_pid);
    /* A claimer clears host_pid before it publishes its pid: seen here if it came between. A
     * host pid left on another live process's slot would make it look dead. */
    if (!same_process(process, pid, pid_namespace, start_time)) {
        atomic_store(&process->host_pid, 0);
        return VGPU_REGION_STALE;
    }
    return 0;
}

unsigned vgpu_region_settle_generations(struct vgpu_region *region) {
    unsigned settled = 0;
    uint32_t count = atomic_load(&region->device_count);
    for (uint32_t i = 0; i < count && i < VGPU_REGION_MAX_DEVICES; i++) {
        uint32_t generation = atomic_load(&region->devices[i].generation);
        if (generation & 1U) { /* under the writers' lock: a writer that died mid-change */
            atomic_store(&region->devices[i].generation, generation + 1U);
            settled++;
        }
    }
    return settled;
}
