/* What the limiter intercepts, defined once. Each hooked symbol is an exported wrapper with the
 * driver's own prototype (from cuda_api.h / nvml_abi.h); the real functions it forwards to, the
 * routing of dlsym and cuGetProcAddress, and the coverage test all derive from these lists. */
#ifndef VGPU_LIMITER_HOOKS_H
#define VGPU_LIMITER_HOOKS_H

#include <stdbool.h>

#include "cuda_api.h"
#include "nvml_abi.h"

/* Driver entry points with a wrapper in the limiter. */
#define VGPU_CUDA_HOOKS(X) \
    X(cuInit) \
    X(cuGetProcAddress) \
    X(cuGetProcAddress_v2) \
    X(cuDeviceTotalMem) \
    X(cuDeviceTotalMem_v2) \
    X(cuMemGetInfo) \
    X(cuMemGetInfo_v2) \
    X(cuCtxCreate) \
    X(cuCtxCreate_v2) \
    X(cuCtxCreate_v3) \
    X(cuCtxCreate_v4) \
    X(cuCtxSetLimit) \
    X(cuCtxDestroy) \
    X(cuCtxDestroy_v2) \
    X(cuGreenCtxCreate) \
    X(cuGreenCtxDestroy) \
    X(cuDevicePrimaryCtxRetain) \
    X(cuDevicePrimaryCtxRelease) \
    X(cuDevicePrimaryCtxRelease_v2) \
    X(cuDevicePrimaryCtxReset) \
    X(cuDevicePrimaryCtxReset_v2) \
    X(cuMemAlloc) \
    X(cuMemAlloc_v2) \
    X(cuMemAllocPitch) \
    X(cuMemAllocPitch_v2) \
    X(cuMemAllocManaged) \
    X(cuMemFree) \
    X(cuMemFree_v2) \
    X(cuMemAllocAsync) \
    X(cuMemAllocAsync_ptsz) \
    X(cuMemAllocFromPoolAsync) \
    X(cuMemAllocFromPoolAsync_ptsz) \
    X(cuMemFreeAsync) \
    X(cuMemFreeAsync_ptsz) \
    X(cuMemPoolTrimTo) \
    X(cuMemPoolCreate) \
    X(cuMemPoolDestroy) \
    X(cuMemCreate) \
    X(cuMemRelease) \
    X(cuMemMap) \
    X(cuMemUnmap) \
    X(cuArrayCreate) \
    X(cuArrayCreate_v2) \
    X(cuArray3DCreate) \
    X(cuArray3DCreate_v2) \
    X(cuArrayDestroy) \
    X(cuMipmappedArrayCreate) \
    X(cuMipmappedArrayDestroy) \
    X(cuStreamSynchronize) \
    X(cuStreamSynchronize_ptsz) \
    X(cuCtxSynchronize) \
    X(cuCtxSynchronize_v2) \
    X(cuEventSynchronize) \
    X(cuStreamDestroy_v2) \
    X(cuStreamBeginCapture) \
    X(cuStreamBeginCapture_ptsz) \
    X(cuStreamBeginCapture_v2) \
    X(cuStreamBeginCapture_v2_ptsz) \
    X(cuStreamBeginCaptureToGraph) \
    X(cuStreamBeginCaptureToGraph_ptsz) \
    X(cuStreamEndCapture) \
    X(cuStreamEndCapture_ptsz) \
    X(cuLaunchKernel) \
    X(cuLaunchKernel_ptsz) \
    X(cuLaunchKernelEx) \
    X(cuLaunchKernelEx_ptsz) \
    X(cuLaunchCooperativeKernel) \
    X(cuLaunchCooperativeKernel_ptsz) \
    X(cuLaunchCooperativeKernelMultiDevice) \
    X(cuLaunch) \
    X(cuLaunchGrid) \
    X(cuLaunchGridAsync) \
    X(cuGraphLaunch) \
    X(cuGraphLaunch_ptsz) \
    X(cuGraphInstantiate) \
    X(cuGraphInstantiate_v2) \
    X(cuGraphInstantiateWithFlags) \
    X(cuGraphInstantiateWithParams) \
    X(cuGraphInstantiateWithParams_ptsz) \
    X(cuGraphExecDestroy) \
    X(cuDeviceGraphMemTrim)

