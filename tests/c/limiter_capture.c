/* A launch into a capturing stream is not paced, whichever entry point opened the capture:
 *   limiter_capture FORM PATH
 * FORM: v1, v1_ptsz, v2, v2_ptsz, to_graph or to_graph_ptsz (the cuStreamBeginCapture* entry
 * points); PATH: linked (the symbol itself) or procaddress (cuGetProcAddress for the version and
 * stream form). Under a small compute limit it runs a 300 ms kernel, so that the pod's bucket
 * goes into debt for seconds once the epoch is charged, then opens a capture with FORM and
 * launches into it. Paced, that launch would wait out the debt; captured, it returns at once.
 * Prints {"captured_launch_ms": T, "end": R, "nodes": N}: the captured launch's time, what
 * cuStreamEndCapture returned and the captured graph's node count. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "spin_kernel.h"

#define PER_THREAD 2 /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */

static void fail(const char *what) {
    fprintf(stderr, "limiter_capture: %s failed\n", what);
    exit(1);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void *entry(const char *base, int version, bool per_thread) {
    void *function = NULL;
    if (cuGetProcAddress_v2(base, &function, version, per_thread ? PER_THREAD : 0, NULL) !=
            CUDA_SUCCESS ||
        function == NULL) {
        fail(base);
    }
    return function;
}

/* Open a capture of `stream` into `graph` (used by the ToGraph forms) with FORM through PATH. */
static CUresult begin(const char *form, bool linked, CUstream stream, CUgraph graph) {
    bool per_thread = strstr(form, "_ptsz") != NULL;
    if (strncmp(form, "v1", 2) == 0) {
        __typeof__(&cuStreamBeginCapture) open =
            linked ? (per_thread ? cuStreamBeginCapture_ptsz : cuStreamBeginCapture)
                   : entry("cuStreamBeginCapture", 10000, per_thread);
        return open(stream);
    }
    if (strncmp(form, "v2", 2) == 0) {
        __typeof__(&cuStreamBeginCapture_v2) open =
            linked ? (per_thread ? cuStreamBeginCapture_v2_ptsz : cuStreamBeginCapture_v2)
                   : entry("cuStreamBeginCapture", 13000, per_thread);
        return open(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
    }
    if (strncmp(form, "to_graph", 8) == 0) {
        __typeof__(&cuStreamBeginCaptureToGraph) open =
            linked ? (per_thread ? cuStreamBeginCaptureToGraph_ptsz : cuStreamBeginCaptureToGraph)
                   : entry("cuStreamBeginCaptureToGraph", 13000, per_thread);
        return open(stream, graph, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_GLOBAL);
    }
    fail(form);
    return CUDA_ERROR_INVALID_VALUE;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: limiter_capture FORM linked|procaddress\n");
        return 2;
    }
    CUcontext context;
    CUmodule module;
    CUfunction spin;
    CUstream stream;
    CUgraph into;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&context, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(context) != CUDA_SUCCESS || cuModuleLoadData(&module, SPIN) != CUDA_SUCCESS ||
        cuModuleGetFunction(&spin, module, "spin") != CUDA_SUCCESS ||
        cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        cuGraphCreate(&into, 0) != CUDA_SUCCESS) {
        fail("setup");
    }
    unsigned long long long_ns = 300000000ULL;
    unsigned long long short_ns = 1000000ULL;
    void *long_params[] = {&long_ns};
    void *short_params[] = {&short_ns};
    if (cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, long_params, NULL) != CUDA_SUCCESS ||
        cuStreamSynchronize(stream) != CUDA_SUCCESS) {
        fail("the long kernel");
    }
    bool linked = strcmp(argv[2], "linked") == 0;
    if (begin(argv[1], linked, stream, into) != CUDA_SUCCESS) {
        fail("cuStreamBeginCapture*");
    }
    double started = now_ms();
    if (cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, short_params, NULL) != CUDA_SUCCESS) {
        fail("the captured launch");
    }
    double took = now_ms() - started;
    CUgraph graph = NULL;
    CUresult ended = cuStreamEndCapture(stream, &graph);
    size_t nodes = 0;
    if (ended == CUDA_SUCCESS && cuGraphGetNodes(graph, NULL, &nodes) != CUDA_SUCCESS) {
        fail("cuGraphGetNodes");
    }
    printf("{\"captured_launch_ms\": %.1f, \"end\": %d, \"nodes\": %zu}\n", took, (int)ended,
           nodes);
    return 0;
}
