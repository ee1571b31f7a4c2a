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
 *   writers     asks NVML for the GPUs (the limiter opens the pod's region and maps no device),
 *               takes the region's writers' lock on the limiter's own descriptor of it, as a
 *               thread of this process inside the writers' section holds it, and forks a child
 *               that calls cuInit (the limiter maps the devices, seeding each entry under the
 *               writers' lock). After 500 ms it tries the lock from a descriptor of its own,
 *               as another process of the pod or the daemon would, then lets go. Prints
 *               {"child": exit status, "entered": whether the child was through the writers'
 *               section within the 500 ms, "kept": whether the lock still kept others out}.
 *   orphan      a process asks NVML for the GPUs, forks a worker that lives on, takes the
 *               writers' lock on the limiter's descriptor and is killed. Prints {"held":
 *               whether the lock is still held, tried from a descriptor of its own}.
 *   exec        asks NVML for the GPUs, then runs this program again (fork and exec) as
 *               `limiter_fork open`, which prints {"open": whether it has the pod's region
 *               open}, passed through.
 *
 * Usage: limiter_fork busy MODE FORKS | limiter_fork charge | limiter_fork writers |
 *        limiter_fork orphan | limiter_fork exec */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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

/* NVML's count of GPUs: the limiter sets itself up (opens the pod's region) and maps no device. */
static void ask_nvml(void) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    nvmlReturn_t (*init)(void) = nvml ? (nvmlReturn_t(*)(void))dlsym(nvml, "nvmlInit_v2") : NULL;
    nvmlReturn_t (*count_of)(unsigned *) =
        nvml ? (nvmlReturn_t(*)(unsigned *))dlsym(nvml, "nvmlDeviceGetCount_v2") : NULL;
    unsigned count;
    if (init == NULL || count_of == NULL || init() != NVML_SUCCESS ||
        count_of(&count) != NVML_SUCCESS) {
        fail("asking NVML for the GPUs");
    }
}

/* The pod's region file, $SHM_PATH/shm, as /proc shows the files a process has open. */
static void region_path(char *path) {
    char given[PATH_MAX];
    const char *folder = getenv("SHM_PATH");
    snprintf(given, sizeof given, "%s/shm", folder != NULL ? folder : "");
    if (realpath(given, path) == NULL) {
        fail("realpath of $SHM_PATH/shm");
    }
}

/* The limiter's descriptor of the pod's region in this process; -1 when it has none open. */
static int region_descriptor(void) {
    char path[PATH_MAX], entry[64], target[PATH_MAX];
    region_path(path);
    DIR *folder = opendir("/proc/self/fd");
    if (folder == NULL) {
        fail("opendir /proc/self/fd");
    }
    int found = -1;
    for (struct dirent *name; found < 0 && (name = readdir(folder)) != NULL;) {
        snprintf(entry, sizeof entry, "/proc/self/fd/%.40s", name->d_name);
        ssize_t length = readlink(entry, target, sizeof target - 1);
        if (length > 0) {
            target[length] = '\0';
            found = strcmp(target, path) == 0 ? atoi(name->d_name) : -1;
        }
    }
    closedir(folder);
    return found;
}

/* Whether the writers' lock keeps out a description of the region of its own (another process
 * of the pod, the daemon). */
static bool others_kept_out(void) {
    char path[PATH_MAX];
    region_path(path);
    int other = open(path, O_RDWR | O_CLOEXEC);
    if (other < 0) {
        fail("opening the region");
    }
    bool kept = flock(other, LOCK_EX | LOCK_NB) != 0;
    close(other);
    return kept;
}

static int writers(void) {
    ask_nvml();
    int region = region_descriptor();
    if (region < 0 || flock(region, LOCK_EX) != 0) {
        fail("taking the writers' lock on the limiter's descriptor");
    }
    pid_t pid = fork();
    if (pid == 0) {
        alarm(CHILD_SECONDS);
        _exit(cuInit(0) == CUDA_SUCCESS ? 0 : 1);
    }
    if (pid < 0) {
        fail("fork");
    }
    int status = 0;
    bool entered = false;
    for (int waited = 0; waited < 500 && !entered; waited += 10) {
        pause_ms(10);
        entered = waitpid(pid, &status, WNOHANG) == pid;
    }
    bool kept = others_kept_out();
    flock(region, LOCK_UN);
    if (!entered) {
        waitpid(pid, &status, 0);
    }
    printf("{\"child\":%d,\"entered\":%s,\"kept\":%s}\n",
           WIFEXITED(status) ? WEXITSTATUS(status) : -1, entered ? "true" : "false",
           kept ? "true" : "false");
    return 0;
}

static int orphan(void) {
    /* The worker's pid, and whether it is running (its fork returned: the limiter is done with
     * it), shared with this process. */
    _Atomic pid_t *worker =
        mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (worker == MAP_FAILED) {
        fail("mmap");
    }
    pid_t parent = fork();
    if (parent == 0) {
        ask_nvml();
        int region = region_descriptor();
        if (region < 0) {
            fail("finding the limiter's descriptor");
        }
        pid_t pid = fork();
        if (pid == 0) { /* a data loader's worker: it lives on with what it was forked with */
            alarm(CHILD_SECONDS);
            atomic_store(&worker[1], 1);
            for (;;) {
                pause();
            }
        }
        if (pid < 0) {
            fail("fork");
        }
        atomic_store(&worker[0], pid);
        while (atomic_load(&worker[1]) == 0) {
            pause_ms(1);
        }
        if (flock(region, LOCK_EX) != 0) {
            fail("taking the writers' lock");
        }
        raise(SIGKILL); /* killed inside the writers' section */
    }
    if (parent < 0) {
        fail("fork");
    }
    int status;
    waitpid(parent, &status, 0);
    if (!WIFSIGNALED(status) || atomic_load(&worker[0]) <= 0) {
        fail("the parent");
    }
    bool held = others_kept_out();
    kill(atomic_load(&worker[0]), SIGKILL);
    printf("{\"held\":%s}\n", held ? "true" : "false");
    return 0;
}

static int run_again(const char *program) {
    ask_nvml();
    if (region_descriptor() < 0) {
        fail("finding the limiter's descriptor");
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(program, program, "open", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "busy") == 0 && atoi(argv[3]) > 0) {
        return busy(argv[2], atoi(argv[3]));
    }
    if (argc == 2 && strcmp(argv[1], "charge") == 0) {
        return charge();
    }
    if (argc == 2 && strcmp(argv[1], "writers") == 0) {
        return writers();
    }
    if (argc == 2 && strcmp(argv[1], "orphan") == 0) {
        return orphan();
    }
    if (argc == 2 && strcmp(argv[1], "exec") == 0) {
        return run_again(argv[0]);
    }
    if (argc == 2 && strcmp(argv[1], "open") == 0) {
        printf("{\"open\":%s}\n", region_descriptor() >= 0 ? "true" : "false");
        return 0;
    }
    fprintf(stderr, "usage: limiter_fork busy launch|pool|primary|limit FORKS | "
                    "limiter_fork charge | limiter_fork writers|orphan|exec\n");
    return 2;
}
