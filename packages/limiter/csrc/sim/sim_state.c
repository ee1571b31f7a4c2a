/* Mapping, locking and bookkeeping of the simulated GPU's node-wide state file. */
#define _GNU_SOURCE
#include "sim_state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim_config.h"
#include "vgpu_files.h"
#include "vgpu_proc.h"

static pthread_once_t map_once = PTHREAD_ONCE_INIT;
static struct sim_state *mapped;
/* This process's slot; reset in a forked child, which is another process. */
static struct sim_process *self_slot;
static int32_t self_pid;

uint64_t sim_now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

void sim_sleep_until(uint64_t deadline_ns) {
    struct timespec deadline = {(time_t)(deadline_ns / 1000000000ULL),
                                (long)(deadline_ns % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, NULL) == EINTR) {
    }
}

bool sim_process_alive(int32_t pid, uint64_t start_time) {
    return vgpu_process_alive(pid, start_time);
}

static void report(const char *message) {
    fprintf(stderr, "vgpu simulated GPU: %s\n", message);
}

static bool init_lock(pthread_mutex_t *lock) {
    pthread_mutexattr_t attributes;
    bool ok = pthread_mutexattr_init(&attributes) == 0 &&
              pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED) == 0 &&
              pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST) == 0 &&
              pthread_mutex_init(lock, &attributes) == 0;
    pthread_mutexattr_destroy(&attributes);
    return ok;
}

/* Build a complete state in a private file, then link it into place: other processes never see
 * a half-written state, and a concurrent creator's file wins without being overwritten.
 * False (after one line on stderr) when it could not. */
