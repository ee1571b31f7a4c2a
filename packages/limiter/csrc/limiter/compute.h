/* The compute limiter: a pod's share of each GPU's time (TENSOR_FUSION_CUDA_UP_LIMIT). */
#ifndef VGPU_LIMITER_COMPUTE_H
#define VGPU_LIMITER_COMPUTE_H

#include "compute_bucket.h"
#include "cuda_api.h"

struct paced_device;

/* After the program synchronized: close this thread's open epochs (their work is done). */
void vgpu_compute_quiesce(void);

/* Before a context is destroyed: close its epoch and drop its events, so that the next
 * context on the device is paced with events of its own. */
void vgpu_compute_context_gone(CUcontext context);

/* The pace the pod's bucket on device entry `entry` refills at now, for `state`'s process: its
 * soft limit while no other pod wants the GPU, else its hard (or effective) limit; and the
 * hard one whatever others do (another GPU's, as a rank reads it). */
struct vgpu_pace vgpu_compute_pace(struct paced_device *state, int entry);
struct vgpu_pace vgpu_compute_hard_pace(int entry);

/* Whether another pod wants the GPU of `state` (set up, with a lease) at `now`: it waits for the
 * lease or holds it, which the pod's region then remembers (contended_ns), or a process of the
 * pod saw it do so lately. */
bool vgpu_compute_contended(struct paced_device *state, uint64_t now);

#endif
