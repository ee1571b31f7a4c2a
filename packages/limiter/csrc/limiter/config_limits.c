/* The rules that combine settings: each device key once, each limit given once (or again with
 * the same value), and for one device the most specific key that sets a limit. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
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

void vgpu_config_format_limit(char *buffer, size_t size, bool memory, uint64_t value) {
    if (memory) {
        snprintf(buffer, size, "%" PRIu64 " bytes", value);
    } else {
        snprintf(buffer, size, "%u.%02u%%", (unsigned)(value / 100), (unsigned)(value % 100));
    }
}

bool vgpu_config_set_limit(struct vgpu_config *config, const struct report *report,
                      const struct key *key, bool memory, uint64_t value, const char *key_text) {
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
    uint64_t current = memory ? setting->memory_limit : setting->compute_limit;
    char *source = memory ? setting->memory_source : setting->compute_source;
    if (current != 0 && current != value) {
        char old_text[32];
        char new_text[32];
        vgpu_config_format_limit(old_text, sizeof old_text, memory, current);
        vgpu_config_format_limit(new_text, sizeof new_text, memory, value);
        if (strcmp(source, report->name) == 0 && key_text != NULL) {
            char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
            return vgpu_config_fail(
                report, "key \"%s\" is given twice with different values (%s and %s)",
                vgpu_config_shown(buffer, sizeof buffer, key_text, false), old_text, new_text);
        }
        char device[64];
        describe_key(device, sizeof device, key->kind, key->index, key->uuid);
        return vgpu_config_fail(report, "%s %s limit %s contradicts %s from %.63s", device,
                    memory ? "memory" : "compute", new_text, old_text, source);
    }
    if (current == 0) {
        if (memory) {
            setting->memory_limit = value;
        } else {
            setting->compute_limit = (uint32_t)value;
        }
        snprintf(source, VGPU_CONFIG_SOURCE_SIZE, "%.63s", report->name);
    }
    return true;
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
    return vgpu_config_set_limit(config, report, key, true, bytes, key_text);
}

bool vgpu_config_apply_compute(struct vgpu_config *config, const struct report *report,
                          const struct key *key, const char *key_text, const struct token *value) {
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
    return vgpu_config_set_limit(config, report, key, false, hundredths, key_text);
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
        return vgpu_config_set_limit(config, report, key, true, bytes, NULL);
    }
    uint32_t hundredths = 0;
    if (!vgpu_config_parse_percent(report->value, true, &hundredths) || hundredths > 10000) {
        return vgpu_config_fail(report, "bad percent (0.01 to 100 with at most 2 decimals, or 0 "
                                        "for no limit)");
    }
    /* HAMi-core reads 0 as "no limit": keep it as 100 % so it still overrides an all-devices
     * value for its index. */
    return vgpu_config_set_limit(config, report, key, false,
                                 hundredths == 0 ? 10000 : hundredths, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* Limits of one device. */

/* Picks the limit of the most specific setting; index and UUID settings must agree. */
static bool resolve_limit(const struct vgpu_device_setting *all,
                          const struct vgpu_device_setting *by_index,
                          const struct vgpu_device_setting *by_uuid, bool memory,
                          uint64_t *value, const char **source, char *error, size_t error_size) {
    const struct vgpu_device_setting *order[] = {by_uuid, by_index, all};
    const struct vgpu_device_setting *chosen = NULL;
    for (size_t i = 0; i < 3 && chosen == NULL; i++) {
        if (order[i] != NULL && (memory ? order[i]->memory_limit : order[i]->compute_limit)) {
            chosen = order[i];
        }
    }
    *value = 0;
    *source = "";
    if (chosen == NULL) {
        return true;
    }
    *value = memory ? chosen->memory_limit : chosen->compute_limit;
    *source = memory ? chosen->memory_source : chosen->compute_source;
    uint64_t by_index_value = by_index == NULL ? 0
                              : memory         ? by_index->memory_limit
                                               : by_index->compute_limit;
    if (chosen == by_uuid && by_index_value != 0 && by_index_value != *value) {
        char uuid_text[32];
        char index_text[32];
        vgpu_config_format_limit(uuid_text, sizeof uuid_text, memory, *value);
        vgpu_config_format_limit(index_text, sizeof index_text, memory, by_index_value);
        const char *index_source = memory ? by_index->memory_source : by_index->compute_source;
        if (error != NULL && error_size > 0) {
            snprintf(error, error_size,
                     "%s: %s limit %s for %s contradicts %s for device %d (from %s), the same GPU",
                     *source, memory ? "memory" : "compute", uuid_text, by_uuid->uuid,
                     index_text, by_index->index, index_source);
        }
        return false;
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
    uint64_t compute = 0;
    memset(limits, 0, sizeof *limits);
    if (!resolve_limit(all, by_index, by_uuid, true, &limits->memory_limit,
                       &limits->memory_source, error, error_size) ||
        !resolve_limit(all, by_index, by_uuid, false, &compute, &limits->compute_source, error,
                       error_size)) {
        return false;
    }
    limits->compute_limit = (uint32_t)compute;
    limits->soft_source = "";
    limits->oversubscribe_source = "";
    return true;
}

