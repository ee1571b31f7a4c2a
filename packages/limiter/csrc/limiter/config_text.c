/* Messages about configuration values: "NAME=VALUE: detail", one printable line whatever the
 * value holds (control and non-ASCII bytes escaped, long values cut). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "config_internal.h"

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

static void write_line(char *out, size_t out_size, const char *variable, const char *value,
                       const char *format, va_list arguments) {
    char detail[VGPU_CONFIG_ERROR_SIZE];
    vsnprintf(detail, sizeof detail, format, arguments);
    char name[ESCAPED_SIZE(SHOWN_NAME)];
    escape_text(name, sizeof name, variable, strlen(variable), SHOWN_NAME, false);
    if (value == NULL) {
        snprintf(out, out_size, "%s: %s", name, detail);
        return;
    }
    char shown_value[ESCAPED_SIZE(SHOWN_VALUE)];
    escape_text(shown_value, sizeof shown_value, value, strlen(value), SHOWN_VALUE, false);
    snprintf(out, out_size, "%s=%s: %s", name, shown_value, detail);
}

bool vgpu_config_fail(const struct report *report, const char *format, ...) {
    if (report->error == NULL || report->error_size == 0) {
        return false;
    }
    va_list arguments;
    va_start(arguments, format);
    write_line(report->error, report->error_size, report->name, report->value, format,
               arguments);
    va_end(arguments);
    return false;
}

void vgpu_config_warn(struct vgpu_config *config, const char *name, const char *value,
                      const char *format, ...) {
    if (config->warning_count == VGPU_CONFIG_MAX_WARNINGS) {
        return;
    }
    va_list arguments;
    va_start(arguments, format);
    write_line(config->warnings[config->warning_count++], VGPU_CONFIG_WARNING_SIZE, name, value,
               format, arguments);
    va_end(arguments);
}

const char *vgpu_config_shown(char *buffer, size_t size, const char *text, bool cut) {
    escape_text(buffer, size, text, strlen(text), SHOWN_TOKEN, cut);
    return buffer;
}
