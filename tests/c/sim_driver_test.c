/* The simulated driver's allocation paths, lifetimes and error handling, built together with
 * its sources under ASan/UBSan (nox -s sanitize). Every path must give back exactly what it
 * took. Prints "N passed, M failed". */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "unit_check.h"
#include "sim_state.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

static uint64_t used(int device) {
    struct sim_state *state = sim_state();
    sim_lock(state);
    uint64_t bytes = state->devices[device].used_memory;
    sim_unlock(state);
    return bytes;
}

static void test_plain_memory(uint64_t base) {
    CUdeviceptr a = 0, b = 0;
    size_t pitch = 0;
    CHECK(cuMemAlloc_v2(&a, 1) == CUDA_SUCCESS && used(0) == base + 2 * MiB);
    CHECK(cuMemAllocPitch_v2(&b, &pitch, 1000, 3000, 4) == CUDA_SUCCESS && pitch == 1024);
    CHECK(used(0) == base + 2 * MiB + 4 * MiB); /* 1024 × 3000 rounds to 4 MiB */
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS && cuMemFree_v2(b) == CUDA_SUCCESS);
    CHECK(cuMemFree_v2(a) == CUDA_ERROR_INVALID_VALUE); /* double free */
    CHECK(cuMemAlloc_v2(&a, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemAlloc_v2(&a, 64 * GiB) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemAllocPitch_v2(&b, &pitch, 1000, 10, 3) == CUDA_ERROR_INVALID_VALUE);

    CUdeviceptr managed = 0;
    CHECK(cuMemAllocManaged(&managed, 3 * MiB, 1) == CUDA_SUCCESS);
    memset((void *)(uintptr_t)managed, 7, 3 * MiB); /* host-accessible */
    CHECK(used(0) == base + 4 * MiB);
    CHECK(cuMemFree_v2(managed) == CUDA_SUCCESS);

    void *host = NULL;
    CHECK(cuMemAllocHost_v2(&host, 5 * MiB) == CUDA_SUCCESS && used(0) == base);
    memset(host, 1, 5 * MiB);
    CHECK(cuMemFreeHost(host) == CUDA_SUCCESS && cuMemFreeHost(host) == CUDA_ERROR_INVALID_VALUE);
    CHECK(used(0) == base);

    size_t free_bytes = 0, total = 0;
    CHECK(cuMemGetInfo_v2(&free_bytes, &total) == CUDA_SUCCESS);
    CHECK(total == 8 * GiB && free_bytes == total - base);
}

static void test_pools(uint64_t base) {
    CUmemoryPool pool = NULL;
    CUstream stream = NULL;
    CUdeviceptr a = 0, b = 0;
    CHECK(cuStreamCreate(&stream, 0) == CUDA_SUCCESS);
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS);
    CHECK(cuMemAllocAsync(&a, 10 * MiB, stream) == CUDA_SUCCESS && used(0) == base + 10 * MiB);
    CHECK(cuMemFreeAsync(a, stream) == CUDA_SUCCESS && used(0) == base + 10 * MiB); /* kept */
    CHECK(cuMemAllocAsync(&b, 4 * MiB, stream) == CUDA_SUCCESS && used(0) == base + 10 * MiB);
    CHECK(cuMemFreeAsync(b, stream) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(stream) == CUDA_SUCCESS && used(0) == base); /* threshold 0 */

    uint64_t threshold = 64 * MiB;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) == 0);
    CHECK(cuMemAllocAsync(&a, 32 * MiB, stream) == CUDA_SUCCESS);
    CHECK(cuMemFreeAsync(a, stream) == CUDA_SUCCESS && cuStreamSynchronize(stream) == 0);
    CHECK(used(0) == base + 32 * MiB); /* under the threshold: kept across a synchronize */
    uint64_t reserved = 0;
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0);
    CHECK(reserved == 32 * MiB);
    CHECK(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS && used(0) == base);
    threshold = 0;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) == 0);

    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    CUmemoryPool own = NULL;
    CHECK(cuMemPoolCreate(&own, &props) == CUDA_SUCCESS);
    CHECK(cuMemAllocFromPoolAsync(&a, 6 * MiB, own, stream) == CUDA_SUCCESS);
    CHECK(cuMemPoolDestroy(own) == CUDA_SUCCESS && used(0) == base + 6 * MiB); /* still in use */
    CHECK(cuMemFreeAsync(a, stream) == CUDA_SUCCESS && used(0) == base);
    CHECK(cuMemAllocFromPoolAsync(&a, 6 * MiB, own, stream) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemAllocAsync(&a, 64 * GiB, stream) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuStreamDestroy_v2(stream) == CUDA_SUCCESS);
}

