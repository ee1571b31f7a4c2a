/* Collectives under a compute limit (compute_gang.c): which launches are a collective's kernel,
 * and the pod's one pause decision for each collective (compute.c takes the pause). */
#ifndef VGPU_LIMITER_COMPUTE_GANG_H
#define VGPU_LIMITER_COMPUTE_GANG_H

#include <stdbool.h>
#include <stdint.h>

#include "compute_epochs.h"
#include "cuda_api.h"

/* Whether `function` is a collective's kernel (by its name: collectives.c), remembered for
 * the process; lock-free. Forgotten when a context goes (a handle may then be reused). Sets
 * `*first` when the function was not known yet (its first launch, which may load its module). */
bool vgpu_gang_is_collective(CUfunction function, bool *first);
void vgpu_gang_forget_functions(void);

/* Executable graphs with a collective's kernel among their nodes (a collective captured into a
 * CUDA graph, as tensor-parallel inference servers do): noted when instantiated (graphs.c),
 * forgotten when destroyed; whether a launched one is such a graph. Lock-free: safe in a forked
 * child and from any thread. */
void vgpu_gang_note_graph(CUgraphExec exec, CUgraph graph);
void vgpu_gang_forget_graph(CUgraphExec exec);
bool vgpu_gang_graph_is_collective(CUgraphExec exec);
/* Whether a launch of `function`, or else of `graph`, is a collective's (`*first`: as above). */
bool vgpu_gang_launches_collective(CUfunction function, CUgraphExec graph, bool *first);

/* Whether the process launched a collective lately (in the last VGPU_GANG_HOLD_NS): one of a
 * job's ranks, paced by the gang's rules. */
#define VGPU_GANG_HOLD_NS 1000000000ULL
bool vgpu_gang_member(const struct paced_device *state, uint64_t now);
/* The rank's lease was taken by another pod's process (the daemon's arbiter, say, at the end of
 * the pod's turn): the pod's other ranks end their epochs at their next collective
 * (gang_lost_ns), rather than spin in collectives that wait for this one while the other pod's
 * ranks spin in theirs for want of the GPUs they still hold. A 30/70 pair of DDP jobs on two
 * H200s, its ranks' leases taken 2-3 times a second, got 28.4/67.4 and 28.9/67.3 % of a job
 * alone without this, 28.5/68.3 and 28.3/68.5 % with it. */
void vgpu_gang_lost(struct paced_device *state, uint64_t now);
/* Before a collective's kernel, under the device's lock (let go while pausing): counts the
 * collective and takes the pod's decision for it (a pause, the epoch's end). */
void vgpu_gang_pause(struct paced_device *state, int entry);
/* The GPU time a member's epoch runs before it ends for its quantum (others': QUANTUM_NS). */
uint64_t vgpu_gang_quantum(const struct paced_device *state, uint64_t now);
/* Whether a member's new epoch starts without waiting for the bucket (its debt is paid before
 * its next collective); sets the epoch's pace when it does, and adds what the bucket's cap cut
 * off to `*capped`. Not under the device's lock. */
bool vgpu_gang_defers(struct paced_device *state, int entry, uint64_t *capped);

/* The lease of the rank's GPU for an epoch of a process that runs collectives (what
 * vgpu_lease_acquire does for others): got, it waits until the pod's ranks that wait for their
 * GPUs' leases have theirs too, up to VGPU_GANG_START_MAX_NS, so that all start their epochs
 * together. Under the device's lock. */
#define VGPU_GANG_START_MAX_NS 5000000ULL
void vgpu_gang_acquire(struct paced_device *state, int entry);

/* What the rank at its collective number `*seq` does, by the pod's gate: the first rank to reach
 * the collective decides for all, by `decide(context, &now)` (which may end the rank's epoch,
 * and so take time: it reads the clock again); the others follow: pause until the decision's
 * time, and end their epochs where the decider ended its own. A rank behind the gang neither
 * pauses nor hands over (its decision is {0, false}). A rank found astray (farther behind than
 * any rank lags, VGPU_GANG_LAG_MAX) VGPU_GANG_RESYNC times running takes the gate's number as
 * its own (`*late` counts them): its count had drifted (a rank restarted, collectives launched
 * unpaced), and behind for good it would never pause with the others. */
#define VGPU_GANG_RESYNC 4
struct vgpu_gang_decision vgpu_gang_until(uint64_t *seq, unsigned *late, uint64_t now,
                                          struct vgpu_gang_decision (*decide)(void *,
                                                                              uint64_t *now),
                                          void *context);

#endif
