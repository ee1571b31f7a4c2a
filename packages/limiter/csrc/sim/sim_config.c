/* VGPU_SIM_DEVICES syntax (documented in the limiter's docs):
 *   unset or ""       two default devices
 *   "N"               N default devices (0 to 16)
 *   "SPEC;SPEC;..."   one device per SPEC, each a comma-separated list of key=value:
 *                     count=N (repeat this spec), name=TEXT, memory=SIZE, sms=N, cc=MAJOR.MINOR,
 *                     overhead=SIZE (context cost), uuid=GPU-...
 * Defaults: an H100-like device, 80 GiB, 132 SMs, compute capability 9.0, 512 MiB per context. */
#define _GNU_SOURCE
#include "sim_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu_parse.h"

#define DEFAULT_DEVICES 2
#define DEFAULT_NAME "NVIDIA H100 80GB HBM3"
#define DEFAULT_MEMORY (80ULL << 30)
#define DEFAULT_OVERHEAD (512ULL << 20)
#define DEFAULT_SMS 132
#define DEFAULT_DRIVER_VERSION "580.95.05"
#define DEFAULT_CUDA_VERSION 13000

static void default_device(struct sim_device_config *config, unsigned index) {
    memset(config, 0, sizeof *config);
    snprintf(config->name, sizeof config->name, "%s", DEFAULT_NAME);
    snprintf(config->uuid, sizeof config->uuid, "GPU-5157a1e0-0000-4000-8000-%012x", index + 1);
    config->pci_bus = 0x18 + index;
    snprintf(config->pci_bus_id, sizeof config->pci_bus_id, "00000000:%02X:00.0", config->pci_bus);
    config->total_memory = DEFAULT_MEMORY;
    config->context_overhead = DEFAULT_OVERHEAD;
    config->sm_count = DEFAULT_SMS;
    config->cc_major = 9;
    config->cc_minor = 0;
}

