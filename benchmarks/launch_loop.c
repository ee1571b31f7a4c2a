/* Time of cuLaunchKernel for an empty kernel, for benchmarks/limiter_launch_gpu.py: the cost the
 * launch hooks add, without an interpreter in the measured loop. Loads the kernel from PTX (no
 * toolkit needed), launches in batches with a synchronize after each, and prints the mean time
 * per launch (bound by the GPU's rate for empty kernels) and the median time of one
 * cuLaunchKernel call on the host (the hooks' own cost shows there). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_api.h"

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

int main(int argc, char **argv) {
    long launches = argc > 1 ? atol(argv[1]) : 200000;
    long batch = argc > 2 ? atol(argv[2]) : 1000;
    CUcontext context;
    CUmodule module;
    CUfunction function;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(context) != CUDA_SUCCESS || cuModuleLoadData(&module, PTX) != CUDA_SUCCESS ||
        cuModuleGetFunction(&function, module, "empty") != CUDA_SUCCESS) {
        fprintf(stderr, "cannot set up the kernel\n");
        return 1;
    }
    for (long i = 0; i < batch; i++) { /* warm up */
        cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    }
    cuCtxSynchronize();
    double *calls = malloc(sizeof(double) * (size_t)launches);
    if (calls == NULL) {
        return 1;
    }
    long count = 0;
    double start = now_ns();
    for (long done = 0; done < launches; done += batch) {
        for (long i = 0; i < batch && count < launches; i++) {
            double before = now_ns();
            if (cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
                fprintf(stderr, "launch failed\n");
                return 1;
            }
            calls[count++] = now_ns() - before;
        }
        cuCtxSynchronize();
    }
    double elapsed = now_ns() - start;
    qsort(calls, (size_t)count, sizeof(double), by_value);
    printf("{\"ns_per_launch\": %.2f, \"call_ns_median\": %.2f}\n", elapsed / (double)count,
           calls[count / 2]);
    free(calls);
    return 0;
}
