/* The limits other GPU-sharing systems' users already write in their pod specs, read with those
 * systems' meaning (docs/configuration.md has a table per system):
 *   vgpu-manager  CUDA_MEM_LIMIT[_i], CUDA_MEM_RATIO[_i], CUDA_CORE_LIMIT[_i],
 *                 CUDA_CORE_SOFT_LIMIT[_i], CUDA_MEM_OVERSOLD[_i], CUDA_MEMORY_OVERSUBSCRIBE,
 *                 GPU_DEVICES_UUID (binds the i of those variables to a GPU UUID)
 *   vcuda-hook    VCUDA_MEMORY_LIMIT
 *   HAMi-core     GPU_CORE_UTILIZATION_POLICY (its limits are in config.c)
 * Each value lands in the same device settings as ours, so one device and limit given two
 * different values by two systems is the usual contradiction error, naming both variables. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config_internal.h"
#include "vgpu_parse.h"

#define SLOTS (VGPU_CONFIG_MAX_INDEX + 1)
#define UUIDS "GPU_DEVICES_UUID"

/* One vgpu-manager variable family: NAME for every device and NAME_<i> for device i. */
struct family {
    const char *name;
    const char *all;          /* NAME's value, or NULL */
    const char *slot[SLOTS];  /* NAME_<i>'s value, or NULL */
};

enum { MEM, RATIO, CORE, SOFT, OVERSOLD, FAMILIES };

struct seeds {
    struct family families[FAMILIES];
    unsigned uuid_count; /* GPU_DEVICES_UUID's entries; 0 = the i are CUDA ordinals */
    char uuids[SLOTS][VGPU_CONFIG_UUID_SIZE];
};

static const char *value_of(const char *name) {
    const char *value = getenv(name);
    return value != NULL && *value != '\0' ? value : NULL;
}

/* Every NAME_<i> of the families in the environment; a suffix that is not 0-63 is an error
 * rather than a limit ignored. */
static bool collect(struct seeds *seeds, char *error, size_t error_size) {
    for (char **entry = environ; entry != NULL && *entry != NULL; entry++) {
        const char *equals = strchr(*entry, '=');
        if (equals == NULL || equals[1] == '\0') {
            continue;
        }
        for (int f = 0; f < FAMILIES; f++) {
            struct family *family = &seeds->families[f];
            size_t length = strlen(family->name);
            if (strncmp(*entry, family->name, length) != 0 || (*entry)[length] != '_') {
                continue;
            }
            char name[VGPU_CONFIG_SOURCE_SIZE];
            size_t name_length = (size_t)(equals - *entry);
            bool cut = name_length >= sizeof name;
            snprintf(name, sizeof name, "%.*s", (int)(cut ? sizeof name - 1 : name_length),
                     *entry);
            int index = -1;
            if (cut || !vgpu_config_parse_index(name + length + 1, &index)) {
                struct report report = {error, error_size, name, equals + 1};
                char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
                return vgpu_config_fail(
                    &report, "\"%s\" is not a device index 0-%d",
                    vgpu_config_shown(buffer, sizeof buffer, name + length + 1, cut),
                    VGPU_CONFIG_MAX_INDEX);
            }
            /* The first of a name given twice, as getenv. */
            if (family->slot[index] == NULL) {
                family->slot[index] = equals + 1;
            }
            break;
        }
    }
    return true;
}

/* GPU_DEVICES_UUID: GPU UUIDs separated by commas, blanks around each; the i of the families'
 * NAME_<i> is a position in it. */
