/* The pod region: one file per pod, {base}/{namespace}/{pod}/shm, mapped by every process of
 * the pod (through libcuda_limiter.so) and by the node daemon. It holds the pod's limits and
 * usage per GPU and one slot per process. This header is the single definition of the layout;
 * Python reads it through cffi from this very file, preprocessed with VGPU_REGION_CDEF.
 *
 * Concurrency: everything shared is lock-free (atomics), so a process that dies at any point
 * cannot wedge the others.
 * - Memory: reserve with a compare-and-swap loop on memory_used that never passes the limit,
 *   then add to the process's slot; give back in the opposite order.
 * - Limits: a seqlock. The writer makes `generation` odd, stores, makes it even again; readers
 *   retry while it is odd or changed.
 * - Slots: claimed by CAS of pid 0 → VGPU_SLOT_CLAIMING, filled, then pid published. A slot
 *   whose process is gone (pid not alive in the slot's pid namespace, or alive with another
 *   start time: a reused pid) is reclaimed by CAS pid → VGPU_SLOT_RECLAIMING, its memory given
 *   back to the devices, then pid 0. */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#ifdef VGPU_REGION_CDEF
#define VGPU_ATOMIC(type) type
#else
#include <stddef.h>
#include <stdint.h>
#define VGPU_ATOMIC(type) _Atomic type
#endif

#define VGPU_REGION_MAGIC 0x314e4f4947455256ULL /* "VREGION1" */
#define VGPU_REGION_VERSION 2 /* 2: burst, device flags, host-backed memory, scheduler words */
#define VGPU_REGION_MAX_DEVICES 16
#define VGPU_REGION_MAX_PROCESSES 1024
#define VGPU_REGION_UUID_SIZE 48
#define VGPU_REGION_NAME_SIZE 256

#define VGPU_SLOT_FREE 0
#define VGPU_SLOT_CLAIMING (-2)
#define VGPU_SLOT_RECLAIMING (-1)

/* compute_limit is in hundredths of a percent; this or 0 means no compute limit. */
#define VGPU_COMPUTE_UNLIMITED 10000

/* Bits of vgpu_region.flags. */
#define VGPU_REGION_FROZEN 0x1 /* the daemon asks the pod's processes to hold new GPU work */
/* The pod was deleted while processes still charged it: the file (and its usage) stays until
 * the last is gone, then the daemon removes it; a pod created again under that name takes it
 * over, so old and new processes share one limit. */
#define VGPU_REGION_DELETED 0x2

/* Bits of vgpu_region_device.device_flags (written with the limits, under the seqlock). */
#define VGPU_DEVICE_OVERSUBSCRIBE 0x1 /* allocations past memory_limit go to host-backed memory */

/* Quality of service of a pod (vgpu_region.qos): the scheduling weight when weight is 0. */
#define VGPU_QOS_LOW 0
#define VGPU_QOS_MEDIUM 1 /* the default */
#define VGPU_QOS_HIGH 2
#define VGPU_QOS_CRITICAL 3

/* scheduler_state words of a device entry, written by the node daemon's scheduler when the
 * GPU's limits add up past 100 %: the pod's effective limit then (hundredths of a percent; 0:
 * its own limit holds) and when it was written (CLOCK_MONOTONIC). The limiter paces at the
 * smaller of its limit and a fresh effective limit. */
#define VGPU_SCHED_EFFECTIVE 0
#define VGPU_SCHED_EFFECTIVE_NS 1
#define VGPU_EFFECTIVE_STALE_NS 5000000000ULL
/* Nonzero on some entries: a freeze of the pod (VGPU_REGION_FROZEN) holds those GPUs only. */
#define VGPU_SCHED_FROZEN 2
/* For a pod with a soft limit: the rate (hundredths) it may run at while other pods want the
 * GPU, its hard limit and what the others leave, as the daemon measured it; and when that was
 * written. Stale as the effective limit is; without it a contended pod runs at its hard limit. */
#define VGPU_SCHED_BURST 3
#define VGPU_SCHED_BURST_NS 4

