/* The limiter is loaded into programs on whatever glibc their image has: bind the few symbols
 * whose default version is newer than 2.17 on the build machine to their old versions. Before
 * glibc 2.34 these live in libdl and libpthread, which the library keeps NEEDED. Included in
 * every limiter source by the build (-include), so no file can forget it. */
#ifndef VGPU_GLIBC_COMPAT_H
#define VGPU_GLIBC_COMPAT_H

#if defined(__x86_64__)
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlerror,dlerror@GLIBC_2.2.5");
__asm__(".symver dlvsym,dlvsym@GLIBC_2.2.5");
__asm__(".symver dlclose,dlclose@GLIBC_2.2.5");
__asm__(".symver dladdr1,dladdr1@GLIBC_2.3.3");
__asm__(".symver pthread_once,pthread_once@GLIBC_2.2.5");
__asm__(".symver pthread_mutex_trylock,pthread_mutex_trylock@GLIBC_2.2.5");
__asm__(".symver pthread_create,pthread_create@GLIBC_2.2.5");
__asm__(".symver pthread_join,pthread_join@GLIBC_2.2.5");
__asm__(".symver pthread_sigmask,pthread_sigmask@GLIBC_2.2.5");
#elif defined(__aarch64__)
/* aarch64's first glibc is 2.17: its base version. */
__asm__(".symver dlopen,dlopen@GLIBC_2.17");
__asm__(".symver dlerror,dlerror@GLIBC_2.17");
__asm__(".symver dlvsym,dlvsym@GLIBC_2.17");
__asm__(".symver dlclose,dlclose@GLIBC_2.17");
__asm__(".symver dladdr1,dladdr1@GLIBC_2.17");
__asm__(".symver pthread_once,pthread_once@GLIBC_2.17");
__asm__(".symver pthread_mutex_trylock,pthread_mutex_trylock@GLIBC_2.17");
__asm__(".symver pthread_create,pthread_create@GLIBC_2.17");
__asm__(".symver pthread_join,pthread_join@GLIBC_2.17");
__asm__(".symver pthread_sigmask,pthread_sigmask@GLIBC_2.17");
#endif

#endif
