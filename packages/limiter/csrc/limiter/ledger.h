/* What this process holds on its devices, by address or handle: what each allocation was
 * charged to the pod, so that its free gives back exactly that. */
#ifndef VGPU_LIMITER_LEDGER_H
#define VGPU_LIMITER_LEDGER_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_api.h"

enum vgpu_record_kind {
    VGPU_RECORD_MEMORY,  /* cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged */
    VGPU_RECORD_HOST,    /* cuMemAlloc or cuMemAllocManaged past the limit, oversubscribed:
                          * managed memory kept in host memory, charged to host_memory */
    VGPU_RECORD_ARRAY,   /* arrays and mipmapped arrays */
    VGPU_RECORD_PHYSICAL, /* cuMemCreate */
    VGPU_RECORD_MAPPING, /* cuMemMap of a physical allocation */
    VGPU_RECORD_CONTEXT, /* a context's own overhead */
    VGPU_RECORD_POOL,    /* a memory pool: charged what it has reserved on the device */
    VGPU_RECORD_POOLED,  /* an allocation from a pool (charged through its pool) */
    VGPU_RECORD_LIMIT,   /* what cuCtxSetLimit made a context reserve */
};

struct vgpu_record {
    uint64_t key;
    enum vgpu_record_kind kind;
    int entry;         /* region device entry */
    uint64_t bytes;    /* charged to the pod */
    CUcontext context; /* that owned it, for teardown with the context */
    uint64_t link;     /* MAPPING: its physical handle; POOLED: its pool; LIMIT: the value
                        * the context had before its first change */
    uint32_t mappings; /* PHYSICAL: live mappings */
    bool released;     /* PHYSICAL: cuMemRelease was called */
};

bool vgpu_ledger_put(const struct vgpu_record *record);
/* Copy out a record; false when absent. */
bool vgpu_ledger_get(uint64_t key, struct vgpu_record *record);
/* Remove and copy out a record; false when absent. */
bool vgpu_ledger_take(uint64_t key, struct vgpu_record *record);
/* Apply `change` to a record under the ledger's lock; false when absent. */
bool vgpu_ledger_update(uint64_t key, void (*change)(struct vgpu_record *record, void *data),
                        void *data);
/* Remove the records `select` picks (under the lock) and copy them to `out` (at most `max`);
 * returns how many were removed. */
unsigned vgpu_ledger_take_if(bool (*select)(const struct vgpu_record *record, void *data),
                             void *data, struct vgpu_record *out, unsigned max);
/* Calls visit on each record (under the lock; visit must not use the ledger). */
void vgpu_ledger_each(void (*visit)(const struct vgpu_record *record, void *data), void *data);
void vgpu_ledger_clear(void);

/* Give back to the pod what a record of freed memory was charged: device memory, or host-backed
 * bytes for VGPU_RECORD_HOST; nothing for memory from a pool, which stays with the pool. */
void vgpu_record_give_back(const struct vgpu_record *record);

#endif
