/* tf-limiter check-config's document: the configuration as JSON, written snprintf-style (what
 * does not fit is counted, not written). */
#define _GNU_SOURCE
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "vgpu_export.h"

struct writer {
    char *out;
    size_t size;
    size_t length;
};

static void put_bytes(struct writer *writer, const char *text, size_t length) {
    for (size_t i = 0; i < length; i++) {
        if (writer->length + 1 < writer->size) {
            writer->out[writer->length] = text[i];
        }
        writer->length++;
    }
}

static void put(struct writer *writer, const char *text) {
    put_bytes(writer, text, strlen(text));
}

static void put_u64(struct writer *writer, uint64_t value) {
    char buffer[24];
    snprintf(buffer, sizeof buffer, "%" PRIu64, value);
    put(writer, buffer);
}

/* A JSON string; bytes >= 0x80 go through as they are (the reader decodes them). */
static void put_string(struct writer *writer, const char *text) {
    put(writer, "\"");
    for (; *text != '\0'; text++) {
        unsigned char c = (unsigned char)*text;
        if (c == '"' || c == '\\') {
            char escaped[3] = {'\\', (char)c, '\0'};
            put(writer, escaped);
        } else if (c < 0x20 || c == 0x7f) {
            char escaped[8];
            snprintf(escaped, sizeof escaped, "\\u%04x", c);
            put(writer, escaped);
        } else {
            put_bytes(writer, (const char *)&c, 1);
        }
    }
    put(writer, "\"");
}

static void put_string_or_null(struct writer *writer, const char *text) {
    if (*text == '\0') {
        put(writer, "null");
    } else {
        put_string(writer, text);
    }
}

/* ,"NAME_limit":value,"NAME_source":"source", null for what is not set */
static void put_limit(struct writer *writer, const char *name, uint64_t value,
                      const char *source) {
    put(writer, ",\"");
    put(writer, name);
    put(writer, "_limit\":");
    if (value != 0) {
        put_u64(writer, value);
    } else {
        put(writer, "null");
    }
    put(writer, ",\"");
    put(writer, name);
    put(writer, "_source\":");
    put_string_or_null(writer, source);
}

/* ,"NAME":"value","NAME_source":"source" */
static void put_source(struct writer *writer, const char *name, const char *value,
                       const char *source) {
    put(writer, ",\"");
    put(writer, name);
    put(writer, "\":");
    put_string(writer, value);
    put(writer, ",\"");
    put(writer, name);
    put(writer, "_source\":");
    put_string(writer, source);
}

static void put_setting(struct writer *writer, const struct vgpu_device_setting *setting) {
    static const char *const kinds[] = {"all", "index", "uuid"};
    char key[VGPU_CONFIG_UUID_SIZE];
    if (setting->kind == VGPU_KEY_INDEX) {
        snprintf(key, sizeof key, "%d", setting->index);
    } else {
        snprintf(key, sizeof key, "%s", setting->kind == VGPU_KEY_ALL ? "all" : setting->uuid);
    }
    put(writer, "{\"key\":");
    put_string(writer, key);
    put(writer, ",\"kind\":");
    put_string(writer, kinds[setting->kind]);
    put(writer, ",\"index\":");
    if (setting->kind == VGPU_KEY_INDEX) {
        put_u64(writer, (uint64_t)setting->index);
    } else {
        put(writer, "null");
    }
    put(writer, ",\"uuid\":");
    put_string_or_null(writer, setting->uuid);
    put_limit(writer, "memory", setting->memory_limit, setting->memory_source);
    put_limit(writer, "compute", setting->compute_limit, setting->compute_source);
    put_limit(writer, "soft", setting->compute_soft_limit, setting->soft_source);
    put(writer, ",\"oversubscribe\":");
    put(writer, setting->oversubscribe < 0 ? "null" : setting->oversubscribe ? "true" : "false");
    put(writer, ",\"oversubscribe_source\":");
    put_string_or_null(writer, setting->oversubscribe_source);
    put(writer, "}");
}

