/* What the config_*.c files share: the one-line error format, warnings, device keys and the
 * parsers of single values. Not part of the limiter's interface (that is config.h). */
#ifndef VGPU_LIMITER_CONFIG_INTERNAL_H
#define VGPU_LIMITER_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* How many bytes of a variable's value, of a key or value inside it, and of a variable's name
 * a message shows; each byte may take 4 characters once escaped. */
#define SHOWN_VALUE 120
#define SHOWN_TOKEN 48
#define SHOWN_NAME 64
#define ESCAPED_SIZE(bytes) ((bytes) * 4 + 4)

#define UUID_SHAPE "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"

/* The variable a message is about: "NAME=VALUE: detail". */
struct report {
    char *error;
    size_t error_size;
    const char *name; /* NUL-terminated (possibly a cut copy) */
    const char *value;
};

/* Writes "NAME=VALUE: detail" into report->error, one printable line; returns false. */
__attribute__((format(printf, 2, 3))) bool vgpu_config_fail(const struct report *report,
                                                             const char *format, ...);

/* Adds "NAME=VALUE: detail" (or "NAME: detail" when value is NULL) to config's warnings; those
 * past VGPU_CONFIG_MAX_WARNINGS are dropped. */
__attribute__((format(printf, 4, 5))) void vgpu_config_warn(struct vgpu_config *config,
                                                             const char *name,
                                                             const char *value,
                                                             const char *format, ...);

/* A decoded key or value for messages: escaped, cut at SHOWN_TOKEN, in a caller's buffer. */
const char *vgpu_config_shown(char *buffer, size_t size, const char *text, bool cut);

struct key {
    enum vgpu_key_kind kind;
    int index;
    char uuid[VGPU_CONFIG_UUID_SIZE];
};

/* A device index: 0-63 in decimal, no sign, no leading zero (one index, one spelling). */
bool vgpu_config_parse_index(const char *text, int *index);

/* "GPU-" and 8-4-4-4-12 hex digits, any case; stored "GPU-" and lower case, as NVML prints. */
bool vgpu_config_parse_uuid(const char *text, char *uuid);

/* A JSON key: an index or a UUID; otherwise false with the error written. `cut`: the text was
 * longer than any valid key. */
bool vgpu_config_parse_key(const struct report *report, const char *text, bool cut,
                           struct key *key);

/* A percent: digits with up to 2 decimals (more only if zeros), optionally "%" when
 * `allow_sign`, blanks around. Result in hundredths; range checked by the caller. */
bool vgpu_config_parse_percent(const char *text, bool allow_sign, uint32_t *hundredths);

/* The limits a device key carries. */
enum vgpu_limit {
    VGPU_LIMIT_MEMORY,        /* bytes */
    VGPU_LIMIT_COMPUTE,       /* hundredths of a percent */
    VGPU_LIMIT_SOFT,          /* hundredths of a percent, >= the compute limit */
    VGPU_LIMIT_OVERSUBSCRIBE, /* 1 on, 0 off */
};
#define VGPU_LIMIT_COUNT 4

/* "memory", "compute", "soft compute", "oversubscription": for messages. */
const char *vgpu_config_limit_name(enum vgpu_limit limit);

/* Whether a setting gives `limit`, its value and the variable that set it. */
bool vgpu_config_setting_has(const struct vgpu_device_setting *setting, enum vgpu_limit limit);
uint64_t vgpu_config_setting_value(const struct vgpu_device_setting *setting,
                                   enum vgpu_limit limit);
const char *vgpu_config_setting_source(const struct vgpu_device_setting *setting,
                                       enum vgpu_limit limit);

/* Records one limit of a key; the same limit given twice must have the same value. `key_text`
 * is the JSON key as written (NULL for variables that name their device). */
bool vgpu_config_set_limit(struct vgpu_config *config, const struct report *report,
                           const struct key *key, enum vgpu_limit limit, uint64_t value,
                           const char *key_text);

/* "4294967296 bytes", "12.50%" or "on"/"off". */
void vgpu_config_format_limit(char *buffer, size_t size, enum vgpu_limit limit, uint64_t value);

/* true/false, 1/0, yes/no, on/off in any case, blanks around; false when none of them. */
bool vgpu_config_parse_bool(const char *text, bool *value);

/* A JSON value: a string (decoded) or a number (its text). */
#define TOKEN_SIZE 64
struct token {
    bool is_string;
    bool cut; /* longer than TOKEN_SIZE - 1: never a valid key or value */
    char text[TOKEN_SIZE];
};

typedef bool (*vgpu_config_apply)(struct vgpu_config *config, const struct report *report,
                                  const struct key *key, const char *key_text,
                                  const struct token *value);

/* A flat JSON object of the variable in `report` (string keys, number or string values); each
 * pair goes to `apply`. */
bool vgpu_config_parse_object(struct vgpu_config *config, const struct report *report,
                              vgpu_config_apply apply);

/* The values of TENSOR_FUSION_CUDA_MEM_LIMIT and _UP_LIMIT, and of CUDA_DEVICE_*_LIMIT[_i]. */
bool vgpu_config_apply_memory(struct vgpu_config *config, const struct report *report,
                              const struct key *key, const char *key_text,
                              const struct token *value);
bool vgpu_config_apply_compute(struct vgpu_config *config, const struct report *report,
                               const struct key *key, const char *key_text,
                               const struct token *value);
bool vgpu_config_apply_soft(struct vgpu_config *config, const struct report *report,
                            const struct key *key, const char *key_text,
                            const struct token *value);
bool vgpu_config_apply_oversubscribe(struct vgpu_config *config, const struct report *report,
                                     const struct key *key, const char *key_text,
                                     const struct token *value);
bool vgpu_config_apply_compat(struct vgpu_config *config, const struct report *report,
                              const struct key *key, bool memory);

/* Each device's soft limit against its compute limit: an error when below, naming both
 * variables; a warning when there is no compute limit to burst from. */
bool vgpu_config_check_soft(struct vgpu_config *config, char *error, size_t error_size);

/* Loaders of the pod identity and of the process settings (config_pod.c, config_process.c). */
bool vgpu_config_load_pod(struct vgpu_config *config, char *error, size_t error_size);
bool vgpu_config_load_process(struct vgpu_config *config, char *error, size_t error_size);

/* The limits of other systems' variables (config_seeds.c): vgpu-manager's and vcuda-hook's;
 * then HAMi-core's GPU_CORE_UTILIZATION_POLICY, once every compute limit is known. */
bool vgpu_config_load_seeds(struct vgpu_config *config, char *error, size_t error_size);
bool vgpu_config_load_policy(struct vgpu_config *config, char *error, size_t error_size);

/* Warnings for variables of other systems that are recognised but not supported yet. */
void vgpu_config_check_foreign(struct vgpu_config *config);

#endif