struct vgpu_region_device {
    char uuid[VGPU_REGION_UUID_SIZE];  /* physical GPU, "GPU-…" lower case; "" = free entry */
    VGPU_ATOMIC(uint32_t) generation;  /* seqlock of the two limits below */
    VGPU_ATOMIC(uint32_t) compute_limit;
    VGPU_ATOMIC(uint64_t) memory_limit; /* bytes; 0 = no memory limit */
    VGPU_ATOMIC(uint64_t) memory_used;  /* bytes the pod holds on this GPU, contexts included */
    VGPU_ATOMIC(uint64_t) compute_state[8]; /* owned by the compute limiter */
    /* Version 2. The soft limit (hundredths of a percent, >= compute_limit; 0 = no burst) and
     * device_flags (VGPU_DEVICE_*) are limits: written under the seqlock with the two above. */
    VGPU_ATOMIC(uint32_t) compute_soft_limit;
    VGPU_ATOMIC(uint32_t) device_flags;
    /* Bytes of oversubscribed allocations, kept in host memory: not part of memory_used (what
     * the device holds, bounded by memory_limit) and not bounded by it. */
    VGPU_ATOMIC(uint64_t) host_memory_used;
    VGPU_ATOMIC(uint64_t) gpu_ns;       /* GPU time charged to the pod (its achieved share) */
    VGPU_ATOMIC(uint64_t) throttled_ns; /* time its launches waited for its share or the lease */
    VGPU_ATOMIC(uint64_t) burst_ns;     /* GPU time it ran above its hard limit */
    VGPU_ATOMIC(uint64_t) scheduler_state[8]; /* owned by the scheduler */
    /* Allocations refused at memory_limit, and the size of the last one: the daemon reports
     * them (a region written before these words existed reads 0 here). */
    VGPU_ATOMIC(uint64_t) refusals;
    VGPU_ATOMIC(uint64_t) refused_bytes_last;
    /* When a process of the pod last saw another pod want this GPU (CLOCK_MONOTONIC): the pod's
     * bucket holds more while it is contended (compute_bucket.h). Owned by the compute limiter;
     * a region written before this word existed reads 0 here (never contended yet). */
    VGPU_ATOMIC(uint64_t) contended_ns;
    uint64_t spare[1];
};

struct vgpu_region_process {
    VGPU_ATOMIC(int32_t) pid;      /* in the process's own pid namespace; <= 0: see VGPU_SLOT_* */
    VGPU_ATOMIC(int32_t) host_pid; /* in the node's namespace when known (the daemon fills it) */
    uint64_t pid_namespace;        /* inode of the process's /proc/self/ns/pid */
    uint64_t start_time;           /* clock ticks after boot, /proc/<pid>/stat field 22 */
    VGPU_ATOMIC(uint64_t) heartbeat_ns; /* CLOCK_REALTIME of its last GPU call */
    VGPU_ATOMIC(uint64_t) memory[VGPU_REGION_MAX_DEVICES]; /* by device entry */
    /* Version 2: bytes in host-backed (oversubscribed) allocations, apart from memory[]. */
    VGPU_ATOMIC(uint64_t) host_memory[VGPU_REGION_MAX_DEVICES];
};

struct vgpu_region {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size; /* offset of devices[] */
    uint64_t total_size;  /* sizeof(struct vgpu_region) */
    VGPU_ATOMIC(uint64_t) created_ns;
    char pod_namespace[VGPU_REGION_NAME_SIZE];
    char pod_name[VGPU_REGION_NAME_SIZE];
    VGPU_ATOMIC(uint32_t) device_count; /* entries of devices[] in use */
    VGPU_ATOMIC(uint32_t) flags;
    VGPU_ATOMIC(uint64_t) freeze_epoch;
    VGPU_ATOMIC(uint32_t) qos;    /* VGPU_QOS_* (version 2) */
    VGPU_ATOMIC(uint32_t) weight; /* scheduling weight; 0: from qos (version 2) */
    /* VGPU_REGION_FROZEN holds only until this CLOCK_MONOTONIC time, which the daemon renews
     * while the pod stays frozen: a daemon gone cannot leave a pod frozen for good. 0 with the
     * flag set: not frozen. */
    VGPU_ATOMIC(uint64_t) freeze_until_ns;
    /* The pod's gang gate: one pause decision for all the ranks of a collective job (the
     * compute limiter's, compute_bucket.h); 0: none yet. */
    VGPU_ATOMIC(uint64_t) gang_gate;
    /* Bit i set while a rank of the pod's collective job waits for the lease of device entry i:
     * a rank that got its own waits a moment for the others' (the compute limiter's,
     * compute_gang.h). */
    VGPU_ATOMIC(uint64_t) gang_waiting;
    /* The newest collective at which the deciding rank ended its epoch (gang_gate's packing):
     * a rank that lags reaches it after the gate has moved on, and ends its own there too. */
    VGPU_ATOMIC(uint64_t) gang_handover;
    /* When a rank of the pod's collective job last lost its lease to another pod
     * (CLOCK_MONOTONIC): the other ranks end their epochs that began before it at their next
     * collective, so that the other pod gets every GPU (the compute limiter's, compute_gang.h). */
    VGPU_ATOMIC(uint64_t) gang_lost_ns;
    uint64_t reserved[10];
    struct vgpu_region_device devices[VGPU_REGION_MAX_DEVICES];
    struct vgpu_region_process processes[VGPU_REGION_MAX_PROCESSES];
};

