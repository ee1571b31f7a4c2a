/* The compute limiter: a pod's share of each GPU's time (TENSOR_FUSION_CUDA_UP_LIMIT). */
#ifndef VGPU_LIMITER_COMPUTE_H
#define VGPU_LIMITER_COMPUTE_H

/* After the program synchronized: close this thread's open epochs (their work is done). */
void vgpu_compute_quiesce(void);

#endif
