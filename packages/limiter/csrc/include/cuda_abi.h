/* The subset of the CUDA driver ABI that vgpu uses, declared here so that building needs no
 * CUDA toolkit. Names, values and layouts follow the driver's cuda.h (CUDA 13); structs that
 * only the caller allocates may be declared as a prefix of the real one (marked "prefix"). */
#ifndef VGPU_CUDA_ABI_H
#define VGPU_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1; /* the 32-bit pointer of the legacy (pre-3.2) entry points */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
/* The type of a graph's dependency edge (cuStreamBeginCaptureToGraph); only pointed to. */
typedef struct CUgraphEdgeData_st CUgraphEdgeData;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgreenCtx_st *CUgreenCtx;
typedef struct CUdevResourceDesc_st *CUdevResourceDesc;
typedef unsigned long long CUmemGenericAllocationHandle;

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/* Every CUresult with its value; the enum and the sim's error names derive from it. */
#define VGPU_CU_RESULTS(X) \
    X(CUDA_SUCCESS, 0) \
    X(CUDA_ERROR_INVALID_VALUE, 1) \
    X(CUDA_ERROR_OUT_OF_MEMORY, 2) \
    X(CUDA_ERROR_NOT_INITIALIZED, 3) \
    X(CUDA_ERROR_DEINITIALIZED, 4) \
    X(CUDA_ERROR_PROFILER_DISABLED, 5) \
    X(CUDA_ERROR_PROFILER_NOT_INITIALIZED, 6) \
    X(CUDA_ERROR_PROFILER_ALREADY_STARTED, 7) \
    X(CUDA_ERROR_PROFILER_ALREADY_STOPPED, 8) \
    X(CUDA_ERROR_STUB_LIBRARY, 34) \
    X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, 36) \
    X(CUDA_ERROR_DEVICE_UNAVAILABLE, 46) \
    X(CUDA_ERROR_MULTICAST_RESOURCE_FULL, 47) \
    X(CUDA_ERROR_NO_DEVICE, 100) \
    X(CUDA_ERROR_INVALID_DEVICE, 101) \
    X(CUDA_ERROR_DEVICE_NOT_LICENSED, 102) \
    X(CUDA_ERROR_INVALID_IMAGE, 200) \
    X(CUDA_ERROR_INVALID_CONTEXT, 201) \
    X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, 202) \
    X(CUDA_ERROR_MAP_FAILED, 205) \
    X(CUDA_ERROR_UNMAP_FAILED, 206) \
    X(CUDA_ERROR_ARRAY_IS_MAPPED, 207) \
    X(CUDA_ERROR_ALREADY_MAPPED, 208) \
    X(CUDA_ERROR_NO_BINARY_FOR_GPU, 209) \
    X(CUDA_ERROR_ALREADY_ACQUIRED, 210) \
    X(CUDA_ERROR_NOT_MAPPED, 211) \
    X(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, 212) \
    X(CUDA_ERROR_NOT_MAPPED_AS_POINTER, 213) \
    X(CUDA_ERROR_ECC_UNCORRECTABLE, 214) \
    X(CUDA_ERROR_UNSUPPORTED_LIMIT, 215) \
    X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, 216) \
    X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, 217) \
    X(CUDA_ERROR_INVALID_PTX, 218) \
    X(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, 219) \
    X(CUDA_ERROR_NVLINK_UNCORRECTABLE, 220) \
    X(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, 221) \
    X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222) \
    X(CUDA_ERROR_JIT_COMPILATION_DISABLED, 223) \
    X(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, 224) \
    X(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, 225) \
    X(CUDA_ERROR_CONTAINED, 226) \
    X(CUDA_ERROR_INSUFFICIENT_LOADER_VERSION, 227) \
    X(CUDA_ERROR_INVALID_SOURCE, 300) \
    X(CUDA_ERROR_FILE_NOT_FOUND, 301) \
    X(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, 302) \
    X(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, 303) \
    X(CUDA_ERROR_OPERATING_SYSTEM, 304) \
    X(CUDA_ERROR_INVALID_HANDLE, 400) \
    X(CUDA_ERROR_ILLEGAL_STATE, 401) \
    X(CUDA_ERROR_LOSSY_QUERY, 402) \
    X(CUDA_ERROR_NOT_FOUND, 500) \
    X(CUDA_ERROR_NOT_READY, 600) \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, 700) \
    X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, 701) \
    X(CUDA_ERROR_LAUNCH_TIMEOUT, 702) \
    X(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, 703) \
    X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, 704) \
    X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, 705) \
    X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, 708) \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, 709) \
    X(CUDA_ERROR_ASSERT, 710) \
    X(CUDA_ERROR_TOO_MANY_PEERS, 711) \
    X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, 712) \
    X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, 713) \
    X(CUDA_ERROR_HARDWARE_STACK_ERROR, 714) \
    X(CUDA_ERROR_ILLEGAL_INSTRUCTION, 715) \
    X(CUDA_ERROR_MISALIGNED_ADDRESS, 716) \
    X(CUDA_ERROR_INVALID_ADDRESS_SPACE, 717) \
    X(CUDA_ERROR_INVALID_PC, 718) \
    X(CUDA_ERROR_LAUNCH_FAILED, 719) \
    X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, 720) \
    X(CUDA_ERROR_TENSOR_MEMORY_LEAK, 721) \
    X(CUDA_ERROR_NOT_PERMITTED, 800) \
    X(CUDA_ERROR_NOT_SUPPORTED, 801) \
    X(CUDA_ERROR_SYSTEM_NOT_READY, 802) \
    X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, 803) \
    X(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, 804) \
    X(CUDA_ERROR_MPS_CONNECTION_FAILED, 805) \
    X(CUDA_ERROR_MPS_RPC_FAILURE, 806) \
    X(CUDA_ERROR_MPS_SERVER_NOT_READY, 807) \
    X(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, 808) \
    X(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, 809) \
    X(CUDA_ERROR_MPS_CLIENT_TERMINATED, 810) \
    X(CUDA_ERROR_CDP_NOT_SUPPORTED, 811) \
    X(CUDA_ERROR_CDP_VERSION_MISMATCH, 812) \
    X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900) \
    X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901) \
    X(CUDA_ERROR_STREAM_CAPTURE_MERGE, 902) \
    X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, 903) \
    X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, 904) \
    X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, 905) \
    X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 906) \
    X(CUDA_ERROR_CAPTURED_EVENT, 907) \
    X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, 908) \
    X(CUDA_ERROR_TIMEOUT, 909) \
    X(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, 910) \
    X(CUDA_ERROR_EXTERNAL_DEVICE, 911) \
    X(CUDA_ERROR_INVALID_CLUSTER_SIZE, 912) \
    X(CUDA_ERROR_FUNCTION_NOT_LOADED, 913) \
    X(CUDA_ERROR_INVALID_RESOURCE_TYPE, 914) \
    X(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, 915) \
    X(CUDA_ERROR_KEY_ROTATION, 916) \
    X(CUDA_ERROR_STREAM_DETACHED, 917) \
    X(CUDA_ERROR_GRAPH_RECAPTURE_FAILURE, 918) \
    X(CUDA_ERROR_FABRIC_NOT_READY, 919) \
    X(CUDA_ERROR_UNKNOWN, 999) \

