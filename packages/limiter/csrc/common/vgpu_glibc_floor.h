/* The simulated GPU and its workload ship in the same manylinux2014 wheel as the limiter, so they
 * too may ask glibc for nothing newer than 2.17. Built on a newer glibc, these symbols default to
 * versions it added when libpthread and libdl moved into libc (2.34): bind them to the
 * architecture's first versions, which every glibc still exports. The libraries keep libdl and
 * libpthread NEEDED, where those symbols live before 2.34. Included by the build (-include). */
#ifndef VGPU_GLIBC_FLOOR_H
#define VGPU_GLIBC_FLOOR_H

#if defined(__x86_64__)
#define VGPU_GLIBC_FIRST "GLIBC_2.2.5"
#define VGPU_GLIBC_ROBUST "GLIBC_2.12"
#elif defined(__aarch64__)
#define VGPU_GLIBC_FIRST "GLIBC_2.17"
#define VGPU_GLIBC_ROBUST "GLIBC_2.17"
#endif

#ifdef VGPU_GLIBC_FIRST
#define VGPU_GLIBC_BIND(symbol, version) __asm__(".symver " #symbol "," #symbol "@" version)
VGPU_GLIBC_BIND(dlopen, VGPU_GLIBC_FIRST);
VGPU_GLIBC_BIND(dlerror, VGPU_GLIBC_FIRST);
VGPU_GLIBC_BIND(dlsym, VGPU_GLIBC_FIRST);
VGPU_GLIBC_BIND(pthread_once, VGPU_GLIBC_FIRST);
VGPU_GLIBC_BIND(pthread_mutexattr_init, VGPU_GLIBC_FIRST);
VGPU_GLIBC_BIND(pthread_mutexattr_destroy, VGPU_GLIBC_FIRST);
VGPU_GLIBC_BIND(pthread_mutexattr_setpshared, VGPU_GLIBC_FIRST);
VGPU_GLIBC_BIND(pthread_mutexattr_setrobust, VGPU_GLIBC_ROBUST);
VGPU_GLIBC_BIND(pthread_mutex_consistent, VGPU_GLIBC_ROBUST);
#undef VGPU_GLIBC_BIND
#endif

#endif
