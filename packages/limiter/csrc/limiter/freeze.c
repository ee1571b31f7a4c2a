/* Freeze and resume. The wait sleeps on the region's flags word, which vgpu_region_safe_resume
 * wakes, in steps of at most WAIT_STEP_NS so that a deadline the daemon stopped renewing, or a
 * resume written without a wake, is seen soon. Nothing here locks: threads wait on their own. */
#define _GNU_SOURCE
#include "freeze.h"

#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "lease.h"
#include "log.h"

#define WAIT_STEP_NS 100000000ULL

static _Atomic uint64_t logged_epoch; /* the freeze last said at info level, +1 */
static _Atomic uint64_t expired_epoch;

/* The deadline of a frozen pod, 0 when it is not frozen or the deadline passed. */
static uint64_t frozen_until(const struct vgpu_region *region, uint32_t flags, uint64_t now) {
    if ((flags & VGPU_REGION_FROZEN) == 0) {
        return 0;
    }
    uint64_t until = atomic_load(&region->freeze_until_ns);
    if (until == 0 || now >= until) {
        uint64_t epoch = atomic_load(&region->freeze_epoch) + 1;
        if (until != 0 && atomic_exchange(&expired_epoch, epoch) != epoch) {
            vgpu_log(VGPU_LOG_WARN, "the pod's freeze expired without renewal (daemon gone?): "
                                    "launches go on");
        }
        return 0;
    }
    return until;
}

bool vgpu_frozen(void) {
    const struct vgpu_region *region = vgpu_state.region;
    if (region == NULL) {
        return false;
    }
    uint32_t flags = atomic_load_explicit(&region->flags, memory_order_acquire);
    return (flags & VGPU_REGION_FROZEN) != 0 && frozen_until(region, flags, vgpu_monotonic_ns());
}

bool vgpu_freeze_holds(int entry) {
    const struct vgpu_region *region = vgpu_state.region;
    if (region == NULL) {
        return false;
    }
    uint32_t count = atomic_load(&region->device_count);
    bool marked = false;
    for (uint32_t i = 0; i < count && i < VGPU_REGION_MAX_DEVICES; i++) {
        marked |= atomic_load(&region->devices[i].scheduler_state[VGPU_SCHED_FROZEN]) != 0;
    }
    if (!marked || entry < 0 || entry >= VGPU_REGION_MAX_DEVICES) {
        return true;
    }
    return atomic_load(&region->devices[entry].scheduler_state[VGPU_SCHED_FROZEN]) != 0;
}

void vgpu_freeze_wait(void) {
    struct vgpu_region *region = vgpu_state.region;
    if (region == NULL) {
        return;
    }
    uint64_t epoch = atomic_load(&region->freeze_epoch) + 1;
    if (atomic_exchange(&logged_epoch, epoch) != epoch) {
        vgpu_log(VGPU_LOG_INFO, "pod frozen: GPU work waits until it is resumed");
    }
    for (;;) {
        uint32_t flags = atomic_load(&region->flags);
        uint64_t now = vgpu_monotonic_ns();
        uint64_t until = frozen_until(region, flags, now);
        if (until == 0) {
            return;
        }
        uint64_t step = until - now < WAIT_STEP_NS ? until - now : WAIT_STEP_NS;
        struct timespec timeout = {(time_t)(step / 1000000000ULL), (long)(step % 1000000000ULL)};
        syscall(SYS_futex, (uint32_t *)&region->flags, FUTEX_WAIT, flags, &timeout, NULL, 0);
    }
}
