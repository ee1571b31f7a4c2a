/* Simulated driver: contexts and the primary context of each device (the thread's stack of
 * current contexts is in cuda_core.c). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "cuda_sim.h"

/* Primary contexts by physical device, with their retain counts. */
static struct CUctx_st *primary[SIM_MAX_DEVICES];
static unsigned primary_retains[SIM_MAX_DEVICES];
static unsigned primary_flags[SIM_MAX_DEVICES];

/* Each limit's value in a new context; the memory behind these is part of the context's
 * overhead, and only what a larger value adds is reserved on top of it. */
static const size_t limit_defaults[SIM_LIMITS] = {1024, 1 << 20, 8 << 20, 2, 2048};

/* Device memory a limit's value reserves beyond its default: the malloc heap and the printf
 * FIFO byte for byte, the stack once for every thread the device can hold resident. */
static uint64_t limit_reservation(const struct CUctx_st *context, CUlimit limit, size_t value) {
    if (limit > CU_LIMIT_MALLOC_HEAP_SIZE || value <= limit_defaults[limit]) {
        return 0;
    }
    unsigned __int128 bytes = value - limit_defaults[limit];
    if (limit == CU_LIMIT_STACK_SIZE) {
        bytes *= (uint64_t)sim_driver_state()->devices[context->device].config.sm_count *
                 SIM_THREADS_PER_SM;
    }
    bytes = (bytes + SIM_PAGE_SIZE - 1) / SIM_PAGE_SIZE * SIM_PAGE_SIZE;
    return bytes > UINT64_MAX ? UINT64_MAX : (uint64_t)bytes;
}

static uint64_t limits_reservation(const struct CUctx_st *context) {
    uint64_t total = 0;
    for (int limit = 0; limit < SIM_LIMITS; limit++) {
        total += limit_reservation(context, (CUlimit)limit, context->limits[limit]);
    }
    return total;
}

