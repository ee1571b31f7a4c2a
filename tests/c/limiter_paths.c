/* Every allocation path under libcuda_limiter.so on the simulated GPU. Run with the limiter
 * preloaded, a 1 GiB limit on device 0 and TF_CUDA_CONTEXT_OVERHEAD=256MiB: each API must be
 * charged what it holds, refused past the limit, and give everything back when freed. The
 * virtual view (cuMemGetInfo_v2) shows the pod's usage. Prints "N passed, M failed". */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"

#define MiB (1ULL << 20)
#define LIMIT (1024 * MiB)
#define CONTEXT (256 * MiB)

static int passed;
static int failed;

#define CHECK(condition)                                                                     \
    do {                                                                                     \
        if (condition) {                                                                     \
            passed++;                                                                        \
        } else {                                                                             \
            failed++;                                                                        \
            fprintf(stderr, "line %d: %s\n", __LINE__, #condition);                         \
        }                                                                                    \
    } while (0)

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

int main(void) {
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
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    contexts();
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
