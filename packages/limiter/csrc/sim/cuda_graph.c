/* Simulated driver: graphs built node by node or captured from a stream, and their launch.
 * A graph is its kernels in order; the device runs them back to back. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "cuda_sim.h"

CUresult sim_graph_append(struct CUgraph_st *graph, uint64_t duration_ns, CUgraphNode *node) {
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
    added->magic = SIM_GRAPH_NODE;
    added->duration_ns = duration_ns;
    graph->nodes[graph->count++] = added;
    if (node != NULL) {
        *node = added;
    }
    return CUDA_SUCCESS;
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

static CUresult add_kernel_node(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUfunction func, void **kernelParams) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (phGraphNode == NULL || !sim_valid(hGraph, SIM_GRAPH) ||
        (numDependencies > 0 && dependencies == NULL) || !sim_valid(func, SIM_FUNCTION)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < numDependencies; i++) {
        if (!sim_valid(dependencies[i], SIM_GRAPH_NODE)) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_lock(&sim_driver_lock);
    result = sim_graph_append(hGraph, sim_kernel_duration(kernelParams), phGraphNode);
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
        exec->total_ns += hGraph->nodes[i]->duration_ns;
    }
    exec->kernels = hGraph->count;
    pthread_mutex_unlock(&sim_driver_lock);
    *phGraphExec = exec;
    return CUDA_SUCCESS;
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
    if (hGraphExec->kernels == 0) {
        return CUDA_SUCCESS;
    }
    return sim_stream_launch(stream, hGraphExec->total_ns);
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

/* --- capture ----------------------------------------------------------------------------- */

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    struct CUstream_st *stream;
    CUresult result = sim_stream_resolve(hStream, &stream);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (mode > CU_STREAM_CAPTURE_MODE_RELAXED) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (stream == stream->context->default_stream) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    }
    struct CUgraph_st *graph = graph_new();
    if (graph == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&sim_driver_lock);
    if (stream->capture != NULL) {
        result = CUDA_ERROR_ILLEGAL_STATE;
        graph->magic = 0;
    } else {
        stream->capture = graph;
    }
    pthread_mutex_unlock(&sim_driver_lock);
    return result;
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
    return cuStreamBeginCapture_v2(hStream, mode);
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
