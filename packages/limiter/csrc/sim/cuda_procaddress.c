/* Simulated driver: cuGetProcAddress and _v2 with CUDA 12/13 semantics (the selection rule is
 * vgpu_cuda_select), over the functions of the one entry-point table. */
#define _GNU_SOURCE
#include "cuda_sim.h"
#include "vgpu_cuda_table.h"

/* Our implementation of each table entry, in table order. */
static void *const functions[] = {
#define VGPU_SIM_FUNCTION(symbol, base, version, stream, params, args) (void *)symbol,
    VGPU_CUDA_API(VGPU_SIM_FUNCTION)
#undef VGPU_SIM_FUNCTION
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    if (symbol == NULL || pfn == NULL ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    bool known;
    int chosen = vgpu_cuda_select(symbol, cudaVersion, flags, &known);
    *pfn = chosen >= 0 ? functions[chosen] : NULL;
    if (symbolStatus != NULL) {
        *symbolStatus = chosen >= 0 ? CU_GET_PROC_ADDRESS_SUCCESS
                        : known     ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                    : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return chosen >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