static bool load_uuids(struct seeds *seeds, char *error, size_t error_size) {
    const char *value = value_of(UUIDS);
    if (value == NULL) {
        return true;
    }
    struct report report = {error, error_size, UUIDS, value};
    const char *cursor = value;
    for (;;) {
        size_t length = strcspn(cursor, ",");
        char entry[VGPU_CONFIG_UUID_SIZE + 2];
        const char *start = cursor + strspn(cursor, " \t");
        size_t kept = length - (size_t)(start - cursor);
        while (kept > 0 && (start[kept - 1] == ' ' || start[kept - 1] == '\t')) {
            kept--;
        }
        bool cut = kept >= sizeof entry;
        snprintf(entry, sizeof entry, "%.*s", (int)(cut ? sizeof entry - 1 : kept), start);
        if (seeds->uuid_count == SLOTS) {
            return vgpu_config_fail(&report, "more than %d UUIDs", SLOTS);
        }
        if (cut || !vgpu_config_parse_uuid(entry, seeds->uuids[seeds->uuid_count])) {
            char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
            return vgpu_config_fail(&report, "entry %u \"%s\" is not a GPU UUID (%s)",
                                    seeds->uuid_count,
                                    vgpu_config_shown(buffer, sizeof buffer, entry, cut),
                                    UUID_SHAPE);
        }
        seeds->uuid_count++;
        cursor += length;
        if (*cursor == '\0') {
            return true;
        }
        cursor++;
    }
}

/* The device key of NAME_<index> (index -1: NAME, every device); false for an index past
 * GPU_DEVICES_UUID's entries, which names no GPU (as in vgpu-manager: a warning, no limit). */
static bool key_of(struct vgpu_config *config, const struct seeds *seeds,
                   const struct report *report, int index, struct key *key) {
    memset(key, 0, sizeof *key);
    key->index = -1;
    if (index < 0) {
        key->kind = VGPU_KEY_ALL;
        return true;
    }
    if (seeds->uuid_count == 0) {
        key->kind = VGPU_KEY_INDEX;
        key->index = index;
        return true;
    }
    if ((unsigned)index >= seeds->uuid_count) {
        vgpu_config_warn(config, report->name, report->value,
                         "device %d has no UUID in " UUIDS " (%u entr%s): applies to no GPU",
                         index, seeds->uuid_count, seeds->uuid_count == 1 ? "y" : "ies");
        return false;
    }
    key->kind = VGPU_KEY_UUID;
    memcpy(key->uuid, seeds->uuids[index], sizeof key->uuid);
    return true;
}

/* vgpu-manager's and vcuda-hook's sizes: a number and an optional unit whose letters k, m, g, t
 * (any case, alone or followed by b, i or ib) are all binary, as both systems read them ("4g",
 * "1000m", "10GB"); b, byte, bytes or none: bytes. */
static bool parse_seed_size(const char *text, uint64_t *bytes) {
    const char *start = text + strspn(text, " \t");
    size_t number = strspn(start, "0123456789.");
    const char *unit = start + number;
    unit += strspn(unit, " \t");
    size_t letters = strcspn(unit, " \t");
    if (number == 0 || unit[letters + strspn(unit + letters, " \t")] != '\0' || letters > 5) {
        return false;
    }
    char lower[8] = "";
    for (size_t i = 0; i < letters; i++) {
        char c = unit[i];
        lower[i] = c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
    }
    lower[letters] = '\0';
    const char *binary = NULL;
    if (letters == 0 || strcmp(lower, "b") == 0 || strcmp(lower, "byte") == 0 ||
        strcmp(lower, "bytes") == 0) {
        binary = "";
    } else if (strchr("kmgt", lower[0]) != NULL &&
               (lower[1] == '\0' || strcmp(lower + 1, "b") == 0 || strcmp(lower + 1, "i") == 0 ||
                strcmp(lower + 1, "ib") == 0)) {
        static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
        binary = units[strchr("kmgt", lower[0]) - "kmgt"];
    }
    if (binary == NULL || number > 40) {
        return false;
    }
    char canonical[64];
    snprintf(canonical, sizeof canonical, "%.*s%s", (int)number, start, binary);
    return vgpu_parse_size(canonical, bytes);
}

#define SEED_SIZE_RULE "bytes, or a number with a binary unit such as 4g, 1000m or 10GB"

/* CUDA_MEM_RATIO: the memory limit is what the program may use in all; 1/ratio of it stays on
 * the device and the rest is host-backed. A decimal >= 1 with up to 6 decimals, in millionths. */
