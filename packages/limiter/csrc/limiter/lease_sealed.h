/* The daemon's sealed device leases (vgpu_region.h, VGPU_LEASE_SOCKET): asked for once per GPU
 * when pacing starts, and again when the daemon says it hands out another (its restart). */
#ifndef VGPU_LIMITER_LEASE_SEALED_H
#define VGPU_LIMITER_LEASE_SEALED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vgpu_device_lease;

/* The lease of GPU `uuid` from the daemon listening in `node_folder`, mapped read-write, and its
 * instance; NULL with a one-line `why` otherwise. `*absent` says there was simply no daemon to
 * ask (no socket, or nobody listening): the usual case without one, not worth a warning. */
struct vgpu_device_lease *vgpu_lease_sealed(const char *node_folder, const char *uuid,
                                            uint64_t *instance, bool *absent, char *why,
                                            size_t why_size);

#endif
