/* Simulated driver: modules, streams, events, kernel launches and graphs. A kernel occupies its
 * whole device for the nanoseconds in its first parameter; the device runs the kernels of all
 * streams and processes one after another, in submission order. Destroyed objects keep their
 * memory with the magic cleared, so a stale handle fails cleanly instead of crashing. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_sim.h"

uint64_t sim_kernel_duration(void **kernel_params) {
    if (kernel_params == NULL || kernel_params[0] == NULL) {
        return 0;
    }
    uint64_t duration;
    memcpy(&duration, kernel_params[0], sizeof duration);
    return duration;
}

/* --- modules ----------------------------------------------------------------------------- */

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    CUresult result = sim_initialized();
    struct CUctx_st *context;
    if (result != CUDA_SUCCESS || (result = sim_current_context(&context)) != CUDA_SUCCESS) {
        return result;
    }
    if (module == NULL || image == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUmod_st *loaded = calloc(1, sizeof *loaded);
    if (loaded == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    loaded->magic = SIM_MODULE;
    *module = loaded;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (hfunc == NULL || name == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_valid(hmod, SIM_MODULE)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    struct CUfunc_st *function = calloc(1, sizeof *function);
    if (function == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    function->magic = SIM_FUNCTION;
    function->module = hmod;
    snprintf(function->name, sizeof function->name, "%s", name);
    *hfunc = function;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetName(const char **name, CUfunction hfunc) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (name == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_valid(hfunc, SIM_FUNCTION)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *name = hfunc->name;
    return CUDA_SUCCESS;
}

/* The simulator has no libraries: a kernel handle is a function's (both launch alike). */
CUresult cuKernelGetName(const char **name, CUkernel hfunc) {
    return cuFuncGetName(name, (CUfunction)(void *)hfunc);
}

CUresult cuModuleUnload(CUmodule hmod) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hmod, SIM_MODULE)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    hmod->magic = 0;
    return CUDA_SUCCESS;
}

/* --- streams ----------------------------------------------------------------------------- */

struct CUstream_st *sim_stream_new(struct CUctx_st *context, unsigned flags) {
    struct CUstream_st *stream = calloc(1, sizeof *stream);
    if (stream != NULL) {
        stream->magic = SIM_STREAM;
        stream->context = context;
        stream->flags = flags;
    }
    return stream;
}

void sim_stream_free(struct CUstream_st *stream) {
    if (stream != NULL) {
        stream->magic = 0;
    }
}

CUresult sim_stream_resolve(CUstream handle, struct CUstream_st **stream) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (handle == NULL || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
        struct CUctx_st *context;
        if ((result = sim_current_context(&context)) != CUDA_SUCCESS) {
            return result;
        }
        *stream = context->default_stream;
        return CUDA_SUCCESS;
    }
    if (!sim_valid(handle, SIM_STREAM) || !sim_valid(handle->context, SIM_CONTEXT)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *stream = handle;
    return CUDA_SUCCESS;
}

CUresult sim_stream_launch(struct CUstream_st *stream, CUfunction function, uint64_t duration_ns) {
    pthread_mutex_lock(&sim_driver_lock);
    if (stream->capture != NULL) {
        CUresult result = sim_graph_append(stream->capture, function, duration_ns, NULL);
        pthread_mutex_unlock(&sim_driver_lock);
        return result;
    }
    /* A full launch queue blocks the caller until its oldest kernel completes. */
    uint64_t oldest = stream->pending[stream->pending_next];
    pthread_mutex_unlock(&sim_driver_lock);
    if (oldest > sim_now_ns()) {
        sim_sleep_until(oldest);
    }
    pthread_mutex_lock(&sim_driver_lock);
    uint64_t end = sim_enqueue(stream->context->device, stream->tail_ns, duration_ns);
    stream->tail_ns = end;
    stream->pending[stream->pending_next] = end;
    stream->pending_next = (stream->pending_next + 1) % SIM_QUEUE_DEPTH;
    if (end > stream->context->last_end_ns) {
        stream->context->last_end_ns = end;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

static CUresult create_stream(CUstream *phStream, unsigned int flags) {
    struct CUctx_st *context;
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS || (result = sim_current_context(&context)) != CUDA_SUCCESS) {
        return result;
    }
    if (phStream == NULL || (flags & ~CU_STREAM_NON_BLOCKING) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUstream_st *stream = sim_stream_new(context, flags);
    if (stream == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phStream = stream;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    return create_stream(phStream, Flags);
}

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    (void)priority; /* the device runs kernels in submission order whatever their priority */
    return create_stream(phStream, flags);
}

CUresult cuStreamDestroy_v2(CUstream hStream) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hStream, SIM_STREAM) || hStream == hStream->context->default_stream) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    /* Work already queued still runs to completion, as with the real driver. */
    pthread_mutex_lock(&sim_driver_lock);
    sim_stream_free(hStream);
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (pctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pctx = stream->context;
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&sim_driver_lock);
    uint64_t deadline = stream->tail_ns;
    pthread_mutex_unlock(&sim_driver_lock);
    sim_sleep_until(deadline);
    sim_pools_release_unused();
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
    return cuStreamSynchronize(hStream);
}

CUresult cuStreamQuery(CUstream hStream) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&sim_driver_lock);
    bool done = stream->tail_ns <= sim_now_ns();
    pthread_mutex_unlock(&sim_driver_lock);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamQuery_ptsz(CUstream hStream) {
    return cuStreamQuery(hStream);
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hEvent, SIM_EVENT) || Flags > 1) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    if (hEvent->recorded && hEvent->time_ns > stream->tail_ns) {
        stream->tail_ns = hEvent->time_ns; /* later work starts after the event */
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    return cuStreamWaitEvent(hStream, hEvent, Flags);
}

