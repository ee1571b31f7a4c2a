/* The checks of a C unit test: CHECK(condition) counts it passed or failed, naming the failed
 * one's line on stderr; unit_report() prints "N passed, M failed", which the test suite reads,
 * and answers the exit status. */
#ifndef VGPU_TESTS_UNIT_CHECK_H
#define VGPU_TESTS_UNIT_CHECK_H

#include <stdio.h>

static int passed;
static int failed;

static void check(int ok, int line, const char *what) {
    if (ok) {
        passed++;
        return;
    }
    failed++;
    fprintf(stderr, "line %d: %s\n", line, what);
}
#define CHECK(condition) check((condition), __LINE__, #condition)

static int unit_report(void) {
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}

#endif
