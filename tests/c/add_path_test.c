/* libadd_path's merge rule and environment rewrite, built with the library's source under
 * ASan/UBSan (nox -s sanitize). Prints "N passed, M failed" and exits non-zero on failure. */
#define _GNU_SOURCE
#include "add_path.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed;
static int failed;

static void check_string(const char *what, const char *got, const char *expected, int line) {
    int same = (got == NULL && expected == NULL) ||
               (got != NULL && expected != NULL && strcmp(got, expected) == 0);
    if (same) {
        passed++;
        return;
    }
    failed++;
    fprintf(stderr, "line %d: %s: got %s%s%s, expected %s%s%s\n", line, what, got ? "\"" : "",
            got ? got : "NULL", got ? "\"" : "", expected ? "\"" : "",
            expected ? expected : "NULL", expected ? "\"" : "");
}

#define CHECK_MERGE(current, prepend, append, separators, expected)                              \
    do {                                                                                         \
        char *result_ = vgpu_add_path_merge(current, prepend, append, separators);               \
        check_string("merge", result_, expected, __LINE__);                                      \
        vgpu_add_path_free(result_);                                                             \
    } while (0)

#define CHECK_ENV(name, expected) check_string(name, getenv(name), expected, __LINE__)

static void merge_cases(void) {
    CHECK_MERGE("/usr/bin:/bin", "/opt/a", "/opt/b", ":", "/opt/a:/usr/bin:/bin:/opt/b");
    CHECK_MERGE(NULL, NULL, NULL, ":", NULL);
    CHECK_MERGE("x", "", "", ":", NULL);
    CHECK_MERGE(NULL, ":::", "::", ":", NULL);
    CHECK_MERGE(NULL, "a::b:a", NULL, ":", "a:b");
    CHECK_MERGE("", "a", NULL, ":", "a");
    CHECK_MERGE("a:b", "b:c", "c:d:a", ":", "c:a:b:d");
    CHECK_MERGE("a::b", NULL, "c", ":", "a::b:c");
    CHECK_MERGE("x.so y.so", " y.so  z.so ", "x.so:w.so", ": ", "z.so:x.so y.so:w.so");
    CHECK_MERGE("a b", "a b", NULL, ":", NULL);
    CHECK_MERGE("a b", NULL, "a b", ":", NULL);
    CHECK_MERGE("abc", "ab", "abcd", ":", "ab:abc:abcd");
    CHECK_MERGE("a", "b", "b", NULL, "b:a");
}

/* Random inputs over a small alphabet: the result keeps `current` and a second application
 * adds nothing. The sanitizers watch every byte touched on the way. */
static void random_cases(void) {
    static const char alphabet[] = "ab/: .";
    unsigned seed = 12345;
    char current[24];
    char prepend[24];
    char append[24];
    char *inputs[] = {current, prepend, append};
    for (int round = 0; round < 20000; round++) {
        for (int i = 0; i < 3; i++) {
            seed = seed * 1103515245u + 12345u;
            size_t length = (seed >> 16) % sizeof current;
            for (size_t j = 0; j < length; j++) {
                seed = seed * 1103515245u + 12345u;
                inputs[i][j] = alphabet[(seed >> 16) % (sizeof alphabet - 1)];
            }
            inputs[i][length] = '\0';
        }
        const char *separators = round % 2 ? ": " : ":";
        char *once = vgpu_add_path_merge(current, prepend, append, separators);
        if (once == NULL) {
            passed++;
            continue;
        }
        char *twice = vgpu_add_path_merge(once, prepend, append, separators);
        if (strstr(once, current) != NULL && twice == NULL) {
            passed++;
        } else {
            failed++;
            fprintf(stderr, "random: \"%s\" \"%s\" \"%s\" -> \"%s\"\n", current, prepend, append, once);
        }
        vgpu_add_path_free(twice);
        vgpu_add_path_free(once);
    }
}

static void apply_cases(void) {
    setenv("PATH", "/usr/bin:/bin", 1);
    setenv("TF_PREPEND_PATH", "/opt/a", 1);
    setenv("TF_PATH", "/opt/b:/bin", 1);
    unsetenv("LD_LIBRARY_PATH");
    setenv("TF_LD_LIBRARY_PATH", "/opt/lib", 1);
    setenv("LD_PRELOAD", "x.so", 1);
    setenv("TF_PREPEND_LD_PRELOAD", "y.so x.so", 1);
    vgpu_add_path_apply();
    CHECK_ENV("PATH", "/opt/a:/usr/bin:/bin:/opt/b");
    CHECK_ENV("LD_LIBRARY_PATH", "/opt/lib");
    CHECK_ENV("LD_PRELOAD", "y.so:x.so");
    vgpu_add_path_apply();
    CHECK_ENV("PATH", "/opt/a:/usr/bin:/bin:/opt/b");
    /* libc's own setenv keeps working on the array the library replaced. */
    setenv("AFTER", "1", 1);
    CHECK_ENV("AFTER", "1");
    CHECK_ENV("LD_LIBRARY_PATH", "/opt/lib");
}

int main(void) {
    merge_cases();
    random_cases();
    apply_cases();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
