/* The node-wide device lease (vgpu_region.h): exclusive use of one GPU by one limited process at
 * a time, for the epochs of the compute limiter. */
#ifndef VGPU_LIMITER_LEASE_H
#define VGPU_LIMITER_LEASE_H

#include <stdbool.h>
#include <stdint.h>

#include "vgpu_region.h"

/* The lease of a GPU, mapped from {SHM_BASE_PATH}/.devices/{uuid} (else a folder under /tmp
 * shared by the node's users); NULL when neither can be made (the limiter then paces without
 * exclusivity). */
struct vgpu_device_lease *vgpu_lease_open(const char *uuid);

/* Take the lease, waiting while another process holds it (never past a stale holder). */
void vgpu_lease_acquire(struct vgpu_device_lease *lease);
/* Whether this process still holds it (a stale holder may have lost it). */
bool vgpu_lease_held(struct vgpu_device_lease *lease);
/* Record activity of the holder, so that others do not take the lease over. */
void vgpu_lease_touch(struct vgpu_device_lease *lease);
void vgpu_lease_release(struct vgpu_device_lease *lease);
/* Whether another process is waiting for it. */
bool vgpu_lease_wanted(struct vgpu_device_lease *lease);
/* The GPU's boost as the daemon last published it (VGPU_BOOST_ONE .. VGPU_BOOST_MAX), or
 * VGPU_BOOST_ONE when none is published or it is stale. */
uint32_t vgpu_lease_boost(struct vgpu_device_lease *lease);

uint64_t vgpu_monotonic_ns(void);

#endif
