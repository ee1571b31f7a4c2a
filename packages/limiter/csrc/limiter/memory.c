/* Hooks of allocation and free. Every allocation is charged to the pod before the real call
 * (so concurrent allocations can never pass the limit together) and given back when the call
 * fails or the memory is freed. Charges are what the device really holds: sizes rounded up to
 * the driver's 2 MiB pages, a pitched allocation's real pitch × height. */
#define _GNU_SOURCE
#include "core.h"
#include "ledger.h"
#include "log.h"
#include "region.h"
#include "vgpu_cuda_sizes.h"

static CUcontext current_context(void) {
    CUcontext context = NULL;
    if (VGPU_REAL(cuCtxGetCurrent, &context) != CUDA_SUCCESS) {
        context = NULL;
    }
    return context;
}

/* Charge `bytes` to `entry` before an allocation; CUDA_ERROR_OUT_OF_MEMORY past the limit. */
static CUresult charge(int entry, uint64_t bytes) {
    if (!vgpu_charge(entry, bytes)) {
        if (vgpu_region_self(vgpu_state.region) == NULL) {
            vgpu_log(VGPU_LOG_ERROR, "the pod's %d process slots are all in use by live "
                     "processes: this one cannot be charged, so it may not allocate",
                     VGPU_REGION_MAX_PROCESSES);
        } else {
            vgpu_log(VGPU_LOG_INFO, "an allocation of %llu bytes does not fit the pod's limit",
                     (unsigned long long)bytes);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* After the real call: record what was charged, or give it back when the call failed. */
static CUresult settle(CUresult result, int entry, uint64_t bytes, uint64_t key,
                       enum vgpu_record_kind kind) {
    if (result != CUDA_SUCCESS) {
        vgpu_uncharge(entry, bytes);
        return result;
    }
    struct vgpu_record record = {
        .key = key, .kind = kind, .entry = entry, .bytes = bytes, .context = current_context()};
    if (entry >= 0 && !vgpu_ledger_put(&record)) {
        vgpu_log(VGPU_LOG_WARN, "out of memory recording an allocation; it stays charged");
    }
    return result;
}

static uint64_t pages(uint64_t bytes) {
    uint64_t rounded = vgpu_round_up(bytes, VGPU_PAGE_SIZE);
    return rounded < bytes ? UINT64_MAX : rounded;
}

struct allocation;
static CUresult call_managed(struct allocation *a);

/* A real allocation call: its arguments, and where it leaves the address and the pitch. */
struct allocation {
    CUresult (*call)(struct allocation *a);
    uint64_t address; /* out */
    uint64_t pitch;   /* out, pitched calls */
    CUdeviceptr *dptr;
    size_t *pitch_out;
    size_t width;
    size_t height;
    unsigned element;
    unsigned flags;
    CUdeviceptr_v1 *dptr_v1;
    unsigned *pitch_v1;
    bool may_oversubscribe; /* served from host-backed managed memory past the limit */
};

static bool oversubscribed(int entry) {
    struct vgpu_region_limits limits;
    vgpu_region_read_limits(vgpu_state.region, entry, &limits);
    return (limits.device_flags & VGPU_DEVICE_OVERSUBSCRIBE) != 0;
}

/* Ask the driver to keep managed memory in host memory, mapped for the device: the preferred
 * location (which must hold, or the pages could migrate onto the device past the limit) and
 * access by the device (a hint that saves page faults). */
static CUresult keep_on_host(CUdeviceptr address, size_t size) {
    CUdevice device = 0;
    CUresult result = VGPU_REAL(cuCtxGetDevice, &device);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    CUmemLocation host = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    CUmemLocation gpu = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device};
    /* CUDA 12.2 added the location form; older drivers take a device, the host as -1. */
    result = VGPU_REAL(cuMemAdvise_v2, address, size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host);
    bool located = result != CUDA_ERROR_NOT_FOUND;
    if (!located) {
        result = VGPU_REAL(cuMemAdvise, address, size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                           CU_DEVICE_CPU);
    }
    if (result != CUDA_SUCCESS) {
        return result;
    }
    CUmem_advise access = CU_MEM_ADVISE_SET_ACCESSED_BY;
    CUresult hint = located ? VGPU_REAL(cuMemAdvise_v2, address, size, access, gpu)
                            : VGPU_REAL(cuMemAdvise, address, size, access, device);
    if (hint != CUDA_SUCCESS) {
        vgpu_log(VGPU_LOG_DEBUG, "cuMemAdvise(SET_ACCESSED_BY) failed with %d", (int)hint);
    }
    return CUDA_SUCCESS;
}

/* An allocation past the limit of a device with oversubscription on: managed memory kept in
 * host memory, charged to the pod's host-backed bytes instead of its device memory. */
static CUresult allocate_on_host(int entry, uint64_t bytes, struct allocation *a) {
    if (!vgpu_region_reserve_host(vgpu_state.region, entry, bytes)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    unsigned flags = a->call == call_managed ? a->flags : CU_MEM_ATTACH_GLOBAL;
    CUresult result = VGPU_REAL(cuMemAllocManaged, a->dptr, a->width, flags);
    if (result == CUDA_SUCCESS && (result = keep_on_host(*a->dptr, a->width)) != CUDA_SUCCESS) {
        vgpu_log(VGPU_LOG_WARN,
                 "cuMemAdvise cannot keep oversubscribed memory in host memory (error %d): "
                 "the allocation is refused",
                 (int)result);
        VGPU_REAL(cuMemFree_v2, *a->dptr);
        result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (result != CUDA_SUCCESS) {
        vgpu_region_release_host(vgpu_state.region, entry, bytes);
        return result;
    }
    vgpu_log(VGPU_LOG_DEBUG, "%llu bytes past the pod's limit are served from host memory",
             (unsigned long long)bytes);
    struct vgpu_record record = {.key = *a->dptr,
                                 .kind = VGPU_RECORD_HOST,
                                 .entry = entry,
                                 .bytes = bytes,
                                 .context = current_context()};
    if (!vgpu_ledger_put(&record)) {
        vgpu_log(VGPU_LOG_WARN, "out of memory recording an allocation; it stays charged");
    }
    return CUDA_SUCCESS;
}

/* Charge `bytes`, make the call, record it; past the limit, host-backed where allowed. */
static CUresult allocate(uint64_t bytes, struct allocation *a) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    int entry = vgpu_current_entry();
    bool spill = a->may_oversubscribe && entry >= 0 && oversubscribed(entry);
    if (spill && !vgpu_try_charge(entry, bytes)) {
        if (vgpu_region_self(vgpu_state.region) == NULL) {
            return charge(entry, bytes); /* no slot: refused, and said why */
        }
        return allocate_on_host(entry, bytes, a);
    }
    if (!spill && (result = charge(entry, bytes)) != CUDA_SUCCESS) {
        return result;
    }
    result = a->call(a);
    return settle(result, entry, bytes, a->address, VGPU_RECORD_MEMORY);
}

static CUresult call_alloc(struct allocation *a) {
    CUresult result = VGPU_REAL(cuMemAlloc_v2, a->dptr, a->width);
    a->address = result == CUDA_SUCCESS ? *a->dptr : 0;
    return result;
}

static CUresult call_alloc_v1(struct allocation *a) {
    CUresult result = VGPU_REAL(cuMemAlloc, a->dptr_v1, (unsigned)a->width);
    a->address = result == CUDA_SUCCESS ? *a->dptr_v1 : 0;
    return result;
}

static CUresult call_managed(struct allocation *a) {
    CUresult result = VGPU_REAL(cuMemAllocManaged, a->dptr, a->width, a->flags);
    a->address = result == CUDA_SUCCESS ? *a->dptr : 0;
    return result;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    struct allocation a = {
        .call = call_alloc, .dptr = dptr, .width = bytesize, .may_oversubscribe = true};
    return allocate(pages(bytesize), &a);
}

/* The legacy entry point (32-bit pointer and size), which the driver still exports. */
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    struct allocation a = {.call = call_alloc_v1, .dptr_v1 = dptr, .width = bytesize};
    return allocate(pages(bytesize), &a);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    struct allocation a = {.call = call_managed,
                           .dptr = dptr,
                           .width = bytesize,
                           .flags = flags,
                           .may_oversubscribe = true};
    return allocate(pages(bytesize), &a);
}

/* A pitched allocation: the driver pads rows (to 512 bytes on current GPUs), so that estimate
 * is charged first, then corrected to the pitch the driver chose. */
static CUresult allocate_pitched(struct allocation *a) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    int entry = vgpu_current_entry();
    unsigned __int128 estimate = (unsigned __int128)vgpu_round_up(a->width, 512) * a->height;
    uint64_t bytes = estimate > UINT64_MAX ? UINT64_MAX : pages((uint64_t)estimate);
    if ((result = charge(entry, bytes)) != CUDA_SUCCESS) {
        return result;
    }
    result = a->call(a);
    if (result == CUDA_SUCCESS) {
        unsigned __int128 exact = (unsigned __int128)a->pitch * a->height;
        uint64_t actual = exact > UINT64_MAX ? UINT64_MAX : pages((uint64_t)exact);
        if (actual > bytes && !vgpu_charge(entry, actual - bytes)) {
            VGPU_REAL(cuMemFree_v2, a->address);
            vgpu_uncharge(entry, bytes);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (actual < bytes) {
            vgpu_uncharge(entry, bytes - actual);
        }
        bytes = actual;
    }
    return settle(result, entry, bytes, a->address, VGPU_RECORD_MEMORY);
}

static CUresult call_pitch(struct allocation *a) {
    CUresult result =
        VGPU_REAL(cuMemAllocPitch_v2, a->dptr, a->pitch_out, a->width, a->height, a->element);
    a->address = result == CUDA_SUCCESS ? *a->dptr : 0;
    a->pitch = result == CUDA_SUCCESS ? *a->pitch_out : 0;
    return result;
}

static CUresult call_pitch_v1(struct allocation *a) {
    CUresult result = VGPU_REAL(cuMemAllocPitch, a->dptr_v1, a->pitch_v1, (unsigned)a->width,
                                (unsigned)a->height, a->element);
    a->address = result == CUDA_SUCCESS ? *a->dptr_v1 : 0;
    a->pitch = result == CUDA_SUCCESS ? *a->pitch_v1 : 0;
    return result;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                            size_t Height, unsigned int ElementSizeBytes) {
    struct allocation a = {.call = call_pitch,
                           .dptr = dptr,
                           .pitch_out = pPitch,
                           .width = WidthInBytes,
                           .height = Height,
                           .element = ElementSizeBytes};
    return allocate_pitched(&a);
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes) {
    struct allocation a = {.call = call_pitch_v1,
                           .dptr_v1 = dptr,
                           .pitch_v1 = pPitch,
                           .width = WidthInBytes,
                           .height = Height,
                           .element = ElementSizeBytes};
    return allocate_pitched(&a);
}

void vgpu_record_give_back(const struct vgpu_record *record) {
    if (record->kind == VGPU_RECORD_HOST) {
        if (record->entry >= 0 && record->bytes != 0) {
            vgpu_region_release_host(vgpu_state.region, record->entry, record->bytes);
        }
    } else if (record->kind != VGPU_RECORD_POOLED) {
        vgpu_uncharge(record->entry, record->bytes);
    }
}

/* Free through `call`: the record is taken first so that an address the driver hands out again
 * in another thread is never confused with it, and put back if the free fails. */
static CUresult free_recorded(uint64_t key, CUresult (*call)(void *), void *arguments) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    struct vgpu_record record;
    bool known = vgpu_ledger_take(key, &record);
    result = call(arguments);
    if (known && result != CUDA_SUCCESS) {
        vgpu_ledger_put(&record);
    } else if (known) {
        vgpu_record_give_back(&record);
    }
    return result;
}

static CUresult call_free(void *arguments) {
    return VGPU_REAL(cuMemFree_v2, *(CUdeviceptr *)arguments);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    return free_recorded(dptr, call_free, &dptr);
}

static CUresult call_free_v1(void *arguments) {
    return VGPU_REAL(cuMemFree, *(CUdeviceptr_v1 *)arguments);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr) {
    return free_recorded(dptr, call_free_v1, &dptr);
}

/* --- arrays --------------------------------------------------------------------------------- */

static CUresult create_array(void *handle_out, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                             unsigned levels, CUresult (*call)(void *), void *arguments) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    int entry = vgpu_current_entry();
    uint64_t bytes = desc != NULL ? pages(vgpu_array_bytes(desc, levels)) : 0;
    if ((result = charge(entry, bytes)) != CUDA_SUCCESS) {
        return result;
    }
    result = call(arguments);
    uint64_t key = result == CUDA_SUCCESS ? (uint64_t)(uintptr_t) * (void **)handle_out : 0;
    return settle(result, entry, bytes, key, VGPU_RECORD_ARRAY);
}

