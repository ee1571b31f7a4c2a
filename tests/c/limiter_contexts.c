/* Contexts that come and go under the compute limit on the simulated GPU. Runs kernels of
 * KERNEL_US for SECONDS in each of two phases and prints, per phase, the kernels done and the
 * seconds they took (the end of the last kernel included):
 *   destroy   phase 1 in a context of cuCtxCreate, destroyed; phase 2 in a new one
 *   reset     phase 1 in the primary context, reset (cudaDeviceReset does this); phase 2 in the
 *             primary context again
 *   two       both phases at once, alternating batches between two live contexts
 * A program must not leave its limit behind with the context it started in. The kernel spins on
 * the GPU's clock for its parameter's nanoseconds, so the program runs on a real GPU as on the
 * simulated one (which takes any image and times kernels by that same parameter).
 * Usage: limiter_contexts MODE SECONDS KERNEL_US */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "spin_kernel.h"

#define BATCH 10

static uint64_t kernel_ns;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int fail(const char *what) {
    fprintf(stderr, "limiter_contexts: %s failed\n", what);
    exit(1);
}

static CUfunction kernel_in(CUcontext context) {
    CUmodule module;
    CUfunction function;
    if (cuCtxSetCurrent(context) != CUDA_SUCCESS ||
        cuModuleLoadData(&module, SPIN) != CUDA_SUCCESS ||
        cuModuleGetFunction(&function, module, "spin") != CUDA_SUCCESS) {
        fail("loading the kernel");
    }
    return function;
}

static void launch_batch(CUcontext context, CUfunction function) {
    void *params[] = {&kernel_ns};
    if (cuCtxSetCurrent(context) != CUDA_SUCCESS) {
        fail("cuCtxSetCurrent");
    }
    for (int k = 0; k < BATCH; k++) {
        if (cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) != CUDA_SUCCESS) {
            fail("cuLaunchKernel");
        }
    }
}

/* Launch batches for `seconds` (over one or two contexts), then wait; kernels done. */
static unsigned long long run(CUcontext *contexts, CUfunction *functions, int count,
                              double seconds, double *took) {
    unsigned long long done = 0;
    double start = now_s();
    for (int round = 0; now_s() - start < seconds; round++) {
        launch_batch(contexts[round % count], functions[round % count]);
        done += BATCH;
        if (round % 4 == 3 && cuCtxSynchronize() != CUDA_SUCCESS) {
            fail("cuCtxSynchronize");
        }
    }
    for (int i = 0; i < count; i++) {
        if (cuCtxSetCurrent(contexts[i]) != CUDA_SUCCESS || cuCtxSynchronize() != CUDA_SUCCESS) {
            fail("the final cuCtxSynchronize");
        }
    }
    *took = now_s() - start;
    return done;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: limiter_contexts destroy|reset|two SECONDS KERNEL_US\n");
        return 2;
    }
    const char *mode = argv[1];
    double seconds = atof(argv[2]);
    kernel_ns = (uint64_t)(atof(argv[3]) * 1000.0);
    if (cuInit(0) != CUDA_SUCCESS) {
        fail("cuInit");
    }
    CUcontext contexts[2];
    CUfunction functions[2];
    double took[2];
    unsigned long long done[2];
    if (strcmp(mode, "destroy") == 0 || strcmp(mode, "reset") == 0) {
        bool reset = mode[0] == 'r';
        for (int phase = 0; phase < 2; phase++) {
            CUresult made = reset ? cuDevicePrimaryCtxRetain(&contexts[0], 0)
                                  : cuCtxCreate_v2(&contexts[0], 0, 0);
            if (made != CUDA_SUCCESS) {
                fail("making a context");
            }
            functions[0] = kernel_in(contexts[0]);
            done[phase] = run(contexts, functions, 1, seconds, &took[phase]);
            CUresult gone = reset ? cuDevicePrimaryCtxReset_v2(0) : cuCtxDestroy_v2(contexts[0]);
            if (gone != CUDA_SUCCESS) {
                fail("ending the context");
            }
        }
    } else if (strcmp(mode, "two") == 0) {
        for (int i = 0; i < 2; i++) {
            if (cuCtxCreate_v2(&contexts[i], 0, 0) != CUDA_SUCCESS) {
                fail("cuCtxCreate");
            }
            functions[i] = kernel_in(contexts[i]);
        }
        done[0] = run(contexts, functions, 2, seconds, &took[0]);
        done[1] = run(contexts, functions, 2, seconds, &took[1]);
    } else {
        fprintf(stderr, "limiter_contexts: unknown mode %s\n", mode);
        return 2;
    }
    printf("{\"kernels\": [%llu, %llu], \"seconds\": [%.6f, %.6f]}\n", done[0], done[1], took[0],
           took[1]);
    return 0;
}
