/* The compute limiter: a pod's share of each GPU's time (TENSOR_FUSION_CUDA_UP_LIMIT). */
#ifndef VGPU_LIMITER_COMPUTE_H
#define VGPU_LIMITER_COMPUTE_H

#include "cuda_api.h"

/* After the program synchronized: close this thread's open epochs (their work is done). */
void vgpu_compute_quiesce(void);

/* Before a context is destroyed: close its epoch and drop its events, so that the next
 * context on the device is paced with events of its own. */
void vgpu_compute_context_gone(CUcontext context);

#endif
