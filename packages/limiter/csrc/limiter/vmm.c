/* Hooks of virtual memory management (used by PyTorch's expandable segments). Physical memory
 * is charged at cuMemCreate; the driver frees it once it is released and no longer mapped (a
 * program usually releases the handle right after mapping it), and so does the pod's charge. */
#define _GNU_SOURCE
#include "core.h"
#include "ledger.h"
#include "log.h"
#include "vgpu_cuda_sizes.h"

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    int entry = vgpu_entry_at(prop != NULL ? &prop->location : NULL);
    if (entry == VGPU_ENTRY_OUTSIDE) {
        /* As a context there would be: memory there is the pod's to use only on its GPUs. */
        vgpu_log(VGPU_LOG_INFO, "no cuMemCreate on device %d: not one of the pod's GPUs",
                 prop->location.id);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    uint64_t bytes = vgpu_round_up(size, VGPU_PAGE_SIZE);
    if (!vgpu_charge(entry, bytes)) {
        vgpu_log(VGPU_LOG_INFO, "cuMemCreate of %zu bytes does not fit the pod's limit", size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result = VGPU_REAL(cuMemCreate, handle, size, prop, flags);
    if (result != CUDA_SUCCESS) {
        vgpu_uncharge(entry, bytes);
        return result;
    }
    struct vgpu_record record = {
        .key = *handle, .kind = VGPU_RECORD_PHYSICAL, .entry = entry, .bytes = bytes};
    if (entry >= 0 && !vgpu_ledger_put(&record)) {
        vgpu_log(VGPU_LOG_WARN, "out of memory recording cuMemCreate; it stays charged");
    }
    return CUDA_SUCCESS;
}

static void mark_released(struct vgpu_record *record, void *data) {
    record->released = true;
    *(bool *)data = record->mappings == 0;
}

struct mapping_change {
    int delta;   /* +1 mapped, -1 unmapped */
    bool unused; /* out: released and no longer mapped, so the driver freed it */
};

static void add_mapping(struct vgpu_record *record, void *data) {
    struct mapping_change *change = data;
    record->mappings = (uint32_t)((int)record->mappings + change->delta);
    change->unused = record->released && record->mappings == 0;
}

/* The physical allocation is gone: give back its charge. */
static void free_physical(uint64_t handle) {
    struct vgpu_record record;
    if (vgpu_ledger_take(handle, &record)) {
        vgpu_uncharge(record.entry, record.bytes);
    }
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    result = VGPU_REAL(cuMemRelease, handle);
    bool unmapped = false;
    if (result == CUDA_SUCCESS && vgpu_ledger_update(handle, mark_released, &unmapped) &&
        unmapped) {
        free_physical(handle);
    }
    return result;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    result = VGPU_REAL(cuMemMap, ptr, size, offset, handle, flags);
    struct mapping_change change = {1, false};
    if (result == CUDA_SUCCESS && vgpu_ledger_update(handle, add_mapping, &change)) {
        struct vgpu_record mapping = {
            .key = ptr, .kind = VGPU_RECORD_MAPPING, .bytes = size, .link = handle};
        vgpu_ledger_put(&mapping);
    }
    return result;
}

struct range {
    uint64_t start;
    uint64_t end;
};

static bool mapping_in(const struct vgpu_record *record, void *data) {
    const struct range *range = data;
    return record->kind == VGPU_RECORD_MAPPING && record->key >= range->start &&
           record->key < range->end;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    result = VGPU_REAL(cuMemUnmap, ptr, size);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    struct range range = {ptr, ptr + size};
    struct vgpu_record mappings[64];
    unsigned taken;
    do {
        taken = vgpu_ledger_take_if(mapping_in, &range, mappings, 64);
        for (unsigned i = 0; i < taken; i++) {
            struct mapping_change change = {-1, false};
            if (vgpu_ledger_update(mappings[i].link, add_mapping, &change) && change.unused) {
                free_physical(mappings[i].link);
            }
        }
    } while (taken == 64);
    return result;
}