/* The device lease: one file per GPU for the whole node, {base}/.devices/{uuid}. The compute
 * limiter runs a pod's work on a GPU in epochs, each holding the lease, so that the GPU time it
 * measures with events is its own and not another pod's time slice. A holder that stops launching
 * for VGPU_LEASE_STALE_NS (or dies) loses the lease to the next process that wants it.
 *
 * Every paced process writes these words, so none of them is trusted (docs/security.md, device leases):
 * an activity time in the future is stale, a holder that keeps the lease past VGPU_LEASE_HOLD_NS
 * by the waiter's own clock loses it, yield times and waiter counts out of range are ignored.
 * Files: the folder 03770 (setgid: leases belong to its group; sticky: only their owner removes
 * them), leases 0660, nothing world-writable, nothing opened through a symlink. */
#define VGPU_LEASE_MAGIC 0x3145534145454c56ULL /* "VLEASE1" */
#define VGPU_LEASE_VERSION 2 /* 2: the boost moved to the daemon's node file */
#define VGPU_LEASE_STALE_NS 10000000ULL
/* Longer than any epoch (32 ms of GPU time, 10 ms of backlog) with a margin for a busy host. */
#define VGPU_LEASE_HOLD_NS 100000000ULL
#define VGPU_LEASE_DRAINED_NS 500000ULL
#define VGPU_LEASE_WAITERS_MAX 65536U /* more waiters than this are a scribble: ignored */
#define VGPU_LEASE_WAITING_EVERY_NS 20000000ULL
#define VGPU_LEASE_WANTED_NS 100000000ULL

struct vgpu_device_lease {
    uint64_t magic;
    uint32_t version;
    uint32_t reserved;
    VGPU_ATOMIC(uint64_t) owner;       /* 0: free; else the holding process's token */
    VGPU_ATOMIC(uint64_t) activity_ns; /* CLOCK_MONOTONIC of the holder's last GPU call */
    VGPU_ATOMIC(uint64_t) waiters;     /* processes waiting for it now */
    VGPU_ATOMIC(uint64_t) epochs;      /* epochs run (a statistic) */
    VGPU_ATOMIC(uint64_t) takeovers;   /* leases taken from a stale holder (a statistic) */
    VGPU_ATOMIC(uint64_t) yield_until_ns; /* after a release with waiters: theirs until then */
    VGPU_ATOMIC(uint32_t) releases;    /* bumped at every release; waiters sleep on it (futex) */
    uint32_t reserved2;
    uint32_t unused_boost; /* version 1 kept the daemon's boost here; read by no one now */
    uint32_t reserved3;
    uint64_t unused_boost_ns;
    /* When the holder's queued work should be done (CLOCK_MONOTONIC, its own estimate, renewed
     * at every launch). A holder past it by VGPU_LEASE_DRAINED_NS has left the GPU idle (its
     * launching thread asleep): a waiter may take the lease then, so the idle time goes to
     * whoever has work. 0: none said. */
    VGPU_ATOMIC(uint64_t) drains_ns;
    VGPU_ATOMIC(uint64_t) drained_owner; /* the holder last taken over for being drained */
    /* When a waiter last said it waits (CLOCK_MONOTONIC; waiters say so at least every
     * VGPU_LEASE_WAITING_EVERY_NS). A waiter killed while it waits never takes itself off
     * `waiters`: a count not renewed for VGPU_LEASE_WANTED_NS is no one waiting. 0: never. */
    VGPU_ATOMIC(uint64_t) waiting_ns;
    /* The GPU time of every epoch so far, as its events measured it (nanoseconds, before the
     * boost; added as each epoch ends): the node daemon reads from it how busy paced work keeps
     * the GPU, which NVML's utilization reads a few points low. A tenant may write it: the daemon
     * draws only an upper bound on the boost from it (security.md). */
    VGPU_ATOMIC(uint64_t) busy_ns;
    /* When a waiter whose pod used less than half its limit lately began to wait (CLOCK_MONOTONIC;
     * VGPU_ARBITER_URGENT says why): the holder, if of another pod, ends its epoch at its next
     * launch, on average at most once per VGPU_ARBITER_URGENT_EVERY_NS (vgpu_urgency.h). 0:
     * never. */
    VGPU_ATOMIC(uint64_t) urgent_ns;
};

