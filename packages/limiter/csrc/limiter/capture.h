/* Stream capture (capture.c): the hooks that open and close captures count them, so that a
 * launch asks the driver whether its stream captures only while one may. */
#ifndef VGPU_LIMITER_CAPTURE_H
#define VGPU_LIMITER_CAPTURE_H

#include <stdbool.h>

#include "cuda_api.h"

/* The stream a call names: for a _ptsz entry point (`per_thread`), 0 is the per-thread default
 * stream, CU_STREAM_PER_THREAD, and not the legacy one. */
static inline CUstream vgpu_stream_named(CUstream stream, bool per_thread) {
    return stream == NULL && per_thread ? CU_STREAM_PER_THREAD : stream;
}

/* Whether a launch on `stream` (as vgpu_stream_named gives it) is captured into a graph, or
 * cannot be told. */
bool vgpu_capturing(CUstream stream);

#endif