static bool parse_ratio(const char *text, uint64_t *millionths) {
    const char *cursor = text + strspn(text, " \t");
    uint64_t value = 0;
    size_t digits = 0;
    for (; *cursor >= '0' && *cursor <= '9'; cursor++, digits++) {
        if (digits >= 6) {
            return false; /* a ratio of a million is no ratio */
        }
        value = value * 10 + (uint64_t)(*cursor - '0');
    }
    if (digits == 0) {
        return false;
    }
    size_t decimals = 0;
    if (*cursor == '.') {
        for (cursor++; *cursor >= '0' && *cursor <= '9'; cursor++, decimals++) {
            if (decimals >= 6) {
                return false;
            }
            value = value * 10 + (uint64_t)(*cursor - '0');
        }
        if (decimals == 0) {
            return false;
        }
    }
    cursor += strspn(cursor, " \t");
    if (*cursor != '\0') {
        return false;
    }
    for (; decimals < 6; decimals++) {
        value *= 10;
    }
    *millionths = value;
    return true;
}

/* The source of a device-resident limit shows both variables it came from, the memory's and
 * the ratio's. */
static void name_both_sources(struct vgpu_config *config, const struct key *key,
                              const char *memory_name, const char *ratio_name) {
    for (unsigned i = 0; i < config->count; i++) {
        struct vgpu_device_setting *setting = &config->settings[i];
        if (setting->kind == key->kind && setting->index == key->index &&
            strcmp(setting->uuid, key->uuid) == 0 &&
            strcmp(setting->memory_source, memory_name) == 0) {
            snprintf(setting->memory_source, sizeof setting->memory_source, "%.31s/%.31s",
                     memory_name, ratio_name);
        }
    }
}

/* One device's (or every device's) memory: NAME_<i> else NAME, divided by the ratio that
 * applies to it the same way; a ratio above 1 also turns oversubscription on. */
static bool apply_memory(struct vgpu_config *config, const struct seeds *seeds, int index,
                         char *error, size_t error_size) {
    const struct family *memory = &seeds->families[MEM];
    const struct family *ratio = &seeds->families[RATIO];
    bool own = index >= 0 && (memory->slot[index] != NULL || ratio->slot[index] != NULL);
    if (index >= 0 && !own) {
        return true;
    }
    char memory_name[VGPU_CONFIG_SOURCE_SIZE];
    char ratio_name[VGPU_CONFIG_SOURCE_SIZE];
    const char *memory_value = index >= 0 ? memory->slot[index] : NULL;
    const char *ratio_value = index >= 0 ? ratio->slot[index] : NULL;
    snprintf(memory_name, sizeof memory_name, "%s_%d", memory->name, index);
    snprintf(ratio_name, sizeof ratio_name, "%s_%d", ratio->name, index);
    if (memory_value == NULL) {
        memory_value = memory->all;
        snprintf(memory_name, sizeof memory_name, "%s", memory->name);
    }
    if (ratio_value == NULL) {
        ratio_value = ratio->all;
        snprintf(ratio_name, sizeof ratio_name, "%s", ratio->name);
    }
    if (memory_value == NULL) {
        if (ratio_value == NULL || (index < 0 && ratio->all == NULL)) {
            return true;
        }
        /* NAME alone may serve only NAME_<i>s; check that one of them uses it. */
        for (int i = 0; index < 0 && i < SLOTS; i++) {
            if (memory->slot[i] != NULL) {
                return true;
            }
        }
        struct report report = {error, error_size, ratio_name, ratio_value};
        if (index < 0) {
            return vgpu_config_fail(&report, "no %s or %s_<i> to divide: a ratio needs a memory "
                                             "limit",
                                    memory->name, memory->name);
        }
        return vgpu_config_fail(&report, "no %s_%d or %s to divide: a ratio needs a memory limit",
                                memory->name, index, memory->name);
    }
    struct report report = {error, error_size, memory_name, memory_value};
    uint64_t bytes = 0;
    if (!parse_seed_size(memory_value, &bytes)) {
        return vgpu_config_fail(&report, "bad size (" SEED_SIZE_RULE ")");
    }
    if (bytes == 0) {
        return vgpu_config_fail(&report, "bad size (a limit of 0 is not allowed)");
    }
    uint64_t millionths = 1000000;
    if (ratio_value != NULL) {
        struct report ratio_report = {error, error_size, ratio_name, ratio_value};
        if (!parse_ratio(ratio_value, &millionths) || millionths < 1000000) {
            return vgpu_config_fail(&ratio_report,
                                    "bad ratio (a number of 1 or more, such as 1.5: the device "
                                    "keeps 1/ratio of %s, the rest is host-backed)",
                                    memory_name);
        }
    }
    struct key key;
    if (!key_of(config, seeds, &report, index, &key)) {
        return true;
    }
    bool oversold = millionths > 1000000;
    uint64_t resident = (uint64_t)((unsigned __int128)bytes * 1000000 / millionths);
    if (!vgpu_config_set_limit(config, &report, &key, VGPU_LIMIT_MEMORY, resident, NULL)) {
        return false;
    }
    if (!oversold) {
        return true;
    }
    name_both_sources(config, &key, memory_name, ratio_name);
    struct report ratio_report = {error, error_size, ratio_name, ratio_value};
    return vgpu_config_set_limit(config, &ratio_report, &key, VGPU_LIMIT_OVERSUBSCRIBE, 1, NULL);
}

