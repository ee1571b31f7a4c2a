/* Host time of the calls a paced launch makes besides the launch itself, on the GPU machine: the
 * driver's cuCtxGetCurrent, cuCtxGetDevice and cuStreamIsCapturing (on the legacy, a created
 * and the per-thread default stream), the clock, and an uncontended mutex. Each is called in a
 * tight loop, so the figures are the warm floor: in a real launch loop the driver's own work
 * leaves the limiter's data and code colder.
 *     cc -O2 -std=c11 benchmarks/host_call_costs.c -o host_call_costs -ldl -lpthread
 *     ./host_call_costs          one JSON line per repetition, nanoseconds per call */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

typedef int CUresult;
typedef void *CUcontext;
typedef void *CUstream;
typedef int CUdevice;

#define CALLS 5000000
#define REPEATS 3
#define PER_THREAD_STREAM ((CUstream)0x2)

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Nanoseconds per iteration of `body`. */
#define TIME(body)                                                                           \
    ({                                                                                       \
        uint64_t started = now_ns();                                                         \
        for (int i = 0; i < CALLS; i++) {                                                    \
            body;                                                                            \
        }                                                                                    \
        (double)(now_ns() - started) / CALLS;                                                \
    })

int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda == NULL) {
        fprintf(stderr, "no libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    CUresult (*init)(unsigned) = dlsym(cuda, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = dlsym(cuda, "cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = dlsym(cuda, "cuCtxSetCurrent");
    CUresult (*get_current)(CUcontext *) = dlsym(cuda, "cuCtxGetCurrent");
    CUresult (*get_device)(CUdevice *) = dlsym(cuda, "cuCtxGetDevice");
    CUresult (*capturing)(CUstream, int *) = dlsym(cuda, "cuStreamIsCapturing");
    CUresult (*create_stream)(CUstream *, unsigned) = dlsym(cuda, "cuStreamCreate");
    CUcontext context;
    CUstream stream;
    if (init == NULL || init(0) != 0 || retain(&context, 0) != 0 || set_current(context) != 0 ||
        create_stream(&stream, 1) != 0) {
        fprintf(stderr, "cannot set up a context\n");
        return 1;
    }
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    for (int repeat = 0; repeat < REPEATS; repeat++) {
        CUcontext seen;
        CUdevice device;
        int status;
        struct timespec clock;
        double current = TIME(get_current(&seen));
        double device_of = TIME(get_device(&device));
        double legacy = TIME(capturing(NULL, &status));
        double created = TIME(capturing(stream, &status));
        double per_thread = TIME(capturing(PER_THREAD_STREAM, &status));
        double clock_read = TIME(clock_gettime(CLOCK_MONOTONIC, &clock));
        double mutex = TIME((pthread_mutex_lock(&lock), pthread_mutex_unlock(&lock)));
        printf("{\"measure\": \"host_call_ns\", \"cuCtxGetCurrent\": %.1f, \"cuCtxGetDevice\": "
               "%.1f, \"cuStreamIsCapturing_legacy\": %.1f, \"cuStreamIsCapturing_created\": "
               "%.1f, \"cuStreamIsCapturing_per_thread\": %.1f, \"clock_gettime\": %.1f, "
               "\"mutex_lock_unlock\": %.1f}\n",
               current, device_of, legacy, created, per_thread, clock_read, mutex);
    }
    return 0;
}
