/* The rules that combine settings: each device key once, each limit given once (or again with
 * the same value), and for one device the most specific key that sets a limit. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_internal.h"
#include "vgpu_parse.h"

static void describe_key(char *buffer, size_t size, enum vgpu_key_kind kind, int index,
                         const char *uuid) {
    if (kind == VGPU_KEY_ALL) {
        snprintf(buffer, size, "all devices");
    } else if (kind == VGPU_KEY_INDEX) {
        snprintf(buffer, size, "device %d", index);
    } else {
        snprintf(buffer, size, "device %.40s", uuid);
    }
}

const char *vgpu_config_limit_name(enum vgpu_limit limit) {
    static const char *const names[VGPU_LIMIT_COUNT] = {"memory", "compute", "soft compute",
                                                        "oversubscription"};
    return names[limit];
}

bool vgpu_config_setting_has(const struct vgpu_device_setting *setting, enum vgpu_limit limit) {
    switch (limit) {
    case VGPU_LIMIT_MEMORY:
        return setting->memory_limit != 0;
    case VGPU_LIMIT_COMPUTE:
        return setting->compute_limit != 0;
    case VGPU_LIMIT_SOFT:
        return setting->compute_soft_limit != 0;
    case VGPU_LIMIT_OVERSUBSCRIBE:
        return setting->oversubscribe >= 0;
    }
    return false;
}

uint64_t vgpu_config_setting_value(const struct vgpu_device_setting *setting,
                                   enum vgpu_limit limit) {
    switch (limit) {
    case VGPU_LIMIT_MEMORY:
        return setting->memory_limit;
    case VGPU_LIMIT_COMPUTE:
        return setting->compute_limit;
    case VGPU_LIMIT_SOFT:
        return setting->compute_soft_limit;
    case VGPU_LIMIT_OVERSUBSCRIBE:
        return setting->oversubscribe > 0 ? 1 : 0;
    }
    return 0;
}

static char *source_buffer(struct vgpu_device_setting *setting, enum vgpu_limit limit) {
    switch (limit) {
    case VGPU_LIMIT_MEMORY:
        return setting->memory_source;
    case VGPU_LIMIT_COMPUTE:
        return setting->compute_source;
    case VGPU_LIMIT_SOFT:
        return setting->soft_source;
    case VGPU_LIMIT_OVERSUBSCRIBE:
        return setting->oversubscribe_source;
    }
    return setting->memory_source;
}

const char *vgpu_config_setting_source(const struct vgpu_device_setting *setting,
                                       enum vgpu_limit limit) {
    /* source_buffer only picks a field; the setting is not written through it here. */
    return source_buffer((struct vgpu_device_setting *)setting, limit);
}

static void store(struct vgpu_device_setting *setting, enum vgpu_limit limit, uint64_t value) {
    switch (limit) {
    case VGPU_LIMIT_MEMORY:
        setting->memory_limit = value;
        break;
    case VGPU_LIMIT_COMPUTE:
        setting->compute_limit = (uint32_t)value;
        break;
    case VGPU_LIMIT_SOFT:
        setting->compute_soft_limit = (uint32_t)value;
        break;
    case VGPU_LIMIT_OVERSUBSCRIBE:
        setting->oversubscribe = value != 0 ? 1 : 0;
        break;
    }
}

void vgpu_config_format_limit(char *buffer, size_t size, enum vgpu_limit limit, uint64_t value) {
    if (limit == VGPU_LIMIT_MEMORY) {
        snprintf(buffer, size, "%" PRIu64 " bytes", value);
    } else if (limit == VGPU_LIMIT_OVERSUBSCRIBE) {
        snprintf(buffer, size, "%s", value != 0 ? "on" : "off");
    } else {
        snprintf(buffer, size, "%u.%02u%%", (unsigned)(value / 100), (unsigned)(value % 100));
    }
}

