/* Finding the real libraries and routing the three ways a program reaches the driver:
 *   1. linked against libcuda.so.1: the dynamic linker resolves to our exported wrappers;
 *   2. dlopen + dlsym: our dlsym returns our wrapper for a hooked name found in the library;
 *   3. cuGetProcAddress(_v2), as the CUDA runtime uses: the real call picks the symbol for the
 *      caller's version and flags, and a hooked one is swapped for our wrapper. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "hooks.h"
#include "log.h"
#include "vgpu_cuda_table.h"
#include "vgpu_export.h"

struct vgpu_real_functions vgpu_real;

static void *(*real_dlsym)(void *, const char *);
static void *cuda_handle;
static void *nvml_handle;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

/* A sanitizer runtime preloaded before the library (the sanitize test session) looks up its own
 * interceptors through our dlsym before its shadow memory exists: that path stays uninstrumented
 * and calls nothing the runtime intercepts. No effect on a normal build. */
#define VGPU_UNINSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

/* dlsym's version before glibc 2.34: the architecture's first glibc. */
#if defined(__aarch64__)
#define DLSYM_BASE_VERSION "GLIBC_2.17"
#else
#define DLSYM_BASE_VERSION "GLIBC_2.2.5"
#endif

/* The libc dlsym, found with dlvsym so that our own dlsym is never called for it. */
VGPU_UNINSTRUMENTED static void *lookup(void *handle, const char *name) {
    void *(*found)(void *, const char *) = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);
    if (found == NULL) {
        found = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (found == NULL) {
            found = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym",
                                                           DLSYM_BASE_VERSION);
        }
        __atomic_store_n(&real_dlsym, found, __ATOMIC_RELEASE);
    }
    return found == NULL ? NULL : found(handle, name);
}

/* A real function must never be one of our wrappers (a lookup that found our own export, or a
 * TF_*_LIB_PATH naming this library): that would recurse forever. */
static void *checked(void *function, const char *name) {
    if (function != NULL && function == vgpu_hook_for(name)) {
        vgpu_log(VGPU_LOG_ERROR, "%s resolves to the limiter itself; check TF_CUDA_LIB_PATH and "
                 "TF_NVML_LIB_PATH", name);
        return NULL;
    }
    return function;
}

static void *open_library(const char *variable, const char *path) {
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        vgpu_log(VGPU_LOG_ERROR, "%s: cannot load %s: %s", variable, path, dlerror());
    }
    return handle;
}