/* Driver entry points the limiter calls without wrapping them. */
#define VGPU_CUDA_CALLS(X) \
    X(cuDeviceGetCount) \
    X(cuDeviceGetUuid_v2) \
    X(cuCtxGetCurrent) \
    X(cuCtxGetDevice) \
    X(cuCtxPushCurrent_v2) \
    X(cuCtxPopCurrent_v2) \
    X(cuCtxFromGreenCtx) \
    X(cuStreamGetCtx) \
    X(cuCtxGetLimit) \
    X(cuDeviceGetAttribute) \
    X(cuDeviceGetMemPool) \
    X(cuDeviceGetDefaultMemPool) \
    X(cuMemPoolGetAttribute) \
    X(cuMemAdvise) \
    X(cuMemAdvise_v2) \
    X(cuEventCreate) \
    X(cuEventDestroy_v2) \
    X(cuEventRecord) \
    X(cuEventQuery) \
    X(cuEventElapsedTime) \
    X(cuEventElapsedTime_v2) \
    X(cuStreamIsCapturing) \
    X(cuFuncGetName) \
    X(cuKernelGetName) \
    X(cuGraphGetNodes) \
    X(cuGraphNodeGetType) \
    X(cuGraphKernelNodeGetParams_v2) \
    X(cuGraphMemAllocNodeGetParams) \
    X(cuDeviceGetGraphMemAttribute)

/* NVML entry points with a wrapper in the limiter. */
#define VGPU_NVML_HOOKS(X) \
    X(nvmlDeviceGetCount) \
    X(nvmlDeviceGetCount_v2) \
    X(nvmlDeviceGetHandleByIndex) \
    X(nvmlDeviceGetHandleByIndex_v2) \
    X(nvmlDeviceGetIndex) \
    X(nvmlDeviceGetMemoryInfo) \
    X(nvmlDeviceGetMemoryInfo_v2) \
    X(nvmlDeviceGetComputeRunningProcesses) \
    X(nvmlDeviceGetComputeRunningProcesses_v2) \
    X(nvmlDeviceGetComputeRunningProcesses_v3) \
    X(nvmlDeviceGetGraphicsRunningProcesses) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3) \
    X(nvmlDeviceGetMPSComputeRunningProcesses) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3) \
    X(nvmlDeviceGetRunningProcessDetailList)

/* NVML entry points the limiter calls without wrapping them. */
#define VGPU_NVML_CALLS(X) X(nvmlDeviceGetUUID)

/* The real functions, resolved from the real libraries on first use. */
struct vgpu_real_functions {
#define VGPU_REAL_POINTER(symbol) __typeof__(symbol) *symbol;
    VGPU_CUDA_HOOKS(VGPU_REAL_POINTER)
    VGPU_CUDA_CALLS(VGPU_REAL_POINTER)
    VGPU_NVML_HOOKS(VGPU_REAL_POINTER)
    VGPU_NVML_CALLS(VGPU_REAL_POINTER)
#undef VGPU_REAL_POINTER
};

extern struct vgpu_real_functions vgpu_real;

/* Load the real driver (TF_CUDA_LIB_PATH, else libcuda.so.1) and fill the CUDA pointers; false
 * with a logged reason when it cannot. Idempotent and thread-safe. */
bool vgpu_load_cuda(void);
/* The same for NVML (TF_NVML_LIB_PATH, else libnvidia-ml.so.1). */
bool vgpu_load_nvml(void);

/* Our wrapper for an exported driver or NVML symbol name, or NULL when it is not hooked. */
void *vgpu_hook_for(const char *symbol);

#endif
