/* The limiter's configuration parsing, built with its source under ASan/UBSan (nox -s sanitize).
 * Prints "N passed, M failed" and exits non-zero on failure. */
#define _GNU_SOURCE
#include "config.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int passed;
static int failed;

/* Large: a file-scope object rather than one on the stack of every case. */
static struct vgpu_config config;
static char error[VGPU_CONFIG_ERROR_SIZE];

#define GIB (1ULL << 30)
#define MIB (1ULL << 20)
#define UUID_A "GPU-abcdef01-2345-6789-abcd-ef0123456789"
#define UUID_A_UPPER "GPU-ABCDEF01-2345-6789-ABCD-EF0123456789"
#define ZEROS_47 "00000000000000000000000000000000000000000000000"
#define UUID_B "GPU-00000000-1111-2222-3333-444444444444"

static void check(int ok, int line, const char *format, const char *detail) {
    if (ok) {
        passed++;
        return;
    }
    failed++;
    fprintf(stderr, "line %d: ", line);
    fprintf(stderr, format, detail);
    fputc('\n', stderr);
}

/* Removes every variable the configuration reads, including all CUDA_DEVICE_*_LIMIT_<i>. */
static void clear_environment(void) {
    static const char *const names[] = {
        "TENSOR_FUSION_CUDA_MEM_LIMIT", "TENSOR_FUSION_CUDA_UP_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT",
        "TENSOR_FUSION_CUDA_SOFT_LIMIT", "TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE",
        "CUDA_DEVICE_SM_LIMIT", "SHM_PATH", "SHM_BASE_PATH", "POD_NAME", "POD_NAMESPACE",
        "TF_LOG_LEVEL", "TF_LOG_PATH", "CONTAINER_NAME", "TF_CUDA_CONTEXT_OVERHEAD",
        "TF_CUDA_LIB_PATH", "TF_NVML_LIB_PATH", "TMPDIR", "CUDA_VISIBLE_DEVICES",
        "CUDA_MEM_LIMIT", "CUDA_CORE_LIMIT", "VCUDA_MEMORY_LIMIT", "LOGGER_LEVEL",
        "GPU_DEVICES_UUID", "VGPU_POD_NAME", "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "VGPU_POD_NAMESPACE", "VGPU_POD_UID", "VGPU_CONTAINER_NAME", "VCUDA_LOG_LEVEL",
        "GPU_CORE_UTILIZATION_POLICY", "TF_SHM_FILE", "HYPERVISOR_IP", "HYPERVISOR_PORT",
        "ENABLE_NVML_HOOKS", "ENABLE_CUDA_HOOKS", "TF_SKIP_HOOKS_IF_NO_LIMIT",
        "TF_VISIBLE_DEVICES", "CONTAINER_NAME",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        unsetenv(names[i]);
    }
    /* And every variable of the other systems' families, which are warnings. */
    for (;;) {
        char name[512] = "";
        for (char **entry = environ; *entry != NULL; entry++) {
            if (strncmp(*entry, "CUDA_", 5) == 0 || strncmp(*entry, "VGPU_", 5) == 0 ||
                strncmp(*entry, "VCUDA_", 6) == 0 || strncmp(*entry, "GPU_", 4) == 0) {
                size_t length = strcspn(*entry, "=");
                if (length >= sizeof name) {
                    length = sizeof name - 1;
                }
                memcpy(name, *entry, length);
                name[length] = '\0';
                break;
            }
        }
        if (name[0] == '\0') {
            return;
        }
        unsetenv(name);
    }
}

/* A failure message: starts with `variable`=, is one printable line, fits the buffer. */
static void check_error_line(const char *variable, int line) {
    size_t length = strlen(variable);
    check(strncmp(error, variable, length) == 0 && error[length] == '=', line,
          "error does not start with the variable: %s", error);
    int printable = 1;
    for (const char *c = error; *c != '\0'; c++) {
        printable &= *c >= 0x20 && *c < 0x7f;
    }
    check(printable, line, "error is not one printable line: %s", error);
    check(strlen(error) < sizeof error - 1, line, "error was cut: %s", error);
}

static int load(void) {
    memset(error, 'x', sizeof error);
    error[sizeof error - 1] = '\0';
    return vgpu_config_load(&config, error, sizeof error);
}

#define EXPECT_OK()                                                                              \
    do {                                                                                         \
        int ok_ = load();                                                                        \
        check(ok_, __LINE__, "unexpected error: %s", error);                                     \
    } while (0)

/* Fails with an error that names `variable` and contains `expected`. */
#define EXPECT_ERROR(variable, expected)                                                         \
    do {                                                                                         \
        int ok_ = load();                                                                        \
        check(!ok_, __LINE__, "accepted; expected an error with %s", expected);                 \
        if (!ok_) {                                                                              \
            check_error_line(variable, __LINE__);                                                \
            check(strstr(error, expected) != NULL, __LINE__, "error: %s", error);                \
        }                                                                                        \
    } while (0)

#define EXPECT_EQ(got, expected)                                                                 \
    check((got) == (expected), __LINE__, "%s differs", #got " == " #expected)
#define EXPECT_STR(got, expected)                                                                \
    check(strcmp((got), (expected)) == 0, __LINE__, "got \"%s\", expected " #expected, (got))

static const struct vgpu_device_setting *find(enum vgpu_key_kind kind, int index,
                                              const char *uuid) {
    for (unsigned i = 0; i < config.count; i++) {
        const struct vgpu_device_setting *setting = &config.settings[i];
        if (setting->kind == kind && (kind != VGPU_KEY_INDEX || setting->index == index) &&
            (kind != VGPU_KEY_UUID || strcmp(setting->uuid, uuid) == 0)) {
            return setting;
        }
    }
    return NULL;
}

/* The memory (or compute) limit set for a key; UINT64_MAX when the key is missing. */
static uint64_t memory_of(enum vgpu_key_kind kind, int index, const char *uuid) {
    const struct vgpu_device_setting *setting = find(kind, index, uuid);
    return setting == NULL ? UINT64_MAX : setting->memory_limit;
}

static uint64_t compute_of(enum vgpu_key_kind kind, int index, const char *uuid) {
    const struct vgpu_device_setting *setting = find(kind, index, uuid);
    return setting == NULL ? UINT64_MAX : setting->compute_limit;
}

static void set_memory(const char *json) {
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", json, 1);
}

static void set_compute(const char *json) {
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_UP_LIMIT", json, 1);
}

static void defaults(void) {
    clear_environment();
    EXPECT_OK();
    EXPECT_EQ(config.count, 0u);
    EXPECT_EQ(config.pod_source, VGPU_POD_PRIVATE);
    EXPECT_STR(config.pod_folder, "");
    EXPECT_STR(config.pod_name, "");
    EXPECT_EQ(config.log_level, VGPU_LOG_WARN);
    EXPECT_STR(config.log_path, "");
    /* Empty values are unset. */
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "", 1);
    setenv("CUDA_DEVICE_MEMORY_LIMIT", "", 1);
    setenv("CUDA_DEVICE_SM_LIMIT_3", "", 1);
    setenv("TF_LOG_LEVEL", "", 1);
    setenv("SHM_PATH", "", 1);
    EXPECT_OK();
    EXPECT_EQ(config.count, 0u);
    set_memory("{}");
    EXPECT_OK();
    EXPECT_EQ(config.count, 0u);
    set_memory(" \t\n{ \r\n}\n ");
    EXPECT_OK();
}

static void memory_json(void) {
    set_memory("{\"0\":\"4GiB\"}");
    EXPECT_OK();
    EXPECT_EQ(config.count, 1u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 0, NULL), 4 * GIB);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 0, NULL), 0u);
    EXPECT_STR(config.settings[0].memory_source, "TENSOR_FUSION_CUDA_MEM_LIMIT");
    EXPECT_STR(config.settings[0].compute_source, "");
    EXPECT_STR(config.settings[0].uuid, "");

    set_memory("{\"0\": 1073741824, \"" UUID_A_UPPER "\": \"512MiB\", \"63\": \"1.5g\"}");
    EXPECT_OK();
    EXPECT_EQ(config.count, 3u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 0, NULL), GIB);
    EXPECT_EQ(memory_of(VGPU_KEY_UUID, -1, UUID_A), 512 * MIB);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 63, NULL), 3 * GIB / 2);
    EXPECT_EQ(find(VGPU_KEY_UUID, -1, UUID_A)->index, -1);

    /* Unit spellings from vgpu_parse_size; blanks everywhere JSON allows them. */
    set_memory("  {\n \"1\" :\t\"4 g\" ,\"2\":\"1024m\",\"3\":\"2KB\",\"4\":\"7\", "
               "\"5\":\"1TiB\"}  ");
    EXPECT_OK();
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 1, NULL), 4 * GIB);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 2, NULL), GIB);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 3, NULL), 2000u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 4, NULL), 7u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 5, NULL), 1ULL << 40);

    /* Escapes in keys and values. */
    set_memory("{\"\\u0030\":\"1\\u0067\", \"\\u0047PU-abcdef01-2345-6789-abcd-ef0123456789\":1}");
    EXPECT_OK();
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 0, NULL), GIB);
    EXPECT_EQ(memory_of(VGPU_KEY_UUID, -1, UUID_A), 1u);

    /* The same key twice with the same value, in two spellings. */
    set_memory("{\"0\":\"1GiB\",\"0\":1073741824,\"" UUID_A "\":5,\"" UUID_A_UPPER "\":\"5\"}");
    EXPECT_OK();
    EXPECT_EQ(config.count, 2u);

    /* Fractions that make whole bytes, however many digits; blanks are ASCII white space. */
    set_memory("{\"0\":\"1.5KiB\",\"1\":\"0.25k\",\"2\":\"1.0000000000000000000000g\","
               "\"3\":\"0.000000000931322574615478515625GiB\",\"4\":\"1.5KB\","
               "\"5\":\"\\n\\f4\\rg\\u000b \",\"6\":\"00012b\",\"7\":\"16777215.999999940395355224609375TiB\"}");
    EXPECT_OK();
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 0, NULL), 1536u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 1, NULL), 256u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 2, NULL), GIB);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 3, NULL), 1u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 4, NULL), 1500u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 5, NULL), 4 * GIB);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 6, NULL), 12u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 7, NULL), UINT64_MAX - (1ULL << 16) + 1);

    set_memory("{\"0\": 18446744073709551615}");
    EXPECT_OK();
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 0, NULL), UINT64_MAX);
}