/* CUDA_CORE_LIMIT[_i], CUDA_CORE_SOFT_LIMIT[_i] (percent; 0 is no limit, as vgpu-manager
 * reads it) and CUDA_MEM_OVERSOLD[_i] (true or false). */
static bool apply_one(struct vgpu_config *config, const struct seeds *seeds, int family,
                      int index, const char *value, char *error, size_t error_size) {
    char name[VGPU_CONFIG_SOURCE_SIZE];
    if (index >= 0) {
        snprintf(name, sizeof name, "%s_%d", seeds->families[family].name, index);
    } else {
        snprintf(name, sizeof name, "%s", seeds->families[family].name);
    }
    struct report report = {error, error_size, name, value};
    struct key key;
    if (family == OVERSOLD) {
        bool on = false;
        if (!vgpu_config_parse_bool(value, &on)) {
            return vgpu_config_fail(&report, "bad value (true or false)");
        }
        return !key_of(config, seeds, &report, index, &key) ||
               vgpu_config_set_limit(config, &report, &key, VGPU_LIMIT_OVERSUBSCRIBE, on, NULL);
    }
    uint32_t hundredths = 0;
    if (!vgpu_config_parse_percent(value, true, &hundredths) || hundredths > 10000) {
        return vgpu_config_fail(&report, "bad percent (0.01 to 100 with at most 2 decimals, or 0 "
                                         "for no limit)");
    }
    if (family == SOFT && hundredths == 0) {
        return true;
    }
    return !key_of(config, seeds, &report, index, &key) ||
           vgpu_config_set_limit(config, &report, &key,
                                 family == SOFT ? VGPU_LIMIT_SOFT : VGPU_LIMIT_COMPUTE,
                                 hundredths == 0 ? 10000 : hundredths, NULL);
}

static bool load_vgpu_manager(struct vgpu_config *config, char *error, size_t error_size) {
    static const char *const names[FAMILIES] = {"CUDA_MEM_LIMIT", "CUDA_MEM_RATIO",
                                                "CUDA_CORE_LIMIT", "CUDA_CORE_SOFT_LIMIT",
                                                "CUDA_MEM_OVERSOLD"};
    struct seeds seeds;
    memset(&seeds, 0, sizeof seeds);
    for (int f = 0; f < FAMILIES; f++) {
        seeds.families[f].name = names[f];
        seeds.families[f].all = value_of(names[f]);
    }
    if (!collect(&seeds, error, error_size) || !load_uuids(&seeds, error, error_size)) {
        return false;
    }
    for (int index = -1; index < SLOTS; index++) {
        if (!apply_memory(config, &seeds, index, error, error_size)) {
            return false;
        }
        for (int f = CORE; f < FAMILIES; f++) {
            const char *value =
                index < 0 ? seeds.families[f].all : seeds.families[f].slot[index];
            if (value != NULL &&
                !apply_one(config, &seeds, f, index, value, error, error_size)) {
                return false;
            }
        }
    }
    /* The older name of every device's oversubscription, from vgpu-manager's README. */
    const char *oversubscribe = value_of("CUDA_MEMORY_OVERSUBSCRIBE");
    if (oversubscribe != NULL) {
        struct report report = {error, error_size, "CUDA_MEMORY_OVERSUBSCRIBE", oversubscribe};
        struct key key = {.kind = VGPU_KEY_ALL, .index = -1, .uuid = ""};
        bool on = false;
        if (!vgpu_config_parse_bool(oversubscribe, &on)) {
            return vgpu_config_fail(&report, "bad value (true or false)");
        }
        if (!vgpu_config_set_limit(config, &report, &key, VGPU_LIMIT_OVERSUBSCRIBE, on, NULL)) {
            return false;
        }
    }
    return true;
}

