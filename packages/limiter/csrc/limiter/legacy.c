/* The deprecated launch entry points the driver still exports. cuLaunch, cuLaunchGrid and
 * cuLaunchGridAsync queue a kernel on one stream of the current context, like cuLaunchKernel,
 * and are paced as it is. cuLaunchCooperativeKernelMultiDevice queues kernels on several
 * devices that must start together: holding one device's kernel back for its budget would hold
 * all of them, so the launch is refused while any of its devices has a compute limit (the
 * driver deprecated it in CUDA 11.3; cuLaunchCooperativeKernel on each device replaces it). */
#define _GNU_SOURCE
#include "core.h"
#include "log.h"
#include "pacing.h"
#include "region.h"

struct grid_launch {
    CUfunction f;
    int width;
    int height;
    CUstream stream;
    int kind; /* 0 cuLaunch, 1 cuLaunchGrid, 2 cuLaunchGridAsync */
};

static CUresult launch_real(void *arguments) {
    const struct grid_launch *a = arguments;
    switch (a->kind) {
    case 0: return VGPU_REAL(cuLaunch, a->f);
    case 1: return VGPU_REAL(cuLaunchGrid, a->f, a->width, a->height);
    default: return VGPU_REAL(cuLaunchGridAsync, a->f, a->width, a->height, a->stream);
    }
}

CUresult cuLaunch(CUfunction f) {
    struct grid_launch a = {f, 1, 1, NULL, 0};
    return vgpu_compute_paced(NULL, false, launch_real, &a);
}

CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height) {
    struct grid_launch a = {f, grid_width, grid_height, NULL, 1};
    return vgpu_compute_paced(NULL, false, launch_real, &a);
}

CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream) {
    struct grid_launch a = {f, grid_width, grid_height, hStream, 2};
    return vgpu_compute_paced(hStream, false, launch_real, &a);
}

/* The region entry of a stream's device: that of its context, made current for the question. */
static int stream_entry(CUstream stream) {
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
        return vgpu_current_entry();
    }
    CUcontext context = NULL;
    if (VGPU_REAL(cuStreamGetCtx, stream, &context) != CUDA_SUCCESS ||
        VGPU_REAL(cuCtxPushCurrent_v2, context) != CUDA_SUCCESS) {
        return -1; /* not a stream: the driver refuses the launch itself */
    }
    int entry = vgpu_current_entry();
    VGPU_REAL(cuCtxPopCurrent_v2, &context);
    return entry;
}

CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *launchParamsList,
                                              unsigned int numDevices, unsigned int flags) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    for (unsigned i = 0; launchParamsList != NULL && i < numDevices; i++) {
        int entry = stream_entry(launchParamsList[i].hStream);
        uint64_t memory;
        uint32_t compute = 0;
        if (entry >= 0) {
            vgpu_region_limits(vgpu_state.region, entry, &memory, &compute);
        }
        if (compute != 0 && compute < VGPU_COMPUTE_UNLIMITED) {
            vgpu_log(VGPU_LOG_WARN,
                     "cuLaunchCooperativeKernelMultiDevice refused: its launch %u is on a GPU "
                     "with a compute limit; launch with cuLaunchCooperativeKernel on each device",
                     i);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    return VGPU_REAL(cuLaunchCooperativeKernelMultiDevice, launchParamsList, numDevices, flags);
}