typedef enum cudaError_enum {
#define VGPU_CU_RESULT_ENUM(name, value) name = value,
    VGPU_CU_RESULTS(VGPU_CU_RESULT_ENUM)
#undef VGPU_CU_RESULT_ENUM
} CUresult;

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY = 9,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS = 31,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
} CUdevice_attribute;

/* cuGetProcAddress */
typedef enum CUdriverProcAddress_flags_enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
} CUdriverProcAddress_flags;

typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/* Contexts */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCigParam_st CUctxCigParam;
typedef struct CUctxCreateParams_st {
    CUexecAffinityParam *execAffinityParams;
    int numExecAffinityParams;
    CUctxCigParam *cigParams;
} CUctxCreateParams;

typedef enum CUlimit_enum {
    CU_LIMIT_STACK_SIZE = 0x00,
    CU_LIMIT_PRINTF_FIFO_SIZE = 0x01,
    CU_LIMIT_MALLOC_HEAP_SIZE = 0x02,
    CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH = 0x03,
    CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT = 0x04,
} CUlimit;

/* Launches */
typedef struct CUlaunchAttribute_st {
    int id;
    char pad[4];
    union {
        char pad[64];
    } value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* One device's launch of cuLaunchCooperativeKernelMultiDevice. */
typedef struct CUDA_LAUNCH_PARAMS_st {
    CUfunction function;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;

typedef enum CUgreenCtxCreate_flags {
    CU_GREEN_CTX_DEFAULT_STREAM = 0x1,
} CUgreenCtxCreate_flags;

/* Graphs */
typedef struct CUDA_KERNEL_NODE_PARAMS_st {
    CUfunction func;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS_v1;

typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
    CUfunction func;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    CUkernel kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;

typedef enum CUstreamCaptureStatus_enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
} CUstreamCaptureStatus;

typedef enum CUstreamCaptureMode_enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2,
} CUstreamCaptureMode;

/* Virtual memory management */
typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1,
} CUmemAllocationType;

typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_HOST = 2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
} CUmemLocationType;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

/* Managed memory */
typedef enum CUmemAttach_flags_enum {
    CU_MEM_ATTACH_GLOBAL = 0x1,
    CU_MEM_ATTACH_HOST = 0x2,
    CU_MEM_ATTACH_SINGLE = 0x4,
} CUmemAttach_flags;

typedef enum CUmem_advise_enum {
    CU_MEM_ADVISE_SET_READ_MOSTLY = 1,
    CU_MEM_ADVISE_UNSET_READ_MOSTLY = 2,
    CU_MEM_ADVISE_SET_PREFERRED_LOCATION = 3,
    CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION = 4,
    CU_MEM_ADVISE_SET_ACCESSED_BY = 5,
    CU_MEM_ADVISE_UNSET_ACCESSED_BY = 6,
} CUmem_advise;

#define CU_DEVICE_CPU ((CUdevice)-1) /* the host, where the legacy cuMemAdvise takes a device */

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
} CUmemAllocationGranularity_flags;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    int flags;
} CUmemAccessDesc;

/* Stream-ordered allocation pools */
typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char gpuDirectRDMACapable;
    unsigned char reserved[53];
} CUmemPoolProps;

/* Graph memory nodes: allocations a graph makes when launched, from the device's graph pool. */
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v1_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

typedef enum CUgraphNodeType_enum {
    CU_GRAPH_NODE_TYPE_KERNEL = 0,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
    CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
} CUgraphNodeType;

typedef enum CUgraphMem_attribute_enum {
    CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
    CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3,
} CUgraphMem_attribute;

typedef enum CUgraphInstantiateResult_enum {
    CUDA_GRAPH_INSTANTIATE_SUCCESS = 0,
    CUDA_GRAPH_INSTANTIATE_ERROR = 1,
} CUgraphInstantiateResult;

typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

typedef enum CUmemPool_attribute_enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
} CUmemPool_attribute;