static void test_vmm(uint64_t base) {
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    size_t granularity = 0;
    CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
              CUDA_SUCCESS &&
          granularity == 2 * MiB);
    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr range = 0;
    CHECK(cuMemCreate(&handle, 3 * MiB, &prop, 0) == CUDA_ERROR_INVALID_VALUE); /* not aligned */
    CHECK(cuMemCreate(&handle, 8 * MiB, &prop, 0) == CUDA_SUCCESS && used(0) == base + 8 * MiB);
    CHECK(cuMemAddressReserve(&range, 16 * MiB, 0, 0, 0) == CUDA_SUCCESS);
    CHECK(used(0) == base + 8 * MiB); /* address space costs no memory */
    CHECK(cuMemMap(range, 8 * MiB, 0, handle, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(range, 8 * MiB, 0, handle, 0) == CUDA_ERROR_ALREADY_MAPPED);
    CHECK(cuMemMap(range + 8 * MiB, 8 * MiB, 0, handle, 0) == CUDA_SUCCESS);
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, 3};
    CHECK(cuMemSetAccess(range, 8 * MiB, &access, 1) == CUDA_SUCCESS);
    CHECK(cuMemRelease(handle) == CUDA_SUCCESS && used(0) == base + 8 * MiB); /* still mapped */
    CHECK(cuMemRelease(handle) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemUnmap(range, 16 * MiB) == CUDA_SUCCESS && used(0) == base); /* last mapping */
    CHECK(cuMemAddressFree(range, 16 * MiB) == CUDA_SUCCESS);
    CHECK(cuMemCreate(&handle, 64 * GiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);
}

static void test_arrays(uint64_t base) {
    CUarray array = NULL;
    CUDA_ARRAY_DESCRIPTOR desc = {4096, 1024, CU_AD_FORMAT_FLOAT, 4}; /* 64 MiB */
    CHECK(cuArrayCreate_v2(&array, &desc) == CUDA_SUCCESS && used(0) == base + 64 * MiB);
    CHECK(cuArrayDestroy(array) == CUDA_SUCCESS && used(0) == base);
    CHECK(cuArrayDestroy(array) == CUDA_ERROR_INVALID_HANDLE);
    CUDA_ARRAY3D_DESCRIPTOR desc3 = {1024, 1024, 4, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0}; /* 4 MiB */
    CHECK(cuArray3DCreate_v2(&array, &desc3) == CUDA_SUCCESS && used(0) == base + 4 * MiB);
    CHECK(cuArrayDestroy(array) == CUDA_SUCCESS);
    CUmipmappedArray mip = NULL;
    CUDA_ARRAY3D_DESCRIPTOR level0 = {2048, 2048, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0}; /* 4 MiB */
    CHECK(cuMipmappedArrayCreate(&mip, &level0, 3) == CUDA_SUCCESS);
    CHECK(used(0) == base + 6 * MiB); /* 4 + 1 + 0.25 MiB, page-rounded */
    CHECK(cuMipmappedArrayDestroy(mip) == CUDA_SUCCESS && used(0) == base);
    desc.Format = (CUarray_format)0x77;
    CHECK(cuArrayCreate_v2(&array, &desc) == CUDA_ERROR_INVALID_VALUE);
}

