/* The limiter's configuration from the environment (syntax in config.h and the docs).
 *
 * Every invalid or contradictory value is an error, one line that starts with NAME=VALUE, so
 * that the core can fail closed instead of running with a limit silently dropped. No heap, no
 * static mutable state: values are parsed in place from getenv's strings into fixed buffers. */
#define _GNU_SOURCE
#include "config.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "log.h"
#include "vgpu_parse.h"

#define MEM_JSON "TENSOR_FUSION_CUDA_MEM_LIMIT"
#define UP_JSON "TENSOR_FUSION_CUDA_UP_LIMIT"
#define MEM_COMPAT "CUDA_DEVICE_MEMORY_LIMIT"
#define SM_COMPAT "CUDA_DEVICE_SM_LIMIT"

/* How many bytes of a variable's value, of a key or value inside it, and of a variable's name
 * an error shows; each byte may take 4 characters once escaped. */
#define SHOWN_VALUE 120
#define SHOWN_TOKEN 48
#define SHOWN_NAME 64
#define ESCAPED_SIZE(bytes) ((bytes) * 4 + 4)

/* Decoded JSON keys and values longer than this are never valid. */
#define TOKEN_SIZE 64

#define UUID_SHAPE "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"

/* ------------------------------------------------------------------------------------------ */
/* Errors: "NAME=VALUE: detail", one line whatever the value holds. */

/* Copies at most `limit` bytes of src[0..length) into dst, escaping control and non-ASCII
 * bytes (so the message stays one printable line), with "..." when cut here or before (`cut`). */
static void escape_text(char *dst, size_t dst_size, const char *src, size_t length, size_t limit,
                        bool cut) {
    size_t used = 0;
    size_t shown = length < limit ? length : limit;
    cut = cut || shown < length;
    for (size_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)src[i];
        char piece[5];
        if (c == '\n') {
            memcpy(piece, "\\n", 3);
        } else if (c == '\r') {
            memcpy(piece, "\\r", 3);
        } else if (c == '\t') {
            memcpy(piece, "\\t", 3);
        } else if (c < 0x20 || c >= 0x7f) {
            snprintf(piece, sizeof piece, "\\x%02x", c);
        } else {
            piece[0] = (char)c;
            piece[1] = '\0';
        }
        size_t piece_length = strlen(piece);
        /* Room for the piece, a "..." and the NUL. */
        if (used + piece_length + 4 > dst_size) {
            cut = true;
            break;
        }
        memcpy(dst + used, piece, piece_length);
        used += piece_length;
    }
    if (cut && used + 4 <= dst_size) {
        memcpy(dst + used, "...", 3);
        used += 3;
    }
    dst[used] = '\0';
}

struct report {
    char *error;
    size_t error_size;
    const char *name; /* the variable, NUL-terminated (possibly a cut copy) */
    const char *value;
};

__attribute__((format(printf, 2, 3))) static bool fail(const struct report *report,
                                                       const char *format, ...) {
    if (report->error == NULL || report->error_size == 0) {
        return false;
    }
    char detail[VGPU_CONFIG_ERROR_SIZE];
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(detail, sizeof detail, format, arguments);
    va_end(arguments);
    char name[ESCAPED_SIZE(SHOWN_NAME)];
    char value[ESCAPED_SIZE(SHOWN_VALUE)];
    escape_text(name, sizeof name, report->name, strlen(report->name), SHOWN_NAME, false);
    escape_text(value, sizeof value, report->value, strlen(report->value), SHOWN_VALUE, false);
    snprintf(report->error, report->error_size, "%s=%s: %s", name, value, detail);
    return false;
}

/* A decoded key or value for messages: escaped, cut, in a caller's buffer. */
static const char *shown(char *buffer, size_t size, const char *text, bool cut) {
    escape_text(buffer, size, text, strlen(text), SHOWN_TOKEN, cut);
    return buffer;
}

/* ------------------------------------------------------------------------------------------ */
/* Device keys and values. */

struct key {
    enum vgpu_key_kind kind;
    int index;
    char uuid[VGPU_CONFIG_UUID_SIZE];
};

static bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* "GPU-" and 8-4-4-4-12 hex digits, any case; stored all lower case, as the region keeps it. */
static bool parse_uuid(const char *text, char *uuid) {
    if (strlen(text) != sizeof UUID_SHAPE - 1 || strncasecmp(text, "GPU-", 4) != 0) {
        return false;
    }
    for (size_t i = 4; i < sizeof UUID_SHAPE - 1; i++) {
        if (UUID_SHAPE[i] == 'x' ? !is_hex(text[i]) : text[i] != UUID_SHAPE[i]) {
            return false;
        }
    }
    /* Stored as NVML prints it: "GPU-" and lower-case hex. */
    for (size_t i = 0; i < sizeof UUID_SHAPE; i++) {
        char c = text[i];
        uuid[i] = i < 4 ? "GPU-"[i] : (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    return true;
}

/* A device index: 0-63 in decimal, no sign, no leading zero (so one index has one spelling). */
static bool parse_index(const char *text, int *index) {
    size_t length = strlen(text);
    if (length == 0 || length > 2 || (length == 2 && text[0] == '0')) {
        return false;
    }
    int value = 0;
    for (size_t i = 0; i < length; i++) {
        if (text[i] < '0' || text[i] > '9') {
            return false;
        }
        value = value * 10 + (text[i] - '0');
    }
    if (value > VGPU_CONFIG_MAX_INDEX) {
        return false;
    }
    *index = value;
    return true;
}

static bool all_digits(const char *text) {
    if (*text == '\0') {
        return false;
    }
    for (; *text != '\0'; text++) {
        if (*text < '0' || *text > '9') {
            return false;
        }
    }
    return true;
}

static bool parse_key(const struct report *report, const char *text, bool cut, struct key *key) {
    memset(key, 0, sizeof *key);
    key->index = -1;
    char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
    if (!cut && *text == '\0') {
        return fail(report, "empty key");
    }
    if (!cut && parse_index(text, &key->index)) {
        key->kind = VGPU_KEY_INDEX;
        return true;
    }
    if (!cut && parse_uuid(text, key->uuid)) {
        key->kind = VGPU_KEY_UUID;
        key->index = -1;
        return true;
    }
    if (all_digits(text)) {
        return fail(report, "device index \"%s\" is out of range (0 to %d, no leading zeros)",
                    shown(buffer, sizeof buffer, text, cut), VGPU_CONFIG_MAX_INDEX);
    }
    return fail(report, "bad device key \"%s\" (a device index 0-%d or a GPU UUID %s)",
                shown(buffer, sizeof buffer, text, cut), VGPU_CONFIG_MAX_INDEX, UUID_SHAPE);
}

static const char *skip_blanks(const char *text) {
    while (*text == ' ' || *text == '\t') {
        text++;
    }
    return text;
}

/* A percent: digits with up to 2 decimals (more only if zeros), optionally "%" when
 * `allow_sign`, blanks around. Result in hundredths; range checked by the caller. */
static bool parse_percent(const char *text, bool allow_sign, uint32_t *hundredths) {
    text = skip_blanks(text);
    uint32_t whole = 0;
    size_t digits = 0;
    for (; *text >= '0' && *text <= '9'; text++, digits++) {
        whole = whole * 10 + (uint32_t)(*text - '0');
        if (whole > 100) {
            return false;
        }
    }
    if (digits == 0) {
        return false;
    }
    uint32_t fraction = 0;
    if (*text == '.') {
        text++;
        size_t decimals = 0;
        for (; *text >= '0' && *text <= '9'; text++, decimals++) {
            if (decimals < 2) {
                fraction = fraction * 10 + (uint32_t)(*text - '0');
            } else if (*text != '0') {
                return false;
            }
        }
        if (decimals == 0) {
            return false;
        }
        if (decimals == 1) {
            fraction *= 10;
        }
    }
    text = skip_blanks(text);
    if (allow_sign && *text == '%') {
        text = skip_blanks(text + 1);
    }
    if (*text != '\0') {
        return false;
    }
    *hundredths = whole * 100 + fraction;
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* Merging settings: each key once, each limit given once (or again with the same value). */

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

static void format_limit(char *buffer, size_t size, bool memory, uint64_t value) {
    if (memory) {
        snprintf(buffer, size, "%" PRIu64 " bytes", value);
    } else {
        snprintf(buffer, size, "%u.%02u%%", (unsigned)(value / 100), (unsigned)(value % 100));
    }
}

static bool set_limit(struct vgpu_config *config, const struct report *report,
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
            return fail(report, "more than %d device keys in all", VGPU_CONFIG_MAX_SETTINGS);
        }
        setting = &config->settings[config->count++];
        memset(setting, 0, sizeof *setting);
        setting->kind = key->kind;
        setting->index = key->index;
        memcpy(setting->uuid, key->uuid, sizeof setting->uuid);
    }
    uint64_t current = memory ? setting->memory_limit : setting->compute_limit;
    char *source = memory ? setting->memory_source : setting->compute_source;
    if (current != 0 && current != value) {
        char old_text[32];
        char new_text[32];
        format_limit(old_text, sizeof old_text, memory, current);
        format_limit(new_text, sizeof new_text, memory, value);
        if (strcmp(source, report->name) == 0 && key_text != NULL) {
            char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
            return fail(report, "key \"%s\" is given twice with different values (%s and %s)",
                        shown(buffer, sizeof buffer, key_text, false), old_text, new_text);
        }
        char device[64];
        describe_key(device, sizeof device, key->kind, key->index, key->uuid);
        return fail(report, "%s %s limit %s contradicts %s from %.63s", device,
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

/* ------------------------------------------------------------------------------------------ */
/* The JSON objects: one level, string keys, number or string values. */

struct json {
    const char *text;
    size_t pos;
    const struct report *report;
};

struct token {
    bool is_string;
    bool cut; /* longer than TOKEN_SIZE - 1: never a valid key or value */
    char text[TOKEN_SIZE];
};

static void skip_space(struct json *json) {
    for (;;) {
        char c = json->text[json->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            return;
        }
        json->pos++;
    }
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

static void keep(struct token *token, size_t *length, char c) {
    if (*length + 1 < sizeof token->text) {
        token->text[(*length)++] = c;
    } else {
        token->cut = true;
    }
}

/* At a '"': decodes the string into token (cut when long), leaves pos after the closing '"'. */
static bool read_string(struct json *json, struct token *token) {
    size_t start = json->pos;
    size_t length = 0;
    token->is_string = true;
    token->cut = false;
    json->pos++;
    for (;;) {
        unsigned char c = (unsigned char)json->text[json->pos];
        if (c == '\0') {
            return fail(json->report, "unterminated string at offset %zu", start);
        }
        if (c < 0x20) {
            return fail(json->report, "control character in a string at offset %zu", json->pos);
        }
        json->pos++;
        if (c == '"') {
            break;
        }
        if (c != '\\') {
            keep(token, &length, (char)c);
            continue;
        }
        static const char escapes[] = "\"\\/bfnrt";
        static const char decoded[] = "\"\\/\b\f\n\r\t";
        char escape = json->text[json->pos];
        const char *plain = escape == '\0' ? NULL : strchr(escapes, escape);
        if (plain != NULL) {
            keep(token, &length, decoded[plain - escapes]);
            json->pos++;
            continue;
        }
        if (escape == '\0') {
            return fail(json->report, "unterminated string at offset %zu", start);
        }
        if (escape != 'u') {
            return fail(json->report, "bad escape in a string at offset %zu", json->pos - 1);
        }
        unsigned code = 0;
        for (int i = 1; i <= 4; i++) {
            int digit = hex_value(json->text[json->pos + (size_t)i]);
            if (digit < 0) {
                return fail(json->report, "bad \\u escape at offset %zu", json->pos - 1);
            }
            code = code * 16 + (unsigned)digit;
        }
        /* Keys and values are ASCII; a NUL would cut the decoded text short. */
        if (code == 0 || code > 0x7f) {
            return fail(json->report, "\\u%04x at offset %zu: only ASCII characters (\\u0001 to "
                        "\\u007f) may be escaped", code, json->pos - 1);
        }
        keep(token, &length, (char)code);
        json->pos += 5;
    }
    token->text[length] = '\0';
    return true;
}

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

/* A JSON number, checked against the JSON grammar; its text is kept for the value parsers. */
static bool read_number(struct json *json, struct token *token) {
    const char *text = json->text;
    size_t start = json->pos;
    size_t pos = start;
    if (text[pos] == '-') {
        pos++;
    }
    if (text[pos] == '0') {
        pos++;
        if (is_digit(text[pos])) {
            return fail(json->report, "bad number (leading zero) at offset %zu", start);
        }
    } else if (is_digit(text[pos])) {
        while (is_digit(text[pos])) {
            pos++;
        }
    } else {
        return fail(json->report, "bad number at offset %zu", start);
    }
    if (text[pos] == '.') {
        pos++;
        if (!is_digit(text[pos])) {
            return fail(json->report, "bad number at offset %zu", start);
        }
        while (is_digit(text[pos])) {
            pos++;
        }
    }
    if (text[pos] == 'e' || text[pos] == 'E') {
        pos++;
        if (text[pos] == '+' || text[pos] == '-') {
            pos++;
        }
        if (!is_digit(text[pos])) {
            return fail(json->report, "bad number at offset %zu", start);
        }
        while (is_digit(text[pos])) {
            pos++;
        }
    }
    token->is_string = false;
    token->cut = pos - start >= sizeof token->text;
    size_t length = token->cut ? sizeof token->text - 1 : pos - start;
    memcpy(token->text, text + start, length);
    token->text[length] = '\0';
    json->pos = pos;
    return true;
}

static bool read_value(struct json *json, struct token *token, const char *key) {
    char c = json->text[json->pos];
    if (c == '"') {
        return read_string(json, token);
    }
    if (c == '-' || is_digit(c)) {
        return read_number(json, token);
    }
    char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
    if (c == '{' || c == '[') {
        return fail(json->report, "key \"%s\" has a nested %s; values are numbers or strings",
                    shown(buffer, sizeof buffer, key, false), c == '{' ? "object" : "array");
    }
    if (c == '\0') {
        return fail(json->report, "value missing for key \"%s\" at the end",
                    shown(buffer, sizeof buffer, key, false));
    }
    return fail(json->report, "key \"%s\" needs a number or a string at offset %zu",
                shown(buffer, sizeof buffer, key, false), json->pos);
}

typedef bool (*apply_value)(struct vgpu_config *config, const struct report *report,
                            const struct key *key, const char *key_text,
                            const struct token *value);

static bool apply_memory(struct vgpu_config *config, const struct report *report,
                         const struct key *key, const char *key_text, const struct token *value) {
    uint64_t bytes = 0;
    bool ok = !value->cut && (value->is_string ? vgpu_parse_size(value->text, &bytes)
                                               : vgpu_parse_u64(value->text, &bytes));
    char key_buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
    char value_buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
    const char *quote = value->is_string ? "\"" : "";
    if (!ok || bytes == 0) {
        return fail(report, "bad size %s%s%s for key \"%s\" (%s)", quote,
                    shown(value_buffer, sizeof value_buffer, value->text, value->cut), quote,
                    shown(key_buffer, sizeof key_buffer, key_text, false),
                    ok ? "a limit of 0 is not allowed"
                       : "a whole number of bytes, or a string such as \"4GiB\" or \"512MiB\"");
    }
    return set_limit(config, report, key, true, bytes, key_text);
}

static bool apply_compute(struct vgpu_config *config, const struct report *report,
                          const struct key *key, const char *key_text, const struct token *value) {
    uint32_t hundredths = 0;
    if (value->cut || !parse_percent(value->text, value->is_string, &hundredths) ||
        hundredths == 0 || hundredths > 10000) {
        char key_buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
        char value_buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
        const char *quote = value->is_string ? "\"" : "";
        return fail(report,
                    "bad percent %s%s%s for key \"%s\" (1 to 100 with at most 2 decimals, "
                    "e.g. 50 or \"12.5%%\")",
                    quote, shown(value_buffer, sizeof value_buffer, value->text, value->cut),
                    quote, shown(key_buffer, sizeof key_buffer, key_text, false));
    }
    return set_limit(config, report, key, false, hundredths, key_text);
}

static bool parse_object(struct vgpu_config *config, const struct report *report,
                         apply_value apply) {
    struct json json = {.text = report->value, .pos = 0, .report = report};
    skip_space(&json);
    if (json.text[json.pos] != '{') {
        return fail(report, "expected a JSON object such as {\"0\": ...}");
    }
    json.pos++;
    skip_space(&json);
    if (json.text[json.pos] == '}') {
        json.pos++;
    } else {
        for (;;) {
            skip_space(&json);
            char c = json.text[json.pos];
            if (c == '}') {
                return fail(report, "trailing comma before offset %zu", json.pos);
            }
            if (c != '"') {
                return fail(report, "expected a string key at offset %zu", json.pos);
            }
            struct token key_token;
            if (!read_string(&json, &key_token)) {
                return false;
            }
            struct key key;
            if (!parse_key(report, key_token.text, key_token.cut, &key)) {
                return false;
            }
            skip_space(&json);
            if (json.text[json.pos] != ':') {
                return fail(report, "expected ':' at offset %zu", json.pos);
            }
            json.pos++;
            skip_space(&json);
            struct token value;
            if (!read_value(&json, &value, key_token.text) ||
                !apply(config, report, &key, key_token.text, &value)) {
                return false;
            }
            skip_space(&json);
            c = json.text[json.pos];
            if (c == ',') {
                json.pos++;
                continue;
            }
            if (c == '}') {
                json.pos++;
                break;
            }
            return fail(report, "expected ',' or '}' at offset %zu", json.pos);
        }
    }
    skip_space(&json);
    if (json.text[json.pos] != '\0') {
        return fail(report, "unexpected text after the object at offset %zu", json.pos);
    }
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* The variables. */

static bool load_json(struct vgpu_config *config, char *error, size_t error_size,
                      const char *name, apply_value apply) {
    const char *value = getenv(name);
    if (value == NULL || *value == '\0') {
        return true;
    }
    struct report report = {error, error_size, name, value};
    return parse_object(config, &report, apply);
}

/* One CUDA_DEVICE_*_LIMIT[_i] value for `key`. */
static bool apply_compat(struct vgpu_config *config, const struct report *report,
                         const struct key *key, bool memory) {
    if (memory) {
        uint64_t bytes = 0;
        if (!vgpu_parse_size(report->value, &bytes)) {
            return fail(report, "bad size (bytes, or a number with a unit such as 4g, 1024m or "
                                "4GiB)");
        }
        if (bytes == 0) {
            return fail(report, "bad size (a limit of 0 is not allowed)");
        }
        return set_limit(config, report, key, true, bytes, NULL);
    }
    uint32_t hundredths = 0;
    if (!parse_percent(report->value, true, &hundredths) || hundredths > 10000) {
        return fail(report, "bad percent (1 to 100 with at most 2 decimals, or 0 for no limit)");
    }
    /* HAMi-core reads 0 as "no limit": keep it as 100 % so it still overrides an all-devices
     * value for its index. */
    return set_limit(config, report, key, false, hundredths == 0 ? 10000 : hundredths, NULL);
}

static bool load_compat_all(struct vgpu_config *config, char *error, size_t error_size,
                            const char *name, bool memory) {
    const char *value = getenv(name);
    if (value == NULL || *value == '\0') {
        return true;
    }
    struct report report = {error, error_size, name, value};
    struct key key = {.kind = VGPU_KEY_ALL, .index = -1, .uuid = ""};
    return apply_compat(config, &report, &key, memory);
}

/* Every CUDA_DEVICE_MEMORY_LIMIT_<i> and CUDA_DEVICE_SM_LIMIT_<i> in the environment; a name
 * with a suffix that is not an index 0-63 is an error rather than a limit ignored. */
static bool load_compat_indexed(struct vgpu_config *config, char *error, size_t error_size) {
    static const struct {
        const char *prefix;
        bool memory;
    } families[] = {{MEM_COMPAT "_", true}, {SM_COMPAT "_", false}};
    for (char **entry = environ; entry != NULL && *entry != NULL; entry++) {
        const char *equals = strchr(*entry, '=');
        if (equals == NULL) {
            continue;
        }
        for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
            size_t prefix_length = strlen(families[f].prefix);
            if (strncmp(*entry, families[f].prefix, prefix_length) != 0) {
                continue;
            }
            const char *value = equals + 1;
            if (*value == '\0') {
                break;
            }
            char name[VGPU_CONFIG_SOURCE_SIZE];
            size_t name_length = (size_t)(equals - *entry);
            bool cut = name_length >= sizeof name;
            size_t copied = cut ? sizeof name - 1 : name_length;
            memcpy(name, *entry, copied);
            name[copied] = '\0';
            struct report report = {error, error_size, name, value};
            struct key key = {.kind = VGPU_KEY_INDEX, .index = -1, .uuid = ""};
            const char *suffix = name + prefix_length;
            if (cut || !parse_index(suffix, &key.index)) {
                char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
                return fail(&report, "\"%s\" is not a device index 0-%d",
                            shown(buffer, sizeof buffer, suffix, cut), VGPU_CONFIG_MAX_INDEX);
            }
            if (!apply_compat(config, &report, &key, families[f].memory)) {
                return false;
            }
            break;
        }
    }
    return true;
}

/* A name that is one safe path component. */
static bool load_name(const char *variable, const char *fallback, char *out, size_t out_size,
                      char *error, size_t error_size) {
    const char *value = getenv(variable);
    if (value == NULL) {
        value = fallback;
    }
    struct report report = {error, error_size, variable, value};
    size_t length = strlen(value);
    if (length == 0 || length >= out_size || strchr(value, '/') != NULL ||
        strcmp(value, ".") == 0 || strcmp(value, "..") == 0) {
        return fail(&report, "not a usable folder name (1 to %zu bytes, no '/', not . or ..)",
                    out_size - 1);
    }
    memcpy(out, value, length + 1);
    return true;
}

/* An absolute path without its trailing '/'s, with room for "/shm" after it. */
static bool load_folder(const char *variable, const char *value, char *out, char *error,
                        size_t error_size) {
    struct report report = {error, error_size, variable, value};
    if (value[0] != '/') {
        return fail(&report, "must be an absolute path");
    }
    size_t length = strlen(value);
    while (length > 1 && value[length - 1] == '/') {
        length--;
    }
    if (length + sizeof "/" VGPU_CONFIG_REGION_FILE > VGPU_CONFIG_PATH_SIZE) {
        return fail(&report, "path longer than %zu bytes",
                    VGPU_CONFIG_PATH_SIZE - sizeof "/" VGPU_CONFIG_REGION_FILE);
    }
    memcpy(out, value, length);
    out[length] = '\0';
    return true;
}

static bool load_pod(struct vgpu_config *config, char *error, size_t error_size) {
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
    if (shm_path != NULL && *shm_path != '\0') {
        if (!load_folder("SHM_PATH", shm_path, config->pod_folder, error, error_size)) {
            return false;
        }
        if (strcmp(config->pod_folder, "/") == 0) {
            struct report report = {error, error_size, "SHM_PATH", shm_path};
            return fail(&report, "the root folder cannot be a pod's folder");
        }
        config->pod_source = VGPU_POD_SHM_PATH;
        return true;
    }
    if (pod_name == NULL) {
        return true;
    }
    const char *base = getenv("SHM_BASE_PATH");
    const char *base_name = "SHM_BASE_PATH";
    if (base == NULL || *base == '\0') {
        base = VGPU_CONFIG_DEFAULT_BASE;
    }
    char folder[VGPU_CONFIG_PATH_SIZE];
    if (!load_folder(base_name, base, folder, error, error_size)) {
        return false;
    }
    /* {base}/{namespace}/{name}, with room left for "/shm"; a base of "/" adds no '/'. */
    size_t base_length = strcmp(folder, "/") == 0 ? 0 : strlen(folder);
    size_t namespace_length = strlen(config->pod_namespace);
    size_t name_length = strlen(config->pod_name);
    size_t length = base_length + 1 + namespace_length + 1 + name_length;
    if (length + sizeof "/" VGPU_CONFIG_REGION_FILE > sizeof config->pod_folder) {
        struct report report = {error, error_size, base_name, base};
        return fail(&report, "the pod folder under it is longer than %zu bytes",
                    VGPU_CONFIG_PATH_SIZE - sizeof "/" VGPU_CONFIG_REGION_FILE);
    }
    char *end = config->pod_folder;
    memcpy(end, folder, base_length);
    end += base_length;
    *end++ = '/';
    memcpy(end, config->pod_namespace, namespace_length);
    end += namespace_length;
    *end++ = '/';
    memcpy(end, config->pod_name, name_length + 1);
    config->pod_source = VGPU_POD_NAME;
    return true;
}

static bool load_log(struct vgpu_config *config, char *error, size_t error_size) {
    static const struct {
        const char *name;
        int level;
    } levels[] = {
        {"error", VGPU_LOG_ERROR}, {"warn", VGPU_LOG_WARN},
        {"warning", VGPU_LOG_WARN}, {"info", VGPU_LOG_INFO},
        {"debug", VGPU_LOG_DEBUG},
    };
    const char *level = getenv("TF_LOG_LEVEL");
    config->log_level = VGPU_LOG_WARN;
    if (level != NULL && *level != '\0') {
        size_t i = 0;
        while (i < sizeof levels / sizeof levels[0] && strcasecmp(level, levels[i].name) != 0) {
            i++;
        }
        if (i == sizeof levels / sizeof levels[0]) {
            struct report report = {error, error_size, "TF_LOG_LEVEL", level};
            return fail(&report, "unknown level (error, warn, info or debug)");
        }
        config->log_level = levels[i].level;
    }
    const char *path = getenv("TF_LOG_PATH");
    if (path != NULL) {
        size_t length = strlen(path);
        if (length >= sizeof config->log_path) {
            struct report report = {error, error_size, "TF_LOG_PATH", path};
            return fail(&report, "path longer than %zu bytes", sizeof config->log_path - 1);
        }
        memcpy(config->log_path, path, length + 1);
    }
    return true;
}

bool vgpu_config_load(struct vgpu_config *config, char *error, size_t error_size) {
    memset(config, 0, sizeof *config);
    config->log_level = VGPU_LOG_WARN;
    if (error != NULL && error_size > 0) {
        error[0] = '\0';
    }
    /* The JSON variables first, so a contradiction names the compatibility variable. */
    return load_json(config, error, error_size, MEM_JSON, apply_memory) &&
           load_json(config, error, error_size, UP_JSON, apply_compute) &&
           load_compat_all(config, error, error_size, MEM_COMPAT, true) &&
           load_compat_all(config, error, error_size, SM_COMPAT, false) &&
           load_compat_indexed(config, error, error_size) &&
           load_pod(config, error, error_size) && load_log(config, error, error_size);
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
        format_limit(uuid_text, sizeof uuid_text, memory, *value);
        format_limit(index_text, sizeof index_text, memory, by_index_value);
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
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* The JSON description, written snprintf-style: counts what does not fit. */

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
    put(writer, ",\"memory_limit\":");
    if (setting->memory_limit != 0) {
        put_u64(writer, setting->memory_limit);
    } else {
        put(writer, "null");
    }
    put(writer, ",\"memory_source\":");
    put_string_or_null(writer, setting->memory_source);
    put(writer, ",\"compute_limit\":");
    if (setting->compute_limit != 0) {
        put_u64(writer, setting->compute_limit);
    } else {
        put(writer, "null");
    }
    put(writer, ",\"compute_source\":");
    put_string_or_null(writer, setting->compute_source);
    put(writer, "}");
}

static void put_config(struct writer *writer, const struct vgpu_config *config) {
    static const char *const sources[] = {"private", "SHM_PATH", "POD_NAME"};
    static const char *const levels[] = {"error", "warn", "info", "debug"};
    put(writer, "{\"ok\":true,\"devices\":[");
    for (unsigned i = 0; i < config->count; i++) {
        if (i > 0) {
            put(writer, ",");
        }
        put_setting(writer, &config->settings[i]);
    }
    put(writer, "],\"pod\":{\"source\":");
    put_string(writer, sources[config->pod_source]);
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
    put(writer, "},\"log\":{\"level\":");
    put_string(writer, levels[config->log_level]);
    put(writer, ",\"path\":");
    put_string_or_null(writer, config->log_path);
    put(writer, "}}");
}

__attribute__((visibility("default"))) int vgpu_limiter_describe_config(char *out, size_t size) {
    struct writer writer = {out, out == NULL ? 0 : size, 0};
    struct vgpu_config config;
    char error[VGPU_CONFIG_ERROR_SIZE];
    if (vgpu_config_load(&config, error, sizeof error)) {
        put_config(&writer, &config);
    } else {
        put(&writer, "{\"ok\":false,\"error\":");
        put_string(&writer, error);
        put(&writer, "}");
    }
    if (writer.size > 0) {
        writer.out[writer.length < writer.size ? writer.length : writer.size - 1] = '\0';
    }
    return writer.length > INT_MAX ? INT_MAX : (int)writer.length;
}
