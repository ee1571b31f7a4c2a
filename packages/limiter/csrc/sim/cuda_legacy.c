/* Simulated driver: the deprecated launch entry points. A legacy launch takes its block shape
 * and parameter block from the function (cuFuncSetBlockShape, cuParamSetSize, cuParamSetv); its
 * kernel runs for the nanoseconds in the block's first 8 bytes, as a modern launch's first
 * parameter gives them. */
#define _GNU_SOURCE
#include <string.h>

#include "cuda_sim.h"

static CUresult function_argument(CUfunction f) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    return sim_valid(f, SIM_FUNCTION) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuFuncSetBlockShape(CUfunction hfunc, int x, int y, int z) {
    CUresult result = function_argument(hfunc);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (x <= 0 || y <= 0 || z <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    hfunc->block[0] = x;
    hfunc->block[1] = y;
    hfunc->block[2] = z;
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuParamSetSize(CUfunction hfunc, unsigned int numbytes) {
    CUresult result = function_argument(hfunc);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (numbytes > SIM_PARAM_BYTES) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    hfunc->param_size = numbytes;
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuParamSetv(CUfunction hfunc, int offset, void *ptr, unsigned int numbytes) {
    CUresult result = function_argument(hfunc);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (ptr == NULL || offset < 0 || (uint64_t)offset + numbytes > SIM_PARAM_BYTES) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    memcpy(hfunc->params + offset, ptr, numbytes);
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

static CUresult launch_grid(CUfunction f, int width, int height, CUstream stream) {
    CUresult result = function_argument(f);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (width <= 0 || height <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    int block[3] = {f->block[0], f->block[1], f->block[2]};
    uint64_t duration = 0;
    if (f->param_size >= sizeof duration) {
        memcpy(&duration, f->params, sizeof duration);
    }
    pthread_mutex_unlock(&sim_driver_lock);
    if (block[0] <= 0) {
        return CUDA_ERROR_INVALID_VALUE; /* no cuFuncSetBlockShape yet */
    }
    void *params[] = {&duration};
    return sim_launch(f, (unsigned)width, (unsigned)height, 1, (unsigned)block[0],
                      (unsigned)block[1], (unsigned)block[2], stream, params);
}

CUresult cuLaunch(CUfunction f) {
    return launch_grid(f, 1, 1, NULL);
}

CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height) {
    return launch_grid(f, grid_width, grid_height, NULL);
}

CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream) {
    return launch_grid(f, grid_width, grid_height, hStream);
}

/* Each device's kernel on its stream; the streams' contexts must be on distinct devices. */
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *launchParamsList,
                                              unsigned int numDevices, unsigned int flags) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (launchParamsList == NULL || numDevices == 0 || numDevices > SIM_MAX_DEVICES ||
        (flags & ~3U) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    bool seen[SIM_MAX_DEVICES] = {false};
    for (unsigned i = 0; i < numDevices; i++) {
        struct CUstream_st *stream;
        CUstream handle = launchParamsList[i].hStream;
        if (handle == NULL || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
            return CUDA_ERROR_INVALID_HANDLE; /* each launch names its device's stream */
        }
        if ((result = sim_stream_resolve(handle, &stream)) != CUDA_SUCCESS) {
            return result;
        }
        int device = stream->context->device;
        if (seen[device]) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        seen[device] = true;
    }
    for (unsigned i = 0; i < numDevices; i++) {
        const CUDA_LAUNCH_PARAMS *p = &launchParamsList[i];
        result = sim_launch(p->function, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                            p->blockDimY, p->blockDimZ, p->hStream, p->kernelParams);
        if (result != CUDA_SUCCESS) {
            return result;
        }
    }
    return CUDA_SUCCESS;
}
