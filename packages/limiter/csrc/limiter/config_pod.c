/* The pod's identity from the environment: its folder (SHM_PATH, or the base folder with
 * POD_NAMESPACE and POD_NAME), its names, and the base folder of the node's shared files. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config_internal.h"
#include "vgpu_parse.h"

#define NAME_RULE "1-253 letters, digits, '.', '_' or '-', not starting with '.' or '-'"

/* A name as the daemon accepts it (vgpu_valid_name); `fallback` when unset. */
static bool load_name(const char *variable, const char *fallback, char *out, size_t out_size,
                      char *error, size_t error_size) {
    const char *value = getenv(variable);
    if (value == NULL) {
        value = fallback;
    }
    struct report report = {error, error_size, variable, value};
    size_t length = strlen(value);
    if (!vgpu_valid_name(value) || length >= out_size) {
        return vgpu_config_fail(&report, "not a valid name (%s)", NAME_RULE);
    }
    memcpy(out, value, length + 1);
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
    vgpu_config_warn(config, "POD_NAME", config->pod_name,
                     "no pod %s/%s on this node (no folder %s): not one the daemon manages, so "
                     "only this environment's limits apply (a typo?)",
                     config->pod_namespace, config->pod_name,
                     vgpu_config_shown(folder, sizeof folder, config->pod_folder, false));
}

bool vgpu_config_load_pod(struct vgpu_config *config, char *error, size_t error_size) {
    if (!load_base(config, error, error_size)) {
        return false;
    }
    const char *shm_path = getenv("SHM_PATH");
    const char *pod_name = getenv("POD_NAME");
    /* Names go into the region header even when SHM_PATH gives the folder. */
    if (pod_name != NULL &&
        (!load_name("POD_NAME", "", config->pod_name, sizeof config->pod_name, error,
                    error_size) ||
         !load_name("POD_NAMESPACE", "default", config->pod_namespace,
                    sizeof config->pod_namespace, error, error_size))) {
        return false;
    }
    if (getenv("CONTAINER_NAME") != NULL &&
        !load_name("CONTAINER_NAME", "", config->container_name, sizeof config->container_name,
                   error, error_size)) {
        return false;
    }
    if (shm_path != NULL && *shm_path != '\0') {
        if (!load_folder("SHM_PATH", shm_path, config->pod_folder, error, error_size)) {
            return false;
        }
        if (strcmp(config->pod_folder, "/") == 0) {
            struct report report = {error, error_size, "SHM_PATH", shm_path};
            return vgpu_config_fail(&report, "the root folder cannot be a pod's folder");
        }
        config->pod_source = VGPU_POD_SHM_PATH;
        return true;
    }
    if (pod_name == NULL) {
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