static void test_execution(void) {
    CUmodule module = NULL;
    CUfunction function = NULL;
    CUstream stream = NULL;
    CUevent start = NULL, stop = NULL;
    CHECK(cuModuleLoadData(&module, "image") == CUDA_SUCCESS);
    CHECK(cuModuleGetFunction(&function, module, "sleep") == CUDA_SUCCESS);
    const char *name = NULL;
    CHECK(cuFuncGetName(&name, function) == CUDA_SUCCESS && name != NULL &&
          strcmp(name, "sleep") == 0);
    CHECK(cuFuncGetName(&name, NULL) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cuEventCreate(&start, 0) == CUDA_SUCCESS && cuEventCreate(&stop, 0) == CUDA_SUCCESS);
    uint64_t duration = 2000000; /* 2 ms */
    void *params[] = {&duration};
    CHECK(cuEventRecord(start, stream) == CUDA_SUCCESS);
    for (int i = 0; i < 5; i++) {
        CHECK(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL) == 0);
    }
    CHECK(cuEventRecord(stop, stream) == CUDA_SUCCESS);
    CHECK(cuStreamQuery(stream) == CUDA_ERROR_NOT_READY);
    CHECK(cuEventSynchronize(stop) == CUDA_SUCCESS && cuStreamQuery(stream) == CUDA_SUCCESS);
    float ms = 0;
    CHECK(cuEventElapsedTime_v2(&ms, start, stop) == CUDA_SUCCESS && ms > 9.9f && ms < 10.5f);

    /* Capture three launches, replay the graph twice: 6 × 2 ms. */
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CUstreamCaptureStatus status;
    CHECK(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK(cuStreamIsCapturing(stream, &status) == 0 && status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    for (int i = 0; i < 3; i++) {
        CHECK(cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL) == 0);
    }
    CHECK(cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS);
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS);
    CHECK(cuEventRecord(start, stream) == CUDA_SUCCESS);
    CHECK(cuGraphLaunch(exec, stream) == CUDA_SUCCESS && cuGraphLaunch(exec, stream) == 0);
    CHECK(cuEventRecord(stop, stream) == CUDA_SUCCESS && cuStreamSynchronize(stream) == 0);
    CHECK(cuEventElapsedTime_v2(&ms, start, stop) == CUDA_SUCCESS && ms > 11.9f && ms < 12.5f);
    CHECK(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);

    CUgraph built = NULL;
    CUgraphNode node = NULL;
    CUDA_KERNEL_NODE_PARAMS_v2 node_params = {.func = function, .gridDimX = 1, .gridDimY = 1,
                                              .gridDimZ = 1, .blockDimX = 1, .blockDimY = 1,
                                              .blockDimZ = 1, .kernelParams = params};
    CHECK(cuGraphCreate(&built, 0) == CUDA_SUCCESS);
    CHECK(cuGraphAddKernelNode_v2(&node, built, NULL, 0, &node_params) == CUDA_SUCCESS);
    CHECK(cuGraphAddKernelNode_v2(&node, built, &node, 1, &node_params) == CUDA_SUCCESS);
    CUDA_KERNEL_NODE_PARAMS_v2 read_back;
    CHECK(cuGraphKernelNodeGetParams_v2(node, &read_back) == CUDA_SUCCESS &&
          read_back.func == node_params.func);
    CHECK(cuGraphDestroy(built) == CUDA_SUCCESS && cuGraphDestroy(built) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuGraphExecDestroy(exec) == CUDA_SUCCESS && cuGraphDestroy(graph) == CUDA_SUCCESS);

    CHECK(cuLaunchKernel(function, 0, 1, 1, 1, 1, 1, 0, stream, params, NULL) ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(cuEventDestroy_v2(start) == 0 && cuEventQuery(start) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuStreamDestroy_v2(stream) == 0);
    CHECK(cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL) ==
          CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuEventDestroy_v2(stop) == CUDA_SUCCESS && cuModuleUnload(module) == CUDA_SUCCESS);
}

