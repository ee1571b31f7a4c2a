/* The deprecated entry points the driver still exports, under libcuda_limiter.so:
 *   memory PATH         with a 1 GiB limit on device 0 and TF_CUDA_CONTEXT_OVERHEAD=256MiB: the
 *                       v1 memory view, v1 context destroys and primary releases, and green
 *                       contexts are charged, refused and given back as their modern siblings;
 *                       reached by PATH (linked, dlopen or procaddress). Prints "N passed, M
 *                       failed".
 *   view                the v1 and v2 views of device 0 and 1 (-1 without one) as JSON.
 *   launch FORM SECONDS KERNEL_US
 *                       kernels of KERNEL_US launched for SECONDS with FORM (kernel, launch,
 *                       grid or gridasync); prints {"kernels": N, "seconds": S}.
 *   multidevice         one cuLaunchCooperativeKernelMultiDevice over devices 0 and 1; prints
 *                       its result code.
 * The kernel spins on the GPU's clock for its parameter's nanoseconds, so the program runs on a
 * real GPU as on the simulated one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "unit_check.h"
#include "spin_kernel.h"

#define MiB (1ULL << 20)
#define LIMIT (1024 * MiB)
#define CONTEXT (256 * MiB)

static void fail(const char *what) {
    fprintf(stderr, "limiter_legacy: %s failed\n", what);
    exit(1);
}

/* What the pod holds on device 0, as the program sees it through the v2 view. */
static unsigned long long used(void) {
    size_t free_bytes = 0, total = 0;
    if (cuMemGetInfo_v2(&free_bytes, &total) != CUDA_SUCCESS || total != LIMIT) {
        return ~0ULL;
    }
    return total - free_bytes;
}

struct legacy_api {
    __typeof__(&cuMemGetInfo) mem_get_info;
    __typeof__(&cuDeviceTotalMem) device_total_mem;
    __typeof__(&cuCtxDestroy) ctx_destroy;
    __typeof__(&cuDevicePrimaryCtxRelease) primary_release;
    __typeof__(&cuDevicePrimaryCtxReset) primary_reset;
    __typeof__(&cuGreenCtxCreate) green_create;
    __typeof__(&cuGreenCtxDestroy) green_destroy;
};

static void *proc_address(const char *base, int version) {
    void *function = NULL;
    return cuGetProcAddress_v2(base, &function, version, 0, NULL) == CUDA_SUCCESS ? function
                                                                                : NULL;
}

static bool resolve(const char *path, struct legacy_api *api) {
    if (strcmp(path, "linked") == 0) {
        *api = (struct legacy_api){cuMemGetInfo,      cuDeviceTotalMem,        cuCtxDestroy,
                                   cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxReset,
                                   cuGreenCtxCreate,  cuGreenCtxDestroy};
    } else if (strcmp(path, "dlopen") == 0) {
        void *driver = dlopen("libcuda.so.1", RTLD_NOW);
        if (driver == NULL) {
            return false;
        }
#define VGPU_LOOKUP(field, name) api->field = (__typeof__(api->field))dlsym(driver, name)
        VGPU_LOOKUP(mem_get_info, "cuMemGetInfo");
        VGPU_LOOKUP(device_total_mem, "cuDeviceTotalMem");
        VGPU_LOOKUP(ctx_destroy, "cuCtxDestroy");
        VGPU_LOOKUP(primary_release, "cuDevicePrimaryCtxRelease");
        VGPU_LOOKUP(primary_reset, "cuDevicePrimaryCtxReset");
        VGPU_LOOKUP(green_create, "cuGreenCtxCreate");
        VGPU_LOOKUP(green_destroy, "cuGreenCtxDestroy");
#undef VGPU_LOOKUP
    } else if (strcmp(path, "procaddress") == 0) {
        /* As a caller built against an old CUDA asks: the version picks the v1 forms. */
#define VGPU_ADDRESS(field, base, version) \
    api->field = (__typeof__(api->field))proc_address(base, version)
        VGPU_ADDRESS(mem_get_info, "cuMemGetInfo", 3010);
        VGPU_ADDRESS(device_total_mem, "cuDeviceTotalMem", 3010);
        VGPU_ADDRESS(ctx_destroy, "cuCtxDestroy", 3010);
        VGPU_ADDRESS(primary_release, "cuDevicePrimaryCtxRelease", 10000);
        VGPU_ADDRESS(primary_reset, "cuDevicePrimaryCtxReset", 10000);
        VGPU_ADDRESS(green_create, "cuGreenCtxCreate", 13000);
        VGPU_ADDRESS(green_destroy, "cuGreenCtxDestroy", 13000);
#undef VGPU_ADDRESS
    } else {
        return false;
    }
    /* Each must be the limiter's wrapper, not the driver's function. */
    return api->mem_get_info == cuMemGetInfo && api->device_total_mem == cuDeviceTotalMem &&
           api->ctx_destroy == cuCtxDestroy && api->primary_release == cuDevicePrimaryCtxRelease &&
           api->primary_reset == cuDevicePrimaryCtxReset && api->green_create == cuGreenCtxCreate &&
           api->green_destroy == cuGreenCtxDestroy;
}