bool vgpu_config_set_limit(struct vgpu_config *config, const struct report *report,
                           const struct key *key, enum vgpu_limit limit, uint64_t value,
                           const char *key_text) {
    struct vgpu_device_setting *setting = NULL;
    for (unsigned i = 0; i < config->count; i++) {
        struct vgpu_device_setting *candidate = &config->settings[i];
        if (candidate->kind == key->kind && candidate->index == key->index &&
            strcmp(candidate->uuid, key->uuid) == 0) {
            setting = candidate;
            break;
        }
    }
    if (setting == NULL) {
        if (config->count == VGPU_CONFIG_MAX_SETTINGS) {
            return vgpu_config_fail(report, "more than %d device keys in all",
                                    VGPU_CONFIG_MAX_SETTINGS);
        }
        setting = &config->settings[config->count++];
        memset(setting, 0, sizeof *setting);
        setting->oversubscribe = -1;
        setting->kind = key->kind;
        setting->index = key->index;
        memcpy(setting->uuid, key->uuid, sizeof setting->uuid);
    }
    bool given = vgpu_config_setting_has(setting, limit);
    uint64_t current = vgpu_config_setting_value(setting, limit);
    char *source = source_buffer(setting, limit);
    if (given && current != value) {
        char old_text[32];
        char new_text[32];
        vgpu_config_format_limit(old_text, sizeof old_text, limit, current);
        vgpu_config_format_limit(new_text, sizeof new_text, limit, value);
        if (strcmp(source, report->name) == 0 && key_text != NULL) {
            char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
            return vgpu_config_fail(
                report, "key \"%s\" is given twice with different values (%s and %s)",
                vgpu_config_shown(buffer, sizeof buffer, key_text, false), old_text, new_text);
        }
        char device[64];
        describe_key(device, sizeof device, key->kind, key->index, key->uuid);
        return vgpu_config_fail(report, "%s %s limit %s contradicts %s from %.63s", device,
                                vgpu_config_limit_name(limit), new_text, old_text, source);
    }
    if (!given) {
        store(setting, limit, value);
        snprintf(source, VGPU_CONFIG_SOURCE_SIZE, "%.63s", report->name);
    }
    return true;
}

bool vgpu_config_parse_bool(const char *text, bool *value) {
    static const struct {
        const char *text;
        bool value;
    } words[] = {{"true", true}, {"1", true}, {"yes", true}, {"on", true},
                 {"false", false}, {"0", false}, {"no", false}, {"off", false}};
    text += strspn(text, " \t");
    size_t length = strcspn(text, " \t");
    if (text[length + strspn(text + length, " \t")] != '\0') {
        return false;
    }
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        if (strlen(words[i].text) == length && strncasecmp(text, words[i].text, length) == 0) {
            *value = words[i].value;
            return true;
        }
    }
    return false;
}

bool vgpu_config_apply_memory(struct vgpu_config *config, const struct report *report,
                         const struct key *key, const char *key_text, const struct token *value) {
    uint64_t bytes = 0;
    bool ok = !value->cut && (value->is_string ? vgpu_parse_size(value->text, &bytes)
                                               : vgpu_parse_u64(value->text, &bytes));
    char key_buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
    char value_buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
    const char *quote = value->is_string ? "\"" : "";
    if (!ok || bytes == 0) {
        return vgpu_config_fail(report, "bad size %s%s%s for key \"%s\" (%s)", quote,
                    vgpu_config_shown(value_buffer, sizeof value_buffer, value->text, value->cut),
                    quote,
                    vgpu_config_shown(key_buffer, sizeof key_buffer, key_text, false),
                    ok ? "a limit of 0 is not allowed"
                       : "a whole number of bytes, or a string such as \"4GiB\" or \"512MiB\"");
    }
    return vgpu_config_set_limit(config, report, key, VGPU_LIMIT_MEMORY, bytes, key_text);
}

static bool apply_percent(struct vgpu_config *config, const struct report *report,
                          const struct key *key, const char *key_text, const struct token *value,
                          enum vgpu_limit limit) {
    uint32_t hundredths = 0;
    if (value->cut || !vgpu_config_parse_percent(value->text, value->is_string, &hundredths) ||
        hundredths == 0 || hundredths > 10000) {
        char key_buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
        char value_buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
        const char *quote = value->is_string ? "\"" : "";
        return vgpu_config_fail(report,
                    "bad percent %s%s%s for key \"%s\" (0.01 to 100 with at most 2 decimals, "
                    "e.g. 50 or \"12.5%%\")",
                    quote,
                    vgpu_config_shown(value_buffer, sizeof value_buffer, value->text, value->cut),
                    quote, vgpu_config_shown(key_buffer, sizeof key_buffer, key_text, false));
    }
    return vgpu_config_set_limit(config, report, key, limit, hundredths, key_text);
}

bool vgpu_config_apply_compute(struct vgpu_config *config, const struct report *report,
                               const struct key *key, const char *key_text,
                               const struct token *value) {
    return apply_percent(config, report, key, key_text, value, VGPU_LIMIT_COMPUTE);
}

bool vgpu_config_apply_soft(struct vgpu_config *config, const struct report *report,
                            const struct key *key, const char *key_text,
                            const struct token *value) {
    return apply_percent(config, report, key, key_text, value, VGPU_LIMIT_SOFT);
}