static void test_proc_address(void) {
    void *function = NULL;
    CUdriverProcAddressQueryResult status;
    CHECK(cuGetProcAddress_v2("cuMemAlloc", &function, 13000, 0, &status) == CUDA_SUCCESS &&
          function == (void *)cuMemAlloc_v2 && status == CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(cuGetProcAddress_v2("cuLaunchKernel", &function, 13000,
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status) == 0 &&
          function == (void *)cuLaunchKernel_ptsz);
    /* The versions of cudaTypedefs.h: PFN_cuCtxCreate_v3020, _v11040 (v3), _v12050 (v4). */
    CHECK(cuGetProcAddress_v2("cuCtxCreate", &function, 11030, 0, &status) == 0 &&
          function == (void *)cuCtxCreate_v2);
    CHECK(cuGetProcAddress_v2("cuCtxCreate", &function, 12000, 0, &status) == 0 &&
          function == (void *)cuCtxCreate_v3);
    CHECK(cuGetProcAddress_v2("cuMemAlloc", &function, 3010, 0, &status) == 0 &&
          function == (void *)cuMemAlloc);
    CHECK(cuGetProcAddress_v2("cuCtxCreate", &function, 13000, 0, &status) == 0 &&
          function == (void *)cuCtxCreate_v4);
    CHECK(cuGetProcAddress_v2("cuMemCreate", &function, 10000, 0, &status) ==
              CUDA_ERROR_NOT_FOUND &&
          status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    CHECK(cuGetProcAddress_v2("cuNoSuchCall", &function, 13000, 0, &status) ==
              CUDA_ERROR_NOT_FOUND &&
          status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && function == NULL);
    const char *name = NULL;
    CHECK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name) == 0 &&
          strcmp(name, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
    CHECK(cuGetErrorName((CUresult)12345, &name) == CUDA_ERROR_INVALID_VALUE);
}

/* Threads allocate and free concurrently; afterwards the device holds exactly the base. */
static void *churn(void *context) {
    CUcontext ctx = context;
    cuCtxSetCurrent(ctx);
    for (int i = 0; i < 200; i++) {
        CUdeviceptr pointer = 0;
        if (cuMemAlloc_v2(&pointer, (size_t)(i % 7 + 1) * MiB) == CUDA_SUCCESS) {
            cuMemFree_v2(pointer);
        }
    }
    return NULL;
}

static void test_threads(CUcontext ctx, uint64_t base) {
    pthread_t threads[8];
    for (int i = 0; i < 8; i++) {
        pthread_create(&threads[i], NULL, churn, ctx);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(threads[i], NULL);
    }
    CHECK(used(0) == base);
}

/* The legacy (v1) entry points the real driver still exports: 32-bit pointers, the same memory. */
static void test_legacy(uint64_t base) {
    CUdeviceptr_v1 a = 0, b = 0;
    unsigned pitch = 0;
    CHECK(cuMemAlloc(&a, 1) == CUDA_SUCCESS && a != 0 && used(0) == base + 2 * MiB);
    CHECK(cuMemAllocPitch(&b, &pitch, 1000, 3000, 4) == CUDA_SUCCESS && pitch == 1024);
    CHECK(used(0) == base + 6 * MiB);
    CHECK(cuMemFree(a) == CUDA_SUCCESS && cuMemFree_v2(b) == CUDA_SUCCESS && used(0) == base);
    CHECK(cuMemFree(a) == CUDA_ERROR_INVALID_VALUE);
    CUarray array = NULL;
    CUDA_ARRAY_DESCRIPTOR_v1 desc = {4096, 1024, CU_AD_FORMAT_FLOAT, 4}; /* 64 MiB */
    CHECK(cuArrayCreate(&array, &desc) == CUDA_SUCCESS && used(0) == base + 64 * MiB);
    CHECK(cuArrayDestroy(array) == CUDA_SUCCESS && used(0) == base);
    CUDA_ARRAY3D_DESCRIPTOR_v1 desc3 = {1024, 1024, 4, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    CHECK(cuArray3DCreate(&array, &desc3) == CUDA_SUCCESS && used(0) == base + 4 * MiB);
    CHECK(cuArrayDestroy(array) == CUDA_SUCCESS && used(0) == base);
    CUcontext own = NULL, current = NULL;
    CHECK(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
    CHECK(cuCtxCreate(&own, 0, 0) == CUDA_SUCCESS && used(0) == base + 512 * MiB);
    CHECK(cuCtxDestroy_v2(own) == CUDA_SUCCESS && used(0) == base);
    CHECK(cuCtxCreate_v3(&own, NULL, 0, 0, 0) == CUDA_SUCCESS && used(0) == base + 512 * MiB);
    CHECK(cuCtxDestroy_v2(own) == CUDA_SUCCESS && used(0) == base);
    CHECK(cuCtxSetCurrent(current) == CUDA_SUCCESS);
}

/* cuCtxSetLimit: a larger heap, FIFO or stack reserves device memory; a smaller one gives it
 * back, and so does the context's end. */
static void test_limits(uint64_t base) {
    size_t value = 0;
    CHECK(cuCtxGetLimit(&value, CU_LIMIT_MALLOC_HEAP_SIZE) == CUDA_SUCCESS && value == 8 * MiB);
    CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 108 * MiB) == 0);
    CHECK(used(0) == base + 100 * MiB);
    CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 64 * GiB) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuCtxGetLimit(&value, CU_LIMIT_MALLOC_HEAP_SIZE) == 0 && value == 108 * MiB);
    CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 1 * MiB) == 0 && used(0) == base);
    CHECK(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 * MiB) == 0);
    /* 132 SMs × 2048 threads × 1 KiB more stack each: 264 MiB. */
    CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 2048) == 0 && used(0) == base + 264 * MiB);
    CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1024) == 0 && used(0) == base);
    CHECK(cuCtxSetLimit((CUlimit)99, 1) == CUDA_ERROR_INVALID_VALUE);
    CUcontext own = NULL, current = NULL;
    CHECK(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
    CHECK(cuCtxCreate_v2(&own, 0, 0) == CUDA_SUCCESS);
    CHECK(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 33 * MiB) == 0);
    CHECK(used(0) == base + 512 * MiB + 32 * MiB);
    CHECK(cuCtxDestroy_v2(own) == CUDA_SUCCESS && used(0) == base);
    CHECK(cuCtxSetCurrent(current) == CUDA_SUCCESS);
}

