/* The epochs of the compute limiter (compute.c): per GPU, this process's events that measure the
 * GPU time of its work, the device lease each epoch holds, and what an epoch costs the pod's
 * bucket. Every function here but vgpu_paced_device, vgpu_paced_each_device and
 * vgpu_compute_pause runs under the device's lock. */
#ifndef VGPU_LIMITER_COMPUTE_EPOCHS_H
#define VGPU_LIMITER_COMPUTE_EPOCHS_H

#include <stdbool.h>
#include <stdint.h>

#include "compute_bucket.h"
#include "compute_lock.h"
#include "cuda_api.h"

/* GPU time per epoch. Each hand-over to another pod leaves the GPU idle 250-370 µs on an H100
 * (the holder's last kernel to the next holder's first, read from the GPU's global timer:
 * benchmarks/handover_gpu.py), of which ~170 µs is the GPU switching contexts: at 16 ms a 20/30/50
 * set handed over 45-50 times a second and lost 1.5-1.8 % of the GPU, at 32 ms 20 times and
 * 0.6-0.7 %. Alone, each epoch costs a program whose launches are bound by its host (a JAX loop of
 * ~50 µs steps) a little time to get going again after its wait, which the epoch is charged for:
 * at 8 ms such a loop got 22.5 % at a 25 % limit, at 32 ms 25.6 %. */
#define QUANTUM_NS 32000000ULL
#define MARKERS 64

struct marker {
    CUevent event;
    bool pending;
    bool resume;       /* recorded when the epoch's queue had run dry (see idle_ns) */
    unsigned launches; /* launches since the previous marker */
};

/* This process's pacing of one GPU (by CUDA ordinal). A launch in an open epoch reads and
 * writes the fields up to `start` only: they share three cache lines with the lock, which a real
 * driver's launch leaves cold (each line a miss per launch; compute_epochs.c checks it). */
struct paced_device {
    _Alignas(64) struct vgpu_lock lock;
    bool ready;   /* events and lease set up */
    bool open;    /* an epoch is running */
    bool launched;        /* the epoch has had a launch */
    bool looking;         /* this launch reads and writes the lease's words (vgpu_epoch_look) */
    bool blocking;        /* every launch waits for its kernel (CUDA_LAUNCH_BLOCKING=1) */
    int entry;
    /* Moves at every epoch's start and end, stream switch and loss of events: a thread's credit
     * of launches (compute_credit.h) holds while it does not. */
    _Atomic uint32_t generation;
    CUcontext context;
    struct vgpu_lease *lease;
    CUstream stream;      /* the stream of the newest launch */
    unsigned head;    /* oldest pending marker */
    unsigned pending;
    unsigned unmarked;    /* launches after the newest marker */
    unsigned queued;      /* launches of this epoch not yet seen finished */
    uint64_t done_ns;     /* GPU time from the epoch's start to its newest finished marker */
    uint64_t opened_ns;   /* CLOCK_MONOTONIC when the epoch started */
    uint64_t last_launch_ns;
    uint64_t entered_ns;  /* the clock as the launch being made entered the epoch, before it */
    uint64_t retired_ns;  /* when finished markers were last looked for */
    uint64_t looked_ns;   /* when a launch last read and wrote the lease's words; 0: now */
    uint64_t expected_ns; /* when its queued work drains, as last written in the lease */
    uint64_t kernel_ns;   /* estimated GPU time of one launch (moving average) */
    uint64_t yield_asked_ns; /* when it last yielded to an urgent waiter */
    uint64_t collective_ns; /* CLOCK_MONOTONIC of the newest collective */
    /* Launches on a thread's credit (compute_credit.h) may come until then: the epoch's end, a
     * stream switch and a gap's marker must cover them although the epoch has not counted
     * them yet. */
    uint64_t credited_until_ns;
    unsigned launches;      /* launches since the pacing log last said (stats) */
    /* From here, what launches in an open epoch do not touch. */
    CUevent start;
    /* Of done_ns, the time the GPU sat idle within the epoch because the program fed it nothing
     * (its host thread descheduled, or busy between launches): not the pod's GPU time. */
    uint64_t idle_ns;
    struct vgpu_pace pace; /* the epoch's rate (the hard or the soft limit) and hard limit */
    struct vgpu_unboosted unboosted; /* GPU time run before the daemon's boost was known */
    bool estimated;       /* kernel_ns comes from a measurement */
    bool urgent;          /* the pod's use is light (vgpu_use_light): its epoch is urgent */
    uint64_t collectives;   /* collective launches so far: each rank's n-th is the same one */
    unsigned gang_late;     /* collectives running at which the gate was past this rank's */
    struct {              /* what pacing did, logged about once a second at debug level */
        uint64_t since_ns;
        uint64_t charged_ns;
        uint64_t capped_ns;     /* what the pod's bucket could not hold (its cap) */
        uint64_t lease_wait_ns; /* waited for the device lease */
        uint64_t gang_start_ns; /* of it, for the pod's other ranks (vgpu_gang_acquire) */
        uint64_t paused_ns;     /* paused for the pod's bucket (its limit) */
        unsigned epochs, markers, switches;
        unsigned paused, lost, quantum, synchronized, gang, yielded; /* why epochs ended */
        unsigned urgent; /* epochs that asked for the lease urgently */
        unsigned credited; /* launches made on a thread's credit (compute_credit.h) */
    } stats;
    /* Last: a launch touches one marker at most, and the fields above share fewer cache lines
     * without the markers between them. */
    struct marker markers[MARKERS];
};


