/* The limiter's configuration: every variable it reads from the process environment is read
 * here (config.c and config_*.c), so that tf-limiter check-config shows all of them.
 *
 * Limits (per device key):
 *   TENSOR_FUSION_CUDA_MEM_LIMIT   JSON object, key -> bytes (number) or size string ("4GiB")
 *   TENSOR_FUSION_CUDA_UP_LIMIT    JSON object, key -> percent 1-100 (number or "12.5%")
 *   TENSOR_FUSION_CUDA_SOFT_LIMIT  JSON object, key -> burst percent, >= the compute limit
 *   TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE  JSON object, key -> true/false
 *   CUDA_DEVICE_MEMORY_LIMIT[_i]   HAMi-core size ("4g", "1024m"); without _i: every device
 *   CUDA_DEVICE_SM_LIMIT[_i]       HAMi-core percent; 0 means no limit, as in HAMi-core
 *   other systems' variables       vgpu-manager, vcuda-hook, HAMi-core's policy (config_seeds.c)
 * Keys are a device index 0-63 (the CUDA ordinal the program sees) or a GPU UUID
 * ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", any case). For each limit of a device the most
 * specific key applies (UUID, index, all); one key and limit given two values is an error.
 *
 * Pod identity: SHM_PATH (the pod's folder; also TF_SHM_FILE's folder or
 * CUDA_DEVICE_MEMORY_SHARED_CACHE, which must agree), else SHM_BASE_PATH/POD_NAMESPACE/POD_NAME
 * (base /run/tensor-fusion/shm, namespace "default"; VGPU_POD_* the same); neither: no pod (a
 * private region under TMPDIR). CONTAINER_NAME: recorded. Names follow the daemon's rule
 * (vgpu_valid_name).
 * Process: TF_CUDA_CONTEXT_OVERHEAD, TF_CUDA_LIB_PATH, TF_NVML_LIB_PATH, TMPDIR.
 * Logging: TF_LOG_LEVEL (error, warn, info, debug; default warn), else LOGGER_LEVEL, else
 * VCUDA_LOG_LEVEL; TF_LOG_PATH (default stderr).
 * Variables of other systems that are recognised but not supported are warnings.
 *
 * Nothing here allocates, keeps state or aborts; it reads the environment with getenv and
 * environ, so it must not race with setenv in another thread (as every getenv user). */
#ifndef VGPU_LIMITER_CONFIG_H
#define VGPU_LIMITER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VGPU_CONFIG_MAX_SETTINGS 64
#define VGPU_CONFIG_MAX_INDEX 63
#define VGPU_CONFIG_UUID_SIZE 48
#define VGPU_CONFIG_SOURCE_SIZE 64
#define VGPU_CONFIG_PATH_SIZE 4096
#define VGPU_CONFIG_NAME_SIZE 256
/* Room for any message about printable ASCII values; a longer message is cut. */
#define VGPU_CONFIG_ERROR_SIZE 1024
/* The one definition of the default base folder of the pod regions (Python reads it from the
 * library's description, check-config's "base"). */
#define VGPU_CONFIG_DEFAULT_BASE "/run/tensor-fusion/shm"
#define VGPU_CONFIG_DEFAULT_TMP "/tmp"
/* What a CUDA context holds on the device before any allocation (measured on an H100 with
 * CUDA 13: about 518 MiB), rounded up. */
#define VGPU_CONFIG_DEFAULT_CONTEXT_OVERHEAD (544ULL << 20)
#define VGPU_CONFIG_CUDA_LIBRARY "libcuda.so.1"
#define VGPU_CONFIG_NVML_LIBRARY "libnvidia-ml.so.1"
#define VGPU_CONFIG_MAX_WARNINGS 16
#define VGPU_CONFIG_WARNING_SIZE 512
/* The region file inside the pod folder. */
#define VGPU_CONFIG_REGION_FILE "shm"

enum vgpu_key_kind { VGPU_KEY_ALL, VGPU_KEY_INDEX, VGPU_KEY_UUID };

enum vgpu_pod_source {
    VGPU_POD_PRIVATE,  /* neither SHM_PATH nor POD_NAME: the core makes a private region */
    VGPU_POD_SHM_PATH, /* pod_folder is SHM_PATH */
    VGPU_POD_NAME,     /* pod_folder is {SHM_BASE_PATH}/{POD_NAMESPACE}/{POD_NAME} */
    VGPU_POD_SHM_FILE, /* pod_folder is the folder of TF_SHM_FILE (vgpu.rs) */
    VGPU_POD_SHARED_CACHE, /* pod_folder is CUDA_DEVICE_MEMORY_SHARED_CACHE (HAMi-core) */
};

/* One device key with the limits given for it; each (kind, index or uuid) appears once. */
struct vgpu_device_setting {
    enum vgpu_key_kind kind;
    int index;                            /* VGPU_KEY_INDEX: 0-63; otherwise -1 */
    char uuid[VGPU_CONFIG_UUID_SIZE];     /* VGPU_KEY_UUID: "gpu-...", lower case (as the region) */
    uint64_t memory_limit;                /* bytes; 0 = not set */
    uint32_t compute_limit;               /* hundredths of a percent, 1-10000; 0 = not set */
    uint32_t compute_soft_limit;          /* burst: hundredths, >= compute_limit; 0 = not set */
    int oversubscribe;                    /* memory past the limit to host: 1/0; -1 = not set */
    char memory_source[VGPU_CONFIG_SOURCE_SIZE];  /* variable that set it, for messages */
    char compute_source[VGPU_CONFIG_SOURCE_SIZE];
    char soft_source[VGPU_CONFIG_SOURCE_SIZE];
    char oversubscribe_source[VGPU_CONFIG_SOURCE_SIZE];
};