/* Arrays */
typedef enum CUarray_format_enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20,
    /* CUDA 11 and later: packed, block-compressed (4x4 texel blocks) and video (YUV) formats. */
    CU_AD_FORMAT_UNORM_INT_101010_2 = 0x50,
    CU_AD_FORMAT_UINT8_PACKED_422 = 0x51,
    CU_AD_FORMAT_UINT8_PACKED_444 = 0x52,
    CU_AD_FORMAT_UINT8_SEMIPLANAR_420 = 0x53,
    CU_AD_FORMAT_UINT16_SEMIPLANAR_420 = 0x54,
    CU_AD_FORMAT_UINT8_SEMIPLANAR_422 = 0x55,
    CU_AD_FORMAT_UINT16_SEMIPLANAR_422 = 0x56,
    CU_AD_FORMAT_UINT8_SEMIPLANAR_444 = 0x57,
    CU_AD_FORMAT_UINT16_SEMIPLANAR_444 = 0x58,
    CU_AD_FORMAT_UINT8_PLANAR_420 = 0x59,
    CU_AD_FORMAT_UINT16_PLANAR_420 = 0x5a,
    CU_AD_FORMAT_UINT8_PLANAR_422 = 0x5b,
    CU_AD_FORMAT_UINT16_PLANAR_422 = 0x5c,
    CU_AD_FORMAT_UINT8_PLANAR_444 = 0x5d,
    CU_AD_FORMAT_UINT16_PLANAR_444 = 0x5e,
    CU_AD_FORMAT_BC1_UNORM = 0x91,
    CU_AD_FORMAT_BC1_UNORM_SRGB = 0x92,
    CU_AD_FORMAT_BC2_UNORM = 0x93,
    CU_AD_FORMAT_BC2_UNORM_SRGB = 0x94,
    CU_AD_FORMAT_BC3_UNORM = 0x95,
    CU_AD_FORMAT_BC3_UNORM_SRGB = 0x96,
    CU_AD_FORMAT_BC4_UNORM = 0x97,
    CU_AD_FORMAT_BC4_SNORM = 0x98,
    CU_AD_FORMAT_BC5_UNORM = 0x99,
    CU_AD_FORMAT_BC5_SNORM = 0x9a,
    CU_AD_FORMAT_BC6H_UF16 = 0x9b,
    CU_AD_FORMAT_BC6H_SF16 = 0x9c,
    CU_AD_FORMAT_BC7_UNORM = 0x9d,
    CU_AD_FORMAT_BC7_UNORM_SRGB = 0x9e,
    CU_AD_FORMAT_P010 = 0x9f,
    CU_AD_FORMAT_P016 = 0xa1,
    CU_AD_FORMAT_NV16 = 0xa2,
    CU_AD_FORMAT_P210 = 0xa3,
    CU_AD_FORMAT_P216 = 0xa4,
    CU_AD_FORMAT_YUY2 = 0xa5,
    CU_AD_FORMAT_Y210 = 0xa6,
    CU_AD_FORMAT_Y216 = 0xa7,
    CU_AD_FORMAT_AYUV = 0xa8,
    CU_AD_FORMAT_Y410 = 0xa9,
    CU_AD_FORMAT_NV12 = 0xb0,
    CU_AD_FORMAT_Y416 = 0xb1,
    CU_AD_FORMAT_Y444_PLANAR8 = 0xb2,
    CU_AD_FORMAT_Y444_PLANAR10 = 0xb3,
    CU_AD_FORMAT_YUV444_8bit_SemiPlanar = 0xb4,
    CU_AD_FORMAT_YUV444_16bit_SemiPlanar = 0xb5,
    CU_AD_FORMAT_UNORM_INT8X1 = 0xc0,
    CU_AD_FORMAT_UNORM_INT8X2 = 0xc1,
    CU_AD_FORMAT_UNORM_INT8X4 = 0xc2,
    CU_AD_FORMAT_UNORM_INT16X1 = 0xc3,
    CU_AD_FORMAT_UNORM_INT16X2 = 0xc4,
    CU_AD_FORMAT_UNORM_INT16X4 = 0xc5,
    CU_AD_FORMAT_SNORM_INT8X1 = 0xc6,
    CU_AD_FORMAT_SNORM_INT8X2 = 0xc7,
    CU_AD_FORMAT_SNORM_INT8X4 = 0xc8,
    CU_AD_FORMAT_SNORM_INT16X1 = 0xc9,
    CU_AD_FORMAT_SNORM_INT16X2 = 0xca,
    CU_AD_FORMAT_SNORM_INT16X4 = 0xcb,
    CU_AD_FORMAT_MAX = 0x7fffffff,
} CUarray_format;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* The descriptors of the legacy cuArrayCreate and cuArray3DCreate. */
typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_v1_st {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

/* Event and stream flags */
#define CU_EVENT_DEFAULT 0x0
#define CU_EVENT_BLOCKING_SYNC 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_STREAM_DEFAULT 0x0
#define CU_STREAM_NON_BLOCKING 0x1

#endif