CUresult sim_context_new(int device, bool is_primary, unsigned flags, struct CUctx_st **out) {
    struct CUctx_st *context = calloc(1, sizeof *context);
    if (context == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!sim_context_attach(device)) {
        free(context);
        return CUDA_ERROR_OUT_OF_MEMORY; /* the device cannot hold another context */
    }
    context->magic = SIM_CONTEXT;
    context->device = device;
    context->primary = is_primary;
    context->flags = flags;
    memcpy(context->limits, limit_defaults, sizeof context->limits);
    context->default_stream = sim_stream_new(context, 0);
    if (context->default_stream == NULL) {
        sim_context_detach(device);
        free(context);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = context;
    return CUDA_SUCCESS;
}

void sim_context_wait(struct CUctx_st *context) {
    pthread_mutex_lock(&sim_driver_lock);
    uint64_t deadline = context->last_end_ns;
    pthread_mutex_unlock(&sim_driver_lock);
    sim_sleep_until(deadline);
    sim_pools_release_unused();
}

/* Destroying a context waits for its work and gives back everything it owns. */
void sim_context_free(struct CUctx_st *context) {
    sim_context_wait(context);
    pthread_mutex_lock(&sim_driver_lock);
    sim_allocations_free_context(context);
    sim_stream_free(context->default_stream);
    context->magic = 0;
    pthread_mutex_unlock(&sim_driver_lock);
    sim_memory_release(context->device, limits_reservation(context));
    sim_context_detach(context->device);
    /* Pop it from this thread's stack; other threads holding it see an invalid context. */
    sim_context_forget(context);
    /* The struct is kept (magic cleared): a stale handle must fail cleanly, not crash. */
}

static CUresult create(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    int device;
    CUresult result = sim_device_argument(dev, &device);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (pctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUctx_st *context = NULL;
    result = sim_context_new(device, false, flags, &context);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_context_push(context)) { /* a new context becomes current */
        sim_context_free(context);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pctx = context;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return create(pctx, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                        CUdevice dev) {
    if (ctxCreateParams != NULL &&
        (ctxCreateParams->numExecAffinityParams != 0 || ctxCreateParams->cigParams != NULL)) {
        return CUDA_ERROR_NOT_SUPPORTED; /* execution affinity and CIG are not simulated */
    }
    return create(pctx, flags, dev);
}

/* The legacy entry points: the same context without (v1) or with (v3) execution affinity. */
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return create(pctx, flags, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev) {
    if (paramsArray != NULL || numParams != 0) {
        return CUDA_ERROR_NOT_SUPPORTED; /* execution affinity is not simulated */
    }
    return create(pctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(ctx, SIM_CONTEXT) || ctx->primary) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    sim_context_free(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx) {
    return cuCtxDestroy_v2(ctx);
}

/* A green context: a context of its own on a device, made current only through
 * cuCtxFromGreenCtx. Resource partitions are not simulated; any descriptor is taken. */
CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
                          unsigned int flags) {
    int device;
    CUresult result = sim_device_argument(dev, &device);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (phCtx == NULL || desc == NULL || flags != CU_GREEN_CTX_DEFAULT_STREAM) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUgreenCtx_st *green = calloc(1, sizeof *green);
    if (green == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result = sim_context_new(device, false, 0, &green->context);
    if (result != CUDA_SUCCESS) {
        free(green);
        return result;
    }
    green->magic = SIM_GREEN_CONTEXT;
    *phCtx = green;
    return CUDA_SUCCESS;
}

CUresult cuGreenCtxDestroy(CUgreenCtx hCtx) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hCtx, SIM_GREEN_CONTEXT)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    hCtx->magic = 0; /* kept, as every destroyed object, so a stale handle fails cleanly */
    sim_context_free(hCtx->context);
    return CUDA_SUCCESS;
}

CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (pContext == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!sim_valid(hCtx, SIM_GREEN_CONTEXT)) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *pContext = hCtx->context;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(ctx, SIM_CONTEXT)) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    return sim_context_push(ctx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    struct CUctx_st *top = sim_context_pop();
    if (top == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (pctx != NULL) {
        *pctx = top;
    }
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (ctx != NULL && !sim_valid(ctx, SIM_CONTEXT)) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    sim_context_replace_top(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (pctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pctx = sim_context_top();
    return CUDA_SUCCESS;
}

/* The current context's limits. A larger stack, heap or printf FIFO reserves device memory
 * at once (CUDA_ERROR_OUT_OF_MEMORY when the device cannot hold it); a smaller one gives it
 * back. */
CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    struct CUctx_st *context;
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS || (result = sim_current_context(&context)) != CUDA_SUCCESS) {
        return result;
    }
    if ((unsigned)limit >= SIM_LIMITS) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    uint64_t before = limit_reservation(context, limit, context->limits[limit]);
    uint64_t after = limit_reservation(context, limit, value);
    if (after > before && !sim_memory_reserve(context->device, after - before)) {
        pthread_mutex_unlock(&sim_driver_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (after < before) {
        sim_memory_release(context->device, before - after);
    }
    context->limits[limit] = value;
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit) {
    struct CUctx_st *context;
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS || (result = sim_current_context(&context)) != CUDA_SUCCESS) {
        return result;
    }
    if (pvalue == NULL || (unsigned)limit >= SIM_LIMITS) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    *pvalue = context->limits[limit];
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

/* The CUDA ordinal this process sees for a physical device. */
static CUdevice ordinal_of(int physical) {
    for (int i = 0; i < sim_visible_count(); i++) {
        if (sim_physical_device(i) == physical) {
            return i;
        }
    }
    return -1;
}

CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (device == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (ctx == NULL && (result = sim_current_context(&ctx)) != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(ctx, SIM_CONTEXT)) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    *device = ordinal_of(ctx->device);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
    return cuCtxGetDevice_v2(device, NULL);
}

CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (ctx == NULL && (result = sim_current_context(&ctx)) != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(ctx, SIM_CONTEXT)) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    sim_context_wait(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    return cuCtxSynchronize_v2(NULL);
}

/* The primary context: one per device and process, created by the first retain, destroyed
 * when the last retain is released or on reset. */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    int device;
    CUresult result = sim_device_argument(dev, &device);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (pctx == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct CUctx_st *context = primary[device];
    pthread_mutex_unlock(&sim_driver_lock);
    if (context == NULL) {
        /* Created outside the driver lock (it charges node memory); a racing creator's
         * context is dropped again. */
        result = sim_context_new(device, true, primary_flags[device], &context);
        if (result != CUDA_SUCCESS) {
            return result;
        }
        pthread_mutex_lock(&sim_driver_lock);
        if (primary[device] == NULL) {
            primary[device] = context;
            context = NULL;
        }
        pthread_mutex_unlock(&sim_driver_lock);
        if (context != NULL) {
            sim_context_free(context);
        }
    }
    pthread_mutex_lock(&sim_driver_lock);
    primary_retains[device]++;
    *pctx = primary[device];
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

static CUresult release_primary(CUdevice dev, bool reset) {
    int device;
    CUresult result = sim_device_argument(dev, &device);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct CUctx_st *context = primary[device];
    bool destroy = false;
    if (context != NULL) {
        if (!reset && primary_retains[device] == 0) {
            pthread_mutex_unlock(&sim_driver_lock);
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        primary_retains[device] = reset ? 0 : primary_retains[device] - 1;
        destroy = primary_retains[device] == 0;
        if (destroy) {
            primary[device] = NULL;
        }
    } else if (!reset) {
        pthread_mutex_unlock(&sim_driver_lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    if (destroy) {
        sim_context_free(context);
    }
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    return release_primary(dev, false);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    return release_primary(dev, true);
}

/* The CUDA 7.0 forms, as the _v2 ones. */
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    return release_primary(dev, false);
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    return release_primary(dev, true);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    int device;
    CUresult result = sim_device_argument(dev, &device);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (flags == NULL || active == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    *flags = primary_flags[device];
    *active = primary[device] != NULL;
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    int device;
    CUresult result = sim_device_argument(dev, &device);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&sim_driver_lock);
    primary_flags[device] = flags;
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}
