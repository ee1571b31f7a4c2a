/* The pod's identity from the environment: its folder (SHM_PATH, or the base folder with
 * POD_NAMESPACE and POD_NAME), its names, and the base folder of the node's shared files. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config_internal.h"
#include "vgpu_parse.h"

#define NAME_RULE "1-253 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
#define REQUIRED "TF_REGION_REQUIRED"
#define WAIT "TF_REGION_WAIT"
#define MOST_WAIT_S 3600

/* A name as the daemon accepts it (vgpu_valid_name). */
static bool load_name(const char *variable, const char *value, char *out, size_t out_size,
                      char *error, size_t error_size) {
    struct report report = {error, error_size, variable, value};
    size_t length = strlen(value);
    if (!vgpu_valid_name(value) || length >= out_size) {
        return vgpu_config_fail(&report, "not a valid name (%s)", NAME_RULE);
    }
    memcpy(out, value, length + 1);
    return true;
}

/* The value of `ours` or, when unset, of `theirs` (another system's name for the same thing);
 * both set and different is an error naming both. *name says which one it is; NULL when
 * neither is set (an empty value counts as set for the names, which are then refused). */
static bool either(const char *ours, const char *theirs, const char **value, const char **name,
                   char *error, size_t error_size) {
    const char *first = getenv(ours);
    const char *second = getenv(theirs);
    *value = first != NULL ? first : second;
    *name = first != NULL ? ours : second != NULL ? theirs : NULL;
    if (first != NULL && second != NULL && strcmp(first, second) != 0) {
        struct report report = {error, error_size, theirs, second};
        char shown[ESCAPED_SIZE(SHOWN_TOKEN)];
        return vgpu_config_fail(&report, "contradicts %s=%s (the same setting)", ours,
                                vgpu_config_shown(shown, sizeof shown, first, false));
    }
    return true;
}

/* An absolute path without its trailing '/'s, with room for "/shm" after it. */
static bool load_folder(const char *variable, const char *value, char *out, char *error,
                        size_t error_size) {
    struct report report = {error, error_size, variable, value};
    if (value[0] != '/') {
        return vgpu_config_fail(&report, "must be an absolute path");
    }
    size_t length = strlen(value);
    while (length > 1 && value[length - 1] == '/') {
        length--;
    }
    if (length + sizeof "/" VGPU_CONFIG_REGION_FILE > VGPU_CONFIG_PATH_SIZE) {
        return vgpu_config_fail(&report, "path longer than %zu bytes",
                    VGPU_CONFIG_PATH_SIZE - sizeof "/" VGPU_CONFIG_REGION_FILE);
    }
    memcpy(out, value, length);
    out[length] = '\0';
    return true;
}

/* SHM_BASE_PATH, read whether or not a pod is named: the device leases live under it too. */
static bool load_base(struct vgpu_config *config, char *error, size_t error_size) {
    const char *base = getenv("SHM_BASE_PATH");
    if (base == NULL || *base == '\0') {
        snprintf(config->base_path, sizeof config->base_path, "%s", VGPU_CONFIG_DEFAULT_BASE);
        snprintf(config->base_source, sizeof config->base_source, "default");
        return true;
    }
    snprintf(config->base_source, sizeof config->base_source, "SHM_BASE_PATH");
    return load_folder("SHM_BASE_PATH", base, config->base_path, error, error_size);
}

/* A pod named by POD_NAME whose folder is missing is no pod the daemon manages: most likely a
 * typo, and the process would run with its own limits only. */
static void check_pod_folder(struct vgpu_config *config) {
    /* access rather than stat: stat's symbol is newer than the glibc the library targets. */
    if (access(config->pod_folder, F_OK) == 0 || errno != ENOENT) {
        return;
    }
    char folder[ESCAPED_SIZE(SHOWN_TOKEN)];
    vgpu_config_warn(config, config->pod_name_source, config->pod_name,
                     "no pod %s/%s on this node (no folder %s): not one the daemon manages, so "
                     "only this environment's limits apply (a typo?)",
                     config->pod_namespace, config->pod_name,
                     vgpu_config_shown(folder, sizeof folder, config->pod_folder, false));
}

