/* Simulated driver: the table of everything a process holds on its devices, keyed by address
 * (or handle), and the device address space. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cuda_sim.h"

#define TOMBSTONE UINT64_MAX

static struct sim_allocation *table;
static size_t capacity;
static size_t occupied; /* live records and tombstones */

static size_t slot_of(uint64_t key) {
    return (size_t)((key >> 12) * 0x9e3779b97f4a7c15ULL) & (capacity - 1);
}

static bool grow(void) {
    size_t old_capacity = capacity;
    struct sim_allocation *old = table;
    size_t new_capacity = capacity == 0 ? 1024 : capacity * 2;
    struct sim_allocation *fresh = calloc(new_capacity, sizeof *fresh);
    if (fresh == NULL) {
        return false;
    }
    table = fresh;
    capacity = new_capacity;
    occupied = 0;
    for (size_t i = 0; i < old_capacity; i++) {
        if (old[i].key != 0 && old[i].key != TOMBSTONE) {
            size_t slot = slot_of(old[i].key);
            while (table[slot].key != 0) {
                slot = (slot + 1) & (capacity - 1);
            }
            table[slot] = old[i];
            occupied++;
        }
    }
    free(old);
    return true;
}

bool sim_allocation_insert(const struct sim_allocation *record) {
    if ((occupied + 1) * 4 > capacity * 3 && !grow()) {
        return false;
    }
    size_t slot = slot_of(record->key);
    while (table[slot].key != 0 && table[slot].key != TOMBSTONE) {
        slot = (slot + 1) & (capacity - 1);
    }
    occupied += table[slot].key == 0;
    table[slot] = *record;
    return true;
}

struct sim_allocation *sim_allocation_find(uint64_t key) {
    if (capacity == 0 || key == 0 || key == TOMBSTONE) {
        return NULL;
    }
    for (size_t slot = slot_of(key), probes = 0; probes < capacity;
         slot = (slot + 1) & (capacity - 1), probes++) {
        if (table[slot].key == key) {
            return &table[slot];
        }
        if (table[slot].key == 0) {
            return NULL;
        }
    }
    return NULL;
}

void sim_allocation_remove(uint64_t key) {
    struct sim_allocation *record = sim_allocation_find(key);
    if (record != NULL) {
        memset(record, 0, sizeof *record);
        record->key = TOMBSTONE;
    }
}

void sim_allocations_each(void (*visit)(struct sim_allocation *record, void *data), void *data) {
    for (size_t i = 0; i < capacity; i++) {
        if (table[i].key != 0 && table[i].key != TOMBSTONE) {
            visit(&table[i], data);
        }
    }
}

void sim_allocation_free(struct sim_allocation *record) {
    switch (record->kind) {
    case SIM_ALLOC_DEVICE:
    case SIM_ALLOC_ARRAY:
    case SIM_ALLOC_VMM:
        sim_memory_release(record->device, record->size);
        break;
    case SIM_ALLOC_MANAGED:
        sim_memory_release(record->device, record->size);
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
