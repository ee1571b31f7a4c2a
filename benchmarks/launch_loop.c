/* Time of cuLaunchKernel for an empty kernel, for benchmarks/limiter_launch_gpu.py: the cost the
 * launch hooks add, without an interpreter in the measured loop. Loads the kernel from PTX (no
 * toolkit needed), launches in batches with a synchronize after each, and prints the mean time
 * per launch (bound by the GPU's rate for empty kernels) and the median time of one
 * cuLaunchKernel call on the host (the hooks' own cost shows there).
 *
 * Batches alternate between two ways to the driver: the program's own cuLaunchKernel (which a
 * preloaded library intercepts) and the driver's function itself, found with libc's dlsym in
 * libcuda.so.1 (which no preload sees). With a preload, the two are the same program, context
 * and moment with and without the hook: a side-by-side within one process, free of the spread
 * between process launches. Without one, both are the driver and should agree.
 *
 * Usage: launch_loop [LAUNCHES [BATCH [EVICT_BYTES]]]. With EVICT_BYTES, that much memory is
 * written between two calls (outside their timing): the simulated driver's launch touches
 * little, so the hooks' data and code stay in the CPU's caches, where a real driver's launch
 * leaves them cold; evicting the caches shows the simulated GPU the cost a real one sees. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_api.h"

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

static const char PTX[] = ".version 7.0\n"
                          ".target sm_50\n"
                          ".address_size 64\n"
                          ".visible .entry empty()\n"
                          "{\n"
                          "    ret;\n"
                          "}\n";

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* The driver's own cuLaunchKernel: libc's dlsym (from libc's scope, which holds no preload)
 * looked up in libcuda.so.1's scope. */
static launch_fn driver_launch(void) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (libc == NULL || cuda == NULL) {
        return NULL;
    }
    void *(*libc_dlsym)(void *, const char *) = dlvsym(libc, "dlsym", "GLIBC_2.34");
    if (libc_dlsym == NULL) {
        libc_dlsym = dlvsym(libc, "dlsym", "GLIBC_2.2.5");
    }
    return libc_dlsym == NULL ? NULL : (launch_fn)libc_dlsym(cuda, "cuLaunchKernel");
}

struct side {
    launch_fn launch;
    double *calls;
    long count;
    double elapsed;
};

int main(int argc, char **argv) {
    long launches = argc > 1 ? atol(argv[1]) : 200000;
    long batch = argc > 2 ? atol(argv[2]) : 1000;
    long evict = argc > 3 ? atol(argv[3]) : 0;
    volatile unsigned char *scratch = evict > 0 ? calloc(1, (size_t)evict) : NULL;
    if (evict > 0 && scratch == NULL) {
        return 1;
    }
    CUcontext context;
    CUmodule module;
    CUfunction function;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(context) != CUDA_SUCCESS || cuModuleLoadData(&module, PTX) != CUDA_SUCCESS ||
        cuModuleGetFunction(&function, module, "empty") != CUDA_SUCCESS) {
        fprintf(stderr, "cannot set up the kernel\n");
        return 1;
    }
    struct side sides[2] = {{cuLaunchKernel, NULL, 0, 0}, {driver_launch(), NULL, 0, 0}};
    if (sides[1].launch == NULL) {
        fprintf(stderr, "cannot find the driver's cuLaunchKernel\n");
        return 1;
    }
    for (int s = 0; s < 2; s++) {
        for (long i = 0; i < batch; i++) { /* warm up */
            sides[s].launch(function, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        }
        cuCtxSynchronize();
        sides[s].calls = malloc(sizeof(double) * (size_t)launches);
        if (sides[s].calls == NULL) {
            return 1;
        }
    }
    for (long round = 0; sides[0].count < launches || sides[1].count < launches; round++) {
        struct side *side = &sides[round % 2];
        double start = now_ns();
        for (long i = 0; i < batch && side->count < launches; i++) {
            double before = now_ns();
            if (side->launch(function, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
                fprintf(stderr, "launch failed\n");
                return 1;
            }
            side->calls[side->count++] = now_ns() - before;
            for (long byte = 0; byte < evict; byte += 64) {
                scratch[byte]++;
            }
        }
        cuCtxSynchronize();
        side->elapsed += now_ns() - start;
    }
    for (int s = 0; s < 2; s++) {
        qsort(sides[s].calls, (size_t)sides[s].count, sizeof(double), by_value);
    }
    printf("{\"ns_per_launch\": %.2f, \"call_ns_median\": %.2f, "
           "\"direct_ns_per_launch\": %.2f, \"direct_call_ns_median\": %.2f}\n",
           sides[0].elapsed / (double)sides[0].count, sides[0].calls[sides[0].count / 2],
           sides[1].elapsed / (double)sides[1].count, sides[1].calls[sides[1].count / 2]);
    for (int s = 0; s < 2; s++) {
        free(sides[s].calls);
    }
    return 0;
}