/* The variables that name the pod's folder itself, most our own first. */
static const struct {
    const char *variable;
    enum vgpu_pod_source source;
    bool file; /* the value is the region file; the folder is its parent */
} folders[] = {
    {"SHM_PATH", VGPU_POD_SHM_PATH, false},
    {"TF_SHM_FILE", VGPU_POD_SHM_FILE, true},
    {"CUDA_DEVICE_MEMORY_SHARED_CACHE", VGPU_POD_SHARED_CACHE, false},
};

/* The folder of each variable that names one; two that name different folders are an error. */
static bool load_named_folder(struct vgpu_config *config, char *error, size_t error_size) {
    const char *chosen = NULL;
    for (size_t i = 0; i < sizeof folders / sizeof folders[0]; i++) {
        const char *value = getenv(folders[i].variable);
        if (value == NULL || *value == '\0') {
            continue;
        }
        char folder[VGPU_CONFIG_PATH_SIZE];
        if (!load_folder(folders[i].variable, value, folder, error, error_size)) {
            return false;
        }
        struct report report = {error, error_size, folders[i].variable, value};
        if (folders[i].file) {
            char *slash = strrchr(folder, '/');
            if (value[strlen(value) - 1] == '/' || strcmp(slash + 1, "..") == 0 ||
                strcmp(slash + 1, ".") == 0) {
                return vgpu_config_fail(&report, "not a file path");
            }
            *(slash == folder ? slash + 1 : slash) = '\0';
        }
        if (strcmp(folder, "/") == 0) {
            return vgpu_config_fail(&report, "the root folder cannot be a pod's folder");
        }
        if (chosen == NULL) {
            memcpy(config->pod_folder, folder, sizeof folder);
            config->pod_source = folders[i].source;
            chosen = folders[i].variable;
        } else if (strcmp(folder, config->pod_folder) != 0) {
            char shown[ESCAPED_SIZE(SHOWN_TOKEN)];
            return vgpu_config_fail(&report, "names the pod folder %s, but %s names %s",
                                    vgpu_config_shown(shown, sizeof shown, folder, false),
                                    chosen, config->pod_folder);
        }
    }
    return true;
}

