/* Stream capture (capture.c): the hooks that open and close captures count them, so that a
 * launch asks the driver whether its stream captures only while one may. */
#ifndef VGPU_LIMITER_CAPTURE_H
#define VGPU_LIMITER_CAPTURE_H

#include <stdbool.h>

#include "cuda_api.h"

/* Whether a launch on `stream` (CU_STREAM_PER_THREAD for a _ptsz call's 0) is captured into a
 * graph, or cannot be told. */
bool vgpu_capturing(CUstream stream);

#endif
