/* An open-addressing hash table under one mutex; allocation calls are not the hot path. */
#define _GNU_SOURCE
#include "ledger.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define TOMBSTONE UINT64_MAX

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct vgpu_record *table;
static size_t capacity;
static size_t occupied;

static size_t slot_of(uint64_t key) {
    return (size_t)((key >> 4) * 0x9e3779b97f4a7c15ULL) & (capacity - 1);
}

static struct vgpu_record *find(uint64_t key) {
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

static bool grow(void) {
    size_t old_capacity = capacity;
    struct vgpu_record *old = table;
    struct vgpu_record *fresh = calloc(capacity == 0 ? 256 : capacity * 2, sizeof *fresh);
    if (fresh == NULL) {
        return false;
    }
    table = fresh;
    capacity = capacity == 0 ? 256 : capacity * 2;
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

static void erase(struct vgpu_record *record) {
    memset(record, 0, sizeof *record);
    record->key = TOMBSTONE;
}

bool vgpu_ledger_put(const struct vgpu_record *record) {
    pthread_mutex_lock(&lock);
    bool ok = (occupied + 1) * 4 <= capacity * 3 || grow();
    if (ok) {
        struct vgpu_record *existing = find(record->key);
        if (existing != NULL) {
            *existing = *record; /* an address the driver handed out again */
        } else {
            size_t slot = slot_of(record->key);
            while (table[slot].key != 0 && table[slot].key != TOMBSTONE) {
                slot = (slot + 1) & (capacity - 1);
            }
            occupied += table[slot].key == 0;
            table[slot] = *record;
        }
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

bool vgpu_ledger_get(uint64_t key, struct vgpu_record *record) {
    pthread_mutex_lock(&lock);
    struct vgpu_record *found = find(key);
    if (found != NULL) {
        *record = *found;
    }
    pthread_mutex_unlock(&lock);
    return found != NULL;
}

bool vgpu_ledger_take(uint64_t key, struct vgpu_record *record) {
    pthread_mutex_lock(&lock);
    struct vgpu_record *found = find(key);
    if (found != NULL) {
        *record = *found;
        erase(found);
    }
    pthread_mutex_unlock(&lock);
    return found != NULL;
}

bool vgpu_ledger_update(uint64_t key, void (*change)(struct vgpu_record *record, void *data),
                        void *data) {
    pthread_mutex_lock(&lock);
    struct vgpu_record *found = find(key);
    if (found != NULL) {
        change(found, data);
    }
    pthread_mutex_unlock(&lock);
    return found != NULL;
}

unsigned vgpu_ledger_take_if(bool (*select)(const struct vgpu_record *record, void *data),
                             void *data, struct vgpu_record *out, unsigned max) {
    unsigned taken = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < capacity && taken < max; i++) {
        if (table[i].key != 0 && table[i].key != TOMBSTONE && select(&table[i], data)) {
            out[taken++] = table[i];
            erase(&table[i]);
        }
    }
    pthread_mutex_unlock(&lock);
    return taken;
}

void vgpu_ledger_each(void (*visit)(const struct vgpu_record *record, void *data), void *data) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < capacity; i++) {
        if (table[i].key != 0 && table[i].key != TOMBSTONE) {
            visit(&table[i], data);
        }
    }
    pthread_mutex_unlock(&lock);
}

void vgpu_ledger_clear(void) {
    /* In a forked child: the lock may have been copied held; start over without it. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    lock = fresh;
    free(table);
    table = NULL;
    capacity = 0;
    occupied = 0;
}