static bool load_identity(struct vgpu_config *config, char *error, size_t error_size) {
    if (!load_base(config, error, error_size)) {
        return false;
    }
    const char *pod_name;
    const char *name_variable;
    const char *namespace;
    const char *namespace_variable;
    const char *container;
    const char *container_variable;
    const char *uid;
    const char *uid_variable;
    if (!either("POD_NAME", "VGPU_POD_NAME", &pod_name, &name_variable, error, error_size) ||
        !either("POD_NAMESPACE", "VGPU_POD_NAMESPACE", &namespace, &namespace_variable, error,
                error_size) ||
        !either("CONTAINER_NAME", "VGPU_CONTAINER_NAME", &container, &container_variable,
                error, error_size) ||
        false) {
        return false;
    }
    /* vgpu-manager's pod UID: only recorded (shown by check-config). */
    uid = getenv("VGPU_POD_UID");
    uid_variable = "VGPU_POD_UID";
    /* Names go into the region header even when a variable gives the folder. */
    if (pod_name != NULL &&
        (!load_name(name_variable, pod_name, config->pod_name, sizeof config->pod_name, error,
                    error_size) ||
         !load_name(namespace != NULL ? namespace_variable : "POD_NAMESPACE",
                    namespace != NULL ? namespace : "default", config->pod_namespace,
                    sizeof config->pod_namespace, error, error_size))) {
        return false;
    }
    if (pod_name != NULL) {
        snprintf(config->pod_name_source, sizeof config->pod_name_source, "%s", name_variable);
    }
    if (container != NULL) {
        if (!load_name(container_variable, container, config->container_name,
                       sizeof config->container_name, error, error_size)) {
            return false;
        }
        snprintf(config->container_source, sizeof config->container_source, "%s",
                 container_variable);
    }
    if (uid != NULL &&
        !load_name(uid_variable, uid, config->pod_uid, sizeof config->pod_uid, error, error_size)) {
        return false;
    }
    if (!load_named_folder(config, error, error_size)) {
        return false;
    }
    if (config->pod_folder[0] != '\0' || pod_name == NULL) {
        return true;
    }
    /* {base}/{namespace}/{name}, with room left for "/shm"; a base of "/" adds no '/'. */
    const char *base = config->base_path;
    size_t base_length = strcmp(base, "/") == 0 ? 0 : strlen(base);
    size_t namespace_length = strlen(config->pod_namespace);
    size_t name_length = strlen(config->pod_name);
    size_t length = base_length + 1 + namespace_length + 1 + name_length;
    if (length + sizeof "/" VGPU_CONFIG_REGION_FILE > sizeof config->pod_folder) {
        struct report report = {error, error_size, "SHM_BASE_PATH", getenv("SHM_BASE_PATH")};
        return vgpu_config_fail(&report, "the pod folder under it is longer than %zu bytes",
                                VGPU_CONFIG_PATH_SIZE - sizeof "/" VGPU_CONFIG_REGION_FILE);
    }
    char *end = config->pod_folder;
    memcpy(end, base, base_length);
    end += base_length;
    *end++ = '/';
    memcpy(end, config->pod_namespace, namespace_length);
    end += namespace_length;
    *end++ = '/';
    memcpy(end, config->pod_name, name_length + 1);
    config->pod_source = VGPU_POD_NAME;
    check_pod_folder(config);
    return true;
}

/* TF_REGION_REQUIRED=1 (the device plugin's Allocate sets it): the node daemon makes the pod's
 * region before its containers start and passes no limits in the environment, so a process that
 * made a missing region itself would run with no limit at all. It must name a pod. */
static bool load_required(struct vgpu_config *config, char *error, size_t error_size) {
    const char *value = getenv(REQUIRED);
    if (value == NULL || *value == '\0') {
        return true;
    }
    struct report report = {error, error_size, REQUIRED, value};
    if (strcmp(value, "1") == 0 || strcasecmp(value, "true") == 0) {
        config->region_required = true;
    } else if (strcmp(value, "0") != 0 && strcasecmp(value, "false") != 0) {
        return vgpu_config_fail(&report, "expected 1 or true, 0 or false");
    }
    if (config->region_required && config->pod_folder[0] == '\0') {
        return vgpu_config_fail(&report, "names no pod region: SHM_PATH or POD_NAME is unset");
    }
    return true;
}

/* TF_REGION_WAIT=seconds (the device plugin's Allocate sets it): the container's folder gets its
 * region once the daemon has bound the allocation to the pod, which may come a moment after the
 * container starts; a required region that is missing is waited for that long. */
static bool load_wait(struct vgpu_config *config, char *error, size_t error_size) {
    const char *value = getenv(WAIT);
    if (value == NULL || *value == '\0') {
        return true;
    }
    struct report report = {error, error_size, WAIT, value};
    uint64_t seconds;
    if (!vgpu_parse_u64(value, &seconds) || seconds > MOST_WAIT_S) {
        return vgpu_config_fail(&report, "expected a whole number of seconds, 0 to %d",
                                MOST_WAIT_S);
    }
    config->region_wait_s = (unsigned)seconds;
    return true;
}

bool vgpu_config_load_pod(struct vgpu_config *config, char *error, size_t error_size) {
    return load_identity(config, error, error_size) && load_required(config, error, error_size) &&
           load_wait(config, error, error_size);
}