static void memory_json_errors(void) {
    set_memory("{\"0\":\"4XB\"}");
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", "");
    static const char message[] =
        "TENSOR_FUSION_CUDA_MEM_LIMIT={\"0\":\"4XB\"}: bad size \"4XB\" for key \"0\" (";
    check(strncmp(error, message, sizeof message - 1) == 0, __LINE__, "message: %s", error);

    static const struct {
        const char *json;
        const char *expected;
    } cases[] = {
        {"{\"0\":0}", "bad size 0 for key \"0\" (a limit of 0 is not allowed)"},
        {"{\"0\":\"0GiB\"}", "bad size \"0GiB\""},
        {"{\"0\":\"0.1B\"}", "bad size \"0.1B\" for key \"0\" (a whole number of bytes"},
        {"{\"0\":\"0.1KiB\"}", "bad size \"0.1KiB\""},
        {"{\"0\":\"4.0000001GiB\"}", "bad size \"4.0000001GiB\""},
        {"{\"0\":\".5g\"}", "bad size \".5g\""},
        {"{\"0\":\"5.g\"}", "bad size \"5.g\""},
        {"{\"0\":\"4 g b\"}", "bad size \"4 g b\""},
        {"{\"0\":-1}", "bad size -1"},
        {"{\"0\":1.5}", "bad size 1.5"},
        {"{\"0\":1e9}", "bad size 1e9"},
        {"{\"0\":18446744073709551616}", "bad size 18446744073709551616"},
        {"{\"0\":\"16EiB\"}", "bad size \"16EiB\""},
        {"{\"0\":\"99999999999TiB\"}", "bad size"},
        {"{\"0\":\"\"}", "bad size \"\""},
        {"{\"0\":true}", "bad size true for key \"0\""},
        {"{\"0\":nul}", "key \"0\" needs a number or a string"},
        {"{\"0\":null}", "needs a number or a string"},
        {"{\"0\":{}}", "key \"0\" has a nested object"},
        {"{\"0\":[1]}", "key \"0\" has a nested array"},
        {"[]", "expected a JSON object"},
        {"\"4GiB\"", "expected a JSON object"},
        {"4GiB", "expected a JSON object"},
        {" ", "expected a JSON object"},
        {"{\"0\":\"1g\",}", "trailing comma"},
        {"{\"0\":\"1g\"} x", "unexpected text after the object at offset 11"},
        {"{\"0\":\"1g\"}}", "unexpected text after the object"},
        {"{\"0\":\"1g\"}{}", "unexpected text after the object"},
        {"{,}", "expected a string key at offset 1"},
        {"{\"0\" \"1g\"}", "expected ':' at offset 5"},
        {"{\"0\":}", "needs a number or a string at offset 5"},
        {"{\"0\":", "value missing for key \"0\""},
        {"{\"0\":\"1g\"", "expected ',' or '}'"},
        {"{\"0\":\"1g\" \"1\":\"1g\"}", "expected ',' or '}'"},
        {"{", "expected a string key"},
        {"{0:1}", "expected a string key"},
        {"{'0':1}", "expected a string key"},
        {"{\"0\":01}", "bad number (leading zero) at offset 5"},
        {"{\"0\":-01}", "bad number (leading zero)"},
        {"{\"0\":-}", "bad number"},
        {"{\"0\":1.}", "bad number"},
        {"{\"0\":1e}", "bad number"},
        {"{\"\":\"1g\"}", "empty key"},
        {"{\"gpu0\":\"1g\"}", "bad device key \"gpu0\""},
        {"{\"MIG-abcdef01-2345-6789-abcd-ef0123456789\":\"1g\"}", "bad device key \"MIG-"},
        {"{\"GPU-abcdef01-2345-6789-abcd-ef012345678\":\"1g\"}", "bad device key"},
        {"{\"GPU-abcdef01-2345-6789-abcd-ef012345678g\":\"1g\"}", "bad device key"},
        {"{\"GPU_abcdef01-2345-6789-abcd-ef0123456789\":\"1g\"}", "bad device key"},
        {"{\" 0\":\"1g\"}", "bad device key \" 0\""},
        {"{\"-1\":\"1g\"}", "bad device key \"-1\""},
        {"{\"64\":\"1g\"}", "device index \"64\" is out of range"},
        {"{\"01\":\"1g\"}", "device index \"01\" is out of range"},
        {"{\"99999999999999999999999\":\"1g\"}", "is out of range"},
        {"{\"0\":\"1g\",\"0\":\"2g\"}",
         "key \"0\" is given twice with different values (1073741824 bytes and 2147483648 bytes)"},
        {"{\"" UUID_A "\":\"1g\",\"" UUID_A_UPPER "\":\"2g\"}",
         "key \"" UUID_A_UPPER "\" is given twice"},
        {"{\"\\u00e9\":1}", "\\u00e9 at offset 2: only ASCII"},
        {"{\"\\u0000\":1}", "\\u0000 at offset 2"},
        {"{\"\\x\":1}", "bad escape in a string at offset 2"},
        {"{\"\\u12G4\":1}", "bad \\u escape at offset 2"},
        {"{\"\\u12", "bad \\u escape"},
        {"{\"0\":\"1g", "unterminated string at offset 5"},
        {"{\"0\":\"1g\\", "unterminated string at offset 5"},
        {"{\"0\":\"4\nGiB\"}", "control character in a string at offset 7"},
        {"{\"0\":\"\xc3\xa9\"}", "bad size \"\\xc3\\xa9\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        set_memory(cases[i].json);
        EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", cases[i].expected);
    }
    /* The newline of the value is shown escaped. */
    set_memory("{\"0\":\"4\nGiB\"}");
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", "={\"0\":\"4\\nGiB\"}: ");
}

static void long_values(void) {
    /* A long value is cut in the message, which stays one line. */
    static char text[20000];
    memset(text, 'x', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    set_memory(text);
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", "...: expected a JSON object");

    /* A long key and a long value inside the object. */
    snprintf(text, sizeof text, "{\"%0500d\":1}", 7);
    set_memory(text);
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", "...\" is out of range");
    snprintf(text, sizeof text, "{\"0\":\"%0500d\"}", 7);
    set_memory(text);
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", "...\" for key \"0\"");
    /* A number longer than the token buffer is never taken for its first digits. */
    snprintf(text, sizeof text, "{\"0\":1%099d}", 0);
    set_memory(text);
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", "bad size 1" ZEROS_47 "... for key \"0\"");
    snprintf(text, sizeof text, "{\"0\":\"%s\"}",
             "1                                                                 g");
    set_memory(text);
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", "bad size");
    /* Non-ASCII and control bytes are escaped. */
    set_memory("{\"\xff\x7f\":1}");
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT",
                 "={\"\\xff\\x7f\":1}: bad device key \"\\xff\\x7f\"");
    set_memory("{\"\x01\":1}");
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT",
                 "={\"\\x01\":1}: control character in a string at offset 2");
    /* Deep nesting is refused at the first level. */
    memset(text, '[', 10000);
    text[10000] = '\0';
    set_memory(text);
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", "expected a JSON object");
    text[0] = '{';
    memcpy(text + 1, "\"0\":", 4);
    set_memory(text);
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", "nested array");
}

static void too_many_keys(void) {
    static char text[4096];
    size_t used = (size_t)snprintf(text, sizeof text, "{");
    for (int i = 0; i <= VGPU_CONFIG_MAX_INDEX; i++) {
        used += (size_t)snprintf(text + used, sizeof text - used, "%s\"%d\":%d", i ? "," : "", i,
                                 i + 1);
    }
    snprintf(text + used, sizeof text - used, "}");
    set_memory(text);
    EXPECT_OK();
    EXPECT_EQ(config.count, 64u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 63, NULL), 64u);
    setenv("CUDA_DEVICE_MEMORY_LIMIT", "1g", 1);
    EXPECT_ERROR("CUDA_DEVICE_MEMORY_LIMIT", "more than 64 device keys");
    /* A compute limit for a key that exists takes no new entry. */
    unsetenv("CUDA_DEVICE_MEMORY_LIMIT");
    setenv("TENSOR_FUSION_CUDA_UP_LIMIT", "{\"5\":20}", 1);
    EXPECT_OK();
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 5, NULL), 2000u);
}

