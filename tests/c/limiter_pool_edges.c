/* Stream-ordered allocation and physical memory at the edges, under libcuda_limiter.so on the
 * simulated node. argv[1] names the case:
 *   many     device 0 limited to 4 GiB: 200 pools, each with memory; every one is brought up to
 *            date at a synchronize (no fixed number of pools)
 *   destroy  device 0 limited to 4 GiB: a destroyed pool's live allocation stays charged until
 *            it is freed, its idle memory does not
 *   device   device 0 limited to 8 GiB, device 1 to 4 GiB: pool memory is charged to the pool's
 *            device and a stream's device, not the current context's
 *   default  the same limits: another device's default pool, first used through
 *            cuMemAllocFromPoolAsync on the current context's stream, is charged to its device
 *   outside  a confined pod of GPU 0 with CUDA_VISIBLE_DEVICES=0,1: no physical memory or pool
 *            on GPU 1
 * Run with TF_CUDA_CONTEXT_OVERHEAD=512MiB. Prints "N passed, M failed". */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"
#include "unit_check.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)
#define CONTEXT (512 * MiB)

/* What the pod holds on the device of `context`, as the program sees it there. */
static unsigned long long used(CUcontext context) {
    size_t free_bytes = 0, total = 0;
    CUcontext previous = NULL;
    if (cuCtxPushCurrent_v2(context) != CUDA_SUCCESS) {
        return ~0ULL;
    }
    CUresult result = cuMemGetInfo_v2(&free_bytes, &total);
    cuCtxPopCurrent_v2(&previous);
    return result == CUDA_SUCCESS ? total - free_bytes : ~0ULL;
}

static CUmemoryPool make_pool(int device) {
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {CU_MEM_LOCATION_TYPE_DEVICE, device}};
    CUmemoryPool pool = NULL;
    return cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS ? pool : NULL;
}

static void many(CUcontext context) {
    enum { POOLS = 200 };
    static CUmemoryPool pools[POOLS];
    static CUdeviceptr pointers[POOLS];
    int made = 0;
    for (int i = 0; i < POOLS; i++) {
        pools[i] = make_pool(0);
        made += pools[i] != NULL &&
                cuMemAllocFromPoolAsync(&pointers[i], MiB, pools[i], NULL) == CUDA_SUCCESS;
    }
    CHECK(made == POOLS && used(context) == CONTEXT + POOLS * 2 * MiB);
    for (int i = 0; i < POOLS; i++) {
        cuMemFreeAsync(pointers[i], NULL);
    }
    CHECK(used(context) == CONTEXT + POOLS * 2 * MiB); /* kept by the pools until synchronized */
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS && used(context) == CONTEXT);
    for (int i = 0; i < POOLS; i++) {
        cuMemPoolDestroy(pools[i]);
    }
}

static void destroy(CUcontext context) {
    CUmemoryPool pool = make_pool(0);
    CUdeviceptr live = 0, idle = 0, other = 0;
    CHECK(pool != NULL);
    CHECK(cuMemAllocFromPoolAsync(&live, GiB, pool, NULL) == CUDA_SUCCESS);
    CHECK(cuMemAllocFromPoolAsync(&idle, 512 * MiB, pool, NULL) == CUDA_SUCCESS);
    CHECK(cuMemFreeAsync(idle, NULL) == CUDA_SUCCESS); /* idle in the pool, still reserved */
    CHECK(used(context) == CONTEXT + GiB + 512 * MiB);
    CHECK(cuMemPoolDestroy(pool) == CUDA_SUCCESS && used(context) == CONTEXT + GiB);
    CHECK(cuMemAlloc_v2(&other, 3 * GiB) == CUDA_ERROR_OUT_OF_MEMORY); /* the 1 GiB still counts */
    CHECK(cuMemFreeAsync(live, NULL) == CUDA_SUCCESS && used(context) == CONTEXT);
    CHECK(cuMemAlloc_v2(&other, 3 * GiB) == CUDA_SUCCESS && cuMemFree_v2(other) == CUDA_SUCCESS);
    /* Freed by cuMemFree_v2 as well. */
    pool = make_pool(0);
    CHECK(pool != NULL && cuMemAllocFromPoolAsync(&live, GiB, pool, NULL) == CUDA_SUCCESS);
    CHECK(cuMemPoolDestroy(pool) == CUDA_SUCCESS && used(context) == CONTEXT + GiB);
    CHECK(cuMemFree_v2(live) == CUDA_SUCCESS && used(context) == CONTEXT);
}

