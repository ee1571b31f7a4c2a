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

static const char *skip_spaces(const char *text) {
    while (*text == ' ' || *text == '\t') {
        text++;
    }
    return text;
}

bool vgpu_parse_u64(const char *text, uint64_t *value) {
    if (text == NULL || !isdigit((unsigned char)*text)) {
        return false;
    }
    uint64_t result = 0;
    for (; isdigit((unsigned char)*text); text++) {
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
    size_t digits = 0;
    for (; isdigit((unsigned char)*text); text++, digits++) {
        uint64_t digit = (uint64_t)(*text - '0');
        if (whole > (UINT64_MAX - digit) / 10) {
            return false;
        }
        whole = whole * 10 + digit;
    }
    /* Up to 9 fraction digits, kept as an integer numerator over 10^scale. */
    uint64_t fraction = 0;
    uint64_t scale = 1;
    if (*text == '.') {
        text++;
        size_t fraction_digits = 0;
        for (; isdigit((unsigned char)*text); text++, fraction_digits++) {
            if (fraction_digits < 9) {
                fraction = fraction * 10 + (uint64_t)(*text - '0');
                scale *= 10;
            }
        }
        if (fraction_digits == 0) {
            return false;
        }
        digits += fraction_digits;
    }
    if (digits == 0) {
        return false;
    }
    text = skip_spaces(text);
    size_t unit_length = strlen(text);
    while (unit_length > 0 && (text[unit_length - 1] == ' ' || text[unit_length - 1] == '\t')) {
        unit_length--;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].suffix) != unit_length ||
            strncasecmp(text, units[i].suffix, unit_length) != 0) {
            continue;
        }
        uint64_t factor = units[i].factor;
        if (whole != 0 && factor > UINT64_MAX / whole) {
            return false;
        }
        uint64_t result = whole * factor;
        /* fraction / scale of a unit, rounded down; factor * fraction fits: both < 2^40 * 10^9. */
        if (fraction != 0) {
            unsigned __int128 part = (unsigned __int128)factor * fraction / scale;
            if (result > UINT64_MAX - (uint64_t)part) {
                return false;
            }
            result += (uint64_t)part;
        }
        *bytes = result;
        return true;
    }
    return false;
}
