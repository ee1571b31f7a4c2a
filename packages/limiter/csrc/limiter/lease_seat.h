/* A paced process's side of the daemon's lease arbiter (vgpu_region.h, VGPU_LEASE_SOCKET): one
 * connection and one seat per GPU, made when pacing starts and again after the daemon's
 * restart. */
#ifndef VGPU_LIMITER_LEASE_SEAT_H
#define VGPU_LIMITER_LEASE_SEAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vgpu_lease_seat;

/* Connected to the arbiter of the daemon listening in `node_folder` for GPU `uuid`, as a
 * process of `pod`: the socket (>= 0), with the seat mapped in `*seat` and the daemon's instance
 * in `*instance`; -1 with a one-line `why` otherwise. `*absent` says there was simply no daemon
 * to ask (no socket, or nobody listening): the usual case without one, not worth a warning. */
int vgpu_seat_connect(const char *node_folder, const char *uuid, uint64_t pod,
                      struct vgpu_lease_seat **seat, uint64_t *instance, bool *absent, char *why,
                      size_t why_size);

/* Ask for the lease under `request` (not 0), `urgent` or not (VGPU_ARBITER_URGENT), and wait
 * for it until `deadline_ns` (CLOCK_MONOTONIC), through signals: 1 when granted, 0 when not in
 * time (the request is then withdrawn), -1 when the daemon is gone. */
int vgpu_seat_acquire(int socket_fd, uint64_t request, bool urgent, uint64_t deadline_ns);

/* Give back the lease held for `request` (or withdraw it), saying the epoch's GPU time; false
 * when the daemon is gone. */
bool vgpu_seat_release(int socket_fd, uint64_t request, uint64_t busy_ns);

#endif