struct array_call {
    CUarray *handle;
    const CUDA_ARRAY_DESCRIPTOR *desc;
    const CUDA_ARRAY3D_DESCRIPTOR *desc3d;
    const CUDA_ARRAY_DESCRIPTOR_v1 *desc_v1;
    const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc3d_v1;
    CUmipmappedArray *mipmapped;
    unsigned levels;
};

static CUresult call_array(void *arguments) {
    struct array_call *a = arguments;
    return VGPU_REAL(cuArrayCreate_v2, a->handle, a->desc);
}

static CUresult call_array3d(void *arguments) {
    struct array_call *a = arguments;
    return VGPU_REAL(cuArray3DCreate_v2, a->handle, a->desc3d);
}

static CUresult call_array_v1(void *arguments) {
    struct array_call *a = arguments;
    return VGPU_REAL(cuArrayCreate, a->handle, a->desc_v1);
}

static CUresult call_array3d_v1(void *arguments) {
    struct array_call *a = arguments;
    return VGPU_REAL(cuArray3DCreate, a->handle, a->desc3d_v1);
}

static CUresult call_mipmapped(void *arguments) {
    struct array_call *a = arguments;
    return VGPU_REAL(cuMipmappedArrayCreate, a->mipmapped, a->desc3d, a->levels);
}