static void device(CUcontext zero) {
    CUcontext one = NULL;
    CUstream stream_one = NULL;
    CUdeviceptr pointer = 0;
    CHECK(cuCtxCreate_v2(&one, 0, 1) == CUDA_SUCCESS);
    CHECK(cuStreamCreate(&stream_one, 0) == CUDA_SUCCESS); /* a stream of device 1 */
    CHECK(cuCtxSetCurrent(zero) == CUDA_SUCCESS);
    CUmemoryPool pool = make_pool(1);
    /* From device 1's pool on the current (device 0) context's stream. */
    CHECK(cuMemAllocFromPoolAsync(&pointer, 3 * GiB, pool, NULL) == CUDA_SUCCESS);
    CHECK(used(one) == CONTEXT + 3 * GiB && used(zero) == CONTEXT);
    CHECK(cuMemAllocFromPoolAsync(&pointer, GiB, pool, NULL) == CUDA_ERROR_OUT_OF_MEMORY);
    /* From device 1's own pool, through its stream, while device 0's context is current. */
    CHECK(cuMemAllocAsync(&pointer, 256 * MiB, stream_one) == CUDA_SUCCESS);
    CHECK(used(one) == CONTEXT + 3 * GiB + 256 * MiB && used(zero) == CONTEXT);
    CHECK(cuMemAllocAsync(&pointer, GiB, stream_one) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemAllocAsync(&pointer, 4 * GiB, NULL) == CUDA_SUCCESS); /* device 0's, 8 GiB */
    CHECK(used(zero) == CONTEXT + 4 * GiB);
}

static void default_pool(CUcontext zero) {
    CUcontext one = NULL;
    CUmemoryPool pool = NULL;
    CUdeviceptr pointer = 0;
    CHECK(cuCtxCreate_v2(&one, 0, 1) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(zero) == CUDA_SUCCESS);
    CHECK(cuDeviceGetDefaultMemPool(&pool, 1) == CUDA_SUCCESS);
    CHECK(cuMemAllocFromPoolAsync(&pointer, 3 * GiB, pool, NULL) == CUDA_SUCCESS);
    CHECK(used(one) == CONTEXT + 3 * GiB && used(zero) == CONTEXT);
    CHECK(cuMemAllocFromPoolAsync(&pointer, GiB, pool, NULL) == CUDA_ERROR_OUT_OF_MEMORY);
}

static void outside(void) {
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, 1}};
    CUmemGenericAllocationHandle handle = 0;
    CHECK(cuMemCreate(&handle, 2 * GiB, &prop, 0) == CUDA_ERROR_INVALID_DEVICE);
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {CU_MEM_LOCATION_TYPE_DEVICE, 1}};
    CUmemoryPool pool = NULL;
    CHECK(cuMemPoolCreate(&pool, &props) == CUDA_ERROR_INVALID_DEVICE);
    prop.location.id = 0; /* the pod's own GPU is as always */
    CHECK(cuMemCreate(&handle, 2 * GiB, &prop, 0) == CUDA_SUCCESS && cuMemRelease(handle) == 0);
}

int main(int argc, char **argv) {
    CUcontext context = NULL;
    if (argc < 2 || cuInit(0) != CUDA_SUCCESS || cuCtxCreate_v2(&context, 0, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "usage: limiter_pool_edges many|destroy|device|default|outside\n");
        return 2;
    }
    if (strcmp(argv[1], "many") == 0) {
        many(context);
    } else if (strcmp(argv[1], "destroy") == 0) {
        destroy(context);
    } else if (strcmp(argv[1], "device") == 0) {
        device(context);
    } else if (strcmp(argv[1], "default") == 0) {
        default_pool(context);
    } else if (strcmp(argv[1], "outside") == 0) {
        outside();
    } else {
        return 2;
    }
    return unit_report();
}
