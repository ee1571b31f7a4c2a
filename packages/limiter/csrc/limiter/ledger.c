/* The ledger: a hash table of records (common/vgpu_table) under one mutex; allocation calls are
 * not the hot path. */
#define _GNU_SOURCE
#include "ledger.h"

#include <pthread.h>
#include <string.h>

#include "vgpu_table.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct vgpu_table table = VGPU_TABLE_INIT(struct vgpu_record);

bool vgpu_ledger_put(const struct vgpu_record *record) {
    pthread_mutex_lock(&lock);
    bool ok = vgpu_table_put(&table, record);
    pthread_mutex_unlock(&lock);
    return ok;
}

bool vgpu_ledger_get(uint64_t key, struct vgpu_record *record) {
    pthread_mutex_lock(&lock);
    struct vgpu_record *found = vgpu_table_find(&table, key);
    if (found != NULL) {
        *record = *found;
    }
    pthread_mutex_unlock(&lock);
    return found != NULL;
}

bool vgpu_ledger_take(uint64_t key, struct vgpu_record *record) {
    pthread_mutex_lock(&lock);
    struct vgpu_record *found = vgpu_table_find(&table, key);
    if (found != NULL) {
        *record = *found;
        vgpu_table_remove(&table, key);
    }
    pthread_mutex_unlock(&lock);
    return found != NULL;
}

bool vgpu_ledger_update(uint64_t key, void (*change)(struct vgpu_record *record, void *data),
                        void *data) {
    pthread_mutex_lock(&lock);
    struct vgpu_record *found = vgpu_table_find(&table, key);
    if (found != NULL) {
        change(found, data);
    }
    pthread_mutex_unlock(&lock);
    return found != NULL;
}

struct selection {
    bool (*select)(const struct vgpu_record *record, void *data);
    void *data;
    struct vgpu_record *out;
    unsigned max;
    unsigned taken;
};

static void take_selected(void *record, void *data) {
    struct selection *selection = data;
    const struct vgpu_record *candidate = record;
    if (selection->taken < selection->max && selection->select(candidate, selection->data)) {
        selection->out[selection->taken++] = *candidate;
        vgpu_table_remove(&table, candidate->key);
    }
}

unsigned vgpu_ledger_take_if(bool (*select)(const struct vgpu_record *record, void *data),
                             void *data, struct vgpu_record *out, unsigned max) {
    struct selection selection = {select, data, out, max, 0};
    pthread_mutex_lock(&lock);
    vgpu_table_each(&table, take_selected, &selection);
    pthread_mutex_unlock(&lock);
    return selection.taken;
}

struct visitor {
    void (*visit)(const struct vgpu_record *record, void *data);
    void *data;
};

static void visit_record(void *record, void *data) {
    struct visitor *visitor = data;
    visitor->visit(record, visitor->data);
}

void vgpu_ledger_each(void (*visit)(const struct vgpu_record *record, void *data), void *data) {
    struct visitor visitor = {visit, data};
    pthread_mutex_lock(&lock);
    vgpu_table_each(&table, visit_record, &visitor);
    pthread_mutex_unlock(&lock);
}

void vgpu_ledger_clear(void) {
    /* In a forked child: the lock may have been copied held; start over without it. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    lock = fresh;
    vgpu_table_clear(&table);
}