/* What only the node daemon says about a GPU: {base}/.node/{uuid}, made by the daemon, mode
 * 0644 in a folder of 0755, read-only to every other process (and mounted read-only into pods).
 * The limiter uses it only when it is owned by root or by the folder's owner, and the file and
 * its folder are writable by their owner alone. */
#define VGPU_NODE_MAGIC 0x31444f4e55504756ULL /* "VGPUNOD1" */
#define VGPU_NODE_VERSION 1

struct vgpu_device_node {
    VGPU_ATOMIC(uint64_t) magic; /* written last when the file is made */
    uint32_t version;
    uint32_t reserved;
    /* How much faster the GPU runs the work of the last second than it would with every SM busy
     * and its power at the limit (GPU Boost spends the headroom that idle time leaves), in parts
     * per VGPU_BOOST_ONE; 0: not known. The compute limiter charges GPU time times this, so
     * that a limit is a share of the saturated GPU's work. */
    VGPU_ATOMIC(uint32_t) boost;
    uint32_t reserved2;
    VGPU_ATOMIC(uint64_t) boost_ns; /* CLOCK_MONOTONIC when `boost` was written */
    /* Which daemon arbitrates this GPU's lease now (VGPU_LEASE_SOCKET; random, never 0): a
     * limiter pacing with another (an earlier daemon, or a lease file) connects to this one. */
    VGPU_ATOMIC(uint64_t) lease_instance;
    /* The device memory each CUDA context on this GPU is charged, a setting of the node's (bytes;
     * 0: none published). TF_CUDA_CONTEXT_OVERHEAD may raise it for a process, never lower it:
     * a tenant that could would hold contexts its limit does not count. */
    VGPU_ATOMIC(uint64_t) context_charge;
    uint64_t spare[2];
};

/* With a node daemon, no process shares a writable word with another pod: the daemon arbitrates
 * every GPU's lease itself, over this socket of its node folder ({base}/.node/leases.sock, a
 * SOCK_SEQPACKET socket). A paced process connects once per GPU and sends a HELLO for the GPU;
 * the daemon answers WELCOME with one descriptor (SCM_RIGHTS): the process's own seat, a memfd
 * sealed against shrinking and growing that only this process and the daemon map. Then ACQUIRE
 * (a request number) is answered with GRANT (the same number) when the lease is this process's,
 * and RELEASE (that number, and the GPU time of the epoch) gives it back, or withdraws a request
 * given up. The daemon takes the lease back from a holder whose seat says it stopped launching
 * (VGPU_LEASE_STALE_NS) or left the GPU idle (VGPU_LEASE_DRAINED_NS), or that kept it past
 * VGPU_LEASE_HOLD_NS while others waited; it grants in turn among pods (one pid namespace and
 * user is one party), a party that overran the hold last of all for a while. A tenant can write
 * only its own seat, so it can mislead the daemon only about itself. */
#define VGPU_LEASE_SOCKET "leases.sock"
#define VGPU_ARBITER_MAGIC 0x3242524155504756ULL /* "VGPUARB2" */
#define VGPU_ARBITER_HELLO 1
#define VGPU_ARBITER_ACQUIRE 2
#define VGPU_ARBITER_RELEASE 3
#define VGPU_ARBITER_WELCOME 4
#define VGPU_ARBITER_GRANT 5
/* The answer to a HELLO from a process that does not hold the GPU's device file open (every
 * process with a context on the GPU does): it is not served that GPU's lease. */
#define VGPU_ARBITER_STRANGER 6
/* An ACQUIRE's value: the process's pod has used less than its share lately (its bucket holds
 * at least half of what it may save), so it waits with work of a short burst, an inference
 * request say: the holder of another party is asked to end its epoch now (yield_request), on
 * average at most once per VGPU_ARBITER_URGENT_EVERY_NS for each party that asks
 * (vgpu_urgency.h). */
