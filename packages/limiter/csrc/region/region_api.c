/* libvgpu_region.so's operations on a mapped region, for the node daemon: the protocol of
 * region.c behind a guard against SIGBUS. A tenant may truncate its own pod's file at any
 * moment; the limiter's processes of that pod then fault (theirs to suffer), but the daemon,
 * which maps every pod's file, must not. A fault inside a guarded call jumps back out of it and
 * the call reports VGPU_REGION_FAULT; a fault anywhere else goes to the handler that was there
 * before. The guard is armed per thread, so threads guard their own calls. */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "region.h"
#include "vgpu_proc.h"

static __thread __attribute__((tls_model("initial-exec"))) sigjmp_buf *armed;
static struct sigaction previous;
static _Atomic int installed; /* 0: no, 1: being installed, 2: yes */

static void on_bus_error(int signal, siginfo_t *info, void *context) {
    sigjmp_buf *jump = armed;
    if (jump != NULL) {
        armed = NULL;
        siglongjmp(*jump, 1);
    }
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(signal, info, context);
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(signal);
    } else {
        /* Not ours: put the old disposition back; the access faults again and it applies. */
        sigaction(SIGBUS, &previous, NULL);
    }
}

static void install(void) {
    int state = 0;
    if (atomic_compare_exchange_strong(&installed, &state, 1)) {
        struct sigaction action = {.sa_sigaction = on_bus_error, .sa_flags = SA_SIGINFO};
        sigemptyset(&action.sa_mask);
        sigaction(SIGBUS, &action, &previous);
        atomic_store(&installed, 2);
    }
    while (atomic_load(&installed) != 2) {
    }
}

/* Run `statement` with the guard armed; a fault makes the enclosing function return
 * VGPU_REGION_FAULT. sigsetjmp must sit in the guarded function's own frame, hence a macro. */
#define GUARDED(statement)                                                                     \
    do {                                                                                       \
        install();                                                                             \
        sigjmp_buf jump;                                                                       \
        if (sigsetjmp(jump, 1) != 0) {                                                         \
            return VGPU_REGION_FAULT;                                                          \
        }                                                                                      \
        armed = &jump;                                                                         \
        statement;                                                                             \
        armed = NULL;                                                                          \
    } while (0)

int vgpu_region_safe_add_device(struct vgpu_region *region,
                                const struct vgpu_region_limits *device) {
    int result = 0;
    GUARDED(result = vgpu_region_add_device(region, device));
    return result;
}

int vgpu_region_safe_store_limits(struct vgpu_region *region, unsigned entry,
                                  const struct vgpu_region_limits *limits) {
    if (entry >= VGPU_REGION_MAX_DEVICES) {
        return VGPU_REGION_ERROR;
    }
    GUARDED(vgpu_region_store_limits(region, entry, limits));
    return 0;
}

int vgpu_region_safe_restore_entry(struct vgpu_region *region, unsigned entry, const char *uuid) {
    if (entry >= VGPU_REGION_MAX_DEVICES) {
        return VGPU_REGION_ERROR;
    }
    struct vgpu_region_device *device = &region->devices[entry];
    GUARDED(snprintf(device->uuid, sizeof device->uuid, "%.*s", (int)sizeof device->uuid - 1,
                     uuid);
            if (atomic_load(&region->device_count) <= entry) {
                atomic_store(&region->device_count, entry + 1);
            });
    return 0;
}

int vgpu_region_safe_read_device(const struct vgpu_region *region, unsigned entry,
                                 struct vgpu_region_device_view *view) {
    if (entry >= VGPU_REGION_MAX_DEVICES) {
        return VGPU_REGION_ERROR;
    }
    GUARDED(vgpu_region_read_device(region, entry, view));
    return 0;
}

int vgpu_region_safe_set_host_pid(struct vgpu_region *region, unsigned slot, int32_t pid,
                                  uint64_t pid_namespace, uint64_t start_time, int32_t host_pid) {
    int result = 0;
    GUARDED(result =
                vgpu_region_set_host_pid(region, slot, pid, pid_namespace, start_time, host_pid));
    return result;
}

