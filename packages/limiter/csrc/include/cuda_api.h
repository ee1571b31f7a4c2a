/* The CUDA driver entry points vgpu knows, defined once:
 *   X(symbol, base, version, stream, params, args)
 * symbol   the exported ABI name (cuMemAlloc_v2)
 * base     the name cuGetProcAddress is asked for (cuMemAlloc)
 * version  the CUDA version that introduced this symbol for `base`: cuGetProcAddress returns
 *          the newest symbol whose version is <= the caller's cudaVersion
 * stream   LEGACY, or PTSZ for the per-thread-default-stream variant (_ptsz/_ptds)
 * Prototypes, the simulated driver's symbol table and the limiter's wrappers derive from it. */
#ifndef VGPU_CUDA_API_H
#define VGPU_CUDA_API_H

#include "cuda_abi.h"

#define VGPU_CUDA_API(X) \
    X(cuInit, cuInit, 2000, LEGACY, (unsigned int Flags), (Flags)) \
    X(cuDriverGetVersion, cuDriverGetVersion, 2020, LEGACY, (int *driverVersion), (driverVersion)) \
    X(cuGetErrorName, cuGetErrorName, 6000, LEGACY, (CUresult error, const char **pStr), (error, pStr)) \
    X(cuGetErrorString, cuGetErrorString, 6000, LEGACY, (CUresult error, const char **pStr), (error, pStr)) \
    X(cuGetProcAddress, cuGetProcAddress, 11030, LEGACY, \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags), (symbol, pfn, cudaVersion, flags)) \
    X(cuGetProcAddress_v2, cuGetProcAddress, 12000, LEGACY, \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus), \
      (symbol, pfn, cudaVersion, flags, symbolStatus)) \
    X(cuDeviceGet, cuDeviceGet, 2000, LEGACY, (CUdevice *device, int ordinal), (device, ordinal)) \
    X(cuDeviceGetCount, cuDeviceGetCount, 2000, LEGACY, (int *count), (count)) \
    X(cuDeviceGetName, cuDeviceGetName, 2000, LEGACY, (char *name, int len, CUdevice dev), (name, len, dev)) \
    X(cuDeviceGetUuid, cuDeviceGetUuid, 9020, LEGACY, (CUuuid *uuid, CUdevice dev), (uuid, dev)) \
    X(cuDeviceGetUuid_v2, cuDeviceGetUuid, 11040, LEGACY, (CUuuid *uuid, CUdevice dev), (uuid, dev)) \
    X(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, LEGACY, (size_t *bytes, CUdevice dev), (bytes, dev)) \
    X(cuDeviceTotalMem, cuDeviceTotalMem, 2000, LEGACY, (unsigned int *bytes, CUdevice dev), (bytes, dev)) \
    X(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000, LEGACY, \
      (int *pi, CUdevice_attribute attrib, CUdevice dev), (pi, attrib, dev)) \
    X(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId, 4010, LEGACY, (char *pciBusId, int len, CUdevice dev), \
      (pciBusId, len, dev)) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, LEGACY, (CUcontext *pctx, CUdevice dev), (pctx, dev)) \
    X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, 11000, LEGACY, (CUdevice dev), (dev)) \
    X(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset, 11000, LEGACY, (CUdevice dev), (dev)) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 7000, LEGACY, (CUdevice dev), (dev)) \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 7000, LEGACY, (CUdevice dev), (dev)) \
    X(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState, 7000, LEGACY, \
      (CUdevice dev, unsigned int *flags, int *active), (dev, flags, active)) \
    X(cuDevicePrimaryCtxSetFlags_v2, cuDevicePrimaryCtxSetFlags, 11000, LEGACY, (CUdevice dev, unsigned int flags), \
      (dev, flags)) \
    X(cuCtxCreate, cuCtxCreate, 2000, LEGACY, (CUcontext *pctx, unsigned int flags, CUdevice dev), \
      (pctx, flags, dev)) \
    X(cuCtxCreate_v2, cuCtxCreate, 3020, LEGACY, (CUcontext *pctx, unsigned int flags, CUdevice dev), \
      (pctx, flags, dev)) \
    X(cuCtxCreate_v3, cuCtxCreate, 11040, LEGACY, \
      (CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags, CUdevice dev), \
      (pctx, paramsArray, numParams, flags, dev)) \
    X(cuCtxCreate_v4, cuCtxCreate, 12050, LEGACY, \
      (CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev), \
      (pctx, ctxCreateParams, flags, dev)) \
    X(cuCtxDestroy_v2, cuCtxDestroy, 4000, LEGACY, (CUcontext ctx), (ctx)) \
    X(cuCtxDestroy, cuCtxDestroy, 2000, LEGACY, (CUcontext ctx), (ctx)) \
    X(cuGreenCtxCreate, cuGreenCtxCreate, 12040, LEGACY, \
      (CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags), (phCtx, desc, dev, flags)) \
    X(cuGreenCtxDestroy, cuGreenCtxDestroy, 12040, LEGACY, (CUgreenCtx hCtx), (hCtx)) \
    X(cuCtxFromGreenCtx, cuCtxFromGreenCtx, 12040, LEGACY, (CUcontext *pContext, CUgreenCtx hCtx), (pContext, hCtx)) \
    X(cuCtxPushCurrent_v2, cuCtxPushCurrent, 4000, LEGACY, (CUcontext ctx), (ctx)) \
    X(cuCtxPopCurrent_v2, cuCtxPopCurrent, 4000, LEGACY, (CUcontext *pctx), (pctx)) \
    X(cuCtxSetCurrent, cuCtxSetCurrent, 4000, LEGACY, (CUcontext ctx), (ctx)) \
    X(cuCtxGetCurrent, cuCtxGetCurrent, 4000, LEGACY, (CUcontext *pctx), (pctx)) \
    X(cuCtxGetDevice, cuCtxGetDevice, 2000, LEGACY, (CUdevice *device), (device)) \
    X(cuCtxGetDevice_v2, cuCtxGetDevice, 13000, LEGACY, (CUdevice *device, CUcontext ctx), (device, ctx)) \
    X(cuCtxSynchronize, cuCtxSynchronize, 2000, LEGACY, (void), ()) \
    X(cuCtxSynchronize_v2, cuCtxSynchronize, 13000, LEGACY, (CUcontext ctx), (ctx)) \
    X(cuCtxSetLimit, cuCtxSetLimit, 3010, LEGACY, (CUlimit limit, size_t value), (limit, value)) \
    X(cuCtxGetLimit, cuCtxGetLimit, 3010, LEGACY, (size_t *pvalue, CUlimit limit), (pvalue, limit)) \
    X(cuMemGetInfo_v2, cuMemGetInfo, 3020, LEGACY, (size_t *free, size_t *total), (free, total)) \
    X(cuMemGetInfo, cuMemGetInfo, 2000, LEGACY, (unsigned int *free, unsigned int *total), (free, total)) \
    X(cuMemAlloc, cuMemAlloc, 2000, LEGACY, (CUdeviceptr_v1 *dptr, unsigned int bytesize), (dptr, bytesize)) \
    X(cuMemFree, cuMemFree, 2000, LEGACY, (CUdeviceptr_v1 dptr), (dptr)) \
    X(cuMemAllocPitch, cuMemAllocPitch, 2000, LEGACY, \
      (CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height, \
       unsigned int ElementSizeBytes), \
      (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes)) \
    X(cuMemAlloc_v2, cuMemAlloc, 3020, LEGACY, (CUdeviceptr *dptr, size_t bytesize), (dptr, bytesize)) \
    X(cuMemFree_v2, cuMemFree, 3020, LEGACY, (CUdeviceptr dptr), (dptr)) \
    X(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, LEGACY, \
      (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes), \
      (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes)) \
    X(cuMemAllocManaged, cuMemAllocManaged, 6000, LEGACY, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags), \
      (dptr, bytesize, flags)) \
    X(cuMemAdvise, cuMemAdvise, 8000, LEGACY, (CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device), \
      (devPtr, count, advice, device)) \
    X(cuMemAdvise_v2, cuMemAdvise, 12020, LEGACY, \
      (CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location), (devPtr, count, advice, location)) \
    X(cuMemAllocHost_v2, cuMemAllocHost, 3020, LEGACY, (void **pp, size_t bytesize), (pp, bytesize)) \
    X(cuMemHostAlloc, cuMemHostAlloc, 2020, LEGACY, (void **pp, size_t bytesize, unsigned int Flags), \
      (pp, bytesize, Flags)) \
    X(cuMemFreeHost, cuMemFreeHost, 2000, LEGACY, (void *p), (p)) \
    X(cuMemAllocAsync, cuMemAllocAsync, 11020, LEGACY, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream), \
      (dptr, bytesize, hStream)) \
    X(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, PTSZ, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream), \
      (dptr, bytesize, hStream)) \
    X(cuMemFreeAsync, cuMemFreeAsync, 11020, LEGACY, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream)) \
    X(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, PTSZ, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream)) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, LEGACY, \
      (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream), (dptr, bytesize, pool, hStream)) \
    X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, PTSZ, \
      (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream), (dptr, bytesize, pool, hStream)) \
    X(cuMemPoolCreate, cuMemPoolCreate, 11020, LEGACY, (CUmemoryPool *pool, const CUmemPoolProps *poolProps), \
      (pool, poolProps)) \
    X(cuMemPoolDestroy, cuMemPoolDestroy, 11020, LEGACY, (CUmemoryPool pool), (pool)) \
    X(cuMemPoolTrimTo, cuMemPoolTrimTo, 11020, LEGACY, (CUmemoryPool pool, size_t minBytesToKeep), \
      (pool, minBytesToKeep)) \
    X(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, LEGACY, \
      (CUmemoryPool pool, CUmemPool_attribute attr, void *value), (pool, attr, value)) \
    X(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 11020, LEGACY, \
      (CUmemoryPool pool, CUmemPool_attribute attr, void *value), (pool, attr, value)) \
    X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 11020, LEGACY, (CUmemoryPool *pool_out, CUdevice dev), \
      (pool_out, dev)) \
    X(cuDeviceGetMemPool, cuDeviceGetMemPool, 11020, LEGACY, (CUmemoryPool *pool, CUdevice dev), (pool, dev)) \
    X(cuDeviceSetMemPool, cuDeviceSetMemPool, 11020, LEGACY, (CUdevice dev, CUmemoryPool pool), (dev, pool)) \
    X(cuMemCreate, cuMemCreate, 10020, LEGACY, \
      (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags), \
      (handle, size, prop, flags)) \
    X(cuMemRelease, cuMemRelease, 10020, LEGACY, (CUmemGenericAllocationHandle handle), (handle)) \
    X(cuMemAddressReserve, cuMemAddressReserve, 10020, LEGACY, \
      (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags), \
      (ptr, size, alignment, addr, flags)) \
    X(cuMemAddressFree, cuMemAddressFree, 10020, LEGACY, (CUdeviceptr ptr, size_t size), (ptr, size)) \
    X(cuMemMap, cuMemMap, 10020, LEGACY, \
      (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags), \
      (ptr, size, offset, handle, flags)) \
    X(cuMemUnmap, cuMemUnmap, 10020, LEGACY, (CUdeviceptr ptr, size_t size), (ptr, size)) \
    X(cuMemSetAccess, cuMemSetAccess, 10020, LEGACY, \
      (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count), (ptr, size, desc, count)) \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020, LEGACY, \
      (size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option), \
      (granularity, prop, option)) \
    X(cuArrayCreate, cuArrayCreate, 2000, LEGACY, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray), \
      (pHandle, pAllocateArray)) \
    X(cuArray3DCreate, cuArray3DCreate, 2000, LEGACY, \
      (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray), (pHandle, pAllocateArray)) \
    X(cuArrayCreate_v2, cuArrayCreate, 3020, LEGACY, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray), \
      (pHandle, pAllocateArray)) \
    X(cuArray3DCreate_v2, cuArray3DCreate, 3020, LEGACY, \
      (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray), (pHandle, pAllocateArray)) \
    X(cuArrayDestroy, cuArrayDestroy, 2000, LEGACY, (CUarray hArray), (hArray)) \
    X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, LEGACY, \
      (CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc, unsigned int numMipmapLevels), \
      (pHandle, pMipmappedArrayDesc, numMipmapLevels)) \
    X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, LEGACY, (CUmipmappedArray hMipmappedArray), \
      (hMipmappedArray)) \
    X(cuModuleLoadData, cuModuleLoadData, 2000, LEGACY, (CUmodule *module, const void *image), (module, image)) \
    X(cuModuleGetFunction, cuModuleGetFunction, 2000, LEGACY, (CUfunction *hfunc, CUmodule hmod, const char *name), \
      (hfunc, hmod, name)) \
    X(cuModuleUnload, cuModuleUnload, 2000, LEGACY, (CUmodule hmod), (hmod)) \
    X(cuFuncGetName, cuFuncGetName, 12030, LEGACY, (const char **name, CUfunction hfunc), (name, hfunc)) \
    X(cuKernelGetName, cuKernelGetName, 12030, LEGACY, (const char **name, CUkernel hfunc), (name, hfunc)) \
    X(cuStreamCreate, cuStreamCreate, 2000, LEGACY, (CUstream *phStream, unsigned int Flags), (phStream, Flags)) \
    X(cuStreamGetCtx, cuStreamGetCtx, 9020, LEGACY, (CUstream hStream, CUcontext *pctx), (hStream, pctx)) \
    X(cuStreamCreateWithPriority, cuStreamCreateWithPriority, 5050, LEGACY, \
      (CUstream *phStream, unsigned int flags, int priority), (phStream, flags, priority)) \
    X(cuStreamDestroy_v2, cuStreamDestroy, 4000, LEGACY, (CUstream hStream), (hStream)) \
    X(cuStreamSynchronize, cuStreamSynchronize, 2000, LEGACY, (CUstream hStream), (hStream)) \
    X(cuStreamSynchronize_ptsz, cuStreamSynchronize, 7000, PTSZ, (CUstream hStream), (hStream)) \
    X(cuStreamQuery, cuStreamQuery, 2000, LEGACY, (CUstream hStream), (hStream)) \
    X(cuStreamQuery_ptsz, cuStreamQuery, 7000, PTSZ, (CUstream hStream), (hStream)) \
    X(cuStreamWaitEvent, cuStreamWaitEvent, 3020, LEGACY, (CUstream hStream, CUevent hEvent, unsigned int Flags), \
      (hStream, hEvent, Flags)) \
    X(cuStreamWaitEvent_ptsz, cuStreamWaitEvent, 7000, PTSZ, (CUstream hStream, CUevent hEvent, unsigned int Flags), \
      (hStream, hEvent, Flags)) \
    X(cuEventCreate, cuEventCreate, 2000, LEGACY, (CUevent *phEvent, unsigned int Flags), (phEvent, Flags)) \
    X(cuEventRecord, cuEventRecord, 2000, LEGACY, (CUevent hEvent, CUstream hStream), (hEvent, hStream)) \
    X(cuEventRecord_ptsz, cuEventRecord, 7000, PTSZ, (CUevent hEvent, CUstream hStream), (hEvent, hStream)) \
    X(cuEventRecordWithFlags, cuEventRecordWithFlags, 11010, LEGACY, \
      (CUevent hEvent, CUstream hStream, unsigned int flags), (hEvent, hStream, flags)) \
    X(cuEventRecordWithFlags_ptsz, cuEventRecordWithFlags, 11010, PTSZ, \
      (CUevent hEvent, CUstream hStream, unsigned int flags), (hEvent, hStream, flags)) \
    X(cuEventSynchronize, cuEventSynchronize, 2000, LEGACY, (CUevent hEvent), (hEvent)) \
    X(cuEventQuery, cuEventQuery, 2000, LEGACY, (CUevent hEvent), (hEvent)) \
    X(cuEventElapsedTime, cuEventElapsedTime, 2000, LEGACY, (float *pMilliseconds, CUevent hStart, CUevent hEnd), \
      (pMilliseconds, hStart, hEnd)) \
    X(cuEventElapsedTime_v2, cuEventElapsedTime, 12080, LEGACY, \
      (float *pMilliseconds, CUevent hStart, CUevent hEnd), (pMilliseconds, hStart, hEnd)) \
    X(cuEventDestroy_v2, cuEventDestroy, 4000, LEGACY, (CUevent hEvent), (hEvent)) \
    X(cuLaunchKernel, cuLaunchKernel, 4000, LEGACY, \
      (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
       unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, \
       void **kernelParams, void **extra), \
      (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra)) \
    X(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, PTSZ, \
      (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
       unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, \
       void **kernelParams, void **extra), \
      (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra)) \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, LEGACY, \
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra), (config, f, kernelParams, extra)) \
    X(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, PTSZ, \
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra), (config, f, kernelParams, extra)) \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, LEGACY, \
      (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
       unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, \
       void **kernelParams), \
      (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams)) \
    X(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, 9000, PTSZ, \
      (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
       unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, \
       void **kernelParams), \
      (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams)) \
    X(cuLaunchCooperativeKernelMultiDevice, cuLaunchCooperativeKernelMultiDevice, 9000, LEGACY, \
      (CUDA_LAUNCH_PARAMS *launchParamsList, unsigned int numDevices, unsigned int flags), \
      (launchParamsList, numDevices, flags)) \
    X(cuFuncSetBlockShape, cuFuncSetBlockShape, 2000, LEGACY, (CUfunction hfunc, int x, int y, int z), (hfunc, x, y, z)) \
    X(cuParamSetSize, cuParamSetSize, 2000, LEGACY, (CUfunction hfunc, unsigned int numbytes), (hfunc, numbytes)) \
    X(cuParamSetv, cuParamSetv, 2000, LEGACY, (CUfunction hfunc, int offset, void *ptr, unsigned int numbytes), \
      (hfunc, offset, ptr, numbytes)) \
    X(cuLaunch, cuLaunch, 2000, LEGACY, (CUfunction f), (f)) \
    X(cuLaunchGrid, cuLaunchGrid, 2000, LEGACY, (CUfunction f, int grid_width, int grid_height), (f, grid_width, grid_height)) \
    X(cuLaunchGridAsync, cuLaunchGridAsync, 2000, LEGACY, \
      (CUfunction f, int grid_width, int grid_height, CUstream hStream), (f, grid_width, grid_height, hStream)) \
    X(cuStreamBeginCapture, cuStreamBeginCapture, 10000, LEGACY, (CUstream hStream), (hStream)) \
    X(cuStreamBeginCapture_ptsz, cuStreamBeginCapture, 10000, PTSZ, (CUstream hStream), (hStream)) \
    X(cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, LEGACY, (CUstream hStream, CUstreamCaptureMode mode), \
      (hStream, mode)) \
    X(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, 10010, PTSZ, (CUstream hStream, CUstreamCaptureMode mode), \
      (hStream, mode)) \
    X(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph, 12030, LEGACY, \
      (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData, \
       size_t numDependencies, CUstreamCaptureMode mode), \
      (hStream, hGraph, dependencies, dependencyData, numDependencies, mode)) \
    X(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph, 12030, PTSZ, \
      (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData, \
       size_t numDependencies, CUstreamCaptureMode mode), \
      (hStream, hGraph, dependencies, dependencyData, numDependencies, mode)) \
    X(cuStreamEndCapture, cuStreamEndCapture, 10000, LEGACY, (CUstream hStream, CUgraph *phGraph), (hStream, phGraph)) \
    X(cuStreamEndCapture_ptsz, cuStreamEndCapture, 10000, PTSZ, (CUstream hStream, CUgraph *phGraph), \
      (hStream, phGraph)) \
    X(cuStreamIsCapturing, cuStreamIsCapturing, 10000, LEGACY, \
      (CUstream hStream, CUstreamCaptureStatus *captureStatus), (hStream, captureStatus)) \
    X(cuStreamIsCapturing_ptsz, cuStreamIsCapturing, 10000, PTSZ, \
      (CUstream hStream, CUstreamCaptureStatus *captureStatus), (hStream, captureStatus)) \
    X(cuGraphCreate, cuGraphCreate, 10000, LEGACY, (CUgraph *phGraph, unsigned int flags), (phGraph, flags)) \
    X(cuGraphDestroy, cuGraphDestroy, 10000, LEGACY, (CUgraph hGraph), (hGraph)) \
    X(cuGraphAddKernelNode, cuGraphAddKernelNode, 10000, LEGACY, \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, \
       const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams), \
      (phGraphNode, hGraph, dependencies, numDependencies, nodeParams)) \
    X(cuGraphAddKernelNode_v2, cuGraphAddKernelNode, 12000, LEGACY, \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, \
       const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams), \
      (phGraphNode, hGraph, dependencies, numDependencies, nodeParams)) \
    X(cuGraphKernelNodeGetParams_v2, cuGraphKernelNodeGetParams, 12000, LEGACY, \
      (CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams), (hNode, nodeParams)) \
    X(cuGraphInstantiate, cuGraphInstantiate, 10000, LEGACY, \
      (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize), \
      (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize)) \
    X(cuGraphInstantiate_v2, cuGraphInstantiate, 11000, LEGACY, \
      (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize), \
      (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize)) \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiate, 11040, LEGACY, \
      (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags), (phGraphExec, hGraph, flags)) \
    X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, LEGACY, \
      (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams), \
      (phGraphExec, hGraph, instantiateParams)) \
    X(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, 12000, PTSZ, \
      (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams), \
      (phGraphExec, hGraph, instantiateParams)) \
    X(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, LEGACY, \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, \
       CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams), \
      (phGraphNode, hGraph, dependencies, numDependencies, nodeParams)) \
    X(cuGraphAddMemFreeNode, cuGraphAddMemFreeNode, 11040, LEGACY, \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, \
       CUdeviceptr dptr), \
      (phGraphNode, hGraph, dependencies, numDependencies, dptr)) \
    X(cuGraphMemAllocNodeGetParams, cuGraphMemAllocNodeGetParams, 11040, LEGACY, \
      (CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out), (hNode, params_out)) \
    X(cuGraphGetNodes, cuGraphGetNodes, 10000, LEGACY, (CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes), \
      (hGraph, nodes, numNodes)) \
    X(cuGraphNodeGetType, cuGraphNodeGetType, 10000, LEGACY, (CUgraphNode hNode, CUgraphNodeType *type), \
      (hNode, type)) \
    X(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, 11040, LEGACY, (CUdevice device), (device)) \
    X(cuDeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute, 11040, LEGACY, \
      (CUdevice device, CUgraphMem_attribute attr, void *value), (device, attr, value)) \
    X(cuGraphLaunch, cuGraphLaunch, 10000, LEGACY, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream)) \
    X(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, PTSZ, (CUgraphExec hGraphExec, CUstream hStream), \
      (hGraphExec, hStream)) \
    X(cuGraphExecDestroy, cuGraphExecDestroy, 10000, LEGACY, (CUgraphExec hGraphExec), (hGraphExec))

/* A library that defines these (the simulated driver, or the limiter's wrappers) is built with
 * VGPU_API_VISIBILITY=VGPU_EXPORT to export them. */
#include "vgpu_export.h"
#ifndef VGPU_API_VISIBILITY
#define VGPU_API_VISIBILITY
#endif
#define VGPU_CUDA_DECLARE(symbol, base, version, stream, params, args) \
    VGPU_API_VISIBILITY CUresult symbol params;
VGPU_CUDA_API(VGPU_CUDA_DECLARE)
#undef VGPU_CUDA_DECLARE

#endif