static void compute_json(void) {
    set_compute("{\"0\":50,\"1\":\"12.5%\",\"2\":\"100\",\"3\":0.01,\"4\":12.50,\"5\":\"7.100\","
                "\"6\":\" 33 % \",\"7\":1,\"" UUID_B "\":99.99}");
    EXPECT_OK();
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 0, NULL), 5000u);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 1, NULL), 1250u);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 2, NULL), 10000u);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 3, NULL), 1u);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 4, NULL), 1250u);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 5, NULL), 710u);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 6, NULL), 3300u);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 7, NULL), 100u);
    EXPECT_EQ(compute_of(VGPU_KEY_UUID, -1, UUID_B), 9999u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 0, NULL), 0u);
    EXPECT_STR(find(VGPU_KEY_INDEX, 0, NULL)->compute_source, "TENSOR_FUSION_CUDA_UP_LIMIT");

    static const struct {
        const char *json;
        const char *expected;
    } cases[] = {
        {"{\"0\":0}", "bad percent 0 for key \"0\""},
        {"{\"0\":\"0%\"}", "bad percent \"0%\""},
        {"{\"0\":0.001}", "bad percent 0.001"},
        {"{\"0\":101}", "bad percent 101"},
        {"{\"0\":100.01}", "bad percent 100.01"},
        {"{\"0\":1000000000000000000000}", "bad percent"},
        {"{\"0\":\"50%%\"}", "bad percent \"50%%\""},
        {"{\"0\":\"%50\"}", "bad percent"},
        {"{\"0\":12.345}", "bad percent 12.345"},
        {"{\"0\":\"abc\"}", "bad percent \"abc\""},
        {"{\"0\":\"\"}", "bad percent \"\""},
        {"{\"0\":-5}", "bad percent -5"},
        {"{\"0\":1e2}", "bad percent 1e2"},
        {"{\"0\":\"50.\"}", "bad percent"},
        {"{\"0\":\".5\"}", "bad percent"},
        {"{\"0\":50,\"0\":60}", "given twice with different values (50.00% and 60.00%)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        set_compute(cases[i].json);
        EXPECT_ERROR("TENSOR_FUSION_CUDA_UP_LIMIT", cases[i].expected);
    }
    /* The memory variable is checked first. */
    set_compute("{\"0\":0}");
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "{\"0\":0}", 1);
    EXPECT_ERROR("TENSOR_FUSION_CUDA_MEM_LIMIT", "bad size");
}

static void merged(void) {
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "{\"0\":\"2GiB\",\"" UUID_A "\":\"3GiB\"}", 1);
    setenv("TENSOR_FUSION_CUDA_UP_LIMIT", "{\"0\":25,\"1\":75}", 1);
    EXPECT_OK();
    EXPECT_EQ(config.count, 3u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 0, NULL), 2 * GIB);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 0, NULL), 2500u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 1, NULL), 0u);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 1, NULL), 7500u);
    EXPECT_EQ(compute_of(VGPU_KEY_UUID, -1, UUID_A), 0u);
}

static void compatibility(void) {
    clear_environment();
    setenv("CUDA_DEVICE_MEMORY_LIMIT", "4g", 1);
    setenv("CUDA_DEVICE_MEMORY_LIMIT_1", "1024m", 1);
    setenv("CUDA_DEVICE_SM_LIMIT", "30", 1);
    setenv("CUDA_DEVICE_SM_LIMIT_0", "0", 1);
    setenv("CUDA_DEVICE_SM_LIMIT_2", "12.5", 1);
    EXPECT_OK();
    EXPECT_EQ(memory_of(VGPU_KEY_ALL, -1, NULL), 4 * GIB);
    EXPECT_EQ(compute_of(VGPU_KEY_ALL, -1, NULL), 3000u);
    EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 1, NULL), GIB);
    /* HAMi-core's 0: no limit, kept as 100 % so that it overrides the 30 % for device 0. */
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 0, NULL), 10000u);
    EXPECT_EQ(compute_of(VGPU_KEY_INDEX, 2, NULL), 1250u);
    EXPECT_STR(find(VGPU_KEY_ALL, -1, NULL)->memory_source, "CUDA_DEVICE_MEMORY_LIMIT");
    EXPECT_STR(find(VGPU_KEY_INDEX, 1, NULL)->memory_source, "CUDA_DEVICE_MEMORY_LIMIT_1");
    EXPECT_STR(find(VGPU_KEY_INDEX, 0, NULL)->compute_source, "CUDA_DEVICE_SM_LIMIT_0");

    struct vgpu_device_limits limits;
    check(vgpu_config_device_limits(&config, 0, UUID_A, &limits, error, sizeof error), __LINE__,
          "%s", error);
    EXPECT_EQ(limits.memory_limit, 4 * GIB);
    EXPECT_EQ(limits.compute_limit, 10000u);
    EXPECT_STR(limits.memory_source, "CUDA_DEVICE_MEMORY_LIMIT");
    check(vgpu_config_device_limits(&config, 1, NULL, &limits, error, sizeof error), __LINE__,
          "%s", error);
    EXPECT_EQ(limits.memory_limit, GIB);
    EXPECT_EQ(limits.compute_limit, 3000u);

    /* Agreeing values from both families. */
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "{\"0\":\"2GiB\"}", 1);
    setenv("CUDA_DEVICE_MEMORY_LIMIT_0", "2g", 1);
    setenv("TENSOR_FUSION_CUDA_UP_LIMIT", "{\"3\":40}", 1);
    setenv("CUDA_DEVICE_SM_LIMIT_3", "40%", 1);
    EXPECT_OK();
    EXPECT_EQ(config.count, 2u);
    EXPECT_STR(find(VGPU_KEY_INDEX, 0, NULL)->memory_source, "TENSOR_FUSION_CUDA_MEM_LIMIT");

    /* Contradictions name the compatibility variable and the JSON one. */
    setenv("CUDA_DEVICE_MEMORY_LIMIT_0", "1g", 1);
    EXPECT_ERROR("CUDA_DEVICE_MEMORY_LIMIT_0",
                 "CUDA_DEVICE_MEMORY_LIMIT_0=1g: device 0 memory limit 1073741824 bytes "
                 "contradicts 2147483648 bytes from TENSOR_FUSION_CUDA_MEM_LIMIT");
    setenv("CUDA_DEVICE_MEMORY_LIMIT_0", "2g", 1);
    setenv("CUDA_DEVICE_SM_LIMIT_3", "41", 1);
    EXPECT_ERROR("CUDA_DEVICE_SM_LIMIT_3",
                 "device 3 compute limit 41.00% contradicts 40.00% from "
                 "TENSOR_FUSION_CUDA_UP_LIMIT");
    /* The all-devices value does not contradict an index: it is overridden. */
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "{\"0\":\"2GiB\"}", 1);
    setenv("CUDA_DEVICE_MEMORY_LIMIT", "8g", 1);
    EXPECT_OK();

    static const struct {
        const char *name;
        const char *value;
        const char *expected;
    } cases[] = {
        {"CUDA_DEVICE_MEMORY_LIMIT", "4x", "CUDA_DEVICE_MEMORY_LIMIT=4x: bad size"},
        {"CUDA_DEVICE_MEMORY_LIMIT", "0", "a limit of 0 is not allowed"},
        {"CUDA_DEVICE_MEMORY_LIMIT", "-1g", "bad size"},
        {"CUDA_DEVICE_MEMORY_LIMIT_1", "0m", "CUDA_DEVICE_MEMORY_LIMIT_1=0m: bad size"},
        {"CUDA_DEVICE_MEMORY_LIMIT_64", "1g", "\"64\" is not a device index 0-63"},
        {"CUDA_DEVICE_MEMORY_LIMIT_01", "1g", "\"01\" is not a device index"},
        {"CUDA_DEVICE_MEMORY_LIMIT_x", "1g", "CUDA_DEVICE_MEMORY_LIMIT_x=1g: \"x\" is not"},
        {"CUDA_DEVICE_MEMORY_LIMIT_", "1g", "\"\" is not a device index"},
        {"CUDA_DEVICE_MEMORY_LIMIT_0000000000000000000000000000000000000000000000000000", "1g",
         "is not a device index"},
        {"CUDA_DEVICE_SM_LIMIT", "101", "CUDA_DEVICE_SM_LIMIT=101: bad percent"},
        {"CUDA_DEVICE_SM_LIMIT", "half", "bad percent"},
        {"CUDA_DEVICE_SM_LIMIT_0", "-1", "CUDA_DEVICE_SM_LIMIT_0=-1: bad percent"},
        {"CUDA_DEVICE_SM_LIMIT_0", "12.345", "bad percent"},
        {"CUDA_DEVICE_SM_LIMIT_99", "10", "\"99\" is not a device index"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        clear_environment();
        setenv(cases[i].name, cases[i].value, 1);
        /* The message names the variable as far as it is shown. */
        char shown[VGPU_CONFIG_SOURCE_SIZE];
        snprintf(shown, sizeof shown, "%.32s", cases[i].name);
        int ok = load();
        check(!ok, __LINE__, "%s accepted", cases[i].name);
        check(strncmp(error, shown, strlen(shown)) == 0 && strstr(error, cases[i].expected),
              __LINE__, "error: %s", error);
    }
}

