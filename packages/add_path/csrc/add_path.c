/* libadd_path: on load, rewrite PATH, LD_PRELOAD and LD_LIBRARY_PATH from TF_<VAR> (append)
 * and TF_PREPEND_<VAR> (prepend). A guest in other people's processes: libc only, no
 * allocation beyond the new values, never aborts; on any failure the variable stays as it is.
 *
 * The environment is read and written through `environ` directly, not getenv/setenv: a host
 * program may define its own (bash does, and its setenv before main() writes into a variable
 * table that is not set up yet, so the change would be lost). glibc hands `__environ` to main()
 * after the constructors ran, so every program sees the new array. */
#define _GNU_SOURCE
#include "add_path.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

struct target {
    const char *name;
    const char *append_name;
    const char *prepend_name;
    const char *separators;
};

/* ld.so splits LD_PRELOAD on spaces and colons, the other two on colons. */
static const struct target targets[] = {
    {"PATH", "TF_PATH", "TF_PREPEND_PATH", ":"},
    {"LD_PRELOAD", "TF_LD_PRELOAD", "TF_PREPEND_LD_PRELOAD", ": "},
    {"LD_LIBRARY_PATH", "TF_LD_LIBRARY_PATH", "TF_PREPEND_LD_LIBRARY_PATH", ":"},
};

/* Output buffer with the entries written so far; it never needs more than the inputs' sizes. */
struct builder {
    char *data;
    size_t length;
};

static size_t token_length(const char *text, const char *separators) {
    return strcspn(text, separators);
}

/* Whether the entry [entry, entry+length) occurs as a whole entry in list[0..list_length). */
static bool list_contains(const char *list, size_t list_length, const char *separators,
                          const char *entry, size_t length) {
    size_t position = 0;
    while (position < list_length) {
        size_t found = strcspn(list + position, separators);
        if (position + found > list_length) {
            found = list_length - position;
        }
        if (found == length && memcmp(list + position, entry, length) == 0) {
            return true;
        }
        position += found + 1;
    }
    return false;
}

static void builder_add(struct builder *out, const char *text, size_t length) {
    if (out->length > 0) {
        out->data[out->length++] = ':';
    }
    memcpy(out->data + out->length, text, length);
    out->length += length;
    out->data[out->length] = '\0';
}

/* Add the entries of `entries` that are neither in `current` nor already in the builder. */
static size_t add_new_entries(struct builder *out, const char *entries, const char *current,
                              const char *separators) {
    size_t count = 0;
    if (entries == NULL) {
        return 0;
    }
    const char *cursor = entries;
    while (*cursor != '\0') {
        size_t length = token_length(cursor, separators);
        bool duplicate = length == 0 ||
                         (current != NULL &&
                          list_contains(current, strlen(current), separators, cursor, length)) ||
                         list_contains(out->data, out->length, separators, cursor, length);
        if (!duplicate) {
            builder_add(out, cursor, length);
            count++;
        }
        cursor += length;
        if (*cursor != '\0') {
            cursor++;
        }
    }
    return count;
}

char *vgpu_add_path_merge(const char *current, const char *prepend, const char *append,
                          const char *separators) {
    if (separators == NULL || *separators == '\0') {
        separators = ":";
    }
    size_t capacity = 4;
    capacity += current ? strlen(current) : 0;
    capacity += prepend ? strlen(prepend) + 1 : 0;
    capacity += append ? strlen(append) + 1 : 0;
    struct builder out = {malloc(capacity), 0};
    if (out.data == NULL) {
        return NULL;
    }
    out.data[0] = '\0';

    /* New entries are collected in one buffer, prepended ones first, so that appended ones are
     * checked against them too; the current value is spliced in between afterwards. */
    size_t added = add_new_entries(&out, prepend, current, separators);
    size_t prepend_length = out.length;
    added += add_new_entries(&out, append, current, separators);
    if (added == 0) {
        free(out.data);
        return NULL;
    }
    if (current == NULL || *current == '\0') {
        return out.data;
    }

    /* out = P[:A]; result = P : current : A (either side may be empty). */
    size_t current_length = strlen(current);
    char *result = malloc(out.length + current_length + 3);
    if (result == NULL) {
        free(out.data);
        return NULL;
    }
    size_t length = 0;
    if (prepend_length > 0) {
        memcpy(result, out.data, prepend_length);
        length = prepend_length;
        result[length++] = ':';
    }
    memcpy(result + length, current, current_length);
    length += current_length;
    if (out.length > prepend_length) {
        /* The append part starts after the prepend part's joining ':' (or at 0). */
        size_t start = prepend_length > 0 ? prepend_length + 1 : 0;
        result[length++] = ':';
        memcpy(result + length, out.data + start, out.length - start);
        length += out.length - start;
    }
    result[length] = '\0';
    free(out.data);
    return result;
}

void vgpu_add_path_free(char *value) {
    free(value);
}

/* The slot of `name` in environ, or NULL. */
static char **environment_slot(const char *name) {
    size_t length = strlen(name);
    for (char **entry = environ; entry != NULL && *entry != NULL; entry++) {
        if (strncmp(*entry, name, length) == 0 && (*entry)[length] == '=') {
            return entry;
        }
    }
    return NULL;
}

static const char *environment_get(const char *name) {
    char **slot = environment_slot(name);
    return slot == NULL ? NULL : *slot + strlen(name) + 1;
}

/* Set name=value. The replaced string and array are not freed: they belong to the startup
 * code or to libc, and another thread may still be reading them. */
static void environment_set(const char *name, const char *value) {
    size_t name_length = strlen(name);
    size_t value_length = strlen(value);
    char *entry = malloc(name_length + value_length + 2);
    if (entry == NULL) {
        return;
    }
    memcpy(entry, name, name_length);
    entry[name_length] = '=';
    memcpy(entry + name_length + 1, value, value_length + 1);

    char **slot = environment_slot(name);
    if (slot != NULL) {
        *slot = entry;
        return;
    }
    size_t count = 0;
    while (environ != NULL && environ[count] != NULL) {
        count++;
    }
    char **grown = malloc((count + 2) * sizeof *grown);
    if (grown == NULL) {
        free(entry);
        return;
    }
    if (count > 0) {
        memcpy(grown, environ, count * sizeof *grown);
    }
    grown[count] = entry;
    grown[count + 1] = NULL;
    environ = grown;
}

void vgpu_add_path_apply(void) {
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        const struct target *target = &targets[i];
        char *merged = vgpu_add_path_merge(environment_get(target->name),
                                           environment_get(target->prepend_name),
                                           environment_get(target->append_name), target->separators);
        if (merged != NULL) {
            environment_set(target->name, merged);
            free(merged);
        }
    }
}

__attribute__((constructor)) static void add_path_on_load(void) {
    vgpu_add_path_apply();
}
