/* The compute limiter's pacing, for launch entry points outside compute.c. */
#ifndef VGPU_LIMITER_PACING_H
#define VGPU_LIMITER_PACING_H

#include <stdbool.h>

#include "cuda_api.h"

/* Run `launch(arguments)`, which queues work on `stream` of the current context, under the pod's
 * compute limit exactly as cuLaunchKernel is (per_thread: a 0 stream is the per-thread default
 * stream). Returns what `launch` returned, or why it could not run. */
CUresult vgpu_compute_paced(CUstream stream, bool per_thread, CUresult (*launch)(void *),
                            void *arguments);

#endif