static void device_limits(void) {
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "{\"0\":\"1GiB\",\"" UUID_A "\":\"2GiB\"}", 1);
    setenv("TENSOR_FUSION_CUDA_UP_LIMIT", "{\"" UUID_A "\":50}", 1);
    setenv("CUDA_DEVICE_MEMORY_LIMIT", "8g", 1);
    EXPECT_OK();
    struct vgpu_device_limits limits;
    /* Device 0 is GPU A: the two keys disagree, only the driver can tell. */
    check(!vgpu_config_device_limits(&config, 0, UUID_A_UPPER, &limits, error, sizeof error),
          __LINE__, "%s", "conflict accepted");
    check(strstr(error, "TENSOR_FUSION_CUDA_MEM_LIMIT: memory limit 2147483648 bytes for " UUID_A
                        " contradicts 1073741824 bytes for device 0 (from "
                        "TENSOR_FUSION_CUDA_MEM_LIMIT)") == error,
          __LINE__, "error: %s", error);
    /* GPU A as device 1: its UUID limit; device 0 on another GPU: the index limit. */
    check(vgpu_config_device_limits(&config, 1, UUID_A, &limits, error, sizeof error), __LINE__,
          "%s", error);
    EXPECT_EQ(limits.memory_limit, 2 * GIB);
    EXPECT_EQ(limits.compute_limit, 5000u);
    EXPECT_STR(limits.compute_source, "TENSOR_FUSION_CUDA_UP_LIMIT");
    check(vgpu_config_device_limits(&config, 0, UUID_B, &limits, error, sizeof error), __LINE__,
          "%s", error);
    EXPECT_EQ(limits.memory_limit, GIB);
    EXPECT_EQ(limits.compute_limit, 0u);
    EXPECT_STR(limits.compute_source, "");
    check(vgpu_config_device_limits(&config, 5, "", &limits, error, sizeof error), __LINE__, "%s",
          error);
    EXPECT_EQ(limits.memory_limit, 8 * GIB);
    EXPECT_STR(limits.memory_source, "CUDA_DEVICE_MEMORY_LIMIT");
    /* Agreeing index and UUID keys are fine. */
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "{\"0\":\"2GiB\",\"" UUID_A "\":\"2GiB\"}", 1);
    EXPECT_OK();
    check(vgpu_config_device_limits(&config, 0, UUID_A, &limits, error, sizeof error), __LINE__,
          "%s", error);
    EXPECT_EQ(limits.memory_limit, 2 * GIB);
    /* No settings at all. */
    clear_environment();
    EXPECT_OK();
    check(vgpu_config_device_limits(&config, 0, NULL, &limits, NULL, 0), __LINE__, "%s", "none");
    EXPECT_EQ(limits.memory_limit, 0u);
}

static void pod(void) {
    clear_environment();
    setenv("SHM_PATH", "/tmp/pods/a//", 1);
    EXPECT_OK();
    EXPECT_EQ(config.pod_source, VGPU_POD_SHM_PATH);
    EXPECT_STR(config.pod_folder, "/tmp/pods/a");
    EXPECT_STR(config.pod_name, "");

    clear_environment();
    setenv("POD_NAME", "trainer-0", 1);
    EXPECT_OK();
    EXPECT_EQ(config.pod_source, VGPU_POD_NAME);
    EXPECT_STR(config.pod_folder, "/run/tensor-fusion/shm/default/trainer-0");
    EXPECT_STR(config.pod_namespace, "default");
    EXPECT_STR(config.pod_name, "trainer-0");
    setenv("POD_NAMESPACE", "team-a", 1);
    setenv("SHM_BASE_PATH", "/var/shm/", 1);
    EXPECT_OK();
    EXPECT_STR(config.pod_folder, "/var/shm/team-a/trainer-0");
    setenv("SHM_BASE_PATH", "/", 1);
    EXPECT_OK();
    EXPECT_STR(config.pod_folder, "/team-a/trainer-0");
    setenv("SHM_BASE_PATH", "", 1);
    EXPECT_OK();
    EXPECT_STR(config.pod_folder, "/run/tensor-fusion/shm/team-a/trainer-0");
    /* SHM_PATH wins; the names are still kept for the region. */
    setenv("SHM_PATH", "/elsewhere", 1);
    EXPECT_OK();
    EXPECT_EQ(config.pod_source, VGPU_POD_SHM_PATH);
    EXPECT_STR(config.pod_folder, "/elsewhere");
    EXPECT_STR(config.pod_name, "trainer-0");
    EXPECT_STR(config.pod_namespace, "team-a");

    /* A namespace alone is no pod. */
    clear_environment();
    setenv("POD_NAMESPACE", "team-a", 1);
    EXPECT_OK();
    EXPECT_EQ(config.pod_source, VGPU_POD_PRIVATE);
    EXPECT_STR(config.pod_folder, "");
    EXPECT_STR(config.base_path, "/run/tensor-fusion/shm");
    EXPECT_STR(config.base_source, "default");
    /* The base is read even without a pod: the device leases live under it. */
    setenv("SHM_BASE_PATH", "relative/ignored", 1);
    EXPECT_ERROR("SHM_BASE_PATH", "SHM_BASE_PATH=relative/ignored: must be an absolute path");
    setenv("SHM_BASE_PATH", "/var/shm//", 1);
    EXPECT_OK();
    EXPECT_STR(config.base_path, "/var/shm");
    EXPECT_STR(config.base_source, "SHM_BASE_PATH");

    static char long_text[6000];
    memset(long_text, 'n', 254);
    long_text[254] = '\0';
    static const struct {
        const char *name;
        const char *value;
        const char *expected;
    } cases[] = {
        {"SHM_PATH", "pods/a", "SHM_PATH=pods/a: must be an absolute path"},
        {"SHM_PATH", "/", "SHM_PATH=/: the root folder"},
        {"SHM_PATH", "///", "the root folder"},
        {"POD_NAME", "a/b", "POD_NAME=a/b: not a valid name (1-253 letters, digits, '.', '_' "
                            "or '-', not starting with '.' or '-')"},
        {"POD_NAME", "..", "POD_NAME=..: not a valid name"},
        {"POD_NAME", ".", "not a valid name"},
        {"POD_NAME", "", "POD_NAME=: not a valid name"},
        {"POD_NAME", "-rf", "POD_NAME=-rf: not a valid name"},
        {"POD_NAME", ".hidden", "POD_NAME=.hidden: not a valid name"},
        {"POD_NAME", "caf\xc3\xa9", "POD_NAME=caf\\xc3\\xa9: not a valid name"},
        {"POD_NAME", "a b", "not a valid name"},
        {"POD_NAME", long_text, "...: not a valid name"},
        {"CONTAINER_NAME", "-x", "CONTAINER_NAME=-x: not a valid name"},
        {"CONTAINER_NAME", "", "CONTAINER_NAME=: not a valid name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        clear_environment();
        setenv(cases[i].name, cases[i].value, 1);
        EXPECT_ERROR(cases[i].name, cases[i].expected);
    }
    clear_environment();
    setenv("POD_NAME", "p", 1);
    setenv("POD_NAMESPACE", ".", 1);
    EXPECT_ERROR("POD_NAMESPACE", "POD_NAMESPACE=.: not a valid name");
    setenv("POD_NAMESPACE", ".devices", 1);
    EXPECT_ERROR("POD_NAMESPACE", "POD_NAMESPACE=.devices: not a valid name");
    setenv("POD_NAMESPACE", "", 1);
    EXPECT_ERROR("POD_NAMESPACE", "not a valid name");
    /* 253 bytes is the longest name. */
    long_text[253] = '\0';
    setenv("POD_NAMESPACE", long_text, 1);
    EXPECT_OK();
    EXPECT_EQ(strlen(config.pod_namespace), 253u);
    setenv("CONTAINER_NAME", "main_1.x-y", 1);
    EXPECT_OK();
    EXPECT_STR(config.container_name, "main_1.x-y");
    setenv("POD_NAMESPACE", "ns", 1);
    setenv("SHM_BASE_PATH", "shm", 1);
    EXPECT_ERROR("SHM_BASE_PATH", "SHM_BASE_PATH=shm: must be an absolute path");
    /* Names with SHM_PATH are checked too. */
    unsetenv("SHM_BASE_PATH");
    setenv("SHM_PATH", "/pods/p", 1);
    setenv("POD_NAME", "a/b", 1);
    EXPECT_ERROR("POD_NAME", "not a valid name");

    /* Lengths: folder + "/shm" must fit the buffer. */
    clear_environment();
    long_text[0] = '/';
    memset(long_text + 1, 'p', 4090);
    long_text[4091] = '\0';
    setenv("SHM_PATH", long_text, 1);
    EXPECT_OK();
    EXPECT_EQ(strlen(config.pod_folder), 4091u);
    long_text[4091] = 'p';
    long_text[4092] = '\0';
    setenv("SHM_PATH", long_text, 1);
    EXPECT_ERROR("SHM_PATH", "...: path longer than 4091 bytes");
    clear_environment();
    setenv("POD_NAME", "p", 1);
    long_text[4091] = '\0';
    setenv("SHM_BASE_PATH", long_text, 1);
    EXPECT_ERROR("SHM_BASE_PATH", "the pod folder under it is longer than 4091 bytes");
    long_text[4091 - 10] = '\0';
    setenv("SHM_BASE_PATH", long_text, 1);
    EXPECT_OK();
    EXPECT_EQ(strlen(config.pod_folder), 4091u);
}

static void logging(void) {
    static const struct {
        const char *value;
        int level;
    } levels[] = {{"error", 0}, {"WARN", 1}, {"Warning", 1}, {"info", 2}, {"DeBuG", 3}};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        clear_environment();
        setenv("TF_LOG_LEVEL", levels[i].value, 1);
        EXPECT_OK();
        EXPECT_EQ(config.log_level, levels[i].level);
    }
    setenv("TF_LOG_PATH", "/var/log/limiter.log", 1);
    EXPECT_OK();
    EXPECT_STR(config.log_path, "/var/log/limiter.log");
    setenv("TF_LOG_LEVEL", "verbose", 1);
    EXPECT_ERROR("TF_LOG_LEVEL",
                 "TF_LOG_LEVEL=verbose: unknown level (error, warn, info or debug)");
    setenv("TF_LOG_LEVEL", " info", 1);
    EXPECT_ERROR("TF_LOG_LEVEL", "unknown level");
    static char long_path[5000];
    memset(long_path, 'l', sizeof long_path - 1);
    clear_environment();
    setenv("TF_LOG_PATH", long_path, 1);
    EXPECT_ERROR("TF_LOG_PATH", "path longer than 4095 bytes");
}

