/* Forks of a CUDA program under the limiter on the simulated GPU, as a training script forks
 * its data loader's workers, a pool or a shell while other threads work.
 *
 *   busy MODE FORKS
 *               a thread works on through one of the limiter's locks (MODE: "launch", paced
 *               kernels of 50 ms; "pool", stream-ordered allocations; "primary", retains and
 *               releases of the primary context; "limit", cuCtxSetLimit) while the main thread
 *               forks FORKS children one after another. Each child makes the calls a worker
 *               or a runtime's exit handlers may make (the memory views, synchronizations, a
 *               launch, a stream's and the primary context's release) and exits; one that has
 *               not finished after CHILD_SECONDS is killed. Prints one JSON object: children
 *               forked, the call the first hung child was in ("" when none hung).
 *   charge      runs an epoch of 20 kernels of 1 ms, synchronizes (the epoch stays open),
 *               forks a child that releases the primary context and exits, then launches
 *               once more and releases it itself. Prints {"child": exit status}; the pod's
 *               GPU time charged is read from its region by the test.
 *
 * Usage: limiter_fork busy MODE FORKS | limiter_fork charge */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"
#include "nvml_abi.h"
#include "spin_kernel.h"

#define CHILD_SECONDS 30

static CUcontext context;
static CUfunction function;
static CUstream stream;
static atomic_bool stopping;
static atomic_bool working;

static void fail(const char *what) {
    fprintf(stderr, "limiter_fork: %s failed\n", what);
    exit(1);
}

static void pause_ms(long milliseconds) {
    struct timespec pause = {milliseconds / 1000, (milliseconds % 1000) * 1000000L};
    nanosleep(&pause, NULL);
}

static CUresult launch(CUstream on, uint64_t nanoseconds) {
    void *params[] = {&nanoseconds};
    return cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, on, params, NULL);
}

/* The worker thread: through the limiter's lock of MODE, over and over. */
static void *work(void *argument) {
    const char *mode = argument;
    if (cuCtxSetCurrent(context) != CUDA_SUCCESS) {
        fail("cuCtxSetCurrent in the worker");
    }
    CUstream own;
    if (cuStreamCreate(&own, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        fail("cuStreamCreate in the worker");
    }
    while (!atomic_load(&stopping)) {
        bool done = true;
        if (strcmp(mode, "launch") == 0) {
            done = launch(own, 50000000ULL) == CUDA_SUCCESS;
        } else if (strcmp(mode, "pool") == 0) {
            /* One allocation that fits and one past the limit: refused, it looks for dead
             * processes' memory (reading /proc) under the pool's lock, outside the driver. */
            CUdeviceptr pointer;
            done = cuMemAllocAsync(&pointer, 4 << 20, own) == CUDA_SUCCESS &&
                   cuMemFreeAsync(pointer, own) == CUDA_SUCCESS &&
                   cuMemAllocAsync(&pointer, 8ULL << 30, own) == CUDA_ERROR_OUT_OF_MEMORY &&
                   cuStreamSynchronize(own) == CUDA_SUCCESS;
        } else if (strcmp(mode, "primary") == 0) {
            CUcontext primary;
            done = cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS &&
                   cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS;
        } else if (strcmp(mode, "limit") == 0) {
            static size_t heap = 8 << 20;
            heap = heap == 8 << 20 ? 16 << 20 : 8 << 20;
            done = cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, heap) == CUDA_SUCCESS;
        }
        if (!done) {
            fail(mode);
        }
        atomic_store(&working, true);
    }
    cuStreamSynchronize(own);
    return NULL;
}