static void put_config(struct writer *writer, const struct vgpu_config *config) {
    static const char *const sources[] = {"private", "SHM_PATH", "POD_NAME", "TF_SHM_FILE",
                                          "CUDA_DEVICE_MEMORY_SHARED_CACHE"};
    static const char *const levels[] = {"error", "warn", "info", "debug"};
    put(writer, "{\"ok\":true,\"devices\":[");
    for (unsigned i = 0; i < config->count; i++) {
        if (i > 0) {
            put(writer, ",");
        }
        put_setting(writer, &config->settings[i]);
    }
    put(writer, "],\"pod\":{\"source\":");
    /* A folder made of the names says which variable gave the name. */
    put_string(writer, config->pod_source == VGPU_POD_NAME ? config->pod_name_source
                                                           : sources[config->pod_source]);
    put(writer, ",\"folder\":");
    put_string_or_null(writer, config->pod_folder);
    put(writer, ",\"region_file\":");
    if (config->pod_folder[0] != '\0') {
        char region[VGPU_CONFIG_PATH_SIZE];
        /* load_pod left room for the file name. */
        snprintf(region, sizeof region, "%.*s/%s", VGPU_CONFIG_PATH_SIZE - 5, config->pod_folder,
                 VGPU_CONFIG_REGION_FILE);
        put_string(writer, region);
    } else {
        put(writer, "null");
    }
    put(writer, ",\"namespace\":");
    put_string_or_null(writer, config->pod_namespace);
    put(writer, ",\"name\":");
    put_string_or_null(writer, config->pod_name);
    put(writer, ",\"name_source\":");
    put_string_or_null(writer, config->pod_name_source);
    put(writer, ",\"uid\":");
    put_string_or_null(writer, config->pod_uid);
    put(writer, ",\"container\":");
    put_string_or_null(writer, config->container_name);
    put(writer, ",\"container_source\":");
    put_string_or_null(writer, config->container_source);
    put_source(writer, "base", config->base_path, config->base_source);
    put(writer, ",\"region_required\":");
    put(writer, config->region_required ? "true" : "false");
    put(writer, "},\"process\":{\"context_overhead\":");
    put_u64(writer, config->context_overhead);
    put(writer, ",\"context_overhead_source\":");
    put_string(writer, config->context_overhead_source);
    put_source(writer, "cuda_library", config->cuda_library, config->cuda_library_source);
    put_source(writer, "nvml_library", config->nvml_library, config->nvml_library_source);
    /* "tmp_folder" and "tmp_source". */
    put(writer, ",\"tmp_folder\":");
    put_string(writer, config->tmp_folder);
    put(writer, ",\"tmp_source\":");
    put_string(writer, config->tmp_source);
    put(writer, "},\"log\":{\"level\":");
    put_string(writer, levels[config->log_level]);
    put(writer, ",\"level_source\":");
    put_string(writer, config->log_level_source);
    put(writer, ",\"path\":");
    put_string_or_null(writer, config->log_path);
    put(writer, "},\"warnings\":[");
    for (unsigned i = 0; i < config->warning_count; i++) {
        if (i > 0) {
            put(writer, ",");
        }
        put_string(writer, config->warnings[i]);
    }
    put(writer, "]");
}

VGPU_EXPORT int vgpu_limiter_describe_config(char *out, size_t size) {
    struct writer writer = {out, out == NULL ? 0 : size, 0};
    struct vgpu_config config;
    char error[VGPU_CONFIG_ERROR_SIZE];
    if (vgpu_config_load(&config, error, sizeof error)) {
        put_config(&writer, &config);
    } else {
        put(&writer, "{\"ok\":false,\"error\":");
        put_string(&writer, error);
    }
    /* Where Python reads the default, whatever the environment. */
    put(&writer, ",\"default_base\":");
    put_string(&writer, VGPU_CONFIG_DEFAULT_BASE);
    put(&writer, "}");
    if (writer.size > 0) {
        writer.out[writer.length < writer.size ? writer.length : writer.size - 1] = '\0';
    }
    return writer.length > INT_MAX ? INT_MAX : (int)writer.length;
}
