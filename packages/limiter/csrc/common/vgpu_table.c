#include "vgpu_table.h"

#include <stdlib.h>
#include <string.h>

#define EMPTY 0
#define TOMBSTONE UINT64_MAX

static uint64_t key_at(const struct vgpu_table *table, size_t slot) {
    uint64_t key;
    memcpy(&key, table->slots + slot * table->record_size, sizeof key);
    return key;
}

static void *record_at(const struct vgpu_table *table, size_t slot) {
    return table->slots + slot * table->record_size;
}

static size_t home(const struct vgpu_table *table, uint64_t key) {
    return (size_t)((key >> 4) * 0x9e3779b97f4a7c15ULL) & (table->capacity - 1);
}

/* The slot holding `key`, or where the probe for it ended (an empty slot); SIZE_MAX when the
 * table is empty. */
static size_t probe(const struct vgpu_table *table, uint64_t key) {
    if (table->capacity == 0) {
        return SIZE_MAX;
    }
    size_t slot = home(table, key);
    for (size_t probes = 0; probes < table->capacity; probes++) {
        uint64_t found = key_at(table, slot);
        if (found == key || found == EMPTY) {
            return slot;
        }
        slot = (slot + 1) & (table->capacity - 1);
    }
    return SIZE_MAX;
}

static bool grow(struct vgpu_table *table) {
    size_t capacity = table->capacity == 0 ? 256 : table->capacity * 2;
    unsigned char *slots = calloc(capacity, table->record_size);
    if (slots == NULL) {
        return false;
    }
    struct vgpu_table old = *table;
    table->slots = slots;
    table->capacity = capacity;
    table->occupied = 0;
    for (size_t i = 0; i < old.capacity; i++) {
        uint64_t key = key_at(&old, i);
        if (key != EMPTY && key != TOMBSTONE) {
            size_t slot = home(table, key);
            while (key_at(table, slot) != EMPTY) {
                slot = (slot + 1) & (table->capacity - 1);
            }
            memcpy(record_at(table, slot), record_at(&old, i), table->record_size);
            table->occupied++;
        }
    }
    free(old.slots);
    return true;
}

bool vgpu_table_put(struct vgpu_table *table, const void *record) {
    uint64_t key;
    memcpy(&key, record, sizeof key);
    if (key == EMPTY || key == TOMBSTONE) {
        return false;
    }
    size_t existing = probe(table, key);
    if (existing != SIZE_MAX && key_at(table, existing) == key) {
        memcpy(record_at(table, existing), record, table->record_size);
        return true;
    }
    if ((table->occupied + 1) * 4 > table->capacity * 3 && !grow(table)) {
        return false;
    }
    size_t slot = home(table, key);
    while (key_at(table, slot) != EMPTY && key_at(table, slot) != TOMBSTONE) {
        slot = (slot + 1) & (table->capacity - 1);
    }
    table->occupied += key_at(table, slot) == EMPTY;
    memcpy(record_at(table, slot), record, table->record_size);
    return true;
}

void *vgpu_table_find(struct vgpu_table *table, uint64_t key) {
    if (key == EMPTY || key == TOMBSTONE) {
        return NULL;
    }
    size_t slot = probe(table, key);
    return slot != SIZE_MAX && key_at(table, slot) == key ? record_at(table, slot) : NULL;
}

void vgpu_table_remove(struct vgpu_table *table, uint64_t key) {
    unsigned char *record = vgpu_table_find(table, key);
    if (record != NULL) {
        uint64_t tombstone = TOMBSTONE;
        memset(record, 0, table->record_size);
        memcpy(record, &tombstone, sizeof tombstone);
    }
}

void vgpu_table_each(struct vgpu_table *table, void (*visit)(void *record, void *data), void *data) {
    for (size_t i = 0; i < table->capacity; i++) {
        uint64_t key = key_at(table, i);
        if (key != EMPTY && key != TOMBSTONE) {
            visit(record_at(table, i), data);
        }
    }
}

void vgpu_table_clear(struct vgpu_table *table) {
    free(table->slots);
    table->slots = NULL;
    table->capacity = 0;
    table->occupied = 0;
}