static bool create_state(const char *path) {
    char temporary[4096];
    char error[512] = "";
    snprintf(temporary, sizeof temporary, "%s.%d.tmp", path, (int)getpid());
    int fd = open(temporary, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(error, sizeof error, "VGPU_SIM_STATE=%.300s: cannot create: %s", path,
                 strerror(errno));
        report(error);
        return false;
    }
    fchmod(fd, 0666); /* shared by every user's processes on the node, as a GPU is */
    struct sim_state *state = NULL;
    if (ftruncate(fd, sizeof *state) == 0) {
        state = mmap(NULL, sizeof *state, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (state == NULL || state == MAP_FAILED) {
        snprintf(error, sizeof error, "VGPU_SIM_STATE=%.300s: cannot size or map", path);
    } else if (sim_config_load(state, error, sizeof error) && init_lock(&state->lock)) {
        state->version = SIM_STATE_VERSION;
        state->header_size = (uint32_t)offsetof(struct sim_state, devices);
        state->total_size = sizeof *state;
        state->magic = SIM_STATE_MAGIC;
        msync(state, sizeof *state, MS_SYNC);
        if (link(temporary, path) != 0 && errno != EEXIST) {
            snprintf(error, sizeof error, "VGPU_SIM_STATE=%.300s: cannot create: %s", path,
                     strerror(errno));
        }
    } else if (error[0] == '\0') {
        snprintf(error, sizeof error, "cannot set up the state lock");
    }
    if (state != NULL && state != MAP_FAILED) {
        munmap(state, sizeof *state);
    }
    unlink(temporary);
    if (error[0] != '\0') {
        report(error);
        return false;
    }
    return true;
}

static void map_state(void) {
    const char *configured = getenv("VGPU_SIM_STATE");
    char fallback[256];
    if (configured == NULL || *configured == '\0') {
        const char *tmp = getenv("TMPDIR");
        snprintf(fallback, sizeof fallback, "%s/vgpu-sim-%d.state", tmp && *tmp ? tmp : "/tmp",
                 (int)getuid());
        configured = fallback;
    }
    int fd = open(configured, O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        if (!create_state(configured)) {
            return;
        }
        fd = open(configured, O_RDWR | O_CLOEXEC);
    }
    if (fd < 0) {
        char error[512];
        snprintf(error, sizeof error, "VGPU_SIM_STATE=%.300s: cannot open: %s", configured,
                 strerror(errno));
        report(error);
        return;
    }
    struct stat info;
    struct sim_state *state = MAP_FAILED;
    if (vgpu_stat_at(fd, "", &info) == 0 && (size_t)info.st_size >= sizeof *state) {
        state = mmap(NULL, sizeof *state, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (state == MAP_FAILED || state->magic != SIM_STATE_MAGIC ||
        state->version != SIM_STATE_VERSION || state->total_size != sizeof *state ||
        state->device_count > SIM_MAX_DEVICES) {
        char error[512];
        snprintf(error, sizeof error,
                 "VGPU_SIM_STATE=%.300s: not a state file of this simulator version; remove it",
                 configured);
        report(error);
        if (state != MAP_FAILED) {
            munmap(state, sizeof *state);
        }
        return;
    }
    mapped = state;
}

static void forget_self_in_child(void) {
    self_slot = NULL;
}

static void map_state_once(void) {
    map_state();
    if (mapped != NULL) {
        pthread_atfork(NULL, NULL, forget_self_in_child);
    }
}

struct sim_state *sim_state(void) {
    pthread_once(&map_once, map_state_once);
    return mapped;
}

void sim_lock(struct sim_state *state) {
    if (pthread_mutex_lock(&state->lock) == EOWNERDEAD) {
        /* The holder died mid-update; counters stay usable, reaping corrects memory. */
        pthread_mutex_consistent(&state->lock);
    }
}

void sim_unlock(struct sim_state *state) {
    pthread_mutex_unlock(&state->lock);
}

void sim_reap_locked(struct sim_state *state) {
    for (unsigned i = 0; i < SIM_MAX_PROCESSES; i++) {
        struct sim_process *process = &state->processes[i];
        if (process->pid == 0 || sim_process_alive(process->pid, process->start_time)) {
            continue;
        }
        for (unsigned d = 0; d < state->device_count; d++) {
            uint64_t *used = &state->devices[d].used_memory;
            *used -= process->memory[d] < *used ? process->memory[d] : *used;
        }
        memset(process, 0, sizeof *process);
    }
}

struct sim_process *sim_self_locked(struct sim_state *state) {
    int32_t pid = (int32_t)getpid();
    if (self_slot != NULL && self_pid == pid && self_slot->pid == pid) {
        return self_slot;
    }
    uint64_t start_time = vgpu_process_start_time(pid);
    struct sim_process *free_slot = NULL;
    for (int pass = 0; pass < 2 && free_slot == NULL; pass++) {
        for (unsigned i = 0; i < SIM_MAX_PROCESSES; i++) {
            struct sim_process *process = &state->processes[i];
            if (process->pid == pid && process->start_time == start_time) {
                self_slot = process;
                self_pid = pid;
                return process;
            }
            if (process->pid == 0 && free_slot == NULL) {
                free_slot = process;
            }
        }
        if (free_slot == NULL) {
            sim_reap_locked(state);
        }
    }
    if (free_slot == NULL) {
        return NULL;
    }
    memset(free_slot, 0, sizeof *free_slot);
    free_slot->pid = pid;
    free_slot->start_time = start_time;
    self_slot = free_slot;
    self_pid = pid;
    return free_slot;
}

/* The state when `device` is valid, locked; NULL otherwise. */
static struct sim_state *lock_for(int device) {
    struct sim_state *state = sim_state();
    if (state == NULL || device < 0 || (unsigned)device >= state->device_count) {
        return NULL;
    }
    sim_lock(state);
    return state;
}

static bool reserve_locked(struct sim_state *state, struct sim_process *self, int device,
                           uint64_t bytes) {
    struct sim_device *target = &state->devices[device];
    if (bytes > target->config.total_memory - target->used_memory) {
        sim_reap_locked(state); /* memory of dead processes first, as the real driver does */
        if (bytes > target->config.total_memory - target->used_memory) {
            return false;
        }
    }
    target->used_memory += bytes;
    self->memory[device] += bytes;
    return true;
}

static void release_locked(struct sim_state *state, struct sim_process *self, int device,
                           uint64_t bytes) {
    bytes = bytes < self->memory[device] ? bytes : self->memory[device];
    self->memory[device] -= bytes;
    state->devices[device].used_memory -= bytes;
}

bool sim_memory_reserve(int device, uint64_t bytes) {
    struct sim_state *state = lock_for(device);
    if (state == NULL) {
        return false;
    }
    struct sim_process *self = sim_self_locked(state);
    bool ok = self != NULL && reserve_locked(state, self, device, bytes);
    sim_unlock(state);
    return ok;
}

void sim_memory_release(int device, uint64_t bytes) {
    struct sim_state *state = lock_for(device);
    if (state == NULL) {
        return;
    }
    struct sim_process *self = sim_self_locked(state);
    if (self != NULL) {
        release_locked(state, self, device, bytes);
    }
    sim_unlock(state);
}

bool sim_context_attach(int device) {
    struct sim_state *state = lock_for(device);
    if (state == NULL) {
        return false;
    }
    struct sim_process *self = sim_self_locked(state);
    bool ok = self != NULL &&
              reserve_locked(state, self, device, state->devices[device].config.context_overhead);
    if (ok) {
        self->contexts[device]++;
    }
    sim_unlock(state);
    return ok;
}

void sim_context_detach(int device) {
    struct sim_state *state = lock_for(device);
    if (state == NULL) {
        return;
    }
    struct sim_process *self = sim_self_locked(state);
    if (self != NULL && self->contexts[device] > 0) {
        self->contexts[device]--;
        release_locked(state, self, device, state->devices[device].config.context_overhead);
    }
    sim_unlock(state);
}

uint64_t sim_enqueue(int device, uint64_t ready_ns, uint64_t duration_ns) {
    uint64_t now = sim_now_ns();
    struct sim_state *state = lock_for(device);
    if (state == NULL) {
        return now;
    }
    struct sim_device *target = &state->devices[device];
    uint64_t start = ready_ns > now ? ready_ns : now;
    start = target->busy_until_ns > start ? target->busy_until_ns : start;
    uint64_t end = start + duration_ns;
    target->busy_until_ns = end;
    target->busy_total_ns += duration_ns;
    struct sim_process *self = sim_self_locked(state);
    int32_t pid = self != NULL ? self->pid : (int32_t)getpid();
    if (self != NULL) {
        self->busy_ns[device] += duration_ns;
    }
    if (duration_ns > 0) {
        struct sim_interval *last =
            target->interval_count > 0
                ? &target->intervals[(target->interval_count - 1) % SIM_INTERVALS]
                : NULL;
        if (last != NULL && last->pid == pid && last->end_ns == start) {
            last->end_ns = end; /* back-to-back kernels of one process: one interval */
        } else {
            target->intervals[target->interval_count % SIM_INTERVALS] =
                (struct sim_interval){start, end, pid, 0};
            target->interval_count++;
        }
    }
    sim_unlock(state);
    return end;
}

uint64_t sim_busy_locked(const struct sim_device *device, int32_t pid, uint64_t from,
                         uint64_t to) {
    uint64_t busy = 0;
    uint64_t count = device->interval_count < SIM_INTERVALS ? device->interval_count
                                                            : SIM_INTERVALS;
    for (uint64_t i = 0; i < count; i++) {
        const struct sim_interval *interval =
            &device->intervals[(device->interval_count - 1 - i) % SIM_INTERVALS];
        if (interval->end_ns <= from) {
            break; /* older ones end earlier still: the timeline is in order */
        }
        if (pid != 0 && interval->pid != pid) {
            continue;
        }
        uint64_t start = interval->start_ns > from ? interval->start_ns : from;
        uint64_t end = interval->end_ns < to ? interval->end_ns : to;
        busy += end > start ? end - start : 0;
    }
    return busy;
}
