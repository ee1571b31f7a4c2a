/* crt1.o from glibc 2.34 and later calls __libc_start_main@GLIBC_2.34, which older glibc lacks.
 * This definition takes that call and forwards it to the architecture's first version, which
 * every glibc exports (2.34 and later implement both the same way). The new crt1.o passes no
 * init function, leaving the program's constructors to glibc; an older glibc expects one, so
 * one that runs them is passed instead, which a newer glibc calls just the same. */
#include "vgpu_glibc_floor.h"

#ifdef VGPU_GLIBC_FIRST
#include <stddef.h>

typedef int (*main_function)(int, char **, char **);
typedef void (*init_function)(int, char **, char **);

int first_libc_start_main(main_function main, int argc, char **argv, init_function init,
                          void (*fini)(void), void (*rtld_fini)(void), void *stack_end);
__asm__(".symver first_libc_start_main,__libc_start_main@" VGPU_GLIBC_FIRST);

extern init_function __preinit_array_start[], __preinit_array_end[];
extern init_function __init_array_start[], __init_array_end[];

static void run_constructors(int argc, char **argv, char **environment) {
    for (init_function *entry = __preinit_array_start; entry < __preinit_array_end; entry++) {
        (*entry)(argc, argv, environment);
    }
    for (init_function *entry = __init_array_start; entry < __init_array_end; entry++) {
        (*entry)(argc, argv, environment);
    }
}

int __libc_start_main(main_function main, int argc, char **argv, init_function init,
                      void (*fini)(void), void (*rtld_fini)(void), void *stack_end);

int __libc_start_main(main_function main, int argc, char **argv, init_function init,
                      void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
    return first_libc_start_main(main, argc, argv, init != NULL ? init : run_constructors, fini,
                                 rtld_fini, stack_end);
}
#endif
