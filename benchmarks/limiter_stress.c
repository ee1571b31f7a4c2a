/* One worker of benchmarks/limiter_stress.py: THREADS threads that allocate and free device
 * memory through every allocation API the limiter charges, at random, until SIGTERM (then they
 * free what they hold and the process exits 0) or SIGKILL. The driver is reached by one of the
 * three paths real programs take. Counts of calls tried, refused (out of memory) and failed
 * otherwise are kept in STATS, a file the benchmark reads after the process is gone.
 * Usage: limiter_stress linked|dlopen|procaddress THREADS SEED MAX_BYTES STATS */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cuda_api.h"

/* X(field, symbol, base): what the worker calls, by the ABI symbol its prototype follows and
 * the base name cuGetProcAddress is asked for. */
#define STRESS_CALLS(X) \
    X(init, cuInit, cuInit) \
    X(primary_retain, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain) \
    X(primary_release, cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease) \
    X(ctx_set_current, cuCtxSetCurrent, cuCtxSetCurrent) \
    X(ctx_create, cuCtxCreate_v4, cuCtxCreate) \
    X(ctx_pop, cuCtxPopCurrent_v2, cuCtxPopCurrent) \
    X(ctx_destroy, cuCtxDestroy_v2, cuCtxDestroy) \
    X(stream_create, cuStreamCreate, cuStreamCreate) \
    X(stream_destroy, cuStreamDestroy_v2, cuStreamDestroy) \
    X(stream_synchronize, cuStreamSynchronize, cuStreamSynchronize) \
    X(pool_create, cuMemPoolCreate, cuMemPoolCreate) \
    X(pool_destroy, cuMemPoolDestroy, cuMemPoolDestroy) \
    X(pool_trim, cuMemPoolTrimTo, cuMemPoolTrimTo) \
    X(device_pool, cuDeviceGetMemPool, cuDeviceGetMemPool) \
    X(alloc, cuMemAlloc_v2, cuMemAlloc) \
    X(alloc_pitch, cuMemAllocPitch_v2, cuMemAllocPitch) \
    X(alloc_managed, cuMemAllocManaged, cuMemAllocManaged) \
    X(free, cuMemFree_v2, cuMemFree) \
    X(alloc_async, cuMemAllocAsync, cuMemAllocAsync) \
    X(alloc_from_pool, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync) \
    X(free_async, cuMemFreeAsync, cuMemFreeAsync) \
    X(create, cuMemCreate, cuMemCreate) \
    X(release, cuMemRelease, cuMemRelease) \
    X(reserve, cuMemAddressReserve, cuMemAddressReserve) \
    X(address_free, cuMemAddressFree, cuMemAddressFree) \
    X(map, cuMemMap, cuMemMap) \
    X(unmap, cuMemUnmap, cuMemUnmap) \
    X(array_create, cuArrayCreate_v2, cuArrayCreate) \
    X(array3d_create, cuArray3DCreate_v2, cuArray3DCreate) \
    X(array_destroy, cuArrayDestroy, cuArrayDestroy) \
    X(mipmap_create, cuMipmappedArrayCreate, cuMipmappedArrayCreate) \
    X(mipmap_destroy, cuMipmappedArrayDestroy, cuMipmappedArrayDestroy)

static struct {
#define STRESS_FIELD(field, symbol, base) __typeof__(&symbol) field;
    STRESS_CALLS(STRESS_FIELD)
#undef STRESS_FIELD
} cu;

/* The allocation kinds a thread picks from at random, in the order of the rows of counters in
 * STATS; two more rows follow: the primary context (retried while the pod is full) and frees. */
#define STRESS_KINDS(X) \
    X(KIND_ALLOC, "cuMemAlloc_v2") \
    X(KIND_PITCH, "cuMemAllocPitch_v2") \
    X(KIND_MANAGED, "cuMemAllocManaged") \
    X(KIND_ASYNC, "cuMemAllocAsync") \
    X(KIND_FROM_POOL, "cuMemAllocFromPoolAsync") \
    X(KIND_VMM, "cuMemCreate") \
    X(KIND_ARRAY, "cuArrayCreate_v2") \
    X(KIND_ARRAY3D, "cuArray3DCreate_v2") \
    X(KIND_MIPMAP, "cuMipmappedArrayCreate") \
    X(KIND_CONTEXT, "cuCtxCreate_v4")