/* true or false (JSON literals; the strings "true"/"false" too, as pod specs quote values). */
bool vgpu_config_apply_oversubscribe(struct vgpu_config *config, const struct report *report,
                                     const struct key *key, const char *key_text,
                                     const struct token *value) {
    bool on = false;
    if (value->cut || !vgpu_config_parse_bool(value->text, &on) ||
        (!value->is_string && strcmp(value->text, "true") != 0 &&
         strcmp(value->text, "false") != 0)) {
        char key_buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
        char value_buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
        const char *quote = value->is_string ? "\"" : "";
        return vgpu_config_fail(
            report, "bad value %s%s%s for key \"%s\" (true or false)", quote,
            vgpu_config_shown(value_buffer, sizeof value_buffer, value->text, value->cut), quote,
            vgpu_config_shown(key_buffer, sizeof key_buffer, key_text, false));
    }
    return vgpu_config_set_limit(config, report, key, VGPU_LIMIT_OVERSUBSCRIBE, on, key_text);
}

/* One CUDA_DEVICE_*_LIMIT[_i] value for `key`. */
bool vgpu_config_apply_compat(struct vgpu_config *config, const struct report *report,
                         const struct key *key, bool memory) {
    if (memory) {
        uint64_t bytes = 0;
        if (!vgpu_parse_size(report->value, &bytes)) {
            return vgpu_config_fail(report, "bad size (bytes, or a number with a unit such as "
                                            "4g, 1024m or 4GiB)");
        }
        if (bytes == 0) {
            return vgpu_config_fail(report, "bad size (a limit of 0 is not allowed)");
        }
        return vgpu_config_set_limit(config, report, key, VGPU_LIMIT_MEMORY, bytes, NULL);
    }
    uint32_t hundredths = 0;
    if (!vgpu_config_parse_percent(report->value, true, &hundredths) || hundredths > 10000) {
        return vgpu_config_fail(report, "bad percent (0.01 to 100 with at most 2 decimals, or 0 "
                                        "for no limit)");
    }
    /* HAMi-core reads 0 as "no limit": keep it as 100 % so it still overrides an all-devices
     * value for its index. */
    return vgpu_config_set_limit(config, report, key, VGPU_LIMIT_COMPUTE,
                                 hundredths == 0 ? 10000 : hundredths, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* Limits of one device. */

/* Picks the limit of the most specific setting; index and UUID settings must agree. */
static bool resolve_limit(const struct vgpu_device_setting *all,
                          const struct vgpu_device_setting *by_index,
                          const struct vgpu_device_setting *by_uuid, enum vgpu_limit limit,
                          uint64_t *value, const char **source, char *error, size_t error_size) {
    const struct vgpu_device_setting *order[] = {by_uuid, by_index, all};
    const struct vgpu_device_setting *chosen = NULL;
    for (size_t i = 0; i < 3 && chosen == NULL; i++) {
        if (order[i] != NULL && vgpu_config_setting_has(order[i], limit)) {
            chosen = order[i];
        }
    }
    *value = 0;
    *source = "";
    if (chosen == NULL) {
        return true;
    }
    *value = vgpu_config_setting_value(chosen, limit);
    *source = vgpu_config_setting_source(chosen, limit);
    if (chosen == by_uuid && by_index != NULL && vgpu_config_setting_has(by_index, limit) &&
        vgpu_config_setting_value(by_index, limit) != *value) {
        char uuid_text[32];
        char index_text[32];
        vgpu_config_format_limit(uuid_text, sizeof uuid_text, limit, *value);
        vgpu_config_format_limit(index_text, sizeof index_text, limit,
                                 vgpu_config_setting_value(by_index, limit));
        if (error != NULL && error_size > 0) {
            snprintf(error, error_size,
                     "%s: %s limit %s for %s contradicts %s for device %d (from %s), the same GPU",
                     *source, vgpu_config_limit_name(limit), uuid_text, by_uuid->uuid,
                     index_text, by_index->index, vgpu_config_setting_source(by_index, limit));
        }
        return false;
    }
    return true;
}

/* The limits of the settings given (any may be NULL), with the soft limit checked against
 * the compute limit it bursts from. */
static bool resolve(const struct vgpu_device_setting *all, const struct vgpu_device_setting *by_index,
                    const struct vgpu_device_setting *by_uuid, struct vgpu_device_limits *limits,
                    char *error, size_t error_size) {
    uint64_t values[VGPU_LIMIT_COUNT];
    const char *sources[VGPU_LIMIT_COUNT];
    memset(limits, 0, sizeof *limits);
    for (int limit = 0; limit < VGPU_LIMIT_COUNT; limit++) {
        if (!resolve_limit(all, by_index, by_uuid, (enum vgpu_limit)limit, &values[limit],
                           &sources[limit], error, error_size)) {
            return false;
        }
    }
    limits->memory_limit = values[VGPU_LIMIT_MEMORY];
    limits->memory_source = sources[VGPU_LIMIT_MEMORY];
    limits->compute_limit = (uint32_t)values[VGPU_LIMIT_COMPUTE];
    limits->compute_source = sources[VGPU_LIMIT_COMPUTE];
    limits->compute_soft_limit = (uint32_t)values[VGPU_LIMIT_SOFT];
    limits->soft_source = sources[VGPU_LIMIT_SOFT];
    if (limits->compute_limit == 0) {
        /* No compute limit, nothing to burst from (vgpu_config_check_soft warned). */
        limits->compute_soft_limit = 0;
        limits->soft_source = "";
    }
    limits->oversubscribe = values[VGPU_LIMIT_OVERSUBSCRIBE] != 0;
    limits->oversubscribe_source = sources[VGPU_LIMIT_OVERSUBSCRIBE];
    if (limits->compute_soft_limit != 0 && limits->compute_limit != 0 &&
        limits->compute_soft_limit < limits->compute_limit) {
        char soft_text[32];
        char hard_text[32];
        vgpu_config_format_limit(soft_text, sizeof soft_text, VGPU_LIMIT_SOFT,
                                 limits->compute_soft_limit);
        vgpu_config_format_limit(hard_text, sizeof hard_text, VGPU_LIMIT_COMPUTE,
                                 limits->compute_limit);
        struct report report = {error, error_size, limits->soft_source,
                                getenv(limits->soft_source)};
        return vgpu_config_fail(&report,
                                "soft compute limit %s is below the compute limit %s from %s "
                                "(the soft limit is how far past it a pod may burst)",
                                soft_text, hard_text, limits->compute_source);
    }
    return true;
}

bool vgpu_config_device_limits(const struct vgpu_config *config, int index, const char *uuid,
                               struct vgpu_device_limits *limits, char *error,
                               size_t error_size) {
    const struct vgpu_device_setting *all = NULL;
    const struct vgpu_device_setting *by_index = NULL;
    const struct vgpu_device_setting *by_uuid = NULL;
    for (unsigned i = 0; i < config->count; i++) {
        const struct vgpu_device_setting *setting = &config->settings[i];
        if (setting->kind == VGPU_KEY_ALL) {
            all = setting;
        } else if (setting->kind == VGPU_KEY_INDEX && setting->index == index) {
            by_index = setting;
        } else if (setting->kind == VGPU_KEY_UUID && uuid != NULL &&
                   strcasecmp(setting->uuid, uuid) == 0) {
            by_uuid = setting;
        }
    }
    return resolve(all, by_index, by_uuid, limits, error, error_size);
}

bool vgpu_config_check_soft(struct vgpu_config *config, char *error, size_t error_size) {
    const struct vgpu_device_setting *all = NULL;
    bool any_compute = false;
    bool any_memory = false;
    bool by_index = false;
    bool by_uuid = false;
    for (unsigned i = 0; i < config->count; i++) {
        if (config->settings[i].kind == VGPU_KEY_ALL) {
            all = &config->settings[i];
        }
        by_index |= config->settings[i].kind == VGPU_KEY_INDEX;
        by_uuid |= config->settings[i].kind == VGPU_KEY_UUID;
        any_compute |= config->settings[i].compute_limit != 0;
        any_memory |= config->settings[i].memory_limit != 0;
    }
    /* Every key with the all-devices one under it; an index and a UUID key that meet on one
     * GPU are checked when the driver names it (vgpu_config_device_limits). */
    for (unsigned i = 0; i < config->count; i++) {
        const struct vgpu_device_setting *setting = &config->settings[i];
        struct vgpu_device_limits limits;
        bool ok = setting == all
                      ? resolve(all, NULL, NULL, &limits, error, error_size)
                      : resolve(all, setting->kind == VGPU_KEY_INDEX ? setting : NULL,
                                setting->kind == VGPU_KEY_UUID ? setting : NULL, &limits, error,
                                error_size);
        if (!ok) {
            return false;
        }
        /* The all-devices key's burst may serve a device another key limits, and so may an
         * index key's a UUID key's (they meet when the driver names the GPU); a device's key
         * alone in its kind has its limits resolved here. */
        bool own = setting != all && !(by_index && by_uuid);
        bool no_compute = own && (limits.compute_limit == 0 || limits.compute_limit >= 10000);
        if (vgpu_config_setting_has(setting, VGPU_LIMIT_SOFT) && (!any_compute || no_compute)) {
            char text[32];
            vgpu_config_format_limit(text, sizeof text, VGPU_LIMIT_SOFT,
                                     setting->compute_soft_limit);
            vgpu_config_warn(config, setting->soft_source, NULL,
                             "soft compute limit %s without %s: ignored (no limit to burst "
                             "from)",
                             text, any_compute ? "a compute limit on that device"
                                               : "any compute limit");
        }
        if (setting->oversubscribe == 1 && (!any_memory || (own && limits.memory_limit == 0))) {
            vgpu_config_warn(config, setting->oversubscribe_source, NULL,
                             "memory oversubscription without %s: ignored (no limit to go past)",
                             any_memory ? "a memory limit on that device" : "any memory limit");
        }
    }
    return true;
}