/* The pacing of a CUDA ordinal (0 .. VGPU_MAX_ORDINALS - 1). */
struct paced_device *vgpu_paced_device(int ordinal);
/* In a forked child (core.c's fork handler, the child's only thread): every device's pacing as
 * at the start, its lease kept. */
void vgpu_paced_forget_in_child(void);
/* Run `visit` on every device's pacing, each under its lock. */
void vgpu_paced_each_device(void (*visit)(struct paced_device *, const void *),
                            const void *handle);

/* Sleep, through signals. */
void vgpu_compute_pause(uint64_t nanoseconds);

/* Events in the launching context. A launch from another context than the one the events
 * belong to (a second context on the device) closes the epoch and moves them: correct, if slow
 * for a program that alternates contexts launch by launch. False when they cannot be made. */
bool vgpu_epoch_set_up(struct paced_device *state, int ordinal, int entry, CUcontext context);
/* Destroy the device's events (their context still exists) and forget the context. */
void vgpu_epoch_release_events(struct paced_device *state);

/* End an open epoch that paused (no launch for a while), or whose lease was taken (seen when
 * the launch looks: vgpu_epoch_look). */
void vgpu_epoch_end_paused_or_lost(struct paced_device *state, uint64_t now);
/* Sets state->looking: whether a launch at `now` reads and writes the lease's words, at most
 * every VGPU_LEASE_LOOK_EVERY_NS. They are other processes' cache lines (the arbiter's, other pods'),
 * each a cache miss per launch where reading them at every launch cost a launch of empty
 * kernels on an H100 about 2.2x what the same path cost on the simulated GPU. A lease lost, a
 * yield asked or another pod waiting is seen at most that much later, and the holder's activity
 * is that much older than it is: a fifth of the 250 µs after which its own next touch counts it
 * as drained, a tenth of the arbiter's 500 µs. Every 20 µs, the looks cost a launch of empty
 * kernels about 30 ns of the 180 its paced path took on an H100. */
#define VGPU_LEASE_LOOK_EVERY_NS 50000ULL
void vgpu_epoch_look(struct paced_device *state, uint64_t now);
/* Start an epoch on `stream`: take the lease (a wait for another pod is throttled time of the
 * pod's region `entry`; urgent when state->urgent; with the pod's other ranks when `gang`:
 * vgpu_gang_acquire) and record the start event. */
void vgpu_epoch_open(struct paced_device *state, CUstream stream, int entry, bool gang);
/* End the epoch: its GPU time is debited and the lease given back. With `drain`, the epoch's
 * work is waited for first (bounded); a holder that lost its lease charges what is done. */
void vgpu_epoch_close(struct paced_device *state, bool drain);

/* Take finished markers off the ring (oldest first); with `wait`, the oldest even if not done,
 * waiting for it up to `deadline`. False when the deadline passed. */
bool vgpu_epoch_retire(struct paced_device *state, bool wait, uint64_t deadline);
/* Record a marker after the launches not yet covered by one. False when the ring is full or
 * the record failed; those launches then count with the next marker. */
bool vgpu_epoch_mark(struct paced_device *state);
/* A launch goes to `stream`: a marker covers the launches of one stream. */
void vgpu_epoch_switch_stream(struct paced_device *state, CUstream stream);
/* Keep the work queued ahead of the GPU short: wait for old markers past the backlog. */
uint64_t vgpu_epoch_wait_for_backlog(struct paced_device *state, uint64_t now);

/* Around a launch of the open epoch: before, whether the GPU has run dry since the last one;
 * after, the launch counted (when it succeeded), marked when due, and the lease told. */
void vgpu_epoch_before_launch(struct paced_device *state);
void vgpu_epoch_after_launch(struct paced_device *state, CUresult result);

#endif
