/* Simulated driver: cuGetProcAddress and _v2, derived from the one table of entry points.
 * CUDA 12/13 semantics: the caller names the base symbol ("cuMemAlloc") and its CUDA version;
 * the newest ABI symbol introduced at or before that version is returned, the per-thread
 * default stream variant when the flags ask for it (or the legacy one when there is none). */
#define _GNU_SOURCE
#include <string.h>

#include "cuda_sim.h"

enum { LEGACY = 0, PTSZ = 1 };

struct entry {
    const char *symbol;
    const char *base;
    int version;
    int stream;
    void *function;
};

static const struct entry entries[] = {
#define VGPU_SIM_ENTRY(symbol, base, version, stream, params, args) \
    {#symbol, #base, version, stream, (void *)symbol},
    VGPU_CUDA_API(VGPU_SIM_ENTRY)
#undef VGPU_SIM_ENTRY
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    if (symbol == NULL || pfn == NULL ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    int wanted_stream = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ? PTSZ : LEGACY;
    const struct entry *best = NULL;
    bool known = false;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        const struct entry *candidate = &entries[i];
        if (strcmp(candidate->base, symbol) != 0) {
            continue;
        }
        known = true;
        if (candidate->version > cudaVersion ||
            (candidate->stream == PTSZ && wanted_stream != PTSZ)) {
            continue;
        }
        /* Prefer the requested stream kind, then the newest version. */
        if (best == NULL || (candidate->stream == wanted_stream && best->stream != wanted_stream) ||
            (candidate->stream == best->stream && candidate->version > best->version)) {
            best = candidate;
        }
    }
    *pfn = best != NULL ? best->function : NULL;
    if (symbolStatus != NULL) {
        *symbolStatus = best != NULL ? CU_GET_PROC_ADDRESS_SUCCESS
                        : known      ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                     : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return best != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
