/* Simulated driver: graphs built node by node or captured from a stream, and their launch.
 * A graph is its nodes in order; the device runs its kernels back to back. Its memory nodes
 * allocate from the device's graph pool when it is launched; the simulator frees every graph
 * allocation by the graph's end, and the pool keeps the memory until cuDeviceGraphMemTrim. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "cuda_sim.h"

/* This process's graph pool on each device: what it holds on the device, its high mark. */
static uint64_t graph_reserved[SIM_MAX_DEVICES];
static uint64_t graph_reserved_high[SIM_MAX_DEVICES];

static CUresult append(struct CUgraph_st *graph, const struct CUgraphNode_st *contents,
                       CUgraphNode *node) {
    if (graph->count == graph->capacity) {
        size_t capacity = graph->capacity == 0 ? 16 : graph->capacity * 2;
        struct CUgraphNode_st **nodes = realloc(graph->nodes, capacity * sizeof *nodes);
        if (nodes == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        graph->nodes = nodes;
        graph->capacity = capacity;
    }
    struct CUgraphNode_st *added = calloc(1, sizeof *added);
    if (added == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *added = *contents;
    added->magic = SIM_GRAPH_NODE;
    graph->nodes[graph->count++] = added;
    if (node != NULL) {
        *node = added;
    }
    return CUDA_SUCCESS;
}

CUresult sim_graph_append(struct CUgraph_st *graph, CUfunction function, uint64_t duration_ns,
                          CUgraphNode *node) {
    struct CUgraphNode_st kernel = {
        .type = CU_GRAPH_NODE_TYPE_KERNEL, .duration_ns = duration_ns, .function = function};
    return append(graph, &kernel, node);
}

void sim_graph_free(struct CUgraph_st *graph) {
    for (size_t i = 0; i < graph->count; i++) {
        graph->nodes[i]->magic = 0;
    }
    graph->magic = 0;
}

static struct CUgraph_st *graph_new(void) {
    struct CUgraph_st *graph = calloc(1, sizeof *graph);
    if (graph != NULL) {
        graph->magic = SIM_GRAPH;
    }
    return graph;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (phGraph == NULL || flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUgraph_st *graph = graph_new();
    if (graph == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phGraph = graph;
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hGraph, SIM_GRAPH)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    sim_graph_free(hGraph);
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

static CUresult check_node_arguments(CUgraphNode *phGraphNode, CUgraph hGraph,
                                     const CUgraphNode *dependencies, size_t numDependencies) {
    if (phGraphNode == NULL || !sim_valid(hGraph, SIM_GRAPH) ||
        (numDependencies > 0 && dependencies == NULL)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < numDependencies; i++) {
        if (!sim_valid(dependencies[i], SIM_GRAPH_NODE)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

static CUresult add_kernel_node(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUfunction func, void **kernelParams) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (check_node_arguments(phGraphNode, hGraph, dependencies, numDependencies) !=
            CUDA_SUCCESS ||
        !sim_valid(func, SIM_FUNCTION)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    result = sim_graph_append(hGraph, func, sim_kernel_duration(kernelParams), phGraphNode);
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                              const CUgraphNode *dependencies, size_t numDependencies,
                              const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams) {
    if (nodeParams == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams->func,
                           nodeParams->kernelParams);
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                 const CUgraphNode *dependencies, size_t numDependencies,
                                 const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams) {
    if (nodeParams == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams->func,
                           nodeParams->kernelParams);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    (void)flags;
    if (phGraphExec == NULL || !sim_valid(hGraph, SIM_GRAPH)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUgraphExec_st *exec = calloc(1, sizeof *exec);
    if (exec == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    exec->magic = SIM_GRAPH_EXEC;
    pthread_mutex_lock(&sim_driver_lock);
    for (size_t i = 0; i < hGraph->count; i++) {
        const struct CUgraphNode_st *node = hGraph->nodes[i];
        exec->total_ns += node->duration_ns;
        exec->kernels += node->type == CU_GRAPH_NODE_TYPE_KERNEL;
        if (node->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            exec->graph_bytes[node->device] += node->bytes;
        }
    }
    pthread_mutex_unlock(&sim_driver_lock);
    *phGraphExec = exec;
    return CUDA_SUCCESS;
}

/* The older forms: an error node and log (v1, v2), or parameters in and out. */
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize) {
    CUresult result = cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
    if (phErrorNode != NULL) {
        *phErrorNode = NULL;
    }
    if (logBuffer != NULL && bufferSize > 0) {
        logBuffer[0] = '\0';
    }
    return result;
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize) {
    return cuGraphInstantiate_v2(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    if (instantiateParams == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult result =
        cuGraphInstantiateWithFlags(phGraphExec, hGraph, instantiateParams->flags);
    instantiateParams->hErrNode_out = NULL;
    instantiateParams->result_out = result == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS
                                                           : CUDA_GRAPH_INSTANTIATE_ERROR;
    return result;
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    return cuGraphInstantiateWithParams(phGraphExec, hGraph, instantiateParams);
}

/* Grow each device's graph pool to what the graph's allocations take. */
static CUresult reserve_graph_memory(const struct CUgraphExec_st *exec) {
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&sim_driver_lock);
    for (int device = 0; device < SIM_MAX_DEVICES && result == CUDA_SUCCESS; device++) {
        uint64_t need = exec->graph_bytes[device];
        if (need > graph_reserved[device]) {
            if (sim_memory_reserve(device, need - graph_reserved[device])) {
                graph_reserved[device] = need;
            } else {
                result = CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        if (graph_reserved[device] > graph_reserved_high[device]) {
            graph_reserved_high[device] = graph_reserved[device];
        }
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hGraphExec, SIM_GRAPH_EXEC)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((result = reserve_graph_memory(hGraphExec)) != CUDA_SUCCESS) {
        return result;
    }
    if (hGraphExec->kernels == 0) {
        return CUDA_SUCCESS;
    }
    return sim_stream_launch(stream, NULL, hGraphExec->total_ns);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    return cuGraphLaunch(hGraphExec, hStream);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hGraphExec, SIM_GRAPH_EXEC)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    hGraphExec->magic = 0;
    return CUDA_SUCCESS;
}

/* --- memory nodes and the graph pool ------------------------------------------------------ */

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS ||
        (result = check_node_arguments(phGraphNode, hGraph, dependencies, numDependencies)) !=
            CUDA_SUCCESS) {
        return result;
    }
    int device;
    if (nodeParams == NULL || nodeParams->bytesize == 0 ||
        nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        sim_device_argument(nodeParams->poolProps.location.id, &device) != CUDA_SUCCESS) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t bytes = sim_round_up(nodeParams->bytesize, SIM_PAGE_SIZE);
    if (bytes < nodeParams->bytesize) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&sim_driver_lock);
    /* The address is fixed when the node is made; the memory behind it comes at launch. */
    struct CUgraphNode_st node = {.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC,
                                  .device = device,
                                  .bytes = bytes,
                                  .dptr = sim_address_space(bytes, SIM_PAGE_SIZE)};
    result = append(hGraph, &node, phGraphNode);
    pthread_mutex_unlock(&sim_driver_lock);
    if (result == CUDA_SUCCESS) {
        nodeParams->dptr = node.dptr;
    }
    return result;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUdeviceptr dptr) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS ||
        (result = check_node_arguments(phGraphNode, hGraph, dependencies, numDependencies)) !=
            CUDA_SUCCESS) {
        return result;
    }
    struct CUgraphNode_st node = {.type = CU_GRAPH_NODE_TYPE_MEM_FREE, .dptr = dptr};
    pthread_mutex_lock(&sim_driver_lock);
    result = append(hGraph, &node, phGraphNode);
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hNode, SIM_GRAPH_NODE) || hNode->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
        params_out == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memset(params_out, 0, sizeof *params_out);
    params_out->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    params_out->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    for (int ordinal = 0; ordinal < sim_visible_count(); ordinal++) {
        if (sim_physical_device(ordinal) == hNode->device) {
            params_out->poolProps.location.id = ordinal;
        }
    }
    params_out->bytesize = hNode->bytes;
    params_out->dptr = hNode->dptr;
    return CUDA_SUCCESS;
}

CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hGraph, SIM_GRAPH) || numNodes == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    if (nodes != NULL) {
        for (size_t i = 0; i < *numNodes; i++) {
            nodes[i] = i < hGraph->count ? hGraph->nodes[i] : NULL;
        }
    }
    if (nodes == NULL || *numNodes > hGraph->count) {
        *numNodes = hGraph->count;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hNode, SIM_GRAPH_NODE) || type == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *type = hNode->type;
    return CUDA_SUCCESS;
}

/* A kernel node's function and the duration parameter it was given (the simulator keeps no
 * other launch parameters: grid and block read as 1). */
CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (!sim_valid(hNode, SIM_GRAPH_NODE) || nodeParams == NULL ||
        hNode->type != CU_GRAPH_NODE_TYPE_KERNEL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memset(nodeParams, 0, sizeof *nodeParams);
    nodeParams->func = hNode->function;
    nodeParams->gridDimX = nodeParams->gridDimY = nodeParams->gridDimZ = 1;
    nodeParams->blockDimX = nodeParams->blockDimY = nodeParams->blockDimZ = 1;
    return CUDA_SUCCESS;
}

/* Every graph allocation is freed by its graph's end: the whole pool is unused once trimmed. */
CUresult cuDeviceGraphMemTrim(CUdevice device) {
    int physical;
    CUresult result = sim_device_argument(device, &physical);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&sim_driver_lock);
    sim_memory_release(physical, graph_reserved[physical]);
    graph_reserved[physical] = 0;
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value) {
    int physical;
    CUresult result = sim_device_argument(device, &physical);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (value == NULL || (unsigned)attr > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    /* Nothing stays in use past a graph's end, so "used" is 0 and its high mark the pool's. */
    cuuint64_t answer = attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT ? graph_reserved[physical]
                        : attr == CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT   ? 0
                                                                     : graph_reserved_high[physical];
    pthread_mutex_unlock(&sim_driver_lock);
    memcpy(value, &answer, sizeof answer);
    return CUDA_SUCCESS;
}

/* --- capture ----------------------------------------------------------------------------- */

/* Capture on `hStream` into `into` (a new graph when NULL). */
static CUresult begin_capture(CUstream hStream, CUstreamCaptureMode mode, CUgraph into) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (mode > CU_STREAM_CAPTURE_MODE_RELAXED || (into != NULL && !sim_valid(into, SIM_GRAPH))) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (stream == stream->context->default_stream) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    }
    struct CUgraph_st *graph = into != NULL ? into : graph_new();
    if (graph == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&sim_driver_lock);
    if (stream->capture != NULL) {
        result = CUDA_ERROR_ILLEGAL_STATE;
        graph->magic = into != NULL ? graph->magic : 0;
    } else {
        stream->capture = graph;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuStreamBeginCapture(CUstream hStream) {
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL);
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL);
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, mode, NULL);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
    return begin_capture(hStream, mode, NULL);
}

/* The simulator keeps no dependencies: the captured work joins the graph's nodes. */
CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                     const CUgraphNode *dependencies,
                                     const CUgraphEdgeData *dependencyData,
                                     size_t numDependencies, CUstreamCaptureMode mode) {
    (void)dependencies;
    (void)dependencyData;
    (void)numDependencies;
    return hGraph == NULL ? CUDA_ERROR_INVALID_VALUE : begin_capture(hStream, mode, hGraph);
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                          const CUgraphNode *dependencies,
                                          const CUgraphEdgeData *dependencyData,
                                          size_t numDependencies, CUstreamCaptureMode mode) {
    return cuStreamBeginCaptureToGraph(hStream, hGraph, dependencies, dependencyData,
                                       numDependencies, mode);
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (phGraph == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    struct CUgraph_st *graph = stream->capture;
    stream->capture = NULL;
    pthread_mutex_unlock(&sim_driver_lock);
    if (graph == NULL) {
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    *phGraph = graph;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
    return cuStreamEndCapture(hStream, phGraph);
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (captureStatus == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&sim_driver_lock);
    *captureStatus = stream->capture != NULL ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                             : CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_unlock(&sim_driver_lock);
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
    return cuStreamIsCapturing(hStream, captureStatus);
}
