/* Single values of the configuration: device keys (an index or a GPU UUID) and percents. */
#define _GNU_SOURCE
#include <string.h>
#include <strings.h>

#include "config_internal.h"

static bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* "GPU-" and 8-4-4-4-12 hex digits, any case; stored all lower case, as the region keeps it. */
bool vgpu_config_parse_uuid(const char *text, char *uuid) {
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
bool vgpu_config_parse_index(const char *text, int *index) {
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

bool vgpu_config_parse_key(const struct report *report, const char *text, bool cut,
                           struct key *key) {
    memset(key, 0, sizeof *key);
    key->index = -1;
    char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
    if (!cut && *text == '\0') {
        return vgpu_config_fail(report, "empty key");
    }
    if (!cut && vgpu_config_parse_index(text, &key->index)) {
        key->kind = VGPU_KEY_INDEX;
        return true;
    }
    if (!cut && vgpu_config_parse_uuid(text, key->uuid)) {
        key->kind = VGPU_KEY_UUID;
        key->index = -1;
        return true;
    }
    if (all_digits(text)) {
        return vgpu_config_fail(report,
                                "device index \"%s\" is out of range (0 to %d, no leading zeros)",
                                vgpu_config_shown(buffer, sizeof buffer, text, cut),
                                VGPU_CONFIG_MAX_INDEX);
    }
    return vgpu_config_fail(report, "bad device key \"%s\" (a device index 0-%d or a GPU UUID %s)",
                            vgpu_config_shown(buffer, sizeof buffer, text, cut),
                            VGPU_CONFIG_MAX_INDEX, UUID_SHAPE);
}

static const char *skip_blanks(const char *text) {
    while (*text == ' ' || *text == '\t') {
        text++;
    }
    return text;
}

/* A percent: digits with up to 2 decimals (more only if zeros), optionally "%" when
 * `allow_sign`, blanks around. Result in hundredths; range checked by the caller. */
bool vgpu_config_parse_percent(const char *text, bool allow_sign, uint32_t *hundredths) {
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
