#define _GNU_SOURCE
#include "vgpu_parse.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *suffix;
    uint64_t factor;
} units[] = {
    {"", 1},
    {"b", 1},
    {"k", 1ULL << 10},
    {"ki", 1ULL << 10},
    {"kib", 1ULL << 10},
    {"kb", 1000ULL},
    {"m", 1ULL << 20},
    {"mi", 1ULL << 20},
    {"mib", 1ULL << 20},
    {"mb", 1000ULL * 1000},
    {"g", 1ULL << 30},
    {"gi", 1ULL << 30},
    {"gib", 1ULL << 30},
    {"gb", 1000ULL * 1000 * 1000},
    {"t", 1ULL << 40},
    {"ti", 1ULL << 40},
    {"tib", 1ULL << 40},
    {"tb", 1000ULL * 1000 * 1000 * 1000},
};

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

/* The blanks a size may have around its number and unit: ASCII white space. */
static bool is_blank(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static const char *skip_spaces(const char *text) {
    while (is_blank(*text)) {
        text++;
    }
    return text;
}

/* factor times the decimal fraction 0.digits[0..count), when that is a whole number (false
 * otherwise). From the last digit back: t = d * factor + t / 10, and t / 10 must be whole at
 * every step, since a remainder there could never be cancelled by the whole terms added later.
 * t stays below 10 * factor, so it fits for any factor below 2^60. */
static bool fraction_bytes(const char *digits, size_t count, uint64_t factor, uint64_t *bytes) {
    uint64_t t = 0;
    for (size_t i = count; i > 0; i--) {
        if (t % 10 != 0) {
            return false;
        }
        t = (uint64_t)(digits[i - 1] - '0') * factor + t / 10;
    }
    if (t % 10 != 0) {
        return false;
    }
    *bytes = t / 10;
    return true;
}

bool vgpu_parse_u64(const char *text, uint64_t *value) {
    if (text == NULL || !is_digit(*text)) {
        return false;
    }
    uint64_t result = 0;
    for (; is_digit(*text); text++) {
        uint64_t digit = (uint64_t)(*text - '0');
        if (result > (UINT64_MAX - digit) / 10) {
            return false;
        }
        result = result * 10 + digit;
    }
    if (*text != '\0') {
        return false;
    }
    *value = result;
    return true;
}

bool vgpu_parse_size(const char *text, uint64_t *bytes) {
    if (text == NULL) {
        return false;
    }
    text = skip_spaces(text);
    uint64_t whole = 0;
    bool too_big = false;
    const char *start = text;
    for (; is_digit(*text); text++) {
        uint64_t digit = (uint64_t)(*text - '0');
        too_big = too_big || whole > (UINT64_MAX - digit) / 10;
        whole = too_big ? 0 : whole * 10 + digit;
    }
    if (text == start) {
        return false;
    }
    const char *fraction = "";
    size_t fraction_digits = 0;
    if (*text == '.') {
        fraction = ++text;
        while (is_digit(*text)) {
            text++;
        }
        fraction_digits = (size_t)(text - fraction);
        if (fraction_digits == 0) {
            return false;
        }
    }
    text = skip_spaces(text);
    size_t unit_length = 0;
    /* ASCII letters only, whatever the host program's locale calls a letter. */
    while ((text[unit_length] >= 'a' && text[unit_length] <= 'z') ||
           (text[unit_length] >= 'A' && text[unit_length] <= 'Z')) {
        unit_length++;
    }
    if (*skip_spaces(text + unit_length) != '\0') {
        return false;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].suffix) != unit_length ||
            strncasecmp(text, units[i].suffix, unit_length) != 0) {
            continue;
        }
        uint64_t factor = units[i].factor;
        uint64_t part = 0;
        if (too_big || (whole != 0 && factor > UINT64_MAX / whole) ||
            !fraction_bytes(fraction, fraction_digits, factor, &part) ||
            whole * factor > UINT64_MAX - part) {
            return false;
        }
        *bytes = whole * factor + part;
        return true;
    }
    return false;
}

bool vgpu_valid_name(const char *text) {
    size_t length = 0;
    for (; text[length] != '\0'; length++) {
        unsigned char c = (unsigned char)text[length];
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '_';
        if (!plain && (length == 0 || (c != '.' && c != '-'))) {
            return false;
        }
        if (length == VGPU_NAME_MAX) {
            return false;
        }
    }
    return length > 0;
}