static bool valid_uuid(const char *text) {
    /* GPU- then 8-4-4-4-12 hex digits */
    static const char shape[] = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    if (strlen(text) != sizeof shape - 1) {
        return false;
    }
    for (size_t i = 0; shape[i] != '\0'; i++) {
        bool hex = (text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f') ||
                   (text[i] >= 'A' && text[i] <= 'F');
        if (shape[i] == 'x' ? !hex : text[i] != shape[i]) {
            return false;
        }
    }
    return true;
}

/* Apply one key=value to a device; false with a message on a bad one. */
static bool apply_field(struct sim_device_config *config, const char *key, const char *value,
                        uint64_t *count, char *error, size_t error_size) {
    uint64_t number = 0;
    if (strcmp(key, "count") == 0 && vgpu_parse_u64(value, &number) && number >= 1 &&
        number <= SIM_MAX_DEVICES) {
        *count = number;
    } else if (strcmp(key, "name") == 0 && *value != '\0' && strlen(value) < sizeof config->name) {
        snprintf(config->name, sizeof config->name, "%s", value);
    } else if (strcmp(key, "memory") == 0 && vgpu_parse_size(value, &number) && number > 0) {
        config->total_memory = number;
    } else if (strcmp(key, "overhead") == 0 && vgpu_parse_size(value, &number)) {
        config->context_overhead = number;
    } else if (strcmp(key, "sms") == 0 && vgpu_parse_u64(value, &number) && number >= 1 &&
               number <= 1024) {
        config->sm_count = (uint32_t)number;
    } else if (strcmp(key, "cc") == 0 && strlen(value) == 3 && value[1] == '.' &&
               value[0] >= '1' && value[0] <= '9' && value[2] >= '0' && value[2] <= '9') {
        config->cc_major = (uint32_t)(value[0] - '0');
        config->cc_minor = (uint32_t)(value[2] - '0');
    } else if (strcmp(key, "uuid") == 0 && valid_uuid(value)) {
        snprintf(config->uuid, sizeof config->uuid, "%s", value);
    } else {
        snprintf(error, error_size, "VGPU_SIM_DEVICES: bad field '%s=%s'", key, value);
        return false;
    }
    return true;
}

/* One device spec's comma-separated key=value fields, applied to `config` (and `count`);
 * `explicit_uuid` is set when a uuid= field is among them. The spec is cut up in place. */
static bool parse_spec(char *spec, struct sim_device_config *config, uint64_t *count,
                       bool *explicit_uuid, char *error, size_t error_size) {
    char *field_state = NULL;
    for (char *field = strtok_r(spec, ",", &field_state); field != NULL;
         field = strtok_r(NULL, ",", &field_state)) {
        char *equals = strchr(field, '=');
        if (equals == NULL) {
            snprintf(error, error_size, "VGPU_SIM_DEVICES: '%s' is not key=value", field);
            return false;
        }
        *equals = '\0';
        *explicit_uuid = *explicit_uuid || strcmp(field, "uuid") == 0;
        if (!apply_field(config, field, equals + 1, count, error, error_size)) {
            return false;
        }
    }
    return true;
}

/* Two devices with one UUID would break every lookup by UUID. */
static bool distinct_uuids(const struct sim_state *state, unsigned total, char *error,
                           size_t error_size) {
    for (unsigned i = 0; i < total; i++) {
        for (unsigned j = i + 1; j < total; j++) {
            if (strcasecmp(state->devices[i].config.uuid, state->devices[j].config.uuid) == 0) {
                snprintf(error, error_size, "VGPU_SIM_DEVICES: devices %u and %u share uuid %s",
                         i, j, state->devices[i].config.uuid);
                return false;
            }
        }
    }
    return true;
}

static bool parse_devices(struct sim_state *state, const char *text, char *error,
                          size_t error_size) {
    uint64_t number = 0;
    if (*text == '\0' || vgpu_parse_u64(text, &number)) {
        number = *text == '\0' ? DEFAULT_DEVICES : number;
        if (number > SIM_MAX_DEVICES) {
            snprintf(error, error_size, "VGPU_SIM_DEVICES=%s: at most %d devices", text,
                     SIM_MAX_DEVICES);
            return false;
        }
        for (unsigned i = 0; i < number; i++) {
            default_device(&state->devices[i].config, i);
        }
        state->device_count = (uint32_t)number;
        return true;
    }
    char *copy = strdup(text);
    if (copy == NULL) {
        snprintf(error, error_size, "VGPU_SIM_DEVICES: out of memory");
        return false;
    }
    bool ok = true;
    unsigned total = 0;
    char *spec_state = NULL;
    for (char *spec = strtok_r(copy, ";", &spec_state); ok && spec != NULL;
         spec = strtok_r(NULL, ";", &spec_state)) {
        struct sim_device_config config;
        default_device(&config, total);
        bool explicit_uuid = false;
        uint64_t count = 1;
        ok = parse_spec(spec, &config, &count, &explicit_uuid, error, error_size);
        if (ok && explicit_uuid && count > 1) {
            snprintf(error, error_size, "VGPU_SIM_DEVICES: uuid= and count= exclude each other");
            ok = false;
        }
        for (uint64_t i = 0; ok && i < count; i++) {
            if (total == SIM_MAX_DEVICES) {
                snprintf(error, error_size, "VGPU_SIM_DEVICES: at most %d devices",
                         SIM_MAX_DEVICES);
                ok = false;
                break;
            }
            struct sim_device_config *device = &state->devices[total].config;
            *device = config;
            if (!explicit_uuid) { /* numbered by position, like the default ones */
                struct sim_device_config numbered;
                default_device(&numbered, total);
                memcpy(device->uuid, numbered.uuid, sizeof device->uuid);
            }
            device->pci_bus = 0x18 + total;
            snprintf(device->pci_bus_id, sizeof device->pci_bus_id, "00000000:%02X:00.0",
                     device->pci_bus);
            total++;
        }
    }
    free(copy);
    ok = ok && distinct_uuids(state, total, error, error_size);
    state->device_count = total;
    return ok;
}

bool sim_config_load(struct sim_state *state, char *error, size_t error_size) {
    const char *devices = getenv("VGPU_SIM_DEVICES");
    if (!parse_devices(state, devices ? devices : "", error, error_size)) {
        return false;
    }
    const char *driver = getenv("VGPU_SIM_DRIVER_VERSION");
    driver = driver && *driver ? driver : DEFAULT_DRIVER_VERSION;
    if (strlen(driver) >= sizeof state->driver_version ||
        strspn(driver, "0123456789.") != strlen(driver)) {
        snprintf(error, error_size, "VGPU_SIM_DRIVER_VERSION=%s: expected digits and dots",
                 driver);
        return false;
    }
    snprintf(state->driver_version, sizeof state->driver_version, "%s", driver);

    /* "13000" as cuDriverGetVersion reports it, or "13.0". */
    const char *cuda = getenv("VGPU_SIM_CUDA_VERSION");
    uint64_t version = DEFAULT_CUDA_VERSION;
    if (cuda != NULL && *cuda != '\0') {
        unsigned major = 0;
        unsigned minor = 0;
        char tail = 0;
        if (sscanf(cuda, "%u.%u%c", &major, &minor, &tail) == 2 && major > 0 && minor < 100) {
            version = major * 1000ULL + minor * 10ULL;
        } else if (!vgpu_parse_u64(cuda, &version) || version < 1000 || version > 99999) {
            snprintf(error, error_size, "VGPU_SIM_CUDA_VERSION=%s: expected e.g. 13000 or 13.0",
                     cuda);
            return false;
        }
    }
    state->cuda_version = (int32_t)version;
    return true;
}