static void small_error_buffers(void) {
    set_memory("{\"0\":\"4XB\"}");
    char tiny[8];
    check(!vgpu_config_load(&config, tiny, sizeof tiny), __LINE__, "%s", "accepted");
    EXPECT_STR(tiny, "TENSOR_");
    check(!vgpu_config_load(&config, NULL, 0), __LINE__, "%s", "accepted");
}

static void describe(void) {
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "{\"0\":\"4GiB\",\"" UUID_A_UPPER "\":\"1g\"}", 1);
    setenv("TENSOR_FUSION_CUDA_UP_LIMIT", "{\"0\":12.5}", 1);
    setenv("CUDA_DEVICE_SM_LIMIT", "50", 1);
    setenv("POD_NAME", "p.q", 1);
    setenv("CONTAINER_NAME", "main", 1);
    setenv("SHM_BASE_PATH", "/b\"x/", 1);
    setenv("TF_CUDA_CONTEXT_OVERHEAD", "256MiB", 1);
    setenv("TF_CUDA_LIB_PATH", "/opt/libcuda.so.1", 1);
    setenv("TMPDIR", "/scratch", 1);
    setenv("CUDA_MEM_LIMIT_0", "4g", 1);
    setenv("TF_LOG_PATH", "/tmp/a\tb", 1);
    int needed = vgpu_limiter_describe_config(NULL, 0);
    static char out[8192];
    check(needed > 0 && (size_t)needed < sizeof out, __LINE__, "%s", "length");
    int written = vgpu_limiter_describe_config(out, sizeof out);
    EXPECT_EQ(written, needed);
    EXPECT_EQ(strlen(out), (size_t)needed);
    EXPECT_STR(out,
               "{\"ok\":true,\"devices\":["
               "{\"key\":\"0\",\"kind\":\"index\",\"index\":0,\"uuid\":null,"
               "\"memory_limit\":4294967296,\"memory_source\":\"TENSOR_FUSION_CUDA_MEM_LIMIT\","
               "\"compute_limit\":1250,\"compute_source\":\"TENSOR_FUSION_CUDA_UP_LIMIT\","
               "\"soft_limit\":null,\"soft_source\":null,\"oversubscribe\":null,"
               "\"oversubscribe_source\":null},"
               "{\"key\":\"" UUID_A "\",\"kind\":\"uuid\",\"index\":null,\"uuid\":\"" UUID_A "\","
               "\"memory_limit\":1073741824,\"memory_source\":\"TENSOR_FUSION_CUDA_MEM_LIMIT\","
               "\"compute_limit\":null,\"compute_source\":null,"
               "\"soft_limit\":null,\"soft_source\":null,\"oversubscribe\":null,"
               "\"oversubscribe_source\":null},"
               "{\"key\":\"all\",\"kind\":\"all\",\"index\":null,\"uuid\":null,"
               "\"memory_limit\":null,\"memory_source\":null,"
               "\"compute_limit\":5000,\"compute_source\":\"CUDA_DEVICE_SM_LIMIT\","
               "\"soft_limit\":null,\"soft_source\":null,\"oversubscribe\":null,"
               "\"oversubscribe_source\":null}],"
               "\"pod\":{\"source\":\"POD_NAME\","
               "\"folder\":\"/b\\\"x/default/p.q\","
               "\"region_file\":\"/b\\\"x/default/p.q/shm\","
               "\"namespace\":\"default\",\"name\":\"p.q\",\"name_source\":\"POD_NAME\","
               "\"uid\":null,\"container\":\"main\",\"container_source\":\"CONTAINER_NAME\","
               "\"base\":\"/b\\\"x\",\"base_source\":\"SHM_BASE_PATH\",\"region_required\":false},"
               "\"process\":{\"context_overhead\":268435456,"
               "\"context_overhead_source\":\"TF_CUDA_CONTEXT_OVERHEAD\","
               "\"cuda_library\":\"/opt/libcuda.so.1\","
               "\"cuda_library_source\":\"TF_CUDA_LIB_PATH\","
               "\"nvml_library\":\"libnvidia-ml.so.1\",\"nvml_library_source\":\"default\","
               "\"tmp_folder\":\"/scratch\",\"tmp_source\":\"TMPDIR\"},"
               "\"log\":{\"level\":\"warn\",\"level_source\":\"default\","
               "\"path\":\"/tmp/a\\u0009b\"},"
               "\"warnings\":[\"POD_NAME=p.q: no pod default/p.q on this node (no folder "
               "/b\\\"x/default/p.q): not one the daemon manages, so only this environment's "
               "limits apply (a typo?)\"],"
               "\"default_base\":\"/run/tensor-fusion/shm\"}");
    /* Cut output stays NUL-terminated and the length is still the whole. */
    memset(out, 'z', sizeof out);
    EXPECT_EQ(vgpu_limiter_describe_config(out, 10), needed);
    EXPECT_STR(out, "{\"ok\":tru");
    EXPECT_EQ(vgpu_limiter_describe_config(out, 1), needed);
    EXPECT_STR(out, "");

    clear_environment();
    written = vgpu_limiter_describe_config(out, sizeof out);
    EXPECT_STR(out, "{\"ok\":true,\"devices\":[],\"pod\":{\"source\":\"private\",\"folder\":null,"
                    "\"region_file\":null,\"namespace\":null,\"name\":null,"
                    "\"name_source\":null,\"uid\":null,\"container\":null,"
                    "\"container_source\":null,"
                    "\"base\":\"/run/tensor-fusion/shm\",\"base_source\":\"default\",\"region_required\":false},"
                    "\"process\":{\"context_overhead\":570425344,"
                    "\"context_overhead_source\":\"default\","
                    "\"cuda_library\":\"libcuda.so.1\",\"cuda_library_source\":\"default\","
                    "\"nvml_library\":\"libnvidia-ml.so.1\",\"nvml_library_source\":\"default\","
                    "\"tmp_folder\":\"/tmp\",\"tmp_source\":\"default\"},"
                    "\"log\":{\"level\":\"warn\",\"level_source\":\"default\",\"path\":null},"
                    "\"warnings\":[],"
                    "\"default_base\":\"/run/tensor-fusion/shm\"}");
    EXPECT_EQ((size_t)written, strlen(out));

    set_memory("{\"0\":\"4\\\\XB\"}");
    written = vgpu_limiter_describe_config(out, sizeof out);
    EXPECT_STR(out, "{\"ok\":false,\"error\":\"TENSOR_FUSION_CUDA_MEM_LIMIT="
                    "{\\\"0\\\":\\\"4\\\\\\\\XB\\\"}: bad size \\\"4\\\\XB\\\" for key \\\"0\\\" "
                    "(a whole number of bytes, or "
                    "a string such as \\\"4GiB\\\" or \\\"512MiB\\\")\","
                    "\"default_base\":\"/run/tensor-fusion/shm\"}");
    EXPECT_EQ((size_t)written, strlen(out));
}

/* Random text made of JSON pieces: no crash, no sanitizer report, and either a success or one
 * line naming the variable. */
