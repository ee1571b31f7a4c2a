/* Hooks of initialization and contexts. Each context holds device memory of its own before
 * any allocation; the pod is charged for it so that the device never holds more than the limit.
 * Destroying a context frees what was allocated in it, and so does the pod's charge. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "compute.h"
#include "core.h"
#include "lease_file.h"
#include "ledger.h"
#include "log.h"

static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned primary_retains[VGPU_MAX_ORDINALS];
static CUcontext primary_context[VGPU_MAX_ORDINALS];

/* The primary contexts retained are the parent's, as are their charges (the child's ledger has
 * none); and a thread of the parent that held the lock at the fork (retaining one: a real
 * driver makes the context meanwhile) left it held for good in the child, whose retains and
 * releases then hung. */
void vgpu_contexts_forget_in_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    primary_lock = fresh;
    memset(primary_retains, 0, sizeof primary_retains);
    memset(primary_context, 0, sizeof primary_context);
}

CUresult cuInit(unsigned int Flags) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    vgpu_show_only_pod_gpus(); /* before the driver reads CUDA_VISIBLE_DEVICES */
    result = VGPU_REAL(cuInit, Flags);
    return result == CUDA_SUCCESS ? vgpu_map_devices() : result;
}

static bool owned_by(const struct vgpu_record *record, void *context) {
    return record->context == context &&
           (record->kind == VGPU_RECORD_MEMORY || record->kind == VGPU_RECORD_HOST ||
            record->kind == VGPU_RECORD_ARRAY ||
            record->kind == VGPU_RECORD_CONTEXT || record->kind == VGPU_RECORD_LIMIT);
}

/* Give back the context's overhead and everything allocated in it. */
static void forget_context(CUcontext context) {
    struct vgpu_record records[256];
    unsigned taken;
    do {
        taken = vgpu_ledger_take_if(owned_by, context, records, 256);
        for (unsigned i = 0; i < taken; i++) {
            vgpu_record_give_back(&records[i]);
        }
    } while (taken == 256);
}

/* What a new context on the GPU of `entry` is charged: the process's setting, or the node's
 * (the daemon's, in the GPU's node file) when that is more. Read at each context's creation,
 * which is rare; the record keeps what was charged, so a later change of the node's setting
 * never unbalances the pod's count. */
static uint64_t node_context_charge(int entry) {
    uint64_t charge = vgpu_state.context_overhead;
    if (entry < 0 || vgpu_state.region == NULL) {
        return charge;
    }
    char folder_path[4200];
    char why[512];
    uid_t owner;
    snprintf(folder_path, sizeof folder_path, "%.4000s/.node", vgpu_state.config.base_path);
    int folder = vgpu_lease_folder(folder_path, VGPU_FOLDER_NODE, &owner, why, sizeof why);
    if (folder < 0) {
        return charge;
    }
    const struct vgpu_device_node *node = vgpu_lease_map_node(
        folder, owner, vgpu_state.region->devices[entry].uuid, why, sizeof why);
    close(folder);
    if (node != NULL) {
        uint64_t published = atomic_load(&node->magic) == VGPU_NODE_MAGIC
                                 ? atomic_load(&node->context_charge)
                                 : 0;
        charge = published > charge ? published : charge;
        munmap((void *)node, sizeof *node);
    }
    return charge;
}

/* The node's folder or file may well be absent (ENOENT): the program's errno is left as it was
 * by a context creation that succeeds. */
static uint64_t context_charge(int entry) {
    int saved = errno;
    uint64_t charge = node_context_charge(entry);
    errno = saved;
    return charge;
}

static void remember_context(CUcontext context, int entry, uint64_t charged) {
    struct vgpu_record record = {
        .key = (uint64_t)(uintptr_t)context,
        .kind = VGPU_RECORD_CONTEXT,
        .entry = entry,
        .bytes = charged,
        .context = context,
    };
    if (!vgpu_ledger_put(&record)) {
        vgpu_log(VGPU_LOG_WARN, "out of memory recording a context");
    }
}