struct vgpu_config {
    struct vgpu_device_setting settings[VGPU_CONFIG_MAX_SETTINGS];
    unsigned count;
    enum vgpu_pod_source pod_source;
    char pod_folder[VGPU_CONFIG_PATH_SIZE]; /* "" = no pod; never ends in '/' */
    char pod_namespace[VGPU_CONFIG_NAME_SIZE]; /* "" when POD_NAME is not set */
    char pod_name[VGPU_CONFIG_NAME_SIZE];
    char pod_name_source[VGPU_CONFIG_SOURCE_SIZE]; /* POD_NAME or VGPU_POD_NAME; "" */
    char pod_uid[VGPU_CONFIG_NAME_SIZE];           /* POD_UID or VGPU_POD_UID; "" */
    char container_name[VGPU_CONFIG_NAME_SIZE]; /* "" when CONTAINER_NAME is not set */
    char container_source[VGPU_CONFIG_SOURCE_SIZE]; /* CONTAINER_NAME, VGPU_CONTAINER_NAME; "" */
    /* TF_REGION_REQUIRED: the node daemon made the pod's region; none is made if it is missing */
    bool region_required;
    /* TF_REGION_WAIT: seconds a required region that is missing is waited for (0: not) */
    unsigned region_wait_s;
    char base_path[VGPU_CONFIG_PATH_SIZE];      /* SHM_BASE_PATH or the default; no trailing '/' */
    char base_source[VGPU_CONFIG_SOURCE_SIZE];  /* "SHM_BASE_PATH" or "default" */
    uint64_t context_overhead;                  /* bytes charged per CUDA context */
    char context_overhead_source[VGPU_CONFIG_SOURCE_SIZE];
    char tmp_folder[VGPU_CONFIG_PATH_SIZE];     /* where a private region goes */
    char tmp_source[VGPU_CONFIG_SOURCE_SIZE];
    char cuda_library[VGPU_CONFIG_PATH_SIZE];   /* a path or a soname for dlopen */
    char cuda_library_source[VGPU_CONFIG_SOURCE_SIZE];
    char nvml_library[VGPU_CONFIG_PATH_SIZE];
    char nvml_library_source[VGPU_CONFIG_SOURCE_SIZE];
    int log_level;                        /* VGPU_LOG_ERROR ... VGPU_LOG_DEBUG of log.h */
    char log_level_source[VGPU_CONFIG_SOURCE_SIZE]; /* the variable, or "default" */
    char log_path[VGPU_CONFIG_PATH_SIZE]; /* "" = stderr */
    /* One line each, "NAME=VALUE: what is ignored or doubtful"; the core logs them. */
    unsigned warning_count;
    char warnings[VGPU_CONFIG_MAX_WARNINGS][VGPU_CONFIG_WARNING_SIZE];
};

/* The limits that apply to one device, from the most specific setting that gives each: UUID,
 * then index, then all devices. Sources point into the config. */
struct vgpu_device_limits {
    uint64_t memory_limit;  /* 0 = none */
    uint32_t compute_limit; /* hundredths of a percent; 0 = none */
    uint32_t compute_soft_limit; /* burst limit, hundredths; 0 = none (no burst) */
    bool oversubscribe;          /* allocations past memory_limit go to host-backed memory */
    const char *memory_source;  /* "" when not set */
    const char *compute_source;
    const char *soft_source;
    const char *oversubscribe_source;
};

/* Reads the environment into `config`. On an invalid or contradictory value returns false with
 * one line in `error` naming the variable and the value (and `config` partly filled). */
bool vgpu_config_load(struct vgpu_config *config, char *error, size_t error_size);

/* The limits for the device the program sees as `index` whose physical UUID is `uuid` (any
 * case; NULL or "" when unknown). False with one line in `error` when an index key and a UUID
 * key both name this device with different values: only the driver can see that conflict. */
bool vgpu_config_device_limits(const struct vgpu_config *config, int index, const char *uuid,
                               struct vgpu_device_limits *limits, char *error,
                               size_t error_size);

/* After the driver listed the `count` devices this process sees, with their UUIDs: a warning in
 * `config` for each key whose limit applies to no GPU, an index key past them (hidden by
 * CUDA_VISIBLE_DEVICES) or, when CUDA_VISIBLE_DEVICES hides nothing, a UUID key of none of
 * them (not on this node). */
void vgpu_config_check_devices(struct vgpu_config *config, int count,
                               const char uuids[][VGPU_CONFIG_UUID_SIZE]);

/* The library to dlopen for the driver (TF_CUDA_LIB_PATH) and NVML (TF_NVML_LIB_PATH), else
 * their sonames: read whenever asked, as the libraries may be needed before the rest. */
const char *vgpu_config_cuda_library(void);
const char *vgpu_config_nvml_library(void);

/* Exported for tf-limiter check-config and the tests: reads the environment and writes a JSON
 * document, {"ok":true,"devices":[...],"pod":{...},"process":{...},"log":{...},
 * "warnings":[...]} or {"ok":false,"error":"..."}.
 * Returns the length written, or needed when it is >= size (as snprintf); out may be NULL when
 * size is 0. */
int vgpu_limiter_describe_config(char *out, size_t size);

#endif
