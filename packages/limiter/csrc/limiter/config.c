/* The limits from the environment, and the whole configuration's loader (syntax in config.h
 * and docs/configuration.md).
 *
 * Every invalid or contradictory value is an error, one line that starts with NAME=VALUE, so
 * that the core can fail closed instead of running with a limit silently dropped. No heap, no
 * static mutable state: values are parsed in place from getenv's strings into fixed buffers. */
#define _GNU_SOURCE
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config_internal.h"
#include "log.h"

#define MEM_JSON "TENSOR_FUSION_CUDA_MEM_LIMIT"
#define UP_JSON "TENSOR_FUSION_CUDA_UP_LIMIT"
#define SOFT_JSON "TENSOR_FUSION_CUDA_SOFT_LIMIT"
#define OVERSUBSCRIBE_JSON "TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE"
#define MEM_COMPAT "CUDA_DEVICE_MEMORY_LIMIT"
#define SM_COMPAT "CUDA_DEVICE_SM_LIMIT"

static bool load_json(struct vgpu_config *config, char *error, size_t error_size,
                      const char *name, vgpu_config_apply apply) {
    const char *value = getenv(name);
    if (value == NULL || *value == '\0') {
        return true;
    }
    struct report report = {error, error_size, name, value};
    return vgpu_config_parse_object(config, &report, apply);
}


static bool load_compat_all(struct vgpu_config *config, char *error, size_t error_size,
                            const char *name, bool memory) {
    const char *value = getenv(name);
    if (value == NULL || *value == '\0') {
        return true;
    }
    struct report report = {error, error_size, name, value};
    struct key key = {.kind = VGPU_KEY_ALL, .index = -1, .uuid = ""};
    return vgpu_config_apply_compat(config, &report, &key, memory);
}

/* Every CUDA_DEVICE_MEMORY_LIMIT_<i> and CUDA_DEVICE_SM_LIMIT_<i> in the environment; a name
 * with a suffix that is not an index 0-63 is an error rather than a limit ignored. */
static bool load_compat_indexed(struct vgpu_config *config, char *error, size_t error_size) {
    static const struct {
        const char *prefix;
        bool memory;
    } families[] = {{MEM_COMPAT "_", true}, {SM_COMPAT "_", false}};
    for (char **entry = environ; entry != NULL && *entry != NULL; entry++) {
        const char *equals = strchr(*entry, '=');
        if (equals == NULL) {
            continue;
        }
        for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
            size_t prefix_length = strlen(families[f].prefix);
            if (strncmp(*entry, families[f].prefix, prefix_length) != 0) {
                continue;
            }
            const char *value = equals + 1;
            if (*value == '\0') {
                break;
            }
            char name[VGPU_CONFIG_SOURCE_SIZE];
            size_t name_length = (size_t)(equals - *entry);
            bool cut = name_length >= sizeof name;
            size_t copied = cut ? sizeof name - 1 : name_length;
            memcpy(name, *entry, copied);
            name[copied] = '\0';
            struct report report = {error, error_size, name, value};
            struct key key = {.kind = VGPU_KEY_INDEX, .index = -1, .uuid = ""};
            const char *suffix = name + prefix_length;
            if (cut || !vgpu_config_parse_index(suffix, &key.index)) {
                char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
                return vgpu_config_fail(&report, "\"%s\" is not a device index 0-%d",
                                        vgpu_config_shown(buffer, sizeof buffer, suffix, cut),
                                        VGPU_CONFIG_MAX_INDEX);
            }
            if (!vgpu_config_apply_compat(config, &report, &key, families[f].memory)) {
                return false;
            }
            break;
        }
    }
    return true;
}


/* CUDA_VISIBLE_DEVICES shows this many devices (entries up to the first empty one, as the
 * driver stops there); -1 when unset. */
static int visible_count(void) {
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible == NULL) {
        return -1;
    }
    int count = 0;
    for (const char *entry = visible; *entry != '\0' && *entry != ','; count++) {
        entry += strcspn(entry, ",");
        if (*entry == ',') {
            entry++;
        }
    }
    return count;
}