/* A 2D array's descriptor as the 3D one its size is computed from. */
static CUDA_ARRAY3D_DESCRIPTOR planar(size_t width, size_t height, CUarray_format format,
                                      unsigned channels) {
    return (CUDA_ARRAY3D_DESCRIPTOR){
        .Width = width, .Height = height, .Format = format, .NumChannels = channels};
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray) {
    const CUDA_ARRAY_DESCRIPTOR *d = pAllocateArray;
    CUDA_ARRAY3D_DESCRIPTOR desc = {0};
    if (d != NULL) {
        desc = planar(d->Width, d->Height, d->Format, d->NumChannels);
    }
    struct array_call arguments = {.handle = pHandle, .desc = d};
    return create_array(pHandle, d != NULL ? &desc : NULL, 1, call_array, &arguments);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray) {
    struct array_call arguments = {.handle = pHandle, .desc3d = pAllocateArray};
    return create_array(pHandle, pAllocateArray, 1, call_array3d, &arguments);
}

/* The legacy descriptors (32-bit sizes), which the driver still takes. */
CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray) {
    const CUDA_ARRAY_DESCRIPTOR_v1 *d = pAllocateArray;
    CUDA_ARRAY3D_DESCRIPTOR desc = {0};
    if (d != NULL) {
        desc = planar(d->Width, d->Height, d->Format, d->NumChannels);
    }
    struct array_call arguments = {.handle = pHandle, .desc_v1 = d};
    return create_array(pHandle, d != NULL ? &desc : NULL, 1, call_array_v1, &arguments);
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray) {
    const CUDA_ARRAY3D_DESCRIPTOR_v1 *d = pAllocateArray;
    CUDA_ARRAY3D_DESCRIPTOR desc = {0};
    if (d != NULL) {
        desc = planar(d->Width, d->Height, d->Format, d->NumChannels);
        desc.Depth = d->Depth;
        desc.Flags = d->Flags;
    }
    struct array_call arguments = {.handle = pHandle, .desc3d_v1 = d};
    return create_array(pHandle, d != NULL ? &desc : NULL, 1, call_array3d_v1, &arguments);
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels) {
    struct array_call arguments = {
        .mipmapped = pHandle, .desc3d = pMipmappedArrayDesc, .levels = numMipmapLevels};
    return create_array(pHandle, pMipmappedArrayDesc, numMipmapLevels, call_mipmapped,
                        &arguments);
}

static CUresult call_array_destroy(void *arguments) {
    return VGPU_REAL(cuArrayDestroy, *(CUarray *)arguments);
}

static CUresult call_mipmapped_destroy(void *arguments) {
    return VGPU_REAL(cuMipmappedArrayDestroy, *(CUmipmappedArray *)arguments);
}

CUresult cuArrayDestroy(CUarray hArray) {
    return free_recorded((uint64_t)(uintptr_t)hArray, call_array_destroy, &hArray);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    return free_recorded((uint64_t)(uintptr_t)hMipmappedArray, call_mipmapped_destroy,
                         &hMipmappedArray);
}
