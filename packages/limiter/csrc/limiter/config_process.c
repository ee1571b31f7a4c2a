/* Settings of the process rather than the pod: the context overhead charged per CUDA context,
 * the real libraries, the folder of a private region, logging. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_internal.h"
#include "log.h"
#include "vgpu_files.h"
#include "vgpu_parse.h"

#define OVERHEAD "TF_CUDA_CONTEXT_OVERHEAD"

/* A pod managed by someone else: its region file or its folder belongs to another user (the
 * daemon makes a tenant's pod folder its own, even when the region is the tenant's). Such a pod
 * must not lower the context charge, or 16 processes could hold 12 GiB under a 4 GiB limit. */
static bool pod_of_another_user(const struct vgpu_config *config) {
    if (config->pod_folder[0] == '\0') {
        return false;
    }
    char region[VGPU_CONFIG_PATH_SIZE];
    struct stat status;
    if (vgpu_stat_at(AT_FDCWD, config->pod_folder, &status) == 0 && status.st_uid != geteuid()) {
        return true;
    }
    /* load_folder left room for the file name. */
    snprintf(region, sizeof region, "%.*s/%s", VGPU_CONFIG_PATH_SIZE - 5, config->pod_folder,
             VGPU_CONFIG_REGION_FILE);
    return vgpu_stat_at(AT_FDCWD, region, &status) == 0 && status.st_uid != geteuid();
}

static bool load_overhead(struct vgpu_config *config, char *error, size_t error_size) {
    const char *value = getenv(OVERHEAD);
    config->context_overhead = VGPU_CONFIG_DEFAULT_CONTEXT_OVERHEAD;
    snprintf(config->context_overhead_source, sizeof config->context_overhead_source, "default");
    if (value == NULL || *value == '\0') {
        return true;
    }
    uint64_t bytes = 0;
    if (!vgpu_parse_size(value, &bytes)) {
        struct report report = {error, error_size, OVERHEAD, value};
        return vgpu_config_fail(&report, "not a size (bytes, or a number with a unit such as "
                                         "512MiB)");
    }
    if (bytes < VGPU_CONFIG_DEFAULT_CONTEXT_OVERHEAD && pod_of_another_user(config)) {
        vgpu_config_warn(config, OVERHEAD, value,
                         "ignored: below the default %llu bytes in a pod managed by another user "
                         "(the daemon's); the default applies",
                         (unsigned long long)VGPU_CONFIG_DEFAULT_CONTEXT_OVERHEAD);
        return true;
    }
    config->context_overhead = bytes;
    snprintf(config->context_overhead_source, sizeof config->context_overhead_source, OVERHEAD);
    return true;
}

/* A path variable: `fallback` when unset or empty (or, with a warning, when not absolute where
 * it must be: TMPDIR is everyone's, the limiter does not fail for it); an error when too long. */
static bool load_path(struct vgpu_config *config, const char *variable, const char *fallback,
                      bool absolute, char *out, char *source, char *error, size_t error_size) {
    const char *value = getenv(variable);
    if (value != NULL && *value != '\0' && absolute && value[0] != '/') {
        vgpu_config_warn(config, variable, value, "not an absolute path: %s is used", fallback);
        value = NULL;
    }
    if (value == NULL || *value == '\0') {
        snprintf(out, VGPU_CONFIG_PATH_SIZE, "%s", fallback);
        snprintf(source, VGPU_CONFIG_SOURCE_SIZE, "default");
        return true;
    }
    struct report report = {error, error_size, variable, value};
    if (strlen(value) >= VGPU_CONFIG_PATH_SIZE) {
        return vgpu_config_fail(&report, "path longer than %d bytes", VGPU_CONFIG_PATH_SIZE - 1);
    }
    snprintf(out, VGPU_CONFIG_PATH_SIZE, "%s", value);
    snprintf(source, VGPU_CONFIG_SOURCE_SIZE, "%s", variable);
    return true;
}

static const char *library(const char *variable, const char *soname) {
    const char *value = getenv(variable);
    return value != NULL && value[0] != '\0' ? value : soname;
}

const char *vgpu_config_cuda_library(void) {
    return library("TF_CUDA_LIB_PATH", VGPU_CONFIG_CUDA_LIBRARY);
}

const char *vgpu_config_nvml_library(void) {
    return library("TF_NVML_LIB_PATH", VGPU_CONFIG_NVML_LIBRARY);
}

struct level_name {
    const char *name;
    int level;
};

