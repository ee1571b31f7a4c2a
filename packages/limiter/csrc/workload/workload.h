/* vgpu-sim-workload: a small CUDA driver program that allocates, launches simulated kernels
 * and reports what it achieved as JSON. It reaches the driver by one of the three paths real
 * programs take, so tests can check the simulator (and later the limiter) on each of them. */
#ifndef VGPU_WORKLOAD_H
#define VGPU_WORKLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_api.h"

/* The entry points the workload calls: X(base, symbol, need).
 * `symbol` is the ABI name whose prototype the workload calls through (what a program built
 * against CUDA 13's cuda.h calls); `base` is the name cuGetProcAddress_v2 is asked for.
 * `need` is ALWAYS, or GRAPH for entries only resolved with --graph, so that an old
 * --cuda-version fails only where the workload really needs a newer entry point. */
#define WORKLOAD_CALLS(X) \
    X(cuInit, cuInit, ALWAYS) \
    X(cuDriverGetVersion, cuDriverGetVersion, ALWAYS) \
    X(cuDeviceGet, cuDeviceGet, ALWAYS) \
    X(cuDeviceGetName, cuDeviceGetName, ALWAYS) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, ALWAYS) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, ALWAYS) \
    X(cuCtxSetCurrent, cuCtxSetCurrent, ALWAYS) \
    X(cuMemGetInfo, cuMemGetInfo_v2, ALWAYS) \
    X(cuMemAlloc, cuMemAlloc_v2, ALWAYS) \
    X(cuMemFree, cuMemFree_v2, ALWAYS) \
    X(cuModuleLoadData, cuModuleLoadData, ALWAYS) \
    X(cuModuleGetFunction, cuModuleGetFunction, ALWAYS) \
    X(cuModuleUnload, cuModuleUnload, ALWAYS) \
    X(cuStreamCreate, cuStreamCreate, ALWAYS) \
    X(cuStreamDestroy, cuStreamDestroy_v2, ALWAYS) \
    X(cuStreamSynchronize, cuStreamSynchronize, ALWAYS) \
    X(cuStreamWaitEvent, cuStreamWaitEvent, ALWAYS) \
    X(cuEventCreate, cuEventCreate, ALWAYS) \
    X(cuEventRecord, cuEventRecord, ALWAYS) \
    X(cuEventSynchronize, cuEventSynchronize, ALWAYS) \
    X(cuEventElapsedTime, cuEventElapsedTime_v2, ALWAYS) \
    X(cuEventDestroy, cuEventDestroy_v2, ALWAYS) \
    X(cuLaunchKernel, cuLaunchKernel, ALWAYS) \
    X(cuStreamBeginCapture, cuStreamBeginCapture_v2, GRAPH) \
    X(cuStreamEndCapture, cuStreamEndCapture, GRAPH) \
    X(cuGraphCreate, cuGraphCreate, GRAPH) \
    X(cuGraphAddKernelNode, cuGraphAddKernelNode_v2, GRAPH) \
    X(cuGraphInstantiate, cuGraphInstantiateWithFlags, GRAPH) \
    X(cuGraphLaunch, cuGraphLaunch, GRAPH) \
    X(cuGraphExecDestroy, cuGraphExecDestroy, GRAPH) \
    X(cuGraphDestroy, cuGraphDestroy, GRAPH)

struct cuda_api {
#define WORKLOAD_FIELD(base, symbol, need) __typeof__(&symbol) base;
    WORKLOAD_CALLS(WORKLOAD_FIELD)
#undef WORKLOAD_FIELD
};

enum call_path { PATH_LINKED, PATH_DLOPEN, PATH_PROCADDRESS };
enum graph_mode { GRAPH_NONE, GRAPH_CAPTURE, GRAPH_BUILD };

struct options {
    enum call_path path;
    int device;
    uint64_t alloc_bytes;
    uint64_t kernels;   /* total, unless duration_s > 0 */
    double kernel_us;
    unsigned streams;   /* 0: the legacy default stream */
    bool fresh_streams; /* each round on a new stream, destroyed after its launches */
    bool marks;         /* report progress over time */
    uint64_t batch;     /* kernels per round (one graph launch with --graph) */
    enum graph_mode graph;
    double duration_s;  /* > 0: issue rounds until this much wall time has passed */
    double hold_s;
    double idle_ms;     /* > 0: each round waited for, then this much sleep */
    int cuda_version;   /* asked of cuGetProcAddress_v2 */
    const char *kernel_name; /* asked of cuModuleGetFunction */
};

/* Parse argv; on bad input print one line on stderr and exit 2 (--help: usage, exit 0). */
void options_parse(int argc, char **argv, struct options *options);

const char *path_name(enum call_path path);
const char *graph_mode_name(enum graph_mode mode);

/* A failure before or outside a CUDA call: "<CUDA error name> in <call>" plus detail. */
struct load_error {
    CUresult result;
    char call[96];
    char detail[160];
};

/* Fill `api` by the chosen path; graph entry points only when `graph`. */
bool api_load(struct cuda_api *api, const struct options *options, bool graph,
              struct load_error *error);

/* "CUDA_ERROR_OUT_OF_MEMORY"; NULL for a value the ABI header does not know. */
const char *cuda_result_name(CUresult result);

#endif
