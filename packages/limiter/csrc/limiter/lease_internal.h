/* The inside of a device lease (lease.h), shared by the two ways a lease is kept: the daemon's
 * arbiter (lease.c, lease_seat.c) and, without a daemon, a lease file whose words every paced
 * process writes (lease_words.c). */
#ifndef VGPU_LIMITER_LEASE_INTERNAL_H
#define VGPU_LIMITER_LEASE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "lease.h"
#include "vgpu_region.h"

/* The longest wait for the lease, whoever holds it: a few holds past any epoch. */
#define WAIT_MAX_NS (4 * VGPU_LEASE_HOLD_NS)

struct vgpu_lease {
    struct vgpu_device_lease *shared;
    const struct vgpu_device_node *node;
    uint64_t node_tried_ns;
    bool node_refused; /* said once why the node file is not used */
    char folder[4096];
    char node_folder[4096];
    bool private;
    char uuid[VGPU_REGION_UUID_SIZE];
    /* The daemon's arbiter (lease_seat.h): its connection and this process's seat, or -1 and
     * NULL while pacing with a lease file. */
    int socket;
    struct vgpu_lease_seat *seat;
    uint64_t request;     /* the last request made of the arbiter */
    unsigned forks;       /* the fork count when connected: a child connects again */
    uint64_t instance;    /* the daemon's instance connected to; 0: a lease file */
    uint64_t asked_ns;    /* when the daemon was last asked for another */
    bool said_daemon;     /* a failure to get the daemon's lease was said (once, as a warning) */
    /* This process's own account, which no other process can write. */
    bool exclusive;      /* this epoch holds the lease */
    bool exposed;        /* a gap in this epoch's activity let a waiter judge it stale */
    uint64_t touched_ns; /* this process's last activity */
    uint64_t drains_ns;  /* what this process last said in vgpu_lease_expect */
    uint64_t distrust_until_ns; /* until then, the lease is taken when free, never waited for */
    uint64_t distrust_ns;
    uint64_t held_ns;    /* when this epoch got the lease file's lease */
    uint64_t yielded_ns[2]; /* when it last ended epochs for urgent waiters (lease file) */
    _Atomic uint64_t *pod; /* this pod's words (lease.h), or NULL */
};

enum { POD_WAITERS = 0, POD_WAITING_NS = 1, POD_HOLDER = 2 };

/* Forks of this process since the library was loaded (counted once a lease is opened). */
unsigned vgpu_lease_forks(void);

/* The lease.h operations on a lease file's words (lease->shared, not NULL). */
bool vgpu_words_acquire(struct vgpu_lease *lease, bool urgent, uint64_t started);
bool vgpu_words_yield_asked(struct vgpu_lease *lease, uint64_t now);
bool vgpu_words_lost(struct vgpu_lease *lease, uint64_t now);
void vgpu_words_touch(struct vgpu_lease *lease, uint64_t now);
void vgpu_words_expect(struct vgpu_lease *lease, uint64_t drains_ns);
void vgpu_words_release(struct vgpu_lease *lease, uint64_t busy_ns);
bool vgpu_words_held_by_other_pod(const struct vgpu_lease *lease);
bool vgpu_words_wanted(const struct vgpu_lease *lease, uint64_t now);
bool vgpu_words_wanted_by_other_pod(const struct vgpu_lease *lease, uint64_t now);

#endif