static CUresult create(CUcontext *pctx, CUdevice dev, CUresult (*call)(void *), void *arguments) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    int entry = vgpu_entry_of(dev);
    if (entry == VGPU_ENTRY_OUTSIDE) {
        vgpu_log(VGPU_LOG_INFO, "no context on device %d: not one of the pod's GPUs", dev);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    uint64_t charge = context_charge(entry);
    if (!vgpu_charge(entry, charge)) {
        vgpu_log(VGPU_LOG_INFO, "a new context on device %d does not fit the pod's limit", dev);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result = call(arguments);
    if (result != CUDA_SUCCESS || pctx == NULL || entry < 0) {
        vgpu_uncharge(entry, charge);
        return result;
    }
    remember_context(*pctx, entry, charge);
    return CUDA_SUCCESS;
}

struct create_v2 {
    CUcontext *pctx;
    unsigned int flags;
    CUdevice dev;
};

static CUresult call_create_v2(void *arguments) {
    struct create_v2 *a = arguments;
    return VGPU_REAL(cuCtxCreate_v2, a->pctx, a->flags, a->dev);
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    struct create_v2 arguments = {pctx, flags, dev};
    return create(pctx, dev, call_create_v2, &arguments);
}

/* The legacy entry points the driver still exports: v1 (as v2) and v3 (execution affinity). */
static CUresult call_create_v1(void *arguments) {
    struct create_v2 *a = arguments;
    return VGPU_REAL(cuCtxCreate, a->pctx, a->flags, a->dev);
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    struct create_v2 arguments = {pctx, flags, dev};
    return create(pctx, dev, call_create_v1, &arguments);
}

struct create_v3 {
    CUcontext *pctx;
    CUexecAffinityParam *params;
    int count;
    unsigned int flags;
    CUdevice dev;
};

static CUresult call_create_v3(void *arguments) {
    struct create_v3 *a = arguments;
    return VGPU_REAL(cuCtxCreate_v3, a->pctx, a->params, a->count, a->flags, a->dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev) {
    struct create_v3 arguments = {pctx, paramsArray, numParams, flags, dev};
    return create(pctx, dev, call_create_v3, &arguments);
}

struct create_v4 {
    CUcontext *pctx;
    CUctxCreateParams *params;
    unsigned int flags;
    CUdevice dev;
};

static CUresult call_create_v4(void *arguments) {
    struct create_v4 *a = arguments;
    return VGPU_REAL(cuCtxCreate_v4, a->pctx, a->params, a->flags, a->dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                        CUdevice dev) {
    struct create_v4 arguments = {pctx, ctxCreateParams, flags, dev};
    return create(pctx, dev, call_create_v4, &arguments);
}

static CUresult destroy(CUcontext ctx, bool v1) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    vgpu_compute_context_gone(ctx);
    result = v1 ? VGPU_REAL(cuCtxDestroy, ctx) : VGPU_REAL(cuCtxDestroy_v2, ctx);
    if (result == CUDA_SUCCESS) {
        forget_context(ctx);
    }
    return result;
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    return destroy(ctx, false);
}

/* The CUDA 2.0 form the driver still exports: it frees the same, so it gives back the same. */
CUresult cuCtxDestroy(CUcontext ctx) {
    return destroy(ctx, true);
}

/* A green context holds a context's overhead like any other; it is charged under the context
 * cuCtxFromGreenCtx gives, where what is allocated in it is recorded too, so that destroying
 * it gives back both. */
static CUcontext green_context(CUgreenCtx green) {
    CUcontext context = NULL;
    return VGPU_REAL(cuCtxFromGreenCtx, &context, green) == CUDA_SUCCESS ? context : NULL;
}

CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
                          unsigned int flags) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    int entry = vgpu_entry_of(dev);
    if (entry == VGPU_ENTRY_OUTSIDE) {
        vgpu_log(VGPU_LOG_INFO, "no green context on device %d: not one of the pod's GPUs", dev);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    uint64_t charge = context_charge(entry);
    if (!vgpu_charge(entry, charge)) {
        vgpu_log(VGPU_LOG_INFO, "a new green context on device %d does not fit the pod's limit",
                 dev);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result = VGPU_REAL(cuGreenCtxCreate, phCtx, desc, dev, flags);
    CUcontext context = result == CUDA_SUCCESS && phCtx != NULL ? green_context(*phCtx) : NULL;
    if (context == NULL || entry < 0) {
        vgpu_uncharge(entry, charge);
        return result;
    }
    remember_context(context, entry, charge);
    return CUDA_SUCCESS;
}

CUresult cuGreenCtxDestroy(CUgreenCtx hCtx) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    CUcontext context = green_context(hCtx);
    if (context != NULL) {
        vgpu_compute_context_gone(context);
    }
    result = VGPU_REAL(cuGreenCtxDestroy, hCtx);
    if (result == CUDA_SUCCESS && context != NULL) {
        forget_context(context);
    }
    return result;
}

static CUresult call_retain(void *arguments) {
    struct create_v2 *a = arguments;
    return VGPU_REAL(cuDevicePrimaryCtxRetain, a->pctx, a->dev);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (dev < 0 || dev >= VGPU_MAX_ORDINALS) {
        return VGPU_REAL(cuDevicePrimaryCtxRetain, pctx, dev);
    }
    /* Only the first retain creates the context and its overhead. */
    pthread_mutex_lock(&primary_lock);
    if (primary_retains[dev] > 0) {
        result = VGPU_REAL(cuDevicePrimaryCtxRetain, pctx, dev);
    } else {
        struct create_v2 arguments = {pctx, 0, dev};
        result = create(pctx, dev, call_retain, &arguments);
        if (result == CUDA_SUCCESS) {
            primary_context[dev] = *pctx;
        }
    }
    primary_retains[dev] += result == CUDA_SUCCESS;
    pthread_mutex_unlock(&primary_lock);
    return result;
}

/* The driver's release or reset: the _v2 forms, or the CUDA 7.0 ones (v1), which free the
 * same. */
static CUresult release_real(CUdevice dev, bool reset, bool v1) {
    if (v1) {
        return reset ? VGPU_REAL(cuDevicePrimaryCtxReset, dev)
                     : VGPU_REAL(cuDevicePrimaryCtxRelease, dev);
    }
    return reset ? VGPU_REAL(cuDevicePrimaryCtxReset_v2, dev)
                 : VGPU_REAL(cuDevicePrimaryCtxRelease_v2, dev);
}

static CUresult release_primary(CUdevice dev, bool reset, bool v1) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (dev < 0 || dev >= VGPU_MAX_ORDINALS) {
        return release_real(dev, reset, v1);
    }
    pthread_mutex_lock(&primary_lock);
    if (primary_context[dev] != NULL && (reset || primary_retains[dev] == 1)) {
        vgpu_compute_context_gone(primary_context[dev]); /* the context is about to go */
    }
    result = release_real(dev, reset, v1);
    if (result == CUDA_SUCCESS && primary_retains[dev] > 0) {
        primary_retains[dev] = reset ? 0 : primary_retains[dev] - 1;
        if (primary_retains[dev] == 0) {
            forget_context(primary_context[dev]);
            primary_context[dev] = NULL;
        }
    }
    pthread_mutex_unlock(&primary_lock);
    return result;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    return release_primary(dev, false, false);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    return release_primary(dev, true, false);
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    return release_primary(dev, false, true);
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    return release_primary(dev, true, true);
}