/* Graph memory nodes: the pool grows to what a launch takes and keeps it until trimmed. */
static void test_graph_memory(uint64_t base) {
    CUgraph graph = NULL;
    CUgraphNode alloc = NULL, release = NULL, nodes[3] = {0};
    CUDA_MEM_ALLOC_NODE_PARAMS params = {.bytesize = 300 * MiB};
    params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    params.poolProps.location = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CHECK(cuGraphCreate(&graph, 0) == CUDA_SUCCESS);
    CHECK(cuGraphAddMemAllocNode(&alloc, graph, NULL, 0, &params) == 0 && params.dptr != 0);
    CHECK(cuGraphAddMemFreeNode(&release, graph, &alloc, 1, params.dptr) == CUDA_SUCCESS);
    size_t count = 0;
    CHECK(cuGraphGetNodes(graph, NULL, &count) == CUDA_SUCCESS && count == 2);
    count = 3;
    CHECK(cuGraphGetNodes(graph, nodes, &count) == 0 && count == 2 && nodes[1] == release);
    CUgraphNodeType type;
    CHECK(cuGraphNodeGetType(alloc, &type) == 0 && type == CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    CHECK(cuGraphNodeGetType(release, &type) == 0 && type == CU_GRAPH_NODE_TYPE_MEM_FREE);
    CUDA_MEM_ALLOC_NODE_PARAMS read = {0};
    CHECK(cuGraphMemAllocNodeGetParams(alloc, &read) == 0 && read.bytesize == 300 * MiB);
    CHECK(read.dptr == params.dptr && read.poolProps.location.id == 0);
    CHECK(cuGraphMemAllocNodeGetParams(release, &read) == CUDA_ERROR_INVALID_VALUE);
    CUgraphExec exec = NULL;
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0) == 0 && used(0) == base); /* at launch */
    CUstream stream = NULL;
    CHECK(cuStreamCreate(&stream, 0) == CUDA_SUCCESS);
    CHECK(cuGraphLaunch(exec, stream) == 0 && cuStreamSynchronize(stream) == 0);
    CHECK(used(0) == base + 300 * MiB);
    cuuint64_t reserved = 0;
    CHECK(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) == 0);
    CHECK(reserved == 300 * MiB);
    CHECK(cuGraphExecDestroy(exec) == 0 && used(0) == base + 300 * MiB); /* kept by the pool */
    CHECK(cuDeviceGraphMemTrim(0) == CUDA_SUCCESS && used(0) == base);
    CUDA_GRAPH_INSTANTIATE_PARAMS instantiate = {0};
    CHECK(cuGraphInstantiateWithParams(&exec, graph, &instantiate) == 0);
    CHECK(instantiate.result_out == CUDA_GRAPH_INSTANTIATE_SUCCESS);
    CHECK(cuGraphExecDestroy(exec) == CUDA_SUCCESS);
    params.bytesize = 64 * GiB;
    CHECK(cuGraphAddMemAllocNode(&alloc, graph, NULL, 0, &params) == CUDA_SUCCESS);
    CHECK(cuGraphInstantiate_v2(&exec, graph, NULL, NULL, 0) == CUDA_SUCCESS);
    CHECK(cuGraphLaunch(exec, stream) == CUDA_ERROR_OUT_OF_MEMORY && used(0) == base);
    CHECK(cuGraphExecDestroy(exec) == 0 && cuGraphDestroy(graph) == 0);
    CHECK(cuStreamDestroy_v2(stream) == CUDA_SUCCESS);
}

