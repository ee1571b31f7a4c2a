/* Internals of the simulated CUDA driver: per-process objects (contexts, streams, events,
 * modules, graphs, pools, allocations) on top of the node-wide state in sim_state.h. */
#ifndef VGPU_CUDA_SIM_H
#define VGPU_CUDA_SIM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cuda_api.h"
#include "sim_state.h"

#include "vgpu_cuda_sizes.h"

/* Device allocations are rounded to this page size, as the real driver does. */
#define SIM_PAGE_SIZE VGPU_PAGE_SIZE
/* Resident threads per multiprocessor: each may use the per-thread stack (CU_LIMIT_STACK_SIZE). */
#define SIM_THREADS_PER_SM 2048
/* The cuCtxSetLimit limits simulated: CU_LIMIT_STACK_SIZE to
 * CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT. */
#define SIM_LIMITS 5
/* Launches a stream may have outstanding before the next one blocks (the real queue depth). */
#define SIM_QUEUE_DEPTH 1024

enum sim_magic {
    SIM_CONTEXT = 0x43545831,
    SIM_STREAM = 0x53545231,
    SIM_EVENT = 0x45564e31,
    SIM_MODULE = 0x4d4f4431,
    SIM_FUNCTION = 0x46554e31,
    SIM_GRAPH = 0x47525031,
    SIM_GRAPH_NODE = 0x4e4f4431,
    SIM_GRAPH_EXEC = 0x45584531,
    SIM_POOL = 0x504f4f31,
    SIM_ARRAY = 0x41525231,
    SIM_VMM_HANDLE = 0x564d4d31,
    SIM_GREEN_CONTEXT = 0x47524e31,
};

struct CUctx_st {
    uint32_t magic;
    int device;  /* physical index in the node state */
    bool primary;
    unsigned flags;
    uint64_t last_end_ns; /* completion of the latest work queued in this context */
    struct CUstream_st *default_stream;
    size_t limits[SIM_LIMITS]; /* cuCtxSetLimit's values, by CUlimit */
};

struct CUstream_st {
    uint32_t magic;
    struct CUctx_st *context;
    unsigned flags;
    uint64_t tail_ns; /* completion of the latest work queued on this stream */
    uint64_t pending[SIM_QUEUE_DEPTH]; /* completion times of queued kernels, a ring */
    unsigned pending_next;
    struct CUgraph_st *capture; /* non-NULL while capturing */
};

struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    bool recorded;
    uint64_t time_ns;
};

struct CUmod_st {
    uint32_t magic;
};

/* The bytes a function's legacy parameter block (cuParamSetv) holds. */
#define SIM_PARAM_BYTES 256

struct CUfunc_st {
    uint32_t magic;
    struct CUmod_st *module;
    char name[128];                 /* as cuModuleGetFunction was asked, cut to fit */
    int block[3];                   /* cuFuncSetBlockShape, for the legacy launches */
    unsigned param_size;            /* cuParamSetSize */
    unsigned char params[SIM_PARAM_BYTES];
};

struct CUgreenCtx_st {
    uint32_t magic;
    struct CUctx_st *context; /* the context cuCtxFromGreenCtx gives */
};

struct CUgraphNode_st {
    uint32_t magic;
    CUgraphNodeType type;
    uint64_t duration_ns; /* KERNEL */
    CUfunction function;  /* KERNEL: NULL for a graph launched into a captured stream */
    int device;           /* MEM_ALLOC: physical device */
    uint64_t bytes;       /* MEM_ALLOC: page-rounded size */
    CUdeviceptr dptr;     /* MEM_ALLOC, MEM_FREE */
};

struct CUgraph_st {
    uint32_t magic;
    struct CUgraphNode_st **nodes;
    size_t count;
    size_t capacity;
};

struct CUgraphExec_st {
    uint32_t magic;
    uint64_t total_ns;
    size_t kernels;
    uint64_t graph_bytes[SIM_MAX_DEVICES]; /* what its allocation nodes take from each pool */
};

struct CUmemPoolHandle_st {
    uint32_t magic;
    int device;
    bool is_default;
    bool destroyed;
    uint64_t reserved;  /* device memory the pool holds */
    uint64_t used;      /* of which handed out */
    uint64_t reserved_high;
    uint64_t used_high;
    uint64_t release_threshold;
};

/* Every live device-memory object of the process, by address or handle. */
enum sim_allocation_kind {
    SIM_ALLOC_DEVICE,  /* cuMemAlloc, cuMemAllocPitch */
    SIM_ALLOC_MANAGED, /* cuMemAllocManaged: host-backed, charged to the device unless advised
                        * to prefer the host (on_host) */
    SIM_ALLOC_HOST,    /* cuMemAllocHost, cuMemHostAlloc: not charged to a device */
    SIM_ALLOC_POOL,    /* cuMemAllocAsync, cuMemAllocFromPoolAsync */
    SIM_ALLOC_ARRAY,   /* arrays and mipmapped arrays */
    SIM_ALLOC_VMM,     /* cuMemCreate physical memory */
    SIM_ALLOC_RESERVED_RANGE, /* cuMemAddressReserve: address space only */
    SIM_ALLOC_MAPPING,        /* cuMemMap of a VMM handle into a reserved range */
};

