/* The node-wide device lease (vgpu_region.h): exclusive use of one GPU by one limited process at
 * a time, for the epochs of the compute limiter, and the daemon's read-only node file beside it.
 * A handle is used under its device's lock (compute.c): nothing here locks. */
#ifndef VGPU_LIMITER_LEASE_H
#define VGPU_LIMITER_LEASE_H

#include <stdbool.h>
#include <stdint.h>

#include "vgpu_region.h"

struct vgpu_lease;

/* The lease of a GPU, mapped from {SHM_BASE_PATH}/.devices/{uuid} (else from a folder of this
 * user's under TMPDIR); NULL when neither can be had (the limiter then paces without
 * exclusivity), with a one-line warning saying why. */
struct vgpu_lease *vgpu_lease_open(const char *uuid);

/* Take the lease for an epoch, waiting while another process holds it: never past a stale holder,
 * nor past one that keeps it VGPU_LEASE_HOLD_NS. `urgent`: the pod has used less than half its
 * limit lately, and the holder is asked to end its epoch now (VGPU_ARBITER_URGENT; in a lease
 * file, urgent_ns). False when the epoch runs without it (this process distrusts the lease for a
 * while after it saw the protocol broken). */
bool vgpu_lease_acquire(struct vgpu_lease *lease, bool urgent);
/* Whether the holder is asked to end its epoch now, for a waiter of another pod that is urgent
 * (vgpu_lease_acquire): by the arbiter, or by a lease file's urgent_ns (then as often as
 * vgpu_urgency.h allows, counted from when this call says yes). */
bool vgpu_lease_yield_asked(struct vgpu_lease *lease, uint64_t now);
/* Whether the epoch's lease was taken by a waiter that could judge this process stale or its
 * work drained (vgpu_lease_expect): the epoch then ends. A lease taken from an active holder is a scribble, which the epoch outlives. */
bool vgpu_lease_lost(struct vgpu_lease *lease, uint64_t now);
/* Record activity of the holder (`now` from vgpu_monotonic_ns), so others do not take it over. */
void vgpu_lease_touch(struct vgpu_lease *lease, uint64_t now);
/* Say when the work this epoch queued should be done (vgpu_monotonic_ns): past it the GPU is
 * idle for want of this process's launches, and a waiter may take the lease. */
void vgpu_lease_expect(struct vgpu_lease *lease, uint64_t drains_ns);
/* Give the lease back after an epoch whose work took `busy_ns` of GPU time (added to the lease's
 * busy_ns, from which the daemon reads how busy paced work keeps the GPU). */
void vgpu_lease_release(struct vgpu_lease *lease, uint64_t busy_ns);
/* This pod's own words about the lease, VGPU_LEASE_POD_WORDS of them in its region (shared by the
 * pod's processes alone): how many of its processes wait for it, when one last said so, and
 * which of them takes or holds it. With them a pod of several processes tells its own processes
 * from other pods (burst is for a GPU no other pod wants). */
#define VGPU_LEASE_POD_WORDS 3
void vgpu_lease_attach_pod(struct vgpu_lease *lease, _Atomic uint64_t *pod_words);
/* Whether a process of another pod holds it now (without pod words: any other process). */
bool vgpu_lease_held_by_other_pod(const struct vgpu_lease *lease);
/* When a process of another pod last began to ask for the lease after a second or more
 * without (the arbiter's word, in the seat); 0: none, or no arbiter. */
uint64_t vgpu_lease_newcomer_ns(const struct vgpu_lease *lease);
/* Whether another process is waiting for it at `now` (vgpu_monotonic_ns; a waiter said so
 * lately: see waiting_ns). */
bool vgpu_lease_wanted(const struct vgpu_lease *lease, uint64_t now);
/* Whether a process of another pod is waiting for it (as wanted without pod words). */
bool vgpu_lease_wanted_by_other_pod(const struct vgpu_lease *lease, uint64_t now);
/* The GPU's boost as the daemon last published it in its node file (VGPU_BOOST_ONE ..
 * VGPU_BOOST_MAX); VGPU_BOOST_ONE when no daemon serves the GPU (no node file), and 0 while one
 * does but its file holds no boost, or a stale one (not estimated yet, withdrawn, or gone). */
uint32_t vgpu_lease_boost(struct vgpu_lease *lease);

uint64_t vgpu_monotonic_ns(void);

#endif