/* A level by name, any case; false when unknown. */
static bool find_level(const struct level_name *names, size_t count, const char *text,
                       int *level) {
    for (size_t i = 0; i < count; i++) {
        if (strcasecmp(text, names[i].name) == 0) {
            *level = names[i].level;
            return true;
        }
    }
    return false;
}

/* The log level: TF_LOG_LEVEL, else vgpu-manager's LOGGER_LEVEL (0 fatal, 1 error, 2 warning,
 * 3 info, 4 verbose, 5 detail), else vcuda-hook's VCUDA_LOG_LEVEL (spdlog's names). */
static bool load_level(struct vgpu_config *config, char *error, size_t error_size) {
    static const struct level_name ours[] = {
        {"error", VGPU_LOG_ERROR}, {"warn", VGPU_LOG_WARN},   {"warning", VGPU_LOG_WARN},
        {"info", VGPU_LOG_INFO},   {"debug", VGPU_LOG_DEBUG},
    };
    static const struct level_name manager[] = {
        {"0", VGPU_LOG_ERROR}, {"1", VGPU_LOG_ERROR}, {"2", VGPU_LOG_WARN},
        {"3", VGPU_LOG_INFO},  {"4", VGPU_LOG_DEBUG}, {"5", VGPU_LOG_DEBUG},
    };
    static const struct level_name spdlog[] = {
        {"trace", VGPU_LOG_DEBUG}, {"debug", VGPU_LOG_DEBUG}, {"info", VGPU_LOG_INFO},
        {"warn", VGPU_LOG_WARN},   {"warning", VGPU_LOG_WARN}, {"err", VGPU_LOG_ERROR},
        {"error", VGPU_LOG_ERROR}, {"critical", VGPU_LOG_ERROR}, {"off", VGPU_LOG_ERROR},
    };
    static const struct {
        const char *variable;
        const struct level_name *names;
        size_t count;
        const char *expected;
    } sources[] = {
        {"TF_LOG_LEVEL", ours, sizeof ours / sizeof ours[0], "error, warn, info or debug"},
        {"LOGGER_LEVEL", manager, sizeof manager / sizeof manager[0],
         "0 to 5, as vgpu-manager: 0-1 error, 2 warn, 3 info, 4-5 debug"},
        {"VCUDA_LOG_LEVEL", spdlog, sizeof spdlog / sizeof spdlog[0],
         "trace, debug, info, warn, error, critical or off"},
    };
    config->log_level = VGPU_LOG_WARN;
    snprintf(config->log_level_source, sizeof config->log_level_source, "default");
    bool chosen = false;
    /* Each one set is checked, so a typo is found even where another one wins. */
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
        const char *text = getenv(sources[i].variable);
        int level = VGPU_LOG_WARN;
        if (text == NULL || *text == '\0') {
            continue;
        }
        if (!find_level(sources[i].names, sources[i].count, text, &level)) {
            struct report report = {error, error_size, sources[i].variable, text};
            return vgpu_config_fail(&report, "unknown level (%s)", sources[i].expected);
        }
        if (!chosen) {
            config->log_level = level;
            snprintf(config->log_level_source, sizeof config->log_level_source, "%s",
                     sources[i].variable);
            chosen = true;
        }
    }
    return true;
}

static bool load_log(struct vgpu_config *config, char *error, size_t error_size) {
    if (!load_level(config, error, error_size)) {
        return false;
    }
    const char *path = getenv("TF_LOG_PATH");
    if (path != NULL) {
        size_t length = strlen(path);
        if (length >= sizeof config->log_path) {
            struct report report = {error, error_size, "TF_LOG_PATH", path};
            return vgpu_config_fail(&report, "path longer than %zu bytes",
                                    sizeof config->log_path - 1);
        }
        memcpy(config->log_path, path, length + 1);
    }
    return true;
}

bool vgpu_config_load_process(struct vgpu_config *config, char *error, size_t error_size) {
    return load_overhead(config, error, error_size) &&
           load_path(config, "TF_CUDA_LIB_PATH", VGPU_CONFIG_CUDA_LIBRARY, false,
                     config->cuda_library, config->cuda_library_source, error, error_size) &&
           load_path(config, "TF_NVML_LIB_PATH", VGPU_CONFIG_NVML_LIBRARY, false,
                     config->nvml_library, config->nvml_library_source, error, error_size) &&
           load_path(config, "TMPDIR", VGPU_CONFIG_DEFAULT_TMP, true, config->tmp_folder,
                     config->tmp_source, error, error_size) &&
           load_log(config, error, error_size);
}