struct sim_allocation {
    uint64_t key; /* address, or handle pointer for arrays and VMM */
    uint64_t size; /* bytes charged to the device (page-rounded) */
    uint64_t requested;
    enum sim_allocation_kind kind;
    int device;
    struct CUctx_st *context;
    struct CUmemPoolHandle_st *pool;
    uint32_t vmm_mappings; /* SIM_ALLOC_VMM: live cuMemMap ranges */
    bool vmm_released;     /* SIM_ALLOC_VMM: cuMemRelease called */
    uint64_t mapped_handle; /* SIM_ALLOC_MAPPING: the VMM handle mapped here */
    bool on_host;           /* SIM_ALLOC_MANAGED: resident in host memory, not charged */
};

/* One lock for the process's driver objects; taken before the node-wide lock, never after. */
extern pthread_mutex_t sim_driver_lock;

/* CUDA_SUCCESS once cuInit succeeded, else CUDA_ERROR_NOT_INITIALIZED. */
CUresult sim_initialized(void);
/* The node state after cuInit (never NULL then). */
struct sim_state *sim_driver_state(void);
/* Physical device index of a CUDA ordinal (after CUDA_VISIBLE_DEVICES), or -1. */
int sim_physical_device(CUdevice ordinal);
int sim_visible_count(void);
/* The common start of a call taking a device: CUDA_SUCCESS with its physical index, else the
 * error to return (not initialized, or an invalid ordinal). */
CUresult sim_device_argument(CUdevice ordinal, int *physical);

/* cuda_core.c: handle checks and the calling thread's stack of current contexts. */
bool sim_valid(const void *object, uint32_t magic);
/* The current context of the calling thread, or CUDA_ERROR_INVALID_CONTEXT. */
CUresult sim_current_context(struct CUctx_st **context);
/* The current context's physical device, after the init and context checks. */
CUresult sim_current_device(int *device, struct CUctx_st **context);
/* The top of the stack as it is (NULL when empty; possibly a destroyed context). */
struct CUctx_st *sim_context_top(void);
/* Push (false when the stack is full), pop (NULL when empty), replace the top (NULL pops). */
bool sim_context_push(struct CUctx_st *context);
struct CUctx_st *sim_context_pop(void);
void sim_context_replace_top(struct CUctx_st *context);
/* Drop a destroyed context from the calling thread's stack. */
void sim_context_forget(struct CUctx_st *context);

/* Context objects: create (charging the overhead) and destroy (freeing what it owns). */
CUresult sim_context_new(int device, bool primary, unsigned flags, struct CUctx_st **out);
void sim_context_free(struct CUctx_st *context);
/* Sleep until everything queued in the context is done. */
void sim_context_wait(struct CUctx_st *context);

/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD mean the current context's default stream. */
CUresult sim_stream_resolve(CUstream handle, struct CUstream_st **stream);
struct CUstream_st *sim_stream_new(struct CUctx_st *context, unsigned flags);
void sim_stream_free(struct CUstream_st *stream);
/* Queue a kernel (or a graph's kernels) of duration_ns; under capture, record it instead. */
CUresult sim_stream_launch(struct CUstream_st *stream, CUfunction function, uint64_t duration_ns);
/* Append a kernel node to a graph (graph capture and cuGraphAddKernelNode). */
CUresult sim_graph_append(struct CUgraph_st *graph, CUfunction function, uint64_t duration_ns,
                          CUgraphNode *node);
void sim_graph_free(struct CUgraph_st *graph);

/* The allocation table. Insert copies the record; find returns a pointer valid under the lock. */
bool sim_allocation_insert(const struct sim_allocation *record);
struct sim_allocation *sim_allocation_find(uint64_t key);
void sim_allocation_remove(uint64_t key);
/* Give back everything a context owns (when it is destroyed). Under the driver lock. */
void sim_allocations_free_context(struct CUctx_st *context);
/* Give back the device memory of one record and drop it from the table. Under the lock. */
void sim_allocation_free(struct sim_allocation *record);
/* Calls visit(record, data) for every record; visit may free the record it is given. */
void sim_allocations_each(void (*visit)(struct sim_allocation *record, void *data), void *data);
/* Fresh device addresses (never host-mapped), aligned to `alignment`. */
uint64_t sim_address_space(uint64_t size, uint64_t alignment);
/* The same below 4 GiB (page-aligned) for the legacy 32-bit entry points; 0 when used up. */
uint64_t sim_legacy_address_space(uint64_t size);
/* Return unused pool memory above each pool's release threshold, as a synchronize does. */
void sim_pools_release_unused(void);
/* A pool allocation was freed (by cuMemFreeAsync, cuMemFree or context teardown). Under lock. */
void sim_pool_returned(struct CUmemPoolHandle_st *pool, uint64_t bytes);
/* The kernel duration of a launch: nanoseconds in the uint64_t that kernelParams[0] points to. */
uint64_t sim_kernel_duration(void **kernel_params);
/* Launch a kernel of the given shape on a stream (0: the current context's), running for the
 * nanoseconds its parameters give. */
CUresult sim_launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                    unsigned int bx, unsigned int by, unsigned int bz, CUstream hStream,
                    void **kernelParams);

static inline uint64_t sim_round_up(uint64_t value, uint64_t unit) {
    return vgpu_round_up(value, unit);
}

#endif
