/* An open-addressing hash table of fixed-size records whose first field is a uint64_t key
 * (0 and UINT64_MAX are reserved). Not locked: its users hold their own lock. */
#ifndef VGPU_TABLE_H
#define VGPU_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vgpu_table {
    unsigned char *slots;
    size_t record_size;
    size_t capacity; /* a power of two */
    size_t occupied; /* live records and tombstones */
};

#define VGPU_TABLE_INIT(record_type) {NULL, sizeof(record_type), 0, 0}

/* Insert a copy of `record`, replacing one with the same key; false when out of memory. */
bool vgpu_table_put(struct vgpu_table *table, const void *record);
/* The record with `key` (valid until the next put), or NULL. */
void *vgpu_table_find(struct vgpu_table *table, uint64_t key);
void vgpu_table_remove(struct vgpu_table *table, uint64_t key);
/* Calls visit on every record; visit may remove the record it is given. */
void vgpu_table_each(struct vgpu_table *table, void (*visit)(void *record, void *data), void *data);
void vgpu_table_clear(struct vgpu_table *table);

#endif
