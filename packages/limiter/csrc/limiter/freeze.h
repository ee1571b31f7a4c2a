/* Freeze and resume (trap and wait): the daemon sets VGPU_REGION_FROZEN in the pod's region with
 * a deadline it renews; a launch of a frozen pod waits here until resumed or the deadline passes. */
#ifndef VGPU_LIMITER_FREEZE_H
#define VGPU_LIMITER_FREEZE_H

#include <stdbool.h>

/* Whether the pod is frozen now: one load of the region's flags in the common case. */
bool vgpu_frozen(void);

/* Whether the pod's freeze holds device entry `entry` (-1: not known, held): every GPU unless
 * some are marked (VGPU_SCHED_FROZEN). */
bool vgpu_freeze_holds(int entry);

/* Wait while the pod is frozen (on a futex the resume wakes; at most until the deadline). The
 * caller holds no lock and no device lease. */
void vgpu_freeze_wait(void);

#endif