#define VGPU_ARBITER_URGENT 1
#define VGPU_ARBITER_URGENT_EVERY_NS 20000000ULL

/* Every message either way: one datagram of exactly this size. */
struct vgpu_arbiter_message {
    uint64_t magic;
    uint32_t kind;
    uint32_t reserved;
    uint64_t request; /* ACQUIRE, GRANT, RELEASE: the request; WELCOME: the daemon's instance */
    /* HELLO: the process's pod (its region's identity); ACQUIRE: VGPU_ARBITER_URGENT or 0;
     * RELEASE: GPU ns */
    uint64_t value;
    char uuid[VGPU_REGION_UUID_SIZE]; /* HELLO: the GPU */
};

/* A process's seat: its own line (written by it, read by the daemon) and the daemon's line
 * (written by the daemon: what the process may know of the others). */
#define VGPU_SEAT_MAGIC 0x3154414553555047ULL /* "GPUSEAT1" */
struct vgpu_lease_seat {
    uint64_t magic;
    VGPU_ATOMIC(uint64_t) activity_ns; /* CLOCK_MONOTONIC of its last launch while holding */
    VGPU_ATOMIC(uint64_t) drains_ns;   /* when its queued work should be done; 0: not said */
    uint64_t own_spare[5];
    VGPU_ATOMIC(uint64_t) granted; /* the request it holds the lease for now; 0: none */
    VGPU_ATOMIC(uint64_t) waiters; /* other processes waiting for the lease now */
    VGPU_ATOMIC(uint64_t) other_pod_waiters; /* of them, those of other pods */
    VGPU_ATOMIC(uint64_t) other_pod_holds;   /* 1: a process of another pod holds it */
    VGPU_ATOMIC(uint64_t) taken_back;        /* grants taken back from it (stale, idle, overrun) */
    /* The request it holds the lease for, when another party waits urgently: it ends its
     * epoch at its next launch (its queued work drained and charged, as at any epoch's end).
     * 0: none asks. */
    VGPU_ATOMIC(uint64_t) yield_request;
    /* CLOCK_MONOTONIC when a process of another party began to ask for the lease after
     * VGPU_NEWCOMER_IDLE_NS or more without (a pod that woke): a burst rate the daemon wrote
     * before then was counted without that pod, and is not run at. 0: none. */
    VGPU_ATOMIC(uint64_t) newcomer_ns;
    uint64_t daemon_spare[1];
};
/* A party that asked for no GPU's lease for this long asks as a newcomer: the daemon's passes
 * stopped counting it as wanting the GPU after a second (daemon/demand.py). */
#define VGPU_NEWCOMER_IDLE_NS 1000000000ULL

#define VGPU_BOOST_ONE 10000U
#define VGPU_BOOST_MAX 20000U          /* larger values are taken as this */
#define VGPU_BOOST_STALE_NS 5000000000ULL /* older than this: the daemon is gone, not applied */

#ifndef VGPU_REGION_CDEF
_Static_assert(sizeof(struct vgpu_device_lease) == 128, "vgpu_device_lease size");
_Static_assert(sizeof(struct vgpu_device_node) == 64, "vgpu_device_node size");
_Static_assert(sizeof(struct vgpu_arbiter_message) == 80, "vgpu_arbiter_message size");
_Static_assert(sizeof(struct vgpu_lease_seat) == 128, "vgpu_lease_seat size");

/* The layout is a contract between processes built at different times: pin it. */
_Static_assert(sizeof(struct vgpu_region_device) == 272, "vgpu_region_device size");
_Static_assert(sizeof(struct vgpu_region_process) == 288, "vgpu_region_process size");
_Static_assert(offsetof(struct vgpu_region, devices) == 688, "vgpu_region header size");
_Static_assert(sizeof(struct vgpu_region) ==
                   688 + 272 * VGPU_REGION_MAX_DEVICES + 288 * VGPU_REGION_MAX_PROCESSES,
               "vgpu_region size");
_Static_assert(sizeof(VGPU_ATOMIC(uint64_t)) == 8 && _Alignof(VGPU_ATOMIC(uint64_t)) == 8,
               "lock-free 64-bit atomics");
#endif

#endif