static void test_contexts(void) {
    uint64_t before = used(1);
    CUcontext own = NULL, popped = NULL, current = NULL;
    CUdeviceptr pointer = 0;
    CHECK(cuCtxCreate_v4(&own, NULL, 0, 1) == CUDA_SUCCESS && used(1) == before + 512 * MiB);
    CHECK(cuMemAlloc_v2(&pointer, 8 * MiB) == CUDA_SUCCESS);
    CUdevice device = -1;
    CHECK(cuCtxGetDevice(&device) == CUDA_SUCCESS && device == 1);
    CHECK(cuCtxDestroy_v2(own) == CUDA_SUCCESS && used(1) == before); /* frees what it owned */
    CHECK(cuCtxGetCurrent(&current) == CUDA_SUCCESS);
    CHECK(cuCtxPushCurrent_v2(own) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuCtxPopCurrent_v2(&popped) == CUDA_SUCCESS);
}

/* The deprecated entry points: legacy launches run for their parameter block's nanoseconds, the
 * v1 views clamp at 4 GiB, the v1 destroys and releases free what their _v2 forms free, and a
 * green context holds a context of its own. */
static void test_deprecated(CUcontext current, uint64_t base) {
    CUcontext owner = NULL, other_ctx = NULL, made = NULL, green_ctx = NULL;
    CUmodule module = NULL, other_module = NULL;
    CUfunction function = NULL, other_function = NULL;
    CUstream stream = NULL, other = NULL;
    CUevent start = NULL, stop = NULL;
    float ms = 0;
    uint64_t duration = 2000000; /* 2 ms */
    CHECK(cuCtxSetCurrent(current) == CUDA_SUCCESS);
    CHECK(cuModuleLoadData(&module, "image") == 0);
    CHECK(cuModuleGetFunction(&function, module, "sleep") == 0);
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cuStreamGetCtx(stream, &owner) == CUDA_SUCCESS && owner == current);
    CHECK(cuEventCreate(&start, 0) == CUDA_SUCCESS && cuEventCreate(&stop, 0) == CUDA_SUCCESS);
    CHECK(cuLaunch(function) == CUDA_ERROR_INVALID_VALUE); /* no block shape yet */
    CHECK(cuFuncSetBlockShape(function, 0, 1, 1) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuFuncSetBlockShape(function, 32, 1, 1) == CUDA_SUCCESS);
    CHECK(cuParamSetSize(function, sizeof duration) == CUDA_SUCCESS);
    CHECK(cuParamSetv(function, 0, &duration, sizeof duration) == CUDA_SUCCESS);
    CHECK(cuParamSetv(function, 250, &duration, sizeof duration) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuEventRecord(start, stream) == CUDA_SUCCESS);
    CHECK(cuLaunchGridAsync(function, 2, 2, stream) == 0);
    CHECK(cuLaunchGridAsync(function, 1, 1, stream) == 0);
    CHECK(cuEventRecord(stop, stream) == CUDA_SUCCESS && cuEventSynchronize(stop) == 0);
    CHECK(cuEventElapsedTime_v2(&ms, start, stop) == CUDA_SUCCESS && ms > 3.9f && ms < 4.5f);
    CHECK(cuLaunchGrid(function, 0, 1) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuEventRecord(start, NULL) == CUDA_SUCCESS);
    CHECK(cuLaunch(function) == CUDA_SUCCESS && cuLaunchGrid(function, 3, 1) == CUDA_SUCCESS);
    CHECK(cuEventRecord(stop, NULL) == CUDA_SUCCESS && cuEventSynchronize(stop) == 0);
    CHECK(cuEventElapsedTime_v2(&ms, start, stop) == CUDA_SUCCESS && ms > 3.9f && ms < 4.5f);

    /* One kernel on each device; each launch names its own device's stream. */
    CHECK(cuDevicePrimaryCtxRetain(&other_ctx, 1) == 0 && cuCtxSetCurrent(other_ctx) == 0);
    CHECK(cuModuleLoadData(&other_module, "image") == 0);
    CHECK(cuModuleGetFunction(&other_function, other_module, "sleep") == 0);
    CHECK(cuStreamCreate(&other, 0) == CUDA_SUCCESS && cuCtxSetCurrent(current) == 0);
    void *params[] = {&duration};
    CUDA_LAUNCH_PARAMS launches[2] = {{function, 1, 1, 1, 32, 1, 1, 0, stream, params},
                                      {other_function, 1, 1, 1, 32, 1, 1, 0, other, params}};
    CHECK(cuLaunchCooperativeKernelMultiDevice(launches, 2, 0) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(stream) == 0 && cuStreamSynchronize(other) == 0);
    CHECK(cuLaunchCooperativeKernelMultiDevice(launches, 0, 0) == CUDA_ERROR_INVALID_VALUE);
    launches[1].hStream = stream; /* both on device 0 */
    CHECK(cuLaunchCooperativeKernelMultiDevice(launches, 2, 0) == CUDA_ERROR_INVALID_DEVICE);
    launches[1].hStream = NULL;
    CHECK(cuLaunchCooperativeKernelMultiDevice(launches, 2, 0) == CUDA_ERROR_INVALID_HANDLE);
    /* v1 reset and release, as _v2: the reset drops every retain at once. */
    CHECK(cuDevicePrimaryCtxRetain(&other_ctx, 1) == 0 && cuDevicePrimaryCtxReset(1) == 0);
    CHECK(used(1) == 0 && cuDevicePrimaryCtxRelease(1) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuDevicePrimaryCtxRetain(&other_ctx, 1) == 0 && used(1) == base);
    CHECK(cuDevicePrimaryCtxRelease(1) == CUDA_SUCCESS && used(1) == 0);

    /* The v1 views: what fits in an unsigned int, else its maximum. */
    unsigned int free_v1 = 0, total_v1 = 0, bytes_v1 = 0;
    CUdeviceptr big = 0;
    CHECK(cuMemGetInfo(&free_v1, &total_v1) == CUDA_SUCCESS);
    CHECK(free_v1 == UINT32_MAX && total_v1 == UINT32_MAX); /* 8 GiB */
    CHECK(cuMemAlloc_v2(&big, 5 * GiB) == CUDA_SUCCESS);
    CHECK(cuMemGetInfo(&free_v1, &total_v1) == 0 && free_v1 == 8 * GiB - base - 5 * GiB);
    CHECK(cuMemFree_v2(big) == CUDA_SUCCESS);
    CHECK(cuDeviceTotalMem(&bytes_v1, 0) == CUDA_SUCCESS && bytes_v1 == UINT32_MAX);
    CHECK(cuMemGetInfo(NULL, &total_v1) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuDeviceTotalMem(&bytes_v1, 7) == CUDA_ERROR_INVALID_DEVICE);

    CHECK(cuCtxCreate_v2(&made, 0, 0) == CUDA_SUCCESS && used(0) == 2 * base);
    CHECK(cuCtxDestroy(made) == CUDA_SUCCESS && used(0) == base);
    CHECK(cuCtxDestroy(made) == CUDA_ERROR_INVALID_CONTEXT && cuCtxSetCurrent(current) == 0);

    CUgreenCtx green = NULL;
    int descriptor = 0; /* resource partitions are not simulated: any descriptor */
    CUdevResourceDesc desc = (CUdevResourceDesc)&descriptor;
    CHECK(cuGreenCtxCreate(&green, desc, 0, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuGreenCtxCreate(&green, NULL, 0, CU_GREEN_CTX_DEFAULT_STREAM) ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(cuGreenCtxCreate(&green, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM) == CUDA_SUCCESS);
    CHECK(used(0) == 2 * base);
    CHECK(cuCtxFromGreenCtx(&green_ctx, green) == 0 && cuCtxSetCurrent(green_ctx) == 0);
    CHECK(cuMemAlloc_v2(&big, 10 * MiB) == CUDA_SUCCESS && used(0) == 2 * base + 10 * MiB);
    CHECK(cuCtxSetCurrent(current) == 0 && cuGreenCtxDestroy(green) == 0 && used(0) == base);
    CHECK(cuGreenCtxDestroy(green) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuCtxFromGreenCtx(&green_ctx, green) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuStreamDestroy_v2(stream) == CUDA_SUCCESS);
}

int main(void) {
    char state_path[] = "/tmp/vgpu-sim-test-XXXXXX";
    int fd = mkstemp(state_path);
    close(fd);
    unlink(state_path); /* the simulator creates it */
    setenv("VGPU_SIM_STATE", state_path, 1);
    setenv("VGPU_SIM_DEVICES", "count=2,memory=8GiB", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");

    CUdeviceptr pointer = 0;
    CHECK(cuMemAlloc_v2(&pointer, 1) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cuInit(1) == CUDA_ERROR_INVALID_VALUE && cuInit(0) == CUDA_SUCCESS);
    CHECK(cuMemAlloc_v2(&pointer, 1) == CUDA_ERROR_INVALID_CONTEXT);
    CUcontext ctx = NULL;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == 0);
    uint64_t base = used(0);
    CHECK(base == 512 * MiB);

    test_plain_memory(base);
    test_pools(base);
    test_vmm(base);
    test_arrays(base);
    test_legacy(base);
    test_limits(base);
    test_graph_memory(base);
    test_execution();
    test_proc_address();
    test_threads(ctx, base);
    test_contexts();
    test_deprecated(ctx, base);

    CHECK(cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS && used(0) == 0);
    CHECK(cuDevicePrimaryCtxRelease_v2(0) == CUDA_ERROR_INVALID_CONTEXT);
    unlink(state_path);
    return unit_report();
}