static void load_cuda(void) {
    cuda_handle = open_library("TF_CUDA_LIB_PATH", vgpu_config_cuda_library());
    if (cuda_handle == NULL) {
        return;
    }
#define VGPU_RESOLVE_CUDA(symbol) \
    vgpu_real.symbol = (__typeof__(symbol) *)checked(lookup(cuda_handle, #symbol), #symbol);
    VGPU_CUDA_HOOKS(VGPU_RESOLVE_CUDA)
    VGPU_CUDA_CALLS(VGPU_RESOLVE_CUDA)
#undef VGPU_RESOLVE_CUDA
    if (vgpu_real.cuInit == NULL) {
        vgpu_log(VGPU_LOG_ERROR, "TF_CUDA_LIB_PATH: %s has no cuInit: not the CUDA driver",
                 vgpu_config_cuda_library());
    }
}

static void load_nvml(void) {
    nvml_handle = open_library("TF_NVML_LIB_PATH", vgpu_config_nvml_library());
    if (nvml_handle == NULL) {
        return;
    }
#define VGPU_RESOLVE_NVML(symbol) \
    vgpu_real.symbol = (__typeof__(symbol) *)checked(lookup(nvml_handle, #symbol), #symbol);
    VGPU_NVML_HOOKS(VGPU_RESOLVE_NVML)
    VGPU_NVML_CALLS(VGPU_RESOLVE_NVML)
#undef VGPU_RESOLVE_NVML
}

bool vgpu_load_cuda(void) {
    pthread_once(&cuda_once, load_cuda);
    return cuda_handle != NULL && vgpu_real.cuInit != NULL;
}

bool vgpu_load_nvml(void) {
    pthread_once(&nvml_once, load_nvml);
    return nvml_handle != NULL;
}

static const struct {
    const char *name;
    void *hook;
} hooks[] = {
#define VGPU_HOOK_ENTRY(symbol) {#symbol, (void *)symbol},
    VGPU_CUDA_HOOKS(VGPU_HOOK_ENTRY)
    VGPU_NVML_HOOKS(VGPU_HOOK_ENTRY)
#undef VGPU_HOOK_ENTRY
};

void *vgpu_hook_for(const char *symbol) {
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++) {
        if (strcmp(hooks[i].name, symbol) == 0) {
            return hooks[i].hook;
        }
    }
    return NULL;
}

/* The object that holds `address`; NULL when none does. */
VGPU_UNINSTRUMENTED static struct link_map *object_of(const void *address) {
    Dl_info info;
    struct link_map *object = NULL;
    return dladdr1(address, &info, (void **)&object, RTLD_DL_LINKMAP) != 0 ? object : NULL;
}

/* Whether `object` was loaded after this library (comes after it in the link map). */
VGPU_UNINSTRUMENTED static bool after_this_library(const struct link_map *object) {
    const struct link_map *self = object_of((const void *)object_of);
    for (const struct link_map *next = self != NULL ? self->l_next : NULL; next != NULL;
         next = next->l_next) {
        if (next == object) {
            return true;
        }
    }
    return false;
}

/* RTLD_NEXT as the caller means it: the first object loaded after the caller's that defines
 * `name`. glibc's dlsym takes "next" to be after the object that called it, which is this
 * library once its dlsym is the program's: a library loaded after it that wraps a function and
 * chains to the next definition got its own wrapper back and recursed until the stack ran out.
 * A caller loaded before this library (the program, a sanitizer's runtime preloaded first) is
 * answered as glibc answers this library, as before: a sanitizer's runtime resolves its own
 * interceptors here before they work, so that path calls nothing a sanitizer intercepts (the
 * walk below opens handles with dlopen, which one does). */
VGPU_UNINSTRUMENTED static void *next_after(const void *caller, const char *name) {
    struct link_map *object = caller != NULL ? object_of(caller) : NULL;
    if (object == NULL || !after_this_library(object)) {
        return lookup(RTLD_NEXT, name);
    }
    for (struct link_map *next = object->l_next; next != NULL; next = next->l_next) {
        /* A handle of its own: a link map is one only for an object dlopen gave (the others'
         * scopes are not set up), and not every object is one to look in (the vDSO is not). */
        void *handle = next->l_name != NULL && next->l_name[0] != '\0'
                           ? dlopen(next->l_name, RTLD_LAZY | RTLD_NOLOAD)
                           : NULL;
        if (handle == NULL) {
            continue;
        }
        void *found = lookup(handle, name);
        dlclose(handle);
        if (found != NULL && object_of(found) == next) { /* not one of its dependencies' */
            return found;
        }
    }
    return NULL;
}

/* Path 2. Cheap for the names no one hooks: only "cu…" and "nvml…" are looked at. */
VGPU_EXPORT VGPU_UNINSTRUMENTED void *dlsym(void *handle, const char *name) {
    void *found = handle == RTLD_NEXT ? next_after(__builtin_return_address(0), name)
                                      : lookup(handle, name);
    if (found != NULL && ((name[0] == 'c' && name[1] == 'u') ||
                          (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l'))) {
        void *hook = vgpu_hook_for(name);
        return hook != NULL ? hook : found;
    }
    return found;
}

/* Path 3: the wrapper of whichever real symbol the driver handed out, recognized by address;
 * a driver whose entry points are not its exported symbols is routed by the same version and
 * stream rule the driver applies, so a hooked call can never escape. */
static void *route(const char *base, void *real_function, int cuda_version, cuuint64_t flags) {
#define VGPU_ROUTE(symbol)                                                                 \
    if (real_function != NULL && real_function == (void *)vgpu_real.symbol) {             \
        return (void *)symbol;                                                             \
    }
    VGPU_CUDA_HOOKS(VGPU_ROUTE)
#undef VGPU_ROUTE
    bool known;
    int chosen = vgpu_cuda_select(base, cuda_version, flags, &known);
    void *hook = chosen >= 0 ? vgpu_hook_for(vgpu_cuda_entries[chosen].symbol) : NULL;
    if (hook != NULL && real_function != NULL) {
        vgpu_log(VGPU_LOG_DEBUG, "cuGetProcAddress(%s): routed by name to %s", base,
                 vgpu_cuda_entries[chosen].symbol);
        return hook;
    }
    return real_function;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    if (!vgpu_load_cuda() || vgpu_real.cuGetProcAddress_v2 == NULL) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    CUresult result =
        vgpu_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (result == CUDA_SUCCESS && pfn != NULL && symbol != NULL) {
        *pfn = route(symbol, *pfn, cudaVersion, flags);
    }
    return result;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    if (!vgpu_load_cuda() || vgpu_real.cuGetProcAddress == NULL) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    CUresult result = vgpu_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (result == CUDA_SUCCESS && pfn != NULL && symbol != NULL) {
        *pfn = route(symbol, *pfn, cudaVersion, flags);
    }
    return result;
}
