/* The lease arbiter's state and its policy (arbiter_policy.c): who gets a GPU's lease next and
 * when a holder loses it, apart from the sockets and seats (arbiter.c) so that the C tests can
 * run it on a clock of their own. */
#ifndef VGPU_REGION_ARBITER_INTERNAL_H
#define VGPU_REGION_ARBITER_INTERNAL_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "vgpu_region_api.h"

#define MAX_GPUS 64
#define MAX_CLIENTS 1024
#define MAX_PER_PARTY 256
/* A user's parties together: a user may make pid namespaces of its own (unshare -Urp), and
 * four of them held every connection, so that paced processes of every pod fell back to
 * leases of their own, unarbitrated. */
#define MAX_PER_USER (MAX_CLIENTS / 2)
/* A connection whose HELLO has not come by then is dropped: one that never sends it holds a
 * slot for nothing (the limiter sends it right after connecting). */
#define HELLO_WITHIN_NS 5000000000ULL
#define PENALTY_NS 4000000000ULL      /* a party that overran the hold: served last this long */
#define PENALTY_MAX_NS 32000000000ULL /* doubled while it keeps doing so */
#define HOUSEKEEPING_NS 1000000000ULL
#define MIN_WAIT_NS 20000ULL /* a deadline just passed is looked at again this soon */

struct party { /* a user in a pid namespace: one pod, as far as the kernel can tell */
    uint32_t uid;
    uint64_t namespace_inode;
    int clients;
    uint64_t last_grant; /* the arbiter's grant count when it last got the lease */
    uint64_t penalty_until_ns;
    uint64_t penalty_ns;
    uint64_t urgent_ns[2]; /* when its last two urgent requests were honoured, older first */
    uint64_t stranger_until_ns; /* its HELLOs are refused unlooked until then (arbiter.c) */
    uint64_t newcomer_ns[4]; /* when it last told the others of a pod of its that woke */
};
/* A party tells the others of pods that woke at most four times in this long, and a GPU's
 * clients are told at most eight times: a pod is what a process says it is, and one saying a
 * new pod in every connection must not keep the others' bursts off (each time until the
 * daemon's next pass, which comes soon after). */
#define NEWCOMER_WINDOW_NS 10000000000ULL

struct client {
    int fd; /* -1: a free slot */
    int gpu;   /* -1 until its HELLO */
    int party;
    pid_t pid;             /* the process that connected (SO_PEERCRED), in the daemon's view */
    uint64_t started;      /* its start time (vgpu_proc.h): the pid is that process's still */
    uint64_t connected_ns; /* when it was accepted: its HELLO is due within HELLO_WITHIN_NS */
    uint64_t pod; /* what it says its pod is: only its own view of "other pods" depends on it */
    struct vgpu_lease_seat *seat;
    bool waiting;
    bool urgent; /* it waits urgently (VGPU_ARBITER_URGENT, honoured) */
    uint64_t request; /* the request it waits with, or holds the lease for */
    uint64_t ticket;  /* when it began to wait: first come, first served within a party */
    uint64_t asked_ns; /* when it last asked for the lease (ACQUIRE); 0: never */
};

struct gpu {
    char uuid[VGPU_REGION_UUID_SIZE];
    struct vgpu_device_lease *words; /* the daemon's own: read by its boost estimate */
    int holder;                      /* a client, or -1 */
    uint64_t held_since_ns;
    uint64_t device; /* st_rdev of its /dev/nvidiaN, which a client must hold open; 0: none */
    uint64_t newcomer_ns[8]; /* when its clients were last told of a pod that woke */
};

struct vgpu_arbiter {
    int listener;
    int wake[2]; /* vgpu_arbiter_stop writes to wake[1] */
    pthread_t thread;
    bool started;
    _Atomic bool stopping;
    uint64_t instance;
    int gpu_count;
    struct gpu gpus[MAX_GPUS];
    struct client clients[MAX_CLIENTS];
    struct party parties[MAX_CLIENTS];
    struct pollfd polled[MAX_CLIENTS + 2];
    int polled_client[MAX_CLIENTS + 2]; /* the client of each polled descriptor past the two */
    uint64_t pods[MAX_CLIENTS];          /* scratch: the pods of a GPU's waiters */
    uint64_t tickets;
    _Atomic uint64_t connected, refused, strangers, grants, taken_back, overruns, newcomers;
    uint64_t (*clock)(void); /* CLOCK_MONOTONIC in ns (a test's own clock in the C tests) */
};

/* Why a holder loses the lease now, if it does. */
enum vgpu_arbiter_verdict {
    VGPU_ARBITER_KEEP = 0,
    VGPU_ARBITER_DONE,    /* its seat says it stopped launching, or left the GPU idle */
    VGPU_ARBITER_OVERRAN, /* held past VGPU_LEASE_HOLD_NS, active by its own word */
    VGPU_ARBITER_YIELDS,  /* its party is served last for now, and another party waits */
    VGPU_ARBITER_CROSSED, /* vgpu_arbiter_crossed: its hold and another pod's block each other */
};

/* A crossed hold is broken only after this long: a pod gathering its GPUs one by one is not. */
#define CROSSED_NS 2000000ULL

/* Two jobs' ranks, each pod holding one GPU and waiting for the other's: each one's collective
 * spins until the other lets go, which its own spinning collective never lets it do. When the
 * hold of `gpu` is such a hold, CROSSED_NS old and the younger of the two, the waiter of the
 * other pod to hand `gpu` to; else -1. */
int vgpu_arbiter_crossed(const struct vgpu_arbiter *arbiter, int gpu, uint64_t now);

/* The waiter of `gpu` to serve next, or -1: a party that overran the hold only when no other
 * waits; an urgent waiter first, then parties in turn (the one served longest ago first), first
 * come first served within one. */
int vgpu_arbiter_next_waiter(const struct vgpu_arbiter *arbiter, int gpu, uint64_t now);
/* Whether the holder of `gpu` (there is one) loses the lease to waiter `next`; reads the
 * holder's seat, then the clock. */
enum vgpu_arbiter_verdict vgpu_arbiter_judge(const struct vgpu_arbiter *arbiter, int gpu,
                                             int next);
/* Whether an urgent request of `party` at `now` is honoured (never while it is served last for
 * overrunning; at most two in any 2 × VGPU_ARBITER_URGENT_EVERY_NS: vgpu_urgency.h), noting it
 * when it is. */
bool vgpu_arbiter_honour_urgent(struct party *party, uint64_t now);
/* Serve `party` last for a while, longer each time it overruns again soon. */
void vgpu_arbiter_penalize(struct party *party, uint64_t now);
/* Tell each client of `gpu` in its seat who waits and whether another pod holds, and the holder
 * whether a waiter of another pod is urgent; the number of waiters. */
uint64_t vgpu_arbiter_tell(struct vgpu_arbiter *arbiter, int gpu);
/* When the holder of `gpu` may be stale, idle, crossed or overrunning: the time to look
 * again. */
uint64_t vgpu_arbiter_deadline(const struct vgpu_arbiter *arbiter, int gpu, uint64_t now);

#endif