static void random_inputs(void) {
    static const char *const pieces[] = {
        "{", "}", "[", "]", ",", ":", "\"", "\\", "\"0\"", "\"63\"", "\"64\"", "\"" UUID_A "\"",
        "\"4GiB\"", "\"12.5%\"", "1", "0", "-", ".", "e", "100", "18446744073709551616", " ",
        "\n", "\\u00", "\\u0041", "\xc3\xa9", "\x01", "true", "\"\"", "\"1g\"",
    };
    static const char *const variables[] = {
        "TENSOR_FUSION_CUDA_MEM_LIMIT", "TENSOR_FUSION_CUDA_UP_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT",
        "TENSOR_FUSION_CUDA_SOFT_LIMIT", "TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE",
        "CUDA_DEVICE_SM_LIMIT_7", "SHM_PATH", "POD_NAME", "TF_LOG_LEVEL",
    };
    unsigned seed = 20240611;
    char text[256];
    static char out[16384];
    int consistent = 1;
    for (int round = 0; round < 30000; round++) {
        seed = seed * 1103515245u + 12345u;
        size_t count = (seed >> 16) % 16;
        size_t used = 0;
        if (round % 2 == 0) {
            text[used++] = '{';
        }
        for (size_t i = 0; i < count; i++) {
            seed = seed * 1103515245u + 12345u;
            const char *piece = pieces[(seed >> 16) % (sizeof pieces / sizeof pieces[0])];
            size_t length = strlen(piece);
            if (used + length + 1 >= sizeof text) {
                break;
            }
            memcpy(text + used, piece, length);
            used += length;
        }
        text[used] = '\0';
        const char *variable = variables[round % (sizeof variables / sizeof variables[0])];
        clear_environment();
        setenv(variable, text, 1);
        int ok = load();
        if (!ok) {
            int before = failed;
            check_error_line(variable, __LINE__);
            if (failed != before) {
                fprintf(stderr, "  input: %s=%s\n", variable, text);
            }
        } else {
            passed++;
        }
        int length = vgpu_limiter_describe_config(out, sizeof out);
        consistent &= length > 0 && (size_t)length == strlen(out) &&
                      strncmp(out, ok ? "{\"ok\":true," : "{\"ok\":false,", ok ? 11 : 12) == 0;
    }
    check(consistent, __LINE__, "%s", "describe disagrees with load");
}

/* The warning that contains `expected`, or NULL. */
static const char *warning_with(const char *expected) {
    for (unsigned i = 0; i < config.warning_count; i++) {
        if (strstr(config.warnings[i], expected) != NULL) {
            return config.warnings[i];
        }
    }
    return NULL;
}

#define EXPECT_WARNING(expected)                                                                 \
    check(warning_with(expected) != NULL, __LINE__, "no warning with %s", expected)

static void foreign_variables(void) {
    static const struct {
        const char *name;
        const char *value;
        const char *expected;
    } cases[] = {
        {"HYPERVISOR_IP", "10.0.0.1", "HYPERVISOR_IP=10.0.0.1: vgpu.rs's variable, not "
                                      "supported: ignored (instead: nothing: the limits come"},
        {"HYPERVISOR_PORT", "8000", "HYPERVISOR_PORT=8000: vgpu.rs's"},
        {"ENABLE_NVML_HOOKS", "false", "ENABLE_NVML_HOOKS=false: vgpu.rs's"},
        {"ENABLE_CUDA_HOOKS", "false", "ENABLE_CUDA_HOOKS=false: vgpu.rs's"},
        {"TF_SKIP_HOOKS_IF_NO_LIMIT", "true", "TF_SKIP_HOOKS_IF_NO_LIMIT=true: vgpu.rs's"},
        {"TF_VISIBLE_DEVICES", UUID_A, "TF_VISIBLE_DEVICES=" UUID_A ": vgpu.rs's variable, not "
                                       "supported: ignored (instead: CUDA_VISIBLE_DEVICES)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        clear_environment();
        setenv(cases[i].name, cases[i].value, 1);
        EXPECT_OK();
        EXPECT_EQ(config.warning_count, 1u);
        EXPECT_WARNING(cases[i].expected);
        EXPECT_EQ(config.count, 0u);
        unsetenv(cases[i].name);
    }
    /* Names that only start like one are not its; an empty one is unset. */
    clear_environment();
    setenv("HYPERVISOR_IPS", "x", 1);
    setenv("ENABLE_CUDA_HOOKS", "", 1);
    EXPECT_OK();
    EXPECT_EQ(config.warning_count, 0u);
    unsetenv("HYPERVISOR_IPS");
    unsetenv("ENABLE_CUDA_HOOKS");
}

static const char no_uuids[2][VGPU_CONFIG_UUID_SIZE] = {UUID_B, UUID_B};

static void hidden_devices(void) {
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "{\"0\":\"1g\",\"2\":\"1g\"}", 1);
    setenv("CUDA_DEVICE_SM_LIMIT_5", "10", 1);
    setenv("CUDA_VISIBLE_DEVICES", "3,1", 1);
    EXPECT_OK();
    EXPECT_EQ(config.warning_count, 2u);
    EXPECT_WARNING("TENSOR_FUSION_CUDA_MEM_LIMIT: device index 2 is not among the 2 devices this "
                   "process sees (CUDA_VISIBLE_DEVICES=3,1): its limit applies to no GPU");
    EXPECT_WARNING("CUDA_DEVICE_SM_LIMIT_5: device index 5 is not among the 2 devices");
    /* The driver's count that CUDA_VISIBLE_DEVICES gave: nothing new. */
    vgpu_config_check_devices(&config, 2, no_uuids);
    EXPECT_EQ(config.warning_count, 2u);
    /* Without CUDA_VISIBLE_DEVICES only the driver can tell. */
    unsetenv("CUDA_VISIBLE_DEVICES");
    EXPECT_OK();
    EXPECT_EQ(config.warning_count, 0u);
    vgpu_config_check_devices(&config, 1, no_uuids);
    EXPECT_EQ(config.warning_count, 2u);
    EXPECT_WARNING("device index 2 is not among the 1 device this process sees: its limit");
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    EXPECT_OK();
    EXPECT_WARNING("is not among the 0 devices this process sees (CUDA_VISIBLE_DEVICES=)");
}

/* A UUID key of no GPU the driver lists, when CUDA_VISIBLE_DEVICES hides none. */
static void absent_uuids(void) {
    static const char node[2][VGPU_CONFIG_UUID_SIZE] = {UUID_B, UUID_A};
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "{\"" UUID_A_UPPER "\":\"1g\"}", 1);
    setenv("TENSOR_FUSION_CUDA_UP_LIMIT", "{\"GPU-12345678-1111-2222-3333-444444444444\":10}",
           1);
    EXPECT_OK();
    EXPECT_EQ(config.warning_count, 0u);
    vgpu_config_check_devices(&config, 2, node);
    EXPECT_EQ(config.warning_count, 1u);
    EXPECT_WARNING("TENSOR_FUSION_CUDA_UP_LIMIT: GPU-12345678-1111-2222-3333-444444444444 is not "
                   "on this node (none of its 2 GPUs): its limit applies to no GPU");
    /* With CUDA_VISIBLE_DEVICES the process sees a part of the node: no word. */
    setenv("CUDA_VISIBLE_DEVICES", "0,1", 1);
    EXPECT_OK();
    vgpu_config_check_devices(&config, 2, node);
    EXPECT_EQ(config.warning_count, 0u);
}

static void process_settings(void) {
    clear_environment();
    setenv("TF_CUDA_CONTEXT_OVERHEAD", "0", 1);
    EXPECT_OK();
    EXPECT_EQ(config.context_overhead, 0u);
    setenv("TF_CUDA_CONTEXT_OVERHEAD", "1GiB", 1);
    EXPECT_OK();
    EXPECT_EQ(config.context_overhead, GIB);
    EXPECT_STR(config.context_overhead_source, "TF_CUDA_CONTEXT_OVERHEAD");
    setenv("TF_CUDA_CONTEXT_OVERHEAD", "big", 1);
    EXPECT_ERROR("TF_CUDA_CONTEXT_OVERHEAD", "TF_CUDA_CONTEXT_OVERHEAD=big: not a size");
    clear_environment();
    setenv("TMPDIR", "relative", 1);
    setenv("TF_NVML_LIB_PATH", "/x/libnvidia-ml.so.1", 1);
    EXPECT_OK();
    EXPECT_STR(config.tmp_folder, "/tmp");
    EXPECT_STR(config.tmp_source, "default");
    EXPECT_WARNING("TMPDIR=relative: not an absolute path: /tmp is used");
    EXPECT_STR(config.nvml_library, "/x/libnvidia-ml.so.1");
    EXPECT_STR(vgpu_config_nvml_library(), "/x/libnvidia-ml.so.1");
    EXPECT_STR(vgpu_config_cuda_library(), "libcuda.so.1");
    static char long_path[5000];
    memset(long_path, 'l', sizeof long_path - 1);
    setenv("TF_CUDA_LIB_PATH", long_path, 1);
    EXPECT_ERROR("TF_CUDA_LIB_PATH", "path longer than 4095 bytes");
}

