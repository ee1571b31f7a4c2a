/* Simulated driver: the table of everything a process holds on its devices, keyed by address
 * (or handle), and the device address space. */
#define _GNU_SOURCE
#include <sys/mman.h>

#include "cuda_sim.h"
#include "vgpu_table.h"

static struct vgpu_table table = VGPU_TABLE_INIT(struct sim_allocation);

bool sim_allocation_insert(const struct sim_allocation *record) {
    return vgpu_table_put(&table, record);
}

struct sim_allocation *sim_allocation_find(uint64_t key) {
    return vgpu_table_find(&table, key);
}

void sim_allocation_remove(uint64_t key) {
    vgpu_table_remove(&table, key);
}

struct visitor {
    void (*visit)(struct sim_allocation *record, void *data);
    void *data;
};

static void visit_record(void *record, void *data) {
    struct visitor *visitor = data;
    visitor->visit(record, visitor->data);
}

void sim_allocations_each(void (*visit)(struct sim_allocation *record, void *data), void *data) {
    struct visitor visitor = {visit, data};
    vgpu_table_each(&table, visit_record, &visitor);
}

void sim_allocation_free(struct sim_allocation *record) {
    switch (record->kind) {
    case SIM_ALLOC_DEVICE:
    case SIM_ALLOC_ARRAY:
    case SIM_ALLOC_VMM:
        sim_memory_release(record->device, record->size);
        break;
    case SIM_ALLOC_MANAGED:
        if (!record->on_host) {
            sim_memory_release(record->device, record->size);
        }
        munmap((void *)(uintptr_t)record->key, record->requested);
        break;
    case SIM_ALLOC_HOST:
        munmap((void *)(uintptr_t)record->key, record->requested);
        break;
    case SIM_ALLOC_POOL:
        sim_pool_returned(record->pool, record->size);
        break;
    case SIM_ALLOC_RESERVED_RANGE:
    case SIM_ALLOC_MAPPING:
        break;
    }
    sim_allocation_remove(record->key);
}

static void free_if_owned(struct sim_allocation *record, void *context) {
    /* VMM memory and address ranges belong to the process, not to a context. */
    if (record->context == context && record->kind != SIM_ALLOC_VMM &&
        record->kind != SIM_ALLOC_RESERVED_RANGE && record->kind != SIM_ALLOC_MAPPING) {
        sim_allocation_free(record);
    }
}

void sim_allocations_free_context(struct CUctx_st *context) {
    sim_allocations_each(free_if_owned, context);
}

uint64_t sim_address_space(uint64_t size, uint64_t alignment) {
    /* Far above where Linux maps anything for a process, so a device pointer dereferenced on the
     * host faults instead of touching host memory; never reused. */
    static uint64_t next = 0x200000000000ULL;
    uint64_t address = sim_round_up(next, alignment);
    next = address + sim_round_up(size, SIM_PAGE_SIZE);
    return address;
}

uint64_t sim_legacy_address_space(uint64_t size) {
    /* Below 4 GiB for the 32-bit pointers of the legacy entry points, never reused; 0 when that
     * range is used up (the real driver's 32-bit allocations are scarce too). */
    static uint64_t next = 0x10000000ULL;
    uint64_t address = next;
    uint64_t end = address + sim_round_up(size, SIM_PAGE_SIZE);
    if (end < address || end > 0x100000000ULL) {
        return 0;
    }
    next = end;
    return address;
}
