/* A library that wraps getppid() and chains to the next definition, the usual way an
 * interposer (a profiler, a tracer) does: dlsym(RTLD_NEXT, ...). With the limiter preloaded
 * its dlsym is the program's; "next" must still be after this library, not after the limiter,
 * or the wrapper gets itself back and recurses. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

static int depth;

pid_t getppid(void) {
    pid_t (*next)(void) = (pid_t(*)(void))dlsym(RTLD_NEXT, "getppid");
    if (next == NULL || next == getppid || ++depth > 1) {
        fprintf(stderr, "RTLD_NEXT gave %s\n", next == NULL ? "nothing" : "the wrapper itself");
        _exit(3);
    }
    pid_t parent = next();
    depth--;
    return parent;
}