/* A pod whose region belongs to another user (the daemon) cannot lower the context overhead. */
static void overhead_floor(void) {
    char folder[] = "/tmp/vgpu-config-test-XXXXXX";
    if (geteuid() != 0 || mkdtemp(folder) == NULL) {
        return; /* giving a file away takes root */
    }
    char region[sizeof folder + 8];
    snprintf(region, sizeof region, "%s/shm", folder);
    FILE *file = fopen(region, "w");
    check(file != NULL, __LINE__, "%s", "region file");
    if (file == NULL) {
        return;
    }
    fclose(file);
    clear_environment();
    setenv("SHM_PATH", folder, 1);
    setenv("TF_CUDA_CONTEXT_OVERHEAD", "0", 1);
    EXPECT_OK(); /* our own region: the test's choice */
    EXPECT_EQ(config.context_overhead, 0u);
    check(chown(region, 65534, 65534) == 0, __LINE__, "%s", "chown");
    EXPECT_OK();
    EXPECT_EQ(config.context_overhead, VGPU_CONFIG_DEFAULT_CONTEXT_OVERHEAD);
    EXPECT_STR(config.context_overhead_source, "default");
    EXPECT_WARNING("TF_CUDA_CONTEXT_OVERHEAD=0: ignored: below the default 570425344 bytes in a "
                   "pod managed by another user");
    /* Raising it stays allowed. */
    setenv("TF_CUDA_CONTEXT_OVERHEAD", "1GiB", 1);
    EXPECT_OK();
    EXPECT_EQ(config.context_overhead, GIB);
    EXPECT_EQ(config.warning_count, 0u);
    /* A region of our own in a folder of another's (the daemon's pod made for this user, with
     * --owner): still not ours to lower. */
    check(chown(region, geteuid(), getegid()) == 0 && chown(folder, 65534, 65534) == 0, __LINE__,
          "%s", "chown");
    setenv("TF_CUDA_CONTEXT_OVERHEAD", "0", 1);
    EXPECT_OK();
    EXPECT_EQ(config.context_overhead, VGPU_CONFIG_DEFAULT_CONTEXT_OVERHEAD);
    EXPECT_WARNING("TF_CUDA_CONTEXT_OVERHEAD=0: ignored: below the default 570425344 bytes in a "
                   "pod managed by another user");
    check(chown(folder, geteuid(), getegid()) == 0, __LINE__, "%s", "chown");
    unlink(region);
    rmdir(folder);
}

/* POD_NAME of a pod with no folder under the base: a warning (a typo, or no daemon). */
static void unknown_pod(void) {
    char base[] = "/tmp/vgpu-config-base-XXXXXX";
    check(mkdtemp(base) != NULL, __LINE__, "%s", "mkdtemp");
    char pod_folder[sizeof base + 32];
    snprintf(pod_folder, sizeof pod_folder, "%s/team", base);
    mkdir(pod_folder, 0700);
    snprintf(pod_folder, sizeof pod_folder, "%s/team/trainer", base);
    mkdir(pod_folder, 0700);
    clear_environment();
    setenv("SHM_BASE_PATH", base, 1);
    setenv("POD_NAMESPACE", "team", 1);
    setenv("POD_NAME", "trainer", 1);
    EXPECT_OK();
    EXPECT_EQ(config.warning_count, 0u);
    setenv("POD_NAME", "trainr", 1);
    EXPECT_OK();
    EXPECT_EQ(config.warning_count, 1u);
    EXPECT_WARNING("POD_NAME=trainr: no pod team/trainr on this node (no folder ");
    EXPECT_WARNING("/team/trainr): not one the daemon manages");
    rmdir(pod_folder);
    snprintf(pod_folder, sizeof pod_folder, "%s/team", base);
    rmdir(pod_folder);
    rmdir(base);
}

/* The soft (burst) compute limit and memory oversubscription, TENSOR_FUSION_CUDA_SOFT_LIMIT and
 * TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE: parsed like the other JSON limits, resolved per device
 * UUID > index > all, a soft limit below the compute limit refused naming both variables. */
