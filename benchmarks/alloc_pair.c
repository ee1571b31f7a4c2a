/* Time of cuMemAlloc_v2 + cuMemFree_v2 pairs, for benchmarks/limiter_alloc.py. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_api.h"

int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 100000;
    CUcontext context;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(context) != CUDA_SUCCESS) {
        return 1;
    }
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < pairs; i++) {
        CUdeviceptr pointer;
        if (cuMemAlloc_v2(&pointer, 1 << 20) != CUDA_SUCCESS || cuMemFree_v2(pointer) != 0) {
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double ns = (double)(end.tv_sec - start.tv_sec) * 1e9 + (double)(end.tv_nsec - start.tv_nsec);
    printf("{\"ns_per_pair\": %.1f}\n", ns / (double)pairs);
    return 0;
}