/* The variable that set a key's first limit, which warnings about the key name. */
static const char *source_of(const struct vgpu_device_setting *setting) {
    const char *const sources[] = {setting->memory_source, setting->compute_source,
                                   setting->soft_source, setting->oversubscribe_source};
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
        if (sources[i][0] != '\0') {
            return sources[i];
        }
    }
    return setting->memory_source;
}

/* Index keys past the devices the program sees: their limits apply to no GPU. */
static void check_indexes(struct vgpu_config *config, int count) {
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    char shown[ESCAPED_SIZE(SHOWN_TOKEN)];
    for (unsigned i = 0; i < config->count; i++) {
        const struct vgpu_device_setting *setting = &config->settings[i];
        if (setting->kind != VGPU_KEY_INDEX || setting->index < count) {
            continue;
        }
        vgpu_config_warn(config, source_of(setting), NULL,
                         "device index %d is not among the %d device%s this process sees%s%s%s: "
                         "its limit applies to no GPU (a UUID key names a GPU wherever it is)",
                         setting->index, count, count == 1 ? "" : "s",
                         visible != NULL ? " (CUDA_VISIBLE_DEVICES=" : "",
                         visible != NULL ? vgpu_config_shown(shown, sizeof shown, visible, false)
                                         : "",
                         visible != NULL ? ")" : "");
    }
}

/* With every GPU of the node visible, a UUID key of none of them names no GPU here. */
static void check_uuids(struct vgpu_config *config, int count,
                        const char uuids[][VGPU_CONFIG_UUID_SIZE]) {
    for (unsigned i = 0; i < config->count; i++) {
        const struct vgpu_device_setting *setting = &config->settings[i];
        int found = 0;
        while (found < count && strcasecmp(uuids[found], setting->uuid) != 0) {
            found++;
        }
        if (setting->kind != VGPU_KEY_UUID || found < count) {
            continue;
        }
        vgpu_config_warn(config, source_of(setting), NULL,
                         "%s is not on this node (none of its %d GPU%s): its limit applies to "
                         "no GPU",
                         setting->uuid, count, count == 1 ? "" : "s");
    }
}

void vgpu_config_check_devices(struct vgpu_config *config, int count,
                               const char uuids[][VGPU_CONFIG_UUID_SIZE]) {
    int visible = visible_count();
    /* What CUDA_VISIBLE_DEVICES already showed was warned about at load. */
    if (visible != count) {
        check_indexes(config, count);
    }
    if (visible < 0) {
        check_uuids(config, count, uuids);
    }
}

bool vgpu_config_load(struct vgpu_config *config, char *error, size_t error_size) {
    memset(config, 0, sizeof *config);
    config->log_level = VGPU_LOG_WARN;
    if (error != NULL && error_size > 0) {
        error[0] = '\0';
    }
    /* The JSON variables first, so a contradiction names the compatibility variable. */
    if (!(load_json(config, error, error_size, MEM_JSON, vgpu_config_apply_memory) &&
          load_json(config, error, error_size, UP_JSON, vgpu_config_apply_compute) &&
          load_json(config, error, error_size, SOFT_JSON, vgpu_config_apply_soft) &&
          load_json(config, error, error_size, OVERSUBSCRIBE_JSON,
                    vgpu_config_apply_oversubscribe) &&
          load_compat_all(config, error, error_size, MEM_COMPAT, true) &&
          load_compat_all(config, error, error_size, SM_COMPAT, false) &&
          load_compat_indexed(config, error, error_size) &&
          vgpu_config_load_seeds(config, error, error_size) &&
          vgpu_config_load_policy(config, error, error_size) &&
          vgpu_config_load_pod(config, error, error_size) &&
          vgpu_config_load_process(config, error, error_size) &&
          vgpu_config_check_soft(config, error, error_size))) {
        return false;
    }
    int visible = visible_count();
    if (visible >= 0) {
        check_indexes(config, visible);
    }
    vgpu_config_check_foreign(config);
    return true;
}
