/* The JSON objects of TENSOR_FUSION_CUDA_*: one level, string keys, number, string or
 * true/false values, checked against the JSON grammar. No heap: keys and values are
 * decoded into fixed tokens, and one longer than any valid key or value is marked cut. */
#define _GNU_SOURCE
#include <string.h>

#include "config_internal.h"

struct json {
    const char *text;
    size_t pos;
    const struct report *report;
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
            return vgpu_config_fail(json->report, "unterminated string at offset %zu", start);
        }
        if (c < 0x20) {
            return vgpu_config_fail(json->report, "control character in a string at offset %zu",
                                    json->pos);
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
            return vgpu_config_fail(json->report, "unterminated string at offset %zu", start);
        }
        if (escape != 'u') {
            return vgpu_config_fail(json->report, "bad escape in a string at offset %zu",
                                    json->pos - 1);
        }
        unsigned code = 0;
        for (int i = 1; i <= 4; i++) {
            int digit = hex_value(json->text[json->pos + (size_t)i]);
            if (digit < 0) {
                return vgpu_config_fail(json->report, "bad \\u escape at offset %zu",
                                        json->pos - 1);
            }
            code = code * 16 + (unsigned)digit;
        }
        /* Keys and values are ASCII; a NUL would cut the decoded text short. */
        if (code == 0 || code > 0x7f) {
            return vgpu_config_fail(json->report,
                                    "\\u%04x at offset %zu: only ASCII characters (\\u0001 to "
                                    "\\u007f) may be escaped",
                                    code, json->pos - 1);
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
            return vgpu_config_fail(json->report, "bad number (leading zero) at offset %zu", start);
        }
    } else if (is_digit(text[pos])) {
        while (is_digit(text[pos])) {
            pos++;
        }
    } else {
        return vgpu_config_fail(json->report, "bad number at offset %zu", start);
    }
    if (text[pos] == '.') {
        pos++;
        if (!is_digit(text[pos])) {
            return vgpu_config_fail(json->report, "bad number at offset %zu", start);
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
            return vgpu_config_fail(json->report, "bad number at offset %zu", start);
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
    /* true and false, for the on/off settings; the value parsers refuse them elsewhere. */
    static const char *const literals[] = {"true", "false"};
    for (size_t i = 0; i < 2; i++) {
        size_t length = strlen(literals[i]);
        if (strncmp(json->text + json->pos, literals[i], length) == 0) {
            token->is_string = false;
            token->cut = false;
            memcpy(token->text, literals[i], length + 1);
            json->pos += length;
            return true;
        }
    }
    char buffer[ESCAPED_SIZE(SHOWN_TOKEN)];
    if (c == '{' || c == '[') {
        return vgpu_config_fail(json->report,
                                "key \"%s\" has a nested %s; values are numbers or strings",
                                vgpu_config_shown(buffer, sizeof buffer, key, false),
                                c == '{' ? "object" : "array");
    }
    if (c == '\0') {
        return vgpu_config_fail(json->report, "value missing for key \"%s\" at the end",
                    vgpu_config_shown(buffer, sizeof buffer, key, false));
    }
    return vgpu_config_fail(json->report, "key \"%s\" needs a number or a string at offset %zu",
                vgpu_config_shown(buffer, sizeof buffer, key, false), json->pos);
}

bool vgpu_config_parse_object(struct vgpu_config *config, const struct report *report,
                         vgpu_config_apply apply) {
    struct json json = {.text = report->value, .pos = 0, .report = report};
    skip_space(&json);
    if (json.text[json.pos] != '{') {
        return vgpu_config_fail(report, "expected a JSON object such as {\"0\": ...}");
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
                return vgpu_config_fail(report, "trailing comma before offset %zu", json.pos);
            }
            if (c != '"') {
                return vgpu_config_fail(report, "expected a string key at offset %zu", json.pos);
            }
            struct token key_token;
            if (!read_string(&json, &key_token)) {
                return false;
            }
            struct key key;
            if (!vgpu_config_parse_key(report, key_token.text, key_token.cut, &key)) {
                return false;
            }
            skip_space(&json);
            if (json.text[json.pos] != ':') {
                return vgpu_config_fail(report, "expected ':' at offset %zu", json.pos);
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
            return vgpu_config_fail(report, "expected ',' or '}' at offset %zu", json.pos);
        }
    }
    skip_space(&json);
    if (json.text[json.pos] != '\0') {
        return vgpu_config_fail(report, "unexpected text after the object at offset %zu", json.pos);
    }
    return true;
}