/* VCUDA_MEMORY_LIMIT: a size for every device. */
static bool load_vcuda(struct vgpu_config *config, char *error, size_t error_size) {
    const char *value = value_of("VCUDA_MEMORY_LIMIT");
    if (value == NULL) {
        return true;
    }
    struct report report = {error, error_size, "VCUDA_MEMORY_LIMIT", value};
    uint64_t bytes = 0;
    if (!parse_seed_size(value, &bytes)) {
        return vgpu_config_fail(&report, "bad size (" SEED_SIZE_RULE "; not an expression)");
    }
    if (bytes == 0) {
        return vgpu_config_fail(&report, "bad size (a limit of 0 is not allowed)");
    }
    struct key key = {.kind = VGPU_KEY_ALL, .index = -1, .uuid = ""};
    return vgpu_config_set_limit(config, &report, &key, VGPU_LIMIT_MEMORY, bytes, NULL);
}

/* GPU_CORE_UTILIZATION_POLICY: HAMi-core's "default" and FORCE both limit (vgpu limits a pod
 * alone on its GPU too); DISABLE turns off the compute limits this environment gives. */
static bool load_policy(struct vgpu_config *config, char *error, size_t error_size) {
    const char *value = value_of("GPU_CORE_UTILIZATION_POLICY");
    if (value == NULL) {
        return true;
    }
    struct report report = {error, error_size, "GPU_CORE_UTILIZATION_POLICY", value};
    if (strcasecmp(value, "default") == 0 || strcasecmp(value, "force") == 0) {
        return true;
    }
    if (strcasecmp(value, "disable") != 0) {
        return vgpu_config_fail(&report, "unknown policy (default, force or disable)");
    }
    unsigned dropped = 0;
    char first[VGPU_CONFIG_SOURCE_SIZE] = "";
    for (unsigned i = 0; i < config->count; i++) {
        struct vgpu_device_setting *setting = &config->settings[i];
        if (setting->compute_limit == 0 && setting->compute_soft_limit == 0) {
            continue;
        }
        if (first[0] == '\0') {
            snprintf(first, sizeof first, "%s",
                     setting->compute_limit != 0 ? setting->compute_source
                                                 : setting->soft_source);
        }
        dropped++;
        setting->compute_limit = 0;
        setting->compute_soft_limit = 0;
        setting->compute_source[0] = '\0';
        setting->soft_source[0] = '\0';
    }
    if (dropped > 0) {
        vgpu_config_warn(config, "GPU_CORE_UTILIZATION_POLICY", value,
                         "the compute limits of this environment are off (%u device key%s, "
                         "from %s%s); a pod region's own limits still apply",
                         dropped, dropped == 1 ? "" : "s", first, dropped == 1 ? "" : " and others");
    }
    return true;
}

bool vgpu_config_load_seeds(struct vgpu_config *config, char *error, size_t error_size) {
    return load_vgpu_manager(config, error, error_size) &&
           load_vcuda(config, error, error_size);
}

bool vgpu_config_load_policy(struct vgpu_config *config, char *error, size_t error_size) {
    return load_policy(config, error, error_size);
}
