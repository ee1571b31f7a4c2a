/* The C side of the pod region contract (vgpu_region.h): opening or creating the file,
 * device entries, this process's slot, memory reservation and reclaiming dead slots. */
#ifndef VGPU_LIMITER_REGION_H
#define VGPU_LIMITER_REGION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vgpu_region_api.h"

/* Map the region at folder/shm, creating folder and file when missing and `create` (namespace
 * and pod name are recorded in a new file). NULL with a one-line reason in `error`. */
struct vgpu_region *vgpu_region_open(const char *folder, const char *pod_namespace,
                                     const char *pod_name, bool create, char *error,
                                     size_t error_size);

/* Wait up to `wait_s` seconds for folder/shm to exist (the device plugin's allocation folder
 * gets it once the daemon has bound the container to its pod). Sleeps only, with a backoff up
 * to 200 ms; holds no lock. False with a one-line reason in `error` when it did not come. */
bool vgpu_region_await(const char *folder, unsigned wait_s, char *error, size_t error_size);

/* The entry of a GPU (lower-case UUID), added when `create`; VGPU_REGION_FULL when it would be
 * added and all entries are in use, -1 when absent or the writers' lock cannot be taken. */
int vgpu_region_device(struct vgpu_region *region, const char *uuid, bool create);

/* Set a device's limits where the region has none yet (the environment seeds, the region is
 * the truth from then on): each limit that is 0 in the region and not 0 in `limits`, and the
 * device flags when the region has none. The uuid of `limits` is ignored. */
void vgpu_region_seed_limits(struct vgpu_region *region, int entry,
                             const struct vgpu_region_limits *limits);

/* A consistent read of a device's limits (seqlock). */
void vgpu_region_limits(const struct vgpu_region *region, int entry, uint64_t *memory_limit,
                        uint32_t *compute_limit);
/* The same for all of them (the uuid of `limits` is left as it is). */
void vgpu_region_read_limits(const struct vgpu_region *region, int entry,
                             struct vgpu_region_limits *limits);

/* This process's slot, claimed on first use (a forked child claims its own). NULL if full. */
struct vgpu_region_process *vgpu_region_self(struct vgpu_region *region);

/* This process made a GPU call now: its slot's heartbeat (what the daemon shows as its last GPU
 * call). Memory reservations write it themselves; a paced launch calls this once per epoch. */
void vgpu_region_heartbeat(struct vgpu_region *region);

/* Reserve `bytes` on a device for this process without ever passing the pod's limit; dead
 * processes' slots are reclaimed first when it would not fit. A reservation the limit refuses
 * is counted in the device's refusals when `count_refusal`. */
bool vgpu_region_reserve(struct vgpu_region *region, int entry, uint64_t bytes,
                         bool count_refusal);
void vgpu_region_release(struct vgpu_region *region, int entry, uint64_t bytes);

/* The same for host-backed (oversubscribed) memory: counted in host_memory_used and the slot's
 * host_memory[], apart from memory_used, and not bounded by the memory limit. */
bool vgpu_region_reserve_host(struct vgpu_region *region, int entry, uint64_t bytes);
void vgpu_region_release_host(struct vgpu_region *region, int entry, uint64_t bytes);

/* Reclaim the slots of processes of this pid namespace that are gone; the number reclaimed. */
unsigned vgpu_region_reap(struct vgpu_region *region);

/* vgpu_region_reap at most once a second per process: called from every memory view and
 * allocation, so a dead process's memory is back within about a second of the pod's next
 * GPU call (the daemon sweeps pods that make none). */
void vgpu_region_sweep(struct vgpu_region *region);

/* Reclaim one slot whose process is known to be gone: its memory goes back to the devices
 * exactly once. The slot must still be that process (pid, pid namespace and start time); a
 * slot reused meanwhile by another process with the same pid number is left alone. */
bool vgpu_region_reclaim_process(struct vgpu_region *region, unsigned slot, int32_t pid,
                                 uint64_t pid_namespace, uint64_t start_time);

/* The writers' changes below need the writers' flock on the region file, held by the caller. */

/* Store a device's limits through the seqlock (the uuid of `limits` is ignored). */
void vgpu_region_store_limits(struct vgpu_region *region, unsigned entry,
                              const struct vgpu_region_limits *limits);

/* Add a GPU's entry (`device->uuid`) with its limits (written first, published by
 * device_count): the entry, or VGPU_REGION_EXISTS / VGPU_REGION_FULL. */
int vgpu_region_add_device(struct vgpu_region *region, const struct vgpu_region_limits *device);

/* Record the node-namespace pid of the process in `slot`; VGPU_REGION_STALE (and nothing
 * stored) when the slot no longer holds that process. */
int vgpu_region_set_host_pid(struct vgpu_region *region, unsigned slot, int32_t pid,
                             uint64_t pid_namespace, uint64_t start_time, int32_t host_pid);

/* Make even the generations left odd by writers that died mid-change; the number settled. */
unsigned vgpu_region_settle_generations(struct vgpu_region *region);

/* A device entry with its limits read consistently. */
void vgpu_region_read_device(const struct vgpu_region *region, unsigned entry,
                             struct vgpu_region_device_view *view);

/* Fill a zeroed region image: header, names and `devices`. */
void vgpu_region_format(struct vgpu_region *region, const char *pod_namespace,
                        const char *pod_name, const struct vgpu_region_limits *devices,
                        unsigned device_count);

/* In a forked child: forget the slot, and open the region's file afresh, so that the writers'
 * flock is the child's own and not its parent's (pthread_atfork's child handler). */
void vgpu_region_forget_in_child(void);

#endif