enum kind {
#define STRESS_ENUM(kind, name) kind,
    STRESS_KINDS(STRESS_ENUM)
#undef STRESS_ENUM
    KINDS,
    ROW_PRIMARY = KINDS,
    ROW_FREE,
    ROWS
};

enum counter { TRIED, REFUSED, FAILED, COUNTERS };

#define MiB (1ULL << 20)
#define PAGE (2 * MiB)
#define MAX_THREADS 64
#define HELD 8

static _Atomic uint64_t (*stats)[COUNTERS]; /* [ROWS][COUNTERS] */
static atomic_bool stopping;
static CUcontext primary;
static CUmemoryPool own_pool;
static uint64_t max_bytes;

struct held {
    enum kind kind;
    uint64_t bytes;
    CUdeviceptr pointer;
    CUmemGenericAllocationHandle handle;
    CUarray array;
    CUmipmappedArray mipmap;
    CUcontext context;
};

struct worker {
    pthread_t thread;
    uint64_t random;
    CUstream stream;
    struct held held[HELD];
    unsigned count;
};

static uint64_t next_random(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static const char *const row_names[ROWS] = {
#define STRESS_NAME(kind, name) name,
    STRESS_KINDS(STRESS_NAME)
#undef STRESS_NAME
    "cuDevicePrimaryCtxRetain",
    "clean-up", /* frees, unmaps, destroys, synchronizations, pool trims */
};

/* An error other than out of memory is a finding: the first of each row is told on stderr. */
static void count(unsigned row, CUresult result) {
    static atomic_bool told[ROWS];
    atomic_fetch_add(&stats[row][TRIED], 1);
    if (result == CUDA_ERROR_OUT_OF_MEMORY) {
        atomic_fetch_add(&stats[row][REFUSED], 1);
    } else if (result != CUDA_SUCCESS) {
        atomic_fetch_add(&stats[row][FAILED], 1);
        if (!atomic_exchange(&told[row], true)) {
            fprintf(stderr, "limiter_stress: %s: CUDA error %d\n", row_names[row], (int)result);
        }
    }
}

/* Log-uniform from 1 MiB to max_bytes: mostly small, now and then a large one. */
static uint64_t random_bytes(uint64_t *random) {
    uint64_t bytes = MiB;
    uint64_t top = max_bytes > MiB ? max_bytes : MiB;
    unsigned doublings = 0;
    while ((MiB << doublings) < top) {
        doublings++;
    }
    bytes <<= next_random(random) % (doublings + 1);
    bytes += next_random(random) % bytes;
    return bytes < top ? bytes : top;
}

static CUresult allocate(struct worker *self, enum kind kind, struct held *out) {
    uint64_t bytes = random_bytes(&self->random);
    *out = (struct held){.kind = kind, .bytes = bytes};
    switch (kind) {
    case KIND_ALLOC:
        return cu.alloc(&out->pointer, bytes);
    case KIND_PITCH: {
        size_t pitch = 0;
        size_t width = 1000 + next_random(&self->random) % 64536;
        return cu.alloc_pitch(&out->pointer, &pitch, width, bytes / width + 1, 4);
    }
    case KIND_MANAGED:
        return cu.alloc_managed(&out->pointer, bytes, 1 /* CU_MEM_ATTACH_GLOBAL */);
    case KIND_ASYNC:
        return cu.alloc_async(&out->pointer, bytes, self->stream);
    case KIND_FROM_POOL:
        return cu.alloc_from_pool(&out->pointer, bytes, own_pool, self->stream);
    case KIND_VMM: {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
        out->bytes = (bytes + PAGE - 1) / PAGE * PAGE;
        CUresult result = cu.create(&out->handle, out->bytes, &prop, 0);
        if (result != CUDA_SUCCESS) {
            return result;
        }
        /* Mapped, and half the time released while mapped: the unmap then frees it. */
        if (cu.reserve(&out->pointer, out->bytes, 0, 0, 0) != CUDA_SUCCESS ||
            cu.map(out->pointer, out->bytes, 0, out->handle, 0) != CUDA_SUCCESS) {
            atomic_fetch_add(&stats[ROW_FREE][FAILED], 1);
        } else if (next_random(&self->random) % 2 == 0) {
            count(ROW_FREE, cu.release(out->handle));
            out->handle = 0;
        }
        return CUDA_SUCCESS;
    }
    case KIND_ARRAY: {
        CUDA_ARRAY_DESCRIPTOR desc = {4096, bytes / (64 * 1024) + 1, CU_AD_FORMAT_FLOAT, 4};
        return cu.array_create(&out->array, &desc);
    }
    case KIND_ARRAY3D: {
        CUDA_ARRAY3D_DESCRIPTOR desc = {1024, 1024, bytes / MiB, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
        return cu.array3d_create(&out->array, &desc);
    }
    case KIND_MIPMAP: {
        size_t side = 1024;
        while (side * side * 2 < bytes) {
            side *= 2;
        }
        CUDA_ARRAY3D_DESCRIPTOR desc = {side, side, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
        return cu.mipmap_create(&out->mipmap, &desc, 1 + (unsigned)(next_random(&self->random) % 4));
    }
    case KIND_CONTEXT: {
        /* A context of its own is charged its overhead; it is pushed current, so it is popped
         * again to leave the primary context to the thread's other work. */
        CUresult result = cu.ctx_create(&out->context, NULL, 0, 0);
        CUcontext popped = NULL;
        if (result == CUDA_SUCCESS && cu.ctx_pop(&popped) != CUDA_SUCCESS) {
            atomic_fetch_add(&stats[ROW_FREE][FAILED], 1);
        }
        return result;
    }
    default:
        break;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static void give_back(struct worker *self, struct held *item) {
    switch (item->kind) {
    case KIND_ALLOC:
    case KIND_PITCH:
    case KIND_MANAGED:
        count(ROW_FREE, cu.free(item->pointer));
        break;
    case KIND_ASYNC:
    case KIND_FROM_POOL:
        count(ROW_FREE, cu.free_async(item->pointer, self->stream));
        /* Pooled memory goes back at a synchronization, now and then. */
        if (next_random(&self->random) % 4 == 0) {
            count(ROW_FREE, cu.stream_synchronize(self->stream));
        }
        break;
    case KIND_VMM:
        if (item->pointer != 0) {
            count(ROW_FREE, cu.unmap(item->pointer, item->bytes));
            count(ROW_FREE, cu.address_free(item->pointer, item->bytes));
        }
        if (item->handle != 0) {
            count(ROW_FREE, cu.release(item->handle));
        }
        break;
    case KIND_ARRAY:
    case KIND_ARRAY3D:
        count(ROW_FREE, cu.array_destroy(item->array));
        break;
    case KIND_MIPMAP:
        count(ROW_FREE, cu.mipmap_destroy(item->mipmap));
        break;
    case KIND_CONTEXT:
        count(ROW_FREE, cu.ctx_destroy(item->context));
        break;
    default:
        break;
    }
}

static void *work(void *argument) {
    struct worker *self = argument;
    if (cu.ctx_set_current(primary) != CUDA_SUCCESS ||
        cu.stream_create(&self->stream, 0) != CUDA_SUCCESS) {
        atomic_fetch_add(&stats[ROW_FREE][FAILED], 1);
        return NULL;
    }
    while (!atomic_load(&stopping)) {
        bool full = self->count == HELD;
        if (self->count > 0 && (full || next_random(&self->random) % 2 == 0)) {
            unsigned pick = (unsigned)(next_random(&self->random) % self->count);
            give_back(self, &self->held[pick]);
            self->held[pick] = self->held[--self->count];
            continue;
        }
        enum kind kind = (enum kind)(next_random(&self->random) % KINDS);
        CUresult result = allocate(self, kind, &self->held[self->count]);
        count(kind, result);
        if (result == CUDA_SUCCESS) {
            self->count++;
        }
    }
    while (self->count > 0) {
        give_back(self, &self->held[--self->count]);
    }
    count(ROW_FREE, cu.stream_synchronize(self->stream));
    count(ROW_FREE, cu.stream_destroy(self->stream));
    return NULL;
}

static bool load(const char *path) {
    if (strcmp(path, "linked") == 0) {
#define STRESS_LINKED(field, symbol, base) cu.field = &symbol;
        STRESS_CALLS(STRESS_LINKED)
#undef STRESS_LINKED
        return true;
    }
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    if (driver == NULL) {
        return false;
    }
    if (strcmp(path, "dlopen") == 0) {
#define STRESS_DLSYM(field, symbol, base) \
    if ((cu.field = (__typeof__(cu.field))dlsym(driver, #symbol)) == NULL) { \
        return false; \
    }
        STRESS_CALLS(STRESS_DLSYM)
#undef STRESS_DLSYM
        return true;
    }
    __typeof__(&cuGetProcAddress_v2) get_proc_address =
        (__typeof__(&cuGetProcAddress_v2))dlsym(driver, "cuGetProcAddress_v2");
    if (strcmp(path, "procaddress") != 0 || get_proc_address == NULL) {
        return false;
    }
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    void *address = NULL;
#define STRESS_PROCADDRESS(field, symbol, base) \
    if (get_proc_address(#base, &address, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status) != \
            CUDA_SUCCESS || address == NULL) { \
        return false; \
    } \
    cu.field = (__typeof__(cu.field))address;
    STRESS_CALLS(STRESS_PROCADDRESS)
#undef STRESS_PROCADDRESS
    return true;
}

static bool map_stats(const char *path) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    size_t size = sizeof(uint64_t) * COUNTERS * ROWS;
    void *mapping = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mapping == MAP_FAILED) {
        return false;
    }
    stats = mapping;
    return true;
}

static void on_term(int signal_number) {
    (void)signal_number;
    atomic_store(&stopping, true);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--rows") == 0) {
        for (int row = 0; row < ROWS; row++) {
            puts(row_names[row]);
        }
        return 0;
    }
    int threads = argc == 6 ? atoi(argv[2]) : 0;
    if (threads < 1 || threads > MAX_THREADS || !map_stats(argv[5])) {
        fprintf(stderr, "usage: limiter_stress linked|dlopen|procaddress THREADS SEED "
                        "MAX_BYTES STATS (THREADS 1 to %d, STATS an existing file)\n",
                MAX_THREADS);
        return 2;
    }
    max_bytes = strtoull(argv[4], NULL, 10);
    /* A worker never outlives the benchmark, however that ends. */
    pid_t parent = getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
        return 1;
    }
    /* SIGTERM comes blocked from the benchmark, so one sent before this handler waits for it. */
    struct sigaction action = {.sa_handler = on_term};
    sigaction(SIGTERM, &action, NULL);
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    pthread_sigmask(SIG_UNBLOCK, &term, NULL);
    if (!load(argv[1])) {
        fprintf(stderr, "limiter_stress: cannot reach the driver by the %s path\n", argv[1]);
        return 1;
    }
    /* The primary context itself is charged: while the pod is full, try again a little later. */
    CUresult result = cu.init(0);
    if (result == CUDA_SUCCESS) {
        while ((result = cu.primary_retain(&primary, 0)) == CUDA_ERROR_OUT_OF_MEMORY &&
               !atomic_load(&stopping)) {
            count(ROW_PRIMARY, result);
            usleep(10000);
        }
        count(ROW_PRIMARY, result);
    }
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    if (result != CUDA_SUCCESS || cu.ctx_set_current(primary) != CUDA_SUCCESS ||
        cu.pool_create(&own_pool, &props) != CUDA_SUCCESS) {
        return result == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 1;
    }
    static struct worker workers[MAX_THREADS];
    uint64_t seed = strtoull(argv[3], NULL, 10) | 1;
    for (int i = 0; i < threads; i++) {
        workers[i].random = seed * 0x9E3779B97F4A7C15ULL + (uint64_t)i * 0xBF58476D1CE4E5B9ULL;
        workers[i].random |= 1;
        if (pthread_create(&workers[i].thread, NULL, work, &workers[i]) != 0) {
            atomic_store(&stopping, true);
            threads = i;
            break;
        }
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(workers[i].thread, NULL);
    }
    CUmemoryPool device_pool = NULL;
    if (cu.device_pool(&device_pool, 0) == CUDA_SUCCESS) {
        count(ROW_FREE, cu.pool_trim(device_pool, 0));
    }
    count(ROW_FREE, cu.pool_destroy(own_pool));
    count(ROW_FREE, cu.primary_release(0));
    return 0;
}