/* The calls of a child, each named in `step` (shared with the parent) before it is made. */
static void child(char *step) {
    alarm(CHILD_SECONDS);
    size_t free_bytes, total;
    strcpy(step, "cuMemGetInfo_v2");
    cuMemGetInfo_v2(&free_bytes, &total);
    strcpy(step, "nvmlDeviceGetMemoryInfo");
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (nvml != NULL) {
        nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(nvml, "nvmlInit_v2");
        nvmlReturn_t (*handle_of)(unsigned, nvmlDevice_t *) =
            (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
        nvmlReturn_t (*memory_of)(nvmlDevice_t, nvmlMemory_t *) =
            (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(nvml, "nvmlDeviceGetMemoryInfo");
        nvmlDevice_t device;
        nvmlMemory_t memory;
        if (init != NULL && handle_of != NULL && memory_of != NULL && init() == NVML_SUCCESS &&
            handle_of(0, &device) == NVML_SUCCESS) {
            memory_of(device, &memory);
        }
    }
    strcpy(step, "cuCtxSynchronize");
    cuCtxSynchronize();
    strcpy(step, "cuStreamSynchronize");
    cuStreamSynchronize(stream);
    strcpy(step, "cuLaunchKernel");
    if (launch(stream, 1000000ULL) == CUDA_SUCCESS) {
        cuStreamSynchronize(stream);
    }
    strcpy(step, "cuCtxSetLimit");
    cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 << 20);
    strcpy(step, "cuStreamDestroy_v2");
    cuStreamDestroy_v2(stream);
    strcpy(step, "cuDevicePrimaryCtxRetain");
    CUcontext primary;
    cuDevicePrimaryCtxRetain(&primary, 0);
    strcpy(step, "cuDevicePrimaryCtxRelease_v2");
    cuDevicePrimaryCtxRelease_v2(0);
    cuDevicePrimaryCtxRelease_v2(0);
    strcpy(step, "");
    _exit(0);
}

static void set_up(void) {
    CUmodule module;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(context) != CUDA_SUCCESS ||
        cuModuleLoadData(&module, SPIN) != CUDA_SUCCESS ||
        cuModuleGetFunction(&function, module, "spin") != CUDA_SUCCESS ||
        cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        fail("setting up");
    }
}

static int busy(const char *mode, int forks) {
    set_up();
    char *step = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (step == MAP_FAILED) {
        fail("mmap");
    }
    pthread_t worker;
    if (pthread_create(&worker, NULL, work, (void *)mode) != 0) {
        fail("pthread_create");
    }
    while (!atomic_load(&working)) {
        pause_ms(1);
    }
    int forked = 0;
    const char *hung = "";
    while (forked < forks && hung[0] == '\0') {
        pause_ms(7 + 13 * forked % 31); /* forks at different moments of the worker's round */
        step[0] = '\0';
        pid_t pid = fork();
        if (pid == 0) {
            child(step);
        }
        if (pid < 0) {
            fail("fork");
        }
        forked++;
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            hung = step[0] != '\0' ? step : "exit";
        }
    }
    atomic_store(&stopping, true);
    pthread_join(worker, NULL);
    printf("{\"forked\":%d,\"hung\":\"%s\"}\n", forked, hung);
    return 0;
}

static int charge(void) {
    set_up();
    for (int k = 0; k < 20; k++) {
        if (launch(stream, 1000000ULL) != CUDA_SUCCESS) {
            fail("cuLaunchKernel");
        }
    }
    if (cuCtxSynchronize() != CUDA_SUCCESS) {
        fail("cuCtxSynchronize");
    }
    pid_t pid = fork();
    if (pid == 0) {
        /* A runtime's exit handler in the child releases the context it inherited. */
        cuDevicePrimaryCtxRelease_v2(0);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    pause_ms(10); /* a pause: the parent's next launch closes its epoch */
    if (launch(stream, 1000000ULL) != CUDA_SUCCESS || cuStreamSynchronize(stream) != CUDA_SUCCESS ||
        cuStreamDestroy_v2(stream) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRelease_v2(0) != CUDA_SUCCESS) {
        fail("the parent's last launch");
    }
    printf("{\"child\":%d}\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "busy") == 0 && atoi(argv[3]) > 0) {
        return busy(argv[2], atoi(argv[3]));
    }
    if (argc == 2 && strcmp(argv[1], "charge") == 0) {
        return charge();
    }
    fprintf(stderr, "usage: limiter_fork busy launch|pool|primary|limit FORKS | "
                    "limiter_fork charge\n");
    return 2;
}
