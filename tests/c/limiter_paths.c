/* Every allocation path under libcuda_limiter.so on the simulated GPU. Run with the limiter
 * preloaded, a 1 GiB limit on device 0 and TF_CUDA_CONTEXT_OVERHEAD=256MiB: each API must be
 * charged what it holds, refused past the limit, and give everything back when freed. The
 * virtual view (cuMemGetInfo_v2) shows the pod's usage. The legacy entry points and context
 * limits are reached by the call path named in argv[1] (linked, dlopen or procaddress).
 * Prints "N passed, M failed". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"
#include "unit_check.h"

#define MiB (1ULL << 20)
#define LIMIT (1024 * MiB)
#define CONTEXT (256 * MiB)

/* What the pod holds on device 0, as the program sees it. */
static unsigned long long used(void) {
    size_t free_bytes = 0, total = 0;
    if (cuMemGetInfo_v2(&free_bytes, &total) != CUDA_SUCCESS || total != LIMIT) {
        return ~0ULL;
    }
    return total - free_bytes;
}

static void plain(void) {
    CUdeviceptr a = 0, b = 0;
    size_t pitch = 0;
    CHECK(cuMemAlloc_v2(&a, 1) == CUDA_SUCCESS && used() == CONTEXT + 2 * MiB);
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(cuMemAlloc_v2(&a, LIMIT - CONTEXT) == CUDA_SUCCESS && used() == LIMIT);
    CHECK(cuMemAlloc_v2(&b, 1) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(cuMemAlloc_v2(&a, LIMIT - CONTEXT + 1) == CUDA_ERROR_OUT_OF_MEMORY && used() == CONTEXT);
    CHECK(cuMemAllocPitch_v2(&a, &pitch, 1000, 3000, 4) == CUDA_SUCCESS && pitch == 1024);
    CHECK(used() == CONTEXT + 4 * MiB);
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(cuMemAllocPitch_v2(&a, &pitch, 1 << 20, 1000, 4) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemAllocManaged(&a, 100 * MiB, 1) == CUDA_SUCCESS && used() == CONTEXT + 100 * MiB);
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(cuMemAllocManaged(&a, LIMIT, 1) == CUDA_ERROR_OUT_OF_MEMORY && used() == CONTEXT);
    CHECK(cuMemFree_v2(a) != CUDA_SUCCESS && used() == CONTEXT); /* a failed free changes nothing */
}

static void pools(void) {
    CUstream stream = NULL;
    CUmemoryPool pool = NULL;
    CUdeviceptr a = 0, b = 0;
    CHECK(cuStreamCreate(&stream, 0) == CUDA_SUCCESS);
    CHECK(cuDeviceGetMemPool(&pool, 0) == CUDA_SUCCESS);
    CHECK(cuMemAllocAsync(&a, 300 * MiB, stream) == CUDA_SUCCESS && used() == CONTEXT + 300 * MiB);
    CHECK(cuMemAllocAsync(&b, LIMIT, stream) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemFreeAsync(a, stream) == CUDA_SUCCESS && used() == CONTEXT + 300 * MiB); /* pooled */
    CHECK(cuMemAllocAsync(&a, 200 * MiB, stream) == CUDA_SUCCESS && used() == CONTEXT + 300 * MiB);
    CHECK(cuMemFreeAsync(a, stream) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(stream) == CUDA_SUCCESS && used() == CONTEXT); /* released at sync */

    cuuint64_t threshold = 512 * MiB;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) == 0);
    CHECK(cuMemAllocAsync(&a, 400 * MiB, stream) == CUDA_SUCCESS);
    CHECK(cuMemFreeAsync(a, stream) == 0 && cuStreamSynchronize(stream) == 0);
    CHECK(used() == CONTEXT + 400 * MiB); /* kept by the pool under its threshold */
    CHECK(cuMemAlloc_v2(&b, 500 * MiB) == CUDA_ERROR_OUT_OF_MEMORY); /* so it still counts */
    CHECK(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS && used() == CONTEXT); /* given back */
    threshold = 0;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) == 0);

    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    CUmemoryPool own = NULL;
    CHECK(cuMemPoolCreate(&own, &props) == CUDA_SUCCESS);
    CHECK(cuMemAllocFromPoolAsync(&a, 100 * MiB, own, stream) == 0 && used() == CONTEXT + 100 * MiB);
    CHECK(cuMemAllocFromPoolAsync(&b, LIMIT, own, stream) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemFreeAsync(a, stream) == CUDA_SUCCESS && cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(used() == CONTEXT);
    CHECK(cuMemPoolDestroy(own) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(cuStreamDestroy_v2(stream) == CUDA_SUCCESS);
}

static void vmm(void) {
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    CUmemGenericAllocationHandle handle = 0, other = 0;
    CUdeviceptr range = 0;
    CHECK(cuMemCreate(&handle, 200 * MiB, &prop, 0) == 0 && used() == CONTEXT + 200 * MiB);
    CHECK(cuMemCreate(&other, LIMIT, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemAddressReserve(&range, 400 * MiB, 0, 0, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(range, 200 * MiB, 0, handle, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(range + 200 * MiB, 200 * MiB, 0, handle, 0) == CUDA_SUCCESS);
    CHECK(cuMemRelease(handle) == CUDA_SUCCESS && used() == CONTEXT + 200 * MiB); /* mapped */
    CHECK(cuMemUnmap(range, 200 * MiB) == CUDA_SUCCESS && used() == CONTEXT + 200 * MiB);
    CHECK(cuMemUnmap(range + 200 * MiB, 200 * MiB) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(cuMemAddressFree(range, 400 * MiB) == CUDA_SUCCESS);
    CHECK(cuMemCreate(&handle, 100 * MiB, &prop, 0) == 0 && cuMemRelease(handle) == 0);
    CHECK(used() == CONTEXT); /* released while unmapped: gone at once */
}

static void arrays(void) {
    CUarray array = NULL;
    CUDA_ARRAY_DESCRIPTOR desc = {4096, 1024, CU_AD_FORMAT_FLOAT, 4}; /* 64 MiB */
    CHECK(cuArrayCreate_v2(&array, &desc) == 0 && used() == CONTEXT + 64 * MiB);
    CHECK(cuArrayDestroy(array) == CUDA_SUCCESS && used() == CONTEXT);
    CUDA_ARRAY3D_DESCRIPTOR big = {8192, 8192, 8, CU_AD_FORMAT_FLOAT, 1, 0}; /* 2 GiB */
    CHECK(cuArray3DCreate_v2(&array, &big) == CUDA_ERROR_OUT_OF_MEMORY && used() == CONTEXT);
    CUDA_ARRAY3D_DESCRIPTOR desc3 = {1024, 1024, 4, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    CHECK(cuArray3DCreate_v2(&array, &desc3) == 0 && used() == CONTEXT + 4 * MiB);
    CHECK(cuArrayDestroy(array) == CUDA_SUCCESS);
    CUmipmappedArray mip = NULL;
    CUDA_ARRAY3D_DESCRIPTOR level0 = {2048, 2048, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    CHECK(cuMipmappedArrayCreate(&mip, &level0, 3) == 0 && used() == CONTEXT + 6 * MiB);
    CHECK(cuMipmappedArrayDestroy(mip) == CUDA_SUCCESS && used() == CONTEXT);
}

static void contexts(void) {
    CUcontext own = NULL;
    CUdeviceptr a = 0;
    CHECK(cuCtxCreate_v4(&own, NULL, 0, 0) == CUDA_SUCCESS && used() == 2 * CONTEXT);
    CHECK(cuMemAlloc_v2(&a, 100 * MiB) == CUDA_SUCCESS && used() == 2 * CONTEXT + 100 * MiB);
    /* Destroying it frees what it owned; the primary context is current again. */
    CHECK(cuCtxDestroy_v2(own) == CUDA_SUCCESS && used() == CONTEXT);
    /* Contexts past the limit are refused. */
    CUcontext many[4] = {0};
    int created = 0;
    while (created < 4 && cuCtxCreate_v4(&many[created], NULL, 0, 0) == CUDA_SUCCESS) {
        created++;
    }
    CHECK(created == 3 && used() == 4 * CONTEXT);
    for (int i = 0; i < created; i++) {
        CHECK(cuCtxDestroy_v2(many[i]) == CUDA_SUCCESS);
    }
    CHECK(used() == CONTEXT);
}

/* The entry points reached by one call path. */
struct legacy_api {
    __typeof__(&cuMemAlloc) mem_alloc;
    __typeof__(&cuMemAllocPitch) mem_alloc_pitch;
    __typeof__(&cuMemFree) mem_free;
    __typeof__(&cuArrayCreate) array_create;
    __typeof__(&cuArray3DCreate) array3d_create;
    __typeof__(&cuCtxCreate) ctx_create;
    __typeof__(&cuCtxCreate_v3) ctx_create_v3;
    __typeof__(&cuCtxSetLimit) set_limit;
    __typeof__(&cuGraphInstantiateWithFlags) instantiate;
    __typeof__(&cuGraphInstantiate_v2) instantiate_v2;
    __typeof__(&cuGraphExecDestroy) exec_destroy;
    __typeof__(&cuDeviceGraphMemTrim) trim;
};

/* As the CUDA runtime asks: a base name and the version whose signature the caller uses. */
static void *proc_address(const char *base, int version) {
    void *function = NULL;
    return cuGetProcAddress_v2(base, &function, version, 0, NULL) == CUDA_SUCCESS ? function
                                                                                : NULL;
}

static bool resolve(const char *path, struct legacy_api *api) {
    if (strcmp(path, "linked") == 0) {
        *api = (struct legacy_api){cuMemAlloc,
                                   cuMemAllocPitch,
                                   cuMemFree,
                                   cuArrayCreate,
                                   cuArray3DCreate,
                                   cuCtxCreate,
                                   cuCtxCreate_v3,
                                   cuCtxSetLimit,
                                   cuGraphInstantiateWithFlags,
                                   cuGraphInstantiate_v2,
                                   cuGraphExecDestroy,
                                   cuDeviceGraphMemTrim};
        return true;
    }
    if (strcmp(path, "dlopen") == 0) {
        void *driver = dlopen("libcuda.so.1", RTLD_NOW);
        if (driver == NULL) {
            return false;
        }
#define VGPU_LOOKUP(field, name) api->field = (__typeof__(api->field))dlsym(driver, name)
        VGPU_LOOKUP(mem_alloc, "cuMemAlloc");
        VGPU_LOOKUP(mem_alloc_pitch, "cuMemAllocPitch");
        VGPU_LOOKUP(mem_free, "cuMemFree");
        VGPU_LOOKUP(array_create, "cuArrayCreate");
        VGPU_LOOKUP(array3d_create, "cuArray3DCreate");
        VGPU_LOOKUP(ctx_create, "cuCtxCreate");
        VGPU_LOOKUP(ctx_create_v3, "cuCtxCreate_v3");
        VGPU_LOOKUP(set_limit, "cuCtxSetLimit");
        VGPU_LOOKUP(instantiate, "cuGraphInstantiateWithFlags");
        VGPU_LOOKUP(instantiate_v2, "cuGraphInstantiate_v2");
        VGPU_LOOKUP(exec_destroy, "cuGraphExecDestroy");
        VGPU_LOOKUP(trim, "cuDeviceGraphMemTrim");
#undef VGPU_LOOKUP
    } else if (strcmp(path, "procaddress") == 0) {
#define VGPU_ADDRESS(field, base, version) \
    api->field = (__typeof__(api->field))proc_address(base, version)
        VGPU_ADDRESS(mem_alloc, "cuMemAlloc", 3010);
        VGPU_ADDRESS(mem_alloc_pitch, "cuMemAllocPitch", 3010);
        VGPU_ADDRESS(mem_free, "cuMemFree", 3010);
        VGPU_ADDRESS(array_create, "cuArrayCreate", 3010);
        VGPU_ADDRESS(array3d_create, "cuArray3DCreate", 3010);
        VGPU_ADDRESS(ctx_create, "cuCtxCreate", 3010);
        VGPU_ADDRESS(ctx_create_v3, "cuCtxCreate", 12000);
        VGPU_ADDRESS(set_limit, "cuCtxSetLimit", 13000);
        VGPU_ADDRESS(instantiate, "cuGraphInstantiate", 12000);
        VGPU_ADDRESS(instantiate_v2, "cuGraphInstantiate", 11000);
        VGPU_ADDRESS(exec_destroy, "cuGraphExecDestroy", 13000);
        VGPU_ADDRESS(trim, "cuDeviceGraphMemTrim", 13000);
#undef VGPU_ADDRESS
    } else {
        return false;
    }
    /* Each must be the limiter's wrapper, not the driver's function. */
    return api->mem_alloc == cuMemAlloc && api->mem_alloc_pitch == cuMemAllocPitch &&
           api->mem_free == cuMemFree && api->array_create == cuArrayCreate &&
           api->array3d_create == cuArray3DCreate && api->ctx_create == cuCtxCreate &&
           api->ctx_create_v3 == cuCtxCreate_v3 && api->set_limit == cuCtxSetLimit &&
           api->instantiate == cuGraphInstantiateWithFlags &&
           api->instantiate_v2 == cuGraphInstantiate_v2 && api->exec_destroy == cuGraphExecDestroy &&
           api->trim == cuDeviceGraphMemTrim;
}

/* The legacy (v1) entry points the driver still exports: 32-bit pointers and sizes. */
static void legacy(const struct legacy_api *api) {
    CUdeviceptr_v1 a = 0, b = 0;
    unsigned pitch = 0;
    CHECK(api->mem_alloc(&a, 1) == CUDA_SUCCESS && used() == CONTEXT + 2 * MiB);
    CHECK(api->mem_free(a) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(api->mem_alloc(&a, LIMIT - CONTEXT) == CUDA_SUCCESS && used() == LIMIT);
    CHECK(api->mem_alloc(&b, 1) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS && used() == CONTEXT); /* either free gives it back */
    CHECK(api->mem_alloc(&a, LIMIT - CONTEXT + 1) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(used() == CONTEXT);
    CHECK(api->mem_alloc_pitch(&a, &pitch, 1000, 3000, 4) == CUDA_SUCCESS && pitch == 1024);
    CHECK(used() == CONTEXT + 4 * MiB);
    CHECK(api->mem_free(a) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(api->mem_alloc_pitch(&a, &pitch, 1 << 20, 1000, 4) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(used() == CONTEXT);

    CUarray array = NULL;
    CUDA_ARRAY_DESCRIPTOR_v1 desc = {4096, 1024, CU_AD_FORMAT_FLOAT, 4}; /* 64 MiB */
    CHECK(api->array_create(&array, &desc) == 0 && used() == CONTEXT + 64 * MiB);
    CHECK(cuArrayDestroy(array) == CUDA_SUCCESS && used() == CONTEXT);
    CUDA_ARRAY3D_DESCRIPTOR_v1 big = {8192, 8192, 8, CU_AD_FORMAT_FLOAT, 1, 0}; /* 2 GiB */
    CHECK(api->array3d_create(&array, &big) == CUDA_ERROR_OUT_OF_MEMORY && used() == CONTEXT);
    CUDA_ARRAY3D_DESCRIPTOR_v1 desc3 = {1024, 1024, 4, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    CHECK(api->array3d_create(&array, &desc3) == 0 && used() == CONTEXT + 4 * MiB);
    CHECK(cuArrayDestroy(array) == CUDA_SUCCESS && used() == CONTEXT);

    CUcontext own = NULL, current = NULL, many[4] = {0};
    CUdeviceptr c = 0;
    CHECK(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
    CHECK(api->ctx_create(&own, 0, 0) == CUDA_SUCCESS && used() == 2 * CONTEXT);
    CHECK(cuMemAlloc_v2(&c, 100 * MiB) == CUDA_SUCCESS && used() == 2 * CONTEXT + 100 * MiB);
    CHECK(cuCtxDestroy_v2(own) == CUDA_SUCCESS && used() == CONTEXT);
    int created = 0;
    while (created < 4 && api->ctx_create_v3(&many[created], NULL, 0, 0, 0) == CUDA_SUCCESS) {
        created++;
    }
    CHECK(created == 3 && used() == 4 * CONTEXT);
    for (int i = 0; i < created; i++) {
        CHECK(cuCtxDestroy_v2(many[i]) == CUDA_SUCCESS);
    }
    CHECK(used() == CONTEXT && cuCtxSetCurrent(current) == CUDA_SUCCESS);
}

/* Context limits that make the driver reserve device memory. */
static void limits(const struct legacy_api *api) {
    CHECK(api->set_limit(CU_LIMIT_MALLOC_HEAP_SIZE, 108 * MiB) == 0);
    CHECK(used() == CONTEXT + 100 * MiB); /* the increase over the 8 MiB default */
    CHECK(api->set_limit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 * MiB + LIMIT) == CUDA_ERROR_OUT_OF_MEMORY);
    size_t value = 0;
    CHECK(cuCtxGetLimit(&value, CU_LIMIT_MALLOC_HEAP_SIZE) == 0 && value == 108 * MiB);
    CHECK(used() == CONTEXT + 100 * MiB);
    CHECK(api->set_limit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 * MiB) == 0 && used() == CONTEXT);
    CHECK(api->set_limit(CU_LIMIT_PRINTF_FIFO_SIZE, 33 * MiB) == 0);
    CHECK(used() == CONTEXT + 32 * MiB);
    CHECK(api->set_limit(CU_LIMIT_PRINTF_FIFO_SIZE, 1 * MiB) == 0 && used() == CONTEXT);
    /* The stack for every resident thread: 132 SMs × 2048 threads × 1 KiB more = 264 MiB. */
    CHECK(api->set_limit(CU_LIMIT_STACK_SIZE, 2048) == 0 && used() == CONTEXT + 264 * MiB);
    CHECK(api->set_limit(CU_LIMIT_STACK_SIZE, 4096) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(api->set_limit(CU_LIMIT_STACK_SIZE, 1024) == 0 && used() == CONTEXT);
    CHECK(api->set_limit(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 4) == 0 && used() == CONTEXT);
    /* A context's limits go with it. */
    CUcontext own = NULL, current = NULL;
    CHECK(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
    CHECK(api->ctx_create(&own, 0, 0) == CUDA_SUCCESS);
    CHECK(api->set_limit(CU_LIMIT_MALLOC_HEAP_SIZE, 208 * MiB) == 0);
    CHECK(used() == 2 * CONTEXT + 200 * MiB);
    CHECK(cuCtxDestroy_v2(own) == CUDA_SUCCESS && used() == CONTEXT);
    CHECK(cuCtxSetCurrent(current) == CUDA_SUCCESS);
}

/* Graph memory nodes: charged when a graph is instantiated, and while the device's graph pool
 * keeps the memory after the graph is gone, until a trim gives it back. */
static void graph_memory(const struct legacy_api *api) {
    CUgraph graph = NULL, big = NULL;
    CUgraphNode alloc = NULL, release = NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS params = {.bytesize = 300 * MiB - 5}; /* 300 MiB in pages */
    params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    params.poolProps.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CHECK(cuGraphCreate(&graph, 0) == CUDA_SUCCESS);
    CHECK(cuGraphAddMemAllocNode(&alloc, graph, NULL, 0, &params) == CUDA_SUCCESS);
    CHECK(cuGraphAddMemFreeNode(&release, graph, &alloc, 1, params.dptr) == CUDA_SUCCESS);
    CHECK(used() == CONTEXT); /* a graph holds nothing until it is instantiated */
    CUgraphExec first = NULL, second = NULL, third = NULL;
    CUstream stream = NULL;
    CHECK(api->instantiate(&first, graph, 0) == CUDA_SUCCESS && used() == CONTEXT + 300 * MiB);
    CHECK(cuStreamCreate(&stream, 0) == CUDA_SUCCESS);
    CHECK(cuGraphLaunch(first, stream) == 0 && cuStreamSynchronize(stream) == 0);
    CHECK(used() == CONTEXT + 300 * MiB);
    CHECK(api->instantiate_v2(&second, graph, NULL, NULL, 0) == 0);
    CHECK(used() == CONTEXT + 600 * MiB);
    CHECK(api->instantiate(&third, graph, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(used() == CONTEXT + 600 * MiB);
    CHECK(api->exec_destroy(second) == CUDA_SUCCESS && used() == CONTEXT + 300 * MiB);
    /* The pool keeps what the launch took, so it stays charged after the graph is gone. */
    CHECK(api->exec_destroy(first) == CUDA_SUCCESS && used() == CONTEXT + 300 * MiB);
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc_v2(&a, 500 * MiB) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(api->trim(0) == CUDA_SUCCESS && used() == CONTEXT);
    params.bytesize = LIMIT;
    CHECK(cuGraphCreate(&big, 0) == CUDA_SUCCESS);
    CHECK(cuGraphAddMemAllocNode(&alloc, big, NULL, 0, &params) == CUDA_SUCCESS);
    CHECK(api->instantiate(&third, big, 0) == CUDA_ERROR_OUT_OF_MEMORY && used() == CONTEXT);
    CHECK(cuGraphDestroy(big) == 0 && cuGraphDestroy(graph) == 0);
    CHECK(cuStreamDestroy_v2(stream) == CUDA_SUCCESS);
}

int main(int argc, char **argv) {
    struct legacy_api api;
    if (argc != 2 || !resolve(argv[1], &api)) {
        fprintf(stderr, "usage: limiter_paths linked|dlopen|procaddress (under the limiter)\n");
        return 2;
    }
    CUcontext ctx = NULL;
    size_t total = 0;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuDeviceTotalMem_v2(&total, 0) == CUDA_SUCCESS && total == LIMIT);
    CHECK(cuDeviceTotalMem_v2(&total, 1) == CUDA_SUCCESS && total == 80ULL * 1024 * MiB);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == 0);
    CHECK(used() == CONTEXT);
    plain();
    pools();
    vmm();
    arrays();
    legacy(&api);
    limits(&api);
    graph_memory(&api);
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    contexts();
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS);
    return unit_report();
}