static void soft_and_oversubscribe(void) {
    struct vgpu_device_limits limits;
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_UP_LIMIT", "{\"0\":30,\"1\":20}", 1);
    setenv("TENSOR_FUSION_CUDA_SOFT_LIMIT", "{\"0\":\"60%\",\"" UUID_A_UPPER "\":80}", 1);
    setenv("TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE", "{\"0\":true,\"1\":\"false\"}", 1);
    setenv("TENSOR_FUSION_CUDA_MEM_LIMIT", "{\"0\":\"4GiB\"}", 1); /* something to go past */
    EXPECT_OK();
    const struct vgpu_device_setting *zero = find(VGPU_KEY_INDEX, 0, NULL);
    EXPECT_EQ(zero->compute_soft_limit, 6000u);
    EXPECT_STR(zero->soft_source, "TENSOR_FUSION_CUDA_SOFT_LIMIT");
    EXPECT_EQ(zero->oversubscribe, 1);
    EXPECT_STR(zero->oversubscribe_source, "TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE");
    EXPECT_EQ(find(VGPU_KEY_INDEX, 1, NULL)->oversubscribe, 0);
    EXPECT_EQ(find(VGPU_KEY_UUID, -1, UUID_A)->oversubscribe, -1);
    EXPECT_EQ(config.warning_count, 0u);
    check(vgpu_config_device_limits(&config, 0, UUID_B, &limits, error, sizeof error), __LINE__,
          "%s", error);
    EXPECT_EQ(limits.compute_limit, 3000u);
    EXPECT_EQ(limits.compute_soft_limit, 6000u);
    EXPECT_STR(limits.soft_source, "TENSOR_FUSION_CUDA_SOFT_LIMIT");
    EXPECT_EQ(limits.oversubscribe, true);
    EXPECT_STR(limits.oversubscribe_source, "TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE");
    check(vgpu_config_device_limits(&config, 1, NULL, &limits, error, sizeof error), __LINE__,
          "%s", error);
    EXPECT_EQ(limits.compute_soft_limit, 0u);
    EXPECT_EQ(limits.oversubscribe, false);
    EXPECT_STR(limits.oversubscribe_source, "TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE");
    /* The UUID key's 80 % wins over index 0's 60 % only when they are not both given for the
     * same GPU: there they contradict. */
    check(!vgpu_config_device_limits(&config, 0, UUID_A, &limits, error, sizeof error), __LINE__,
          "%s", "accepted");
    check(strstr(error, "soft compute limit 80.00% for " UUID_A " contradicts 60.00% for "
                        "device 0") != NULL,
          __LINE__, "error: %s", error);
    /* Device 1 under UUID_A: the UUID's 80 % over device 1's compute 20 %. */
    check(vgpu_config_device_limits(&config, 1, UUID_A, &limits, error, sizeof error), __LINE__,
          "%s", error);
    EXPECT_EQ(limits.compute_soft_limit, 8000u);
    EXPECT_EQ(limits.compute_limit, 2000u);

    /* Below the compute limit: refused at load for a key that has both... */
    setenv("TENSOR_FUSION_CUDA_SOFT_LIMIT", "{\"0\":20}", 1);
    EXPECT_ERROR("TENSOR_FUSION_CUDA_SOFT_LIMIT",
                 "soft compute limit 20.00% is below the compute limit 30.00% from "
                 "TENSOR_FUSION_CUDA_UP_LIMIT");
    /* ... and for an all-devices compute limit under an index soft limit. */
    clear_environment();
    setenv("CUDA_DEVICE_SM_LIMIT", "50", 1);
    setenv("TENSOR_FUSION_CUDA_SOFT_LIMIT", "{\"2\":40}", 1);
    EXPECT_ERROR("TENSOR_FUSION_CUDA_SOFT_LIMIT", "below the compute limit 50.00% from "
                                                  "CUDA_DEVICE_SM_LIMIT");
    /* Met only on one GPU (an index soft limit, a UUID compute limit): refused there. */
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_UP_LIMIT", "{\"" UUID_A "\":50}", 1);
    setenv("TENSOR_FUSION_CUDA_SOFT_LIMIT", "{\"0\":40}", 1);
    EXPECT_OK();
    check(!vgpu_config_device_limits(&config, 0, UUID_A, &limits, error, sizeof error), __LINE__,
          "%s", "accepted");
    check(strstr(error, "TENSOR_FUSION_CUDA_SOFT_LIMIT={\"0\":40}: soft compute limit 40.00% is "
                        "below the "
                        "compute limit 50.00% from TENSOR_FUSION_CUDA_UP_LIMIT") != NULL,
          __LINE__, "error: %s", error);
    /* Equal is fine; without any compute limit: a warning, and no burst limit resolved. */
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_UP_LIMIT", "{\"0\":50}", 1);
    setenv("TENSOR_FUSION_CUDA_SOFT_LIMIT", "{\"0\":50,\"1\":70}", 1);
    EXPECT_OK();
    EXPECT_EQ(config.warning_count, 1u); /* device 1's burst: no compute limit there */
    EXPECT_STR(config.warnings[0], "TENSOR_FUSION_CUDA_SOFT_LIMIT: soft compute limit 70.00% "
                                   "without a compute limit on that device: ignored (no limit "
                                   "to burst from)");
    unsetenv("TENSOR_FUSION_CUDA_UP_LIMIT");
    EXPECT_OK();
    EXPECT_EQ(config.warning_count, 2u);
    EXPECT_STR(config.warnings[1], "TENSOR_FUSION_CUDA_SOFT_LIMIT: soft compute limit 70.00% "
                                   "without any compute limit: ignored (no limit to burst from)");
    check(vgpu_config_device_limits(&config, 1, NULL, &limits, error, sizeof error), __LINE__,
          "%s", error);
    EXPECT_EQ(limits.compute_soft_limit, 0u);
    EXPECT_STR(limits.soft_source, "");

    /* Bad values name the variable and the key. */
    static const struct {
        const char *variable;
        const char *json;
        const char *expected;
    } cases[] = {
        {"TENSOR_FUSION_CUDA_SOFT_LIMIT", "{\"0\":0}", "bad percent 0 for key \"0\""},
        {"TENSOR_FUSION_CUDA_SOFT_LIMIT", "{\"0\":101}", "bad percent 101 for key \"0\""},
        {"TENSOR_FUSION_CUDA_SOFT_LIMIT", "{\"0\":true}", "bad percent true"},
        {"TENSOR_FUSION_CUDA_SOFT_LIMIT", "{\"0\":50,\"0\":60}",
         "key \"0\" is given twice with different values (50.00% and 60.00%)"},
        {"TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE", "{\"0\":1}", "bad value 1 for key \"0\" "
                                                              "(true or false)"},
        {"TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE", "{\"0\":\"maybe\"}", "bad value \"maybe\""},
        {"TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE", "{\"0\":tru}", "needs a number or a string"},
        {"TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE", "{\"0\":true,\"0\":false}",
         "key \"0\" is given twice with different values (on and off)"},
        {"TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE", "{\"x\":true}", "bad device key \"x\""},
        {"TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE", "[true]", "expected a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        clear_environment();
        setenv(cases[i].variable, cases[i].json, 1);
        EXPECT_ERROR(cases[i].variable, cases[i].expected);
    }
    /* The same key twice with the same value is one setting. */
    clear_environment();
    setenv("TENSOR_FUSION_CUDA_MEM_OVERSUBSCRIBE", "{\"0\":true,\"0\":\"TRUE\"}", 1);
    EXPECT_OK();
    EXPECT_EQ(config.count, 1u);
}

/* Other systems' variables (config_seeds.c and friends): values, units, keys, errors. */
static void seed_systems(void) {
    static const struct {
        const char *name;
        const char *value;
        uint64_t bytes; /* expected memory limit of `key`; 0: an error containing `text` */
        const char *text;
    } sizes[] = {
        {"CUDA_MEM_LIMIT_0", "1000m", 1000 * MIB, NULL},
        {"CUDA_MEM_LIMIT_0", "4G", 4 * GIB, NULL},
        {"CUDA_MEM_LIMIT_0", "10GB", 10 * GIB, NULL},
        {"CUDA_MEM_LIMIT_0", " 2 gi ", 2 * GIB, NULL},
        {"CUDA_MEM_LIMIT_0", "1.5g", 3 * GIB / 2, NULL},
        {"CUDA_MEM_LIMIT_0", "4096", 4096, NULL},
        {"CUDA_MEM_LIMIT_0", "4096 bytes", 4096, NULL},
        {"CUDA_MEM_LIMIT_0", "4x", 0, "CUDA_MEM_LIMIT_0=4x: bad size"},
        {"CUDA_MEM_LIMIT_0", "g", 0, "bad size"},
        {"CUDA_MEM_LIMIT_0", "1.g", 0, "bad size"},
        {"CUDA_MEM_LIMIT_0", "4 gbytes", 0, "bad size"},
        {"CUDA_MEM_LIMIT_0", "99999999999999999999999999999999999999999999g", 0, "bad size"},
        {"CUDA_MEM_LIMIT_0", "0k", 0, "a limit of 0 is not allowed"},
        {"CUDA_MEM_LIMIT_0", "0.1k", 0, "bad size"},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        clear_environment();
        setenv(sizes[i].name, sizes[i].value, 1);
        if (sizes[i].bytes != 0) {
            EXPECT_OK();
            EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 0, NULL), sizes[i].bytes);
        } else {
            EXPECT_ERROR(sizes[i].name, sizes[i].text);
        }
    }
    /* Ratios: the device keeps 1/ratio, oversubscription on. */
    static const struct {
        const char *ratio;
        uint64_t bytes;
    } ratios[] = {{"2", 2 * GIB}, {"1.5", 2730 * MIB + 682 * 1024 + 682}, {"1", 4 * GIB},
                  {"4.000000", GIB}, {"1.0000001", 0}, {"0.99", 0}, {"1e3", 0}, {"1000000", 0}};
    for (size_t i = 0; i < sizeof ratios / sizeof ratios[0]; i++) {
        clear_environment();
        setenv("CUDA_MEM_LIMIT_0", "4g", 1);
        setenv("CUDA_MEM_RATIO_0", ratios[i].ratio, 1);
        if (ratios[i].bytes == 0) {
            EXPECT_ERROR("CUDA_MEM_RATIO_0", "bad ratio");
            continue;
        }
        EXPECT_OK();
        EXPECT_EQ(memory_of(VGPU_KEY_INDEX, 0, NULL), ratios[i].bytes);
        EXPECT_EQ(find(VGPU_KEY_INDEX, 0, NULL)->oversubscribe, ratios[i].bytes != 4 * GIB ? 1 : -1);
    }
    /* GPU_DEVICES_UUID binds the indexes; one past it is a warning. */
    clear_environment();
    setenv("GPU_DEVICES_UUID", " " UUID_A_UPPER " ," UUID_B, 1);
    setenv("CUDA_CORE_LIMIT_1", "40", 1);
    setenv("CUDA_CORE_SOFT_LIMIT_1", "60", 1);
    setenv("CUDA_MEM_OVERSOLD_0", "true", 1);
    setenv("CUDA_MEM_LIMIT_5", "1g", 1);
    EXPECT_OK();
    EXPECT_EQ(compute_of(VGPU_KEY_UUID, -1, UUID_B), 4000u);
    EXPECT_EQ(find(VGPU_KEY_UUID, -1, UUID_B)->compute_soft_limit, 6000u);
    EXPECT_EQ(find(VGPU_KEY_UUID, -1, UUID_A)->oversubscribe, 1);
    EXPECT_EQ(config.warning_count, 2u);
    EXPECT_WARNING("CUDA_MEM_LIMIT_5=1g: device 5 has no UUID in GPU_DEVICES_UUID (2 entries)");
    EXPECT_WARNING("CUDA_MEM_OVERSOLD_0: memory oversubscription without any memory limit");
    setenv("GPU_DEVICES_UUID", UUID_A ",GPU-nope", 1);
    EXPECT_ERROR("GPU_DEVICES_UUID", "entry 1 \"GPU-nope\" is not a GPU UUID");
    /* Other variables of each system, and their errors. */
    static const struct {
        const char *name;
        const char *value;
        const char *text; /* NULL: accepted */
    } others[] = {
        {"CUDA_MEM_LIMIT_007", "1g", "\"007\" is not a device index 0-63"},
        {"CUDA_CORE_LIMIT", "0", NULL},
        {"CUDA_CORE_LIMIT", "101", "bad percent"},
        {"CUDA_CORE_SOFT_LIMIT", "0", NULL},
        {"CUDA_MEMORY_OVERSUBSCRIBE", "on", NULL},
        {"CUDA_MEMORY_OVERSUBSCRIBE", "2", "bad value (true or false)"},
        {"VCUDA_MEMORY_LIMIT", "10g", NULL},
        {"VCUDA_MEMORY_LIMIT", "(1024 * 1024)", "bad size"},
        {"VCUDA_LOG_LEVEL", "warn", NULL},
        {"VCUDA_LOG_LEVEL", "chatty", "unknown level"},
        {"LOGGER_LEVEL", "3", NULL},
        {"LOGGER_LEVEL", "-1", "unknown level"},
        {"GPU_CORE_UTILIZATION_POLICY", "Force", NULL},
        {"GPU_CORE_UTILIZATION_POLICY", "off", "unknown policy"},
        {"VGPU_POD_NAME", "p", NULL},
        {"VGPU_POD_NAME", "", "not a valid name"},
        {"VGPU_POD_UID", "5d4c", NULL},
        {"TF_SHM_FILE", "/pods/x/shm", NULL},
        {"TF_SHM_FILE", "/shm", "the root folder cannot be a pod's folder"},
        {"TF_SHM_FILE", "/pods/..", "not a file path"},
        {"CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/a.cache", NULL},
        {"CUDA_DEVICE_MEMORY_SHARED_CACHE", "/", "the root folder cannot be a pod's folder"},
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        clear_environment();
        setenv(others[i].name, others[i].value, 1);
        if (others[i].text == NULL) {
            EXPECT_OK();
        } else {
            EXPECT_ERROR(others[i].name, others[i].text);
        }
    }
    clear_environment();
    setenv("TF_SHM_FILE", "/pods/x/shm", 1);
    EXPECT_OK();
    EXPECT_STR(config.pod_folder, "/pods/x");
    EXPECT_EQ(config.pod_source, VGPU_POD_SHM_FILE);
    clear_environment();
    setenv("VGPU_POD_NAME", "p", 1);
    setenv("VGPU_POD_NAMESPACE", "ns", 1);
    setenv("VGPU_POD_UID", "5d4c", 1);
    setenv("VGPU_CONTAINER_NAME", "c", 1);
    setenv("SHM_BASE_PATH", "/b", 1);
    EXPECT_OK();
    EXPECT_STR(config.pod_folder, "/b/ns/p");
    EXPECT_STR(config.pod_name_source, "VGPU_POD_NAME");
    EXPECT_STR(config.pod_uid, "5d4c");
    EXPECT_STR(config.container_source, "VGPU_CONTAINER_NAME");
    setenv("CONTAINER_NAME", "d", 1);
    EXPECT_ERROR("VGPU_CONTAINER_NAME", "contradicts CONTAINER_NAME=d");
}

int main(void) {
    defaults();
    memory_json();
    memory_json_errors();
    long_values();
    too_many_keys();
    compute_json();
    merged();
    compatibility();
    device_limits();
    pod();
    logging();
    small_error_buffers();
    describe();
    random_inputs();
    foreign_variables();
    hidden_devices();
    absent_uuids();
    process_settings();
    overhead_floor();
    unknown_pod();
    soft_and_oversubscribe();
    seed_systems();
    clear_environment();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
