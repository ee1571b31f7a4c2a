/* Threads under the compute limit on the simulated GPU. WORKERS threads launch kernels of
 * KERNEL_US on streams of their own, each waiting for its own stream now and then, while one more
 * thread synchronizes the context and every worker's stream over and over; after SECONDS the
 * workers stop and the program waits for everything. The limiter's pacing waits must neither
 * deadlock with those synchronizations nor lose launches, and the pod must still get its share.
 * Usage: limiter_threads WORKERS SECONDS KERNEL_US. Prints one JSON object: kernels launched,
 * seconds from the first launch to the end of the last kernel, and failed calls. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_api.h"

#define MAX_WORKERS 16
#define BATCH 10

static CUcontext context;
static CUfunction function;
static CUstream streams[MAX_WORKERS];
static int workers;
static uint64_t kernel_ns;
static atomic_bool stopping;
static atomic_ullong launched;
static atomic_uint failures;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void check(CUresult result) {
    if (result != CUDA_SUCCESS) {
        atomic_fetch_add(&failures, 1);
    }
}

static void *work(void *argument) {
    CUstream stream = streams[(intptr_t)argument];
    void *params[] = {&kernel_ns};
    check(cuCtxSetCurrent(context));
    for (unsigned round = 0; !atomic_load(&stopping); round++) {
        for (int k = 0; k < BATCH; k++) {
            check(cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
        }
        atomic_fetch_add(&launched, BATCH);
        if (round % 4 == 3) {
            check(cuStreamSynchronize(stream));
        }
    }
    return NULL;
}

static void *synchronize(void *argument) {
    (void)argument;
    check(cuCtxSetCurrent(context));
    for (unsigned round = 0; !atomic_load(&stopping); round++) {
        check(cuCtxSynchronize());
        check(cuStreamSynchronize(streams[round % (unsigned)workers]));
        struct timespec pause = {0, 500000};
        nanosleep(&pause, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: limiter_threads WORKERS SECONDS KERNEL_US\n");
        return 2;
    }
    workers = atoi(argv[1]);
    double seconds = atof(argv[2]);
    kernel_ns = (uint64_t)(atof(argv[3]) * 1000.0);
    if (workers < 1 || workers > MAX_WORKERS || seconds <= 0 || kernel_ns == 0) {
        fprintf(stderr, "limiter_threads: bad arguments\n");
        return 2;
    }
    CUmodule module;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(context) != CUDA_SUCCESS ||
        cuModuleLoadData(&module, "limiter_threads") != CUDA_SUCCESS ||
        cuModuleGetFunction(&function, module, "sleep_kernel") != CUDA_SUCCESS) {
        fprintf(stderr, "limiter_threads: cannot set up the device\n");
        return 1;
    }
    for (int i = 0; i < workers; i++) {
        check(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING));
    }
    pthread_t threads[MAX_WORKERS + 1];
    double start = now_s();
    for (int i = 0; i < workers; i++) {
        pthread_create(&threads[i], NULL, work, (void *)(intptr_t)i);
    }
    pthread_create(&threads[workers], NULL, synchronize, NULL);
    struct timespec run = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&run, NULL);
    atomic_store(&stopping, true);
    for (int i = 0; i <= workers; i++) {
        pthread_join(threads[i], NULL);
    }
    check(cuCtxSynchronize());
    double elapsed = now_s() - start;
    for (int i = 0; i < workers; i++) {
        check(cuStreamDestroy_v2(streams[i]));
    }
    printf("{\"kernels\": %llu, \"seconds\": %.6f, \"failures\": %u}\n",
           (unsigned long long)atomic_load(&launched), elapsed, atomic_load(&failures));
    return 0;
}
