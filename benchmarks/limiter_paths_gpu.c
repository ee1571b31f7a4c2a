/* The memory paths that once went around the limit, on a real driver: each asks for more than
 * the pod's limit through one entry point, reached with dlsym as a program that loads libcuda
 * itself would. Run once without the limiter (what the driver does) and once with it and a
 * limit below the request: every path must then answer CUDA_ERROR_OUT_OF_MEMORY (2).
 * One JSON line per path: {"path": ..., "result": N, "freed": N}.
 * Build: cc -std=c11 -Ipackages/limiter/csrc/include benchmarks/limiter_paths_gpu.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_abi.h"

#define GIB (1024ULL * 1024 * 1024)

static void *driver;

static void *entry(const char *name) {
    void *function = dlsym(driver, name);
    if (function == NULL) {
        printf("{\"path\": \"%s\", \"error\": \"not exported\"}\n", name);
    }
    return function;
}

static void report(const char *path, CUresult result, CUresult freed) {
    printf("{\"path\": \"%s\", \"result\": %d, \"freed\": %d}\n", path, (int)result, (int)freed);
    fflush(stdout);
}

int main(int argc, char **argv) {
    /* The size each path asks for, in GiB (below 4: the legacy paths take 32-bit sizes). */
    unsigned long long request = (argc > 1 ? (unsigned long long)atoi(argv[1]) : 3) * GIB;
    driver = dlopen("libcuda.so.1", RTLD_NOW);
    if (driver == NULL) {
        fprintf(stderr, "error: libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    CUresult (*init)(unsigned) = entry("cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = entry("cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = entry("cuCtxSetCurrent");
    CUcontext context;
    if (init == NULL || retain == NULL || set_current == NULL || init(0) != 0 ||
        retain(&context, 0) != 0 || set_current(context) != 0) {
        fprintf(stderr, "error: no context on device 0\n");
        return 1;
    }

    CUresult (*alloc_v1)(CUdeviceptr_v1 *, unsigned) = entry("cuMemAlloc");
    CUresult (*free_v1)(CUdeviceptr_v1) = entry("cuMemFree");
    if (alloc_v1 != NULL && free_v1 != NULL) {
        CUdeviceptr_v1 pointer = 0;
        CUresult result = alloc_v1(&pointer, (unsigned)request);
        report("cuMemAlloc (legacy)", result, result == 0 ? free_v1(pointer) : 0);
    }

    CUresult (*pitch_v1)(CUdeviceptr_v1 *, unsigned *, unsigned, unsigned, unsigned) =
        entry("cuMemAllocPitch");
    if (pitch_v1 != NULL && free_v1 != NULL) {
        CUdeviceptr_v1 pointer = 0;
        unsigned pitch = 0;
        CUresult result = pitch_v1(&pointer, &pitch, 65536, (unsigned)(request / 65536), 4);
        report("cuMemAllocPitch (legacy)", result, result == 0 ? free_v1(pointer) : 0);
    }

    CUresult (*array_v2)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *) = entry("cuArrayCreate_v2");
    CUresult (*array_destroy)(CUarray) = entry("cuArrayDestroy");
    if (array_v2 != NULL && array_destroy != NULL) {
        /* Width x height x 16 bytes (four floats). */
        CUDA_ARRAY_DESCRIPTOR descriptor = {32768, request / (32768 * 16), CU_AD_FORMAT_FLOAT, 4};
        CUarray array = NULL;
        CUresult result = array_v2(&array, &descriptor);
        report("cuArrayCreate_v2", result, result == 0 ? array_destroy(array) : 0);
    }

    CUresult (*set_limit)(CUlimit, size_t) = entry("cuCtxSetLimit");
    if (set_limit != NULL) {
        CUresult result = set_limit(CU_LIMIT_MALLOC_HEAP_SIZE, request);
        report("cuCtxSetLimit heap", result,
               result == 0 ? set_limit(CU_LIMIT_MALLOC_HEAP_SIZE, 8 << 20) : 0);
    }

    CUresult (*graph_create)(CUgraph *, unsigned) = entry("cuGraphCreate");
    CUresult (*graph_alloc)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                            CUDA_MEM_ALLOC_NODE_PARAMS *) = entry("cuGraphAddMemAllocNode");
    CUresult (*graph_free)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr) =
        entry("cuGraphAddMemFreeNode");
    CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long) =
        entry("cuGraphInstantiateWithFlags");
    CUresult (*exec_destroy)(CUgraphExec) = entry("cuGraphExecDestroy");
    CUresult (*graph_destroy)(CUgraph) = entry("cuGraphDestroy");
    if (graph_create && graph_alloc && graph_free && instantiate && exec_destroy && graph_destroy) {
        CUgraph graph = NULL;
        CUgraphNode alloc_node = NULL, free_node = NULL;
        CUDA_MEM_ALLOC_NODE_PARAMS params;
        memset(&params, 0, sizeof params);
        params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        params.poolProps.location.id = 0;
        params.bytesize = request;
        CUresult result = graph_create(&graph, 0);
        if (result == 0) {
            result = graph_alloc(&alloc_node, graph, NULL, 0, &params);
        }
        if (result == 0) {
            result = graph_free(&free_node, graph, &alloc_node, 1, params.dptr);
        }
        CUgraphExec exec = NULL;
        if (result == 0) {
            result = instantiate(&exec, graph, 0);
        }
        report("cuGraphAddMemAllocNode + instantiate", result,
               result == 0 ? exec_destroy(exec) : 0);
        if (graph != NULL) {
            graph_destroy(graph);
        }
    }
    return 0;
}