/* --- events ------------------------------------------------------------------------------ */

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    struct CUctx_st *context;
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS || (result = sim_current_context(&context)) != CUDA_SUCCESS) {
        return result;
    }
    if (phEvent == NULL || Flags > 0xf) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUevent_st *event = calloc(1, sizeof *event);
    if (event == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    event->magic = SIM_EVENT;
    event->flags = Flags;
    *phEvent = event;
    return CUDA_SUCCESS;
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hEvent, SIM_EVENT) || flags > 1) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    if (stream->capture == NULL) { /* under capture an event record adds no kernel time */
        uint64_t now = sim_now_ns();
        hEvent->time_ns = stream->tail_ns > now ? stream->tail_ns : now;
        hEvent->recorded = true;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags) {
    return cuEventRecordWithFlags(hEvent, hStream, flags);
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    return cuEventRecordWithFlags(hEvent, hStream, 0);
}

CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
    return cuEventRecordWithFlags(hEvent, hStream, 0);
}

static CUresult event_time(CUevent event, uint64_t *time_ns) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(event, SIM_EVENT)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    *time_ns = event->recorded ? event->time_ns : 0; /* an unrecorded event is complete */
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent hEvent) {
    uint64_t time_ns;
    CUresult result = event_time(hEvent, &time_ns);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    return time_ns <= sim_now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent) {
    uint64_t time_ns;
    CUresult result = event_time(hEvent, &time_ns);
    if (result == CUDA_SUCCESS) {
        sim_sleep_until(time_ns);
        sim_pools_release_unused();
    }
    return result;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    uint64_t start;
    uint64_t end;
    CUresult result = event_time(hStart, &start);
    if (result != CUDA_SUCCESS || (result = event_time(hEnd, &end)) != CUDA_SUCCESS) {
        return result;
    }
    if (pMilliseconds == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING || !hStart->recorded ||
        !hEnd->recorded) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    uint64_t now = sim_now_ns();
    if (start > now || end > now) {
        return CUDA_ERROR_NOT_READY;
    }
    *pMilliseconds = (float)((double)((int64_t)(end - start)) / 1e6);
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

CUresult cuEventDestroy_v2(CUevent hEvent) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hEvent, SIM_EVENT)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    hEvent->magic = 0;
    return CUDA_SUCCESS;
}

/* --- launches ---------------------------------------------------------------------------- */

CUresult sim_launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                    unsigned int bx, unsigned int by, unsigned int bz, CUstream hStream,
                    void **kernelParams) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(f, SIM_FUNCTION)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 ||
        (uint64_t)bx * by * bz > 1024) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_stream_launch(stream, f, sim_kernel_duration(kernelParams));
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra) {
    (void)sharedMemBytes;
    (void)extra;
    return sim_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                      kernelParams);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                             void **kernelParams, void **extra) {
    return cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                          sharedMemBytes, hStream, kernelParams, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra) {
    (void)extra;
    if (config == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                      config->blockDimY, config->blockDimZ, config->hStream, kernelParams);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra) {
    return cuLaunchKernelEx(config, f, kernelParams, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams) {
    (void)sharedMemBytes;
    return sim_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                      kernelParams);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX,
                                        unsigned int blockDimY, unsigned int blockDimZ,
                                        unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams) {
    return cuLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                     blockDimZ, sharedMemBytes, hStream, kernelParams);
}