static int memory(const char *path) {
    struct legacy_api api;
    if (!resolve(path, &api)) {
        fprintf(stderr, "limiter_legacy: the entry points by %s are not the limiter's\n", path);
        return 2;
    }
    CUcontext own = NULL, second = NULL, primary = NULL, green_context = NULL;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuCtxCreate_v2(&own, 0, 0) == CUDA_SUCCESS && used() == CONTEXT);

    /* The v1 view is the v2 one in unsigned ints; device 1 (80 GiB, no limit) is clamped. */
    unsigned int free_v1 = 0, total_v1 = 0, device_v1 = 0;
    CHECK(api.mem_get_info(&free_v1, &total_v1) == CUDA_SUCCESS);
    CHECK(total_v1 == LIMIT && free_v1 == LIMIT - CONTEXT);
    CHECK(api.device_total_mem(&device_v1, 0) == CUDA_SUCCESS && device_v1 == LIMIT);
    CHECK(api.device_total_mem(&device_v1, 1) == CUDA_SUCCESS && device_v1 == UINT_MAX);
    CHECK(api.mem_get_info(NULL, &total_v1) == CUDA_ERROR_INVALID_VALUE);

    /* cuCtxDestroy (v1) gives back the context and what was allocated in it. */
    CUdeviceptr a = 0;
    CHECK(cuCtxCreate_v2(&second, 0, 0) == CUDA_SUCCESS && used() == 2 * CONTEXT);
    CHECK(cuMemAlloc_v2(&a, 100 * MiB) == CUDA_SUCCESS && used() == 2 * CONTEXT + 100 * MiB);
    CHECK(api.mem_get_info(&free_v1, &total_v1) == CUDA_SUCCESS);
    CHECK(free_v1 == LIMIT - 2 * CONTEXT - 100 * MiB);
    CHECK(api.ctx_destroy(second) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(own) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(api.ctx_destroy(second) != CUDA_SUCCESS && used() == CONTEXT); /* destroyed: no-op */

    /* The primary context's v1 release and reset give back what the retain charged. */
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS && used() == 2 * CONTEXT);
    CHECK(api.primary_release(0) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS && used() == 2 * CONTEXT);
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS && used() == 2 * CONTEXT);
    CHECK(api.primary_release(0) == CUDA_SUCCESS && used() == 2 * CONTEXT); /* one retain left */
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS && used() == 2 * CONTEXT);
    CHECK(api.primary_reset(0) == CUDA_SUCCESS && used() == CONTEXT); /* all retains at once */

    /* A green context is charged a context, its allocations are the pod's, and destroying it
     * gives back both; one that does not fit is refused and charges nothing. */
    CUgreenCtx green = NULL, other = NULL;
    int descriptor = 0; /* the simulated driver takes any resource descriptor */
    CUdevResourceDesc desc = (CUdevResourceDesc)&descriptor;
    CHECK(api.green_create(&green, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM) == CUDA_SUCCESS);
    CHECK(used() == 2 * CONTEXT);
    CHECK(cuCtxFromGreenCtx(&green_context, green) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(green_context) == CUDA_SUCCESS);
    CHECK(cuMemAlloc_v2(&a, 100 * MiB) == CUDA_SUCCESS && used() == 2 * CONTEXT + 100 * MiB);
    CHECK(cuCtxSetCurrent(own) == CUDA_SUCCESS);
    CHECK(api.green_destroy(green) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(cuMemAlloc_v2(&a, LIMIT - 2 * CONTEXT + 2 * MiB) == CUDA_SUCCESS);
    CHECK(api.green_create(&other, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM) ==
          CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(used() == LIMIT - CONTEXT + 2 * MiB);
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(api.green_create(&other, NULL, 0, CU_GREEN_CTX_DEFAULT_STREAM) ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(used() == CONTEXT); /* the driver refused it: the charge is given back */
    CHECK(api.green_destroy(green) != CUDA_SUCCESS && used() == CONTEXT);

    CHECK(cuCtxDestroy_v2(own) == CUDA_SUCCESS);
    return unit_report();
}

static int view(void) {
    CUcontext context = NULL;
    unsigned int free_v1 = 0, total_v1 = 0, device0_v1 = 0, device1_v1 = 0;
    size_t free_v2 = 0, total_v2 = 0, device0_v2 = 0;
    int count = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(context) != CUDA_SUCCESS ||
        cuMemGetInfo(&free_v1, &total_v1) != CUDA_SUCCESS ||
        cuMemGetInfo_v2(&free_v2, &total_v2) != CUDA_SUCCESS ||
        cuDeviceTotalMem(&device0_v1, 0) != CUDA_SUCCESS ||
        cuDeviceTotalMem_v2(&device0_v2, 0) != CUDA_SUCCESS || cuDeviceGetCount(&count) != 0 ||
        (count > 1 && cuDeviceTotalMem(&device1_v1, 1) != CUDA_SUCCESS)) {
        fail("reading the views");
    }
    printf("{\"free_v1\": %u, \"total_v1\": %u, \"free_v2\": %zu, \"total_v2\": %zu, "
           "\"device0_v1\": %u, \"device1_v1\": %lld, \"device0_v2\": %zu}\n",
           free_v1, total_v1, free_v2, total_v2, device0_v1,
           count > 1 ? (long long)device1_v1 : -1LL, device0_v2);
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static CUfunction load_kernel(void) {
    CUcontext context;
    CUmodule module;
    CUfunction function;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(context) != CUDA_SUCCESS ||
        cuModuleLoadData(&module, SPIN) != CUDA_SUCCESS ||
        cuModuleGetFunction(&function, module, "spin") != CUDA_SUCCESS) {
        fail("loading the kernel");
    }
    return function;
}

static int launch(const char *form, double seconds, double kernel_us) {
    CUfunction function = load_kernel();
    uint64_t kernel_ns = (uint64_t)(kernel_us * 1000);
    void *params[] = {&kernel_ns};
    CUstream stream = NULL;
    if (cuFuncSetBlockShape(function, 1, 1, 1) != CUDA_SUCCESS ||
        cuParamSetSize(function, sizeof kernel_ns) != CUDA_SUCCESS ||
        cuParamSetv(function, 0, &kernel_ns, sizeof kernel_ns) != CUDA_SUCCESS ||
        cuStreamCreate(&stream, 0) != CUDA_SUCCESS) {
        fail("setting up the legacy launch");
    }
    unsigned long long kernels = 0;
    double start = now_s();
    while (now_s() - start < seconds) {
        CUresult result;
        if (strcmp(form, "kernel") == 0) {
            result = cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
        } else if (strcmp(form, "launch") == 0) {
            result = cuLaunch(function);
        } else if (strcmp(form, "grid") == 0) {
            result = cuLaunchGrid(function, 1, 1);
        } else if (strcmp(form, "gridasync") == 0) {
            result = cuLaunchGridAsync(function, 1, 1, stream);
        } else {
            fprintf(stderr, "limiter_legacy: unknown launch form %s\n", form);
            return 2;
        }
        if (result != CUDA_SUCCESS) {
            fail(form);
        }
        kernels++;
    }
    if (cuCtxSynchronize() != CUDA_SUCCESS) {
        fail("cuCtxSynchronize");
    }
    printf("{\"kernels\": %llu, \"seconds\": %.6f}\n", kernels, now_s() - start);
    return 0;
}

static int multidevice(void) {
    CUDA_LAUNCH_PARAMS params[2];
    uint64_t kernel_ns = 1000;
    void *arguments[] = {&kernel_ns};
    CUcontext first = NULL;
    if (cuInit(0) != CUDA_SUCCESS) {
        fail("cuInit");
    }
    for (int device = 0; device < 2; device++) {
        CUcontext context;
        CUmodule module;
        CUfunction function;
        CUstream stream;
        if (cuDevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS ||
            cuCtxSetCurrent(context) != CUDA_SUCCESS ||
            cuModuleLoadData(&module, SPIN) != CUDA_SUCCESS ||
            cuModuleGetFunction(&function, module, "spin") != CUDA_SUCCESS ||
            cuStreamCreate(&stream, 0) != CUDA_SUCCESS) {
            fail("setting up a device");
        }
        first = device == 0 ? context : first;
        params[device] = (CUDA_LAUNCH_PARAMS){function, 1, 1, 1, 1, 1, 1, 0, stream, arguments};
    }
    /* The current context is the first device's, so the launch of device 1 is found by its
     * stream's context, not the current one. */
    if (cuCtxSetCurrent(first) != CUDA_SUCCESS) {
        fail("cuCtxSetCurrent");
    }
    CUresult result = cuLaunchCooperativeKernelMultiDevice(params, 2, 0);
    if (result == CUDA_SUCCESS && cuCtxSynchronize() != CUDA_SUCCESS) {
        fail("cuCtxSynchronize");
    }
    CUcontext current = NULL;
    if (cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != first) {
        fail("keeping the current context");
    }
    printf("%d\n", (int)result);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "memory") == 0) {
        return memory(argv[2]);
    }
    if (argc == 2 && strcmp(argv[1], "view") == 0) {
        return view();
    }
    if (argc == 5 && strcmp(argv[1], "launch") == 0) {
        return launch(argv[2], atof(argv[3]), atof(argv[4]));
    }
    if (argc == 2 && strcmp(argv[1], "multidevice") == 0) {
        return multidevice();
    }
    fprintf(stderr, "usage: limiter_legacy memory linked|dlopen|procaddress | view | "
                    "launch kernel|launch|grid|gridasync SECONDS KERNEL_US | multidevice\n");
    return 2;
}