int vgpu_region_safe_settle_generations(struct vgpu_region *region) {
    unsigned settled = 0;
    GUARDED(settled = vgpu_region_settle_generations(region));
    return (int)settled;
}

int vgpu_region_safe_reclaim_process(struct vgpu_region *region, unsigned slot, int32_t pid,
                                     uint64_t pid_namespace, uint64_t start_time) {
    bool reclaimed = false;
    GUARDED(reclaimed =
                vgpu_region_reclaim_process(region, slot, pid, pid_namespace, start_time));
    return reclaimed ? 1 : 0;
}

int64_t vgpu_region_safe_change_flags(struct vgpu_region *region, uint32_t set, uint32_t clear) {
    uint32_t flags = 0;
    GUARDED(atomic_fetch_or(&region->flags, set); flags = atomic_fetch_and(&region->flags, ~clear));
    return flags & ~clear;
}

int vgpu_region_safe_freeze(struct vgpu_region *region, uint64_t until_ns) {
    GUARDED(atomic_store(&region->freeze_until_ns, until_ns);
            if ((atomic_fetch_or(&region->flags, VGPU_REGION_FROZEN) & VGPU_REGION_FROZEN) == 0) {
                atomic_fetch_add(&region->freeze_epoch, 1);
            });
    return 0;
}

int vgpu_region_safe_set_policy(struct vgpu_region *region, uint32_t qos, uint32_t weight) {
    GUARDED(atomic_store(&region->qos, qos); atomic_store(&region->weight, weight));
    return 0;
}

int vgpu_region_safe_set_effective(struct vgpu_region *region, unsigned entry, uint32_t effective,
                                   uint64_t now_ns) {
    if (entry >= VGPU_REGION_MAX_DEVICES) {
        return VGPU_REGION_ERROR;
    }
    struct vgpu_region_device *device = &region->devices[entry];
    GUARDED(atomic_store(&device->scheduler_state[VGPU_SCHED_EFFECTIVE], effective);
            atomic_store(&device->scheduler_state[VGPU_SCHED_EFFECTIVE_NS], now_ns));
    return 0;
}

int vgpu_region_safe_set_burst(struct vgpu_region *region, unsigned entry, uint32_t burst,
                               uint64_t now_ns) {
    if (entry >= VGPU_REGION_MAX_DEVICES) {
        return VGPU_REGION_ERROR;
    }
    struct vgpu_region_device *device = &region->devices[entry];
    GUARDED(atomic_store(&device->scheduler_state[VGPU_SCHED_BURST], burst);
            atomic_store(&device->scheduler_state[VGPU_SCHED_BURST_NS], now_ns));
    return 0;
}

int vgpu_region_safe_freeze_device(struct vgpu_region *region, unsigned entry, uint64_t frozen) {
    if (entry >= VGPU_REGION_MAX_DEVICES) {
        return VGPU_REGION_ERROR;
    }
    GUARDED(atomic_store(&region->devices[entry].scheduler_state[VGPU_SCHED_FROZEN], frozen));
    return 0;
}

static void clear_frozen_marks(struct vgpu_region *region) {
    for (unsigned i = 0; i < VGPU_REGION_MAX_DEVICES; i++) {
        atomic_store(&region->devices[i].scheduler_state[VGPU_SCHED_FROZEN], 0);
    }
}

int vgpu_region_safe_resume(struct vgpu_region *region) {
    GUARDED(clear_frozen_marks(region);
            atomic_fetch_and(&region->flags, ~(uint32_t)VGPU_REGION_FROZEN);
            atomic_store(&region->freeze_until_ns, 0);
            /* Launches waiting in the limiter sleep on the flags word. */
            syscall(SYS_futex, (uint32_t *)&region->flags, FUTEX_WAKE, INT_MAX, NULL, NULL, 0));
    return 0;
}

bool vgpu_region_process_alive(int32_t pid, uint64_t start_time) {
    return vgpu_process_alive(pid, start_time);
}
