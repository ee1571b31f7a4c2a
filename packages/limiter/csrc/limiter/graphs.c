/* Hooks of graph memory. A graph's allocation nodes (cuGraphAddMemAllocNode, or cuMemAllocAsync
 * captured from a stream) take memory from the device's graph pool when the graph is launched,
 * and the pool keeps it, for any graph, until cuDeviceGraphMemTrim. So the pod is charged, for
 * each device, the larger of:
 *   - what the live executable graphs may take: the page-rounded sizes of their allocation
 *     nodes, charged when a graph is instantiated (refused there past the limit), and
 *   - what the pool really holds (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), read when an
 *     executable graph is destroyed and after a trim, so cached memory stays charged until the
 *     driver gives it back. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "compute_gang.h"
#include "core.h"
#include "log.h"
#include "vgpu_cuda_sizes.h"

struct graph_exec {
    CUgraphExec exec;
    uint64_t bytes[VGPU_MAX_ORDINALS];
    struct graph_exec *next;
};

static pthread_mutex_t graph_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static struct graph_exec *execs;            /* live executable graphs with allocation nodes */
static uint64_t live[VGPU_MAX_ORDINALS];    /* what they may take from each device's pool */
static uint64_t charged[VGPU_MAX_ORDINALS]; /* what the pod is charged for each pool */

static void lock_before_fork(void) {
    pthread_mutex_lock(&graph_lock);
}

static void unlock_in_parent(void) {
    pthread_mutex_unlock(&graph_lock);
}

/* A forked child has none of its parent's graphs (and its own slot in the region). */
static void forget_in_child(void) {
    execs = NULL;
    memset(live, 0, sizeof live);
    memset(charged, 0, sizeof charged);
    pthread_mutex_init(&graph_lock, NULL);
}

static void watch_forks(void) {
    pthread_atfork(lock_before_fork, unlock_in_parent, forget_in_child);
}

static uint64_t add_saturating(uint64_t a, uint64_t b) {
    return a + b < a ? UINT64_MAX : a + b;
}

/* What the graph's allocation nodes take from each device's pool, page-rounded. */
static CUresult graph_bytes(CUgraph graph, uint64_t bytes[VGPU_MAX_ORDINALS], bool *any) {
    size_t count = 0;
    CUresult result = VGPU_REAL(cuGraphGetNodes, graph, NULL, &count);
    if (result != CUDA_SUCCESS || count == 0) {
        return result;
    }
    CUgraphNode *nodes = calloc(count, sizeof *nodes);
    if (nodes == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result = VGPU_REAL(cuGraphGetNodes, graph, nodes, &count);
    for (size_t i = 0; i < count && result == CUDA_SUCCESS; i++) {
        CUgraphNodeType type;
        CUDA_MEM_ALLOC_NODE_PARAMS params;
        if (nodes[i] == NULL || VGPU_REAL(cuGraphNodeGetType, nodes[i], &type) != CUDA_SUCCESS ||
            type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            continue;
        }
        result = VGPU_REAL(cuGraphMemAllocNodeGetParams, nodes[i], &params);
        int ordinal = params.poolProps.location.id;
        if (result == CUDA_SUCCESS && ordinal >= 0 && ordinal < VGPU_MAX_ORDINALS) {
            uint64_t rounded = vgpu_round_up(params.bytesize, VGPU_PAGE_SIZE);
            bytes[ordinal] = add_saturating(
                bytes[ordinal], rounded < params.bytesize ? UINT64_MAX : rounded);
            *any = true;
        }
    }
    free(nodes);
    return result;
}

/* Under graph_lock: set a device's charge to the larger of its live graphs and its pool. */
static void settle_device(int ordinal) {
    cuuint64_t reserved = 0;
    if (VGPU_REAL(cuDeviceGetGraphMemAttribute, ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
                  &reserved) != CUDA_SUCCESS) {
        return; /* keep what is charged */
    }
    uint64_t target = live[ordinal] > reserved ? live[ordinal] : reserved;
    int entry = vgpu_entry_of(ordinal);
    if (target < charged[ordinal]) {
        vgpu_uncharge(entry, charged[ordinal] - target);
        charged[ordinal] = target;
    } else if (target > charged[ordinal] && vgpu_try_charge(entry, target - charged[ordinal])) {
        charged[ordinal] = target;
    }
}

/* Under graph_lock: charge what a new executable graph may take on top of what is charged;
 * false (nothing charged) when a device's share does not fit. */
static bool charge_graph(const uint64_t bytes[VGPU_MAX_ORDINALS],
                         uint64_t extra[VGPU_MAX_ORDINALS]) {
    for (int d = 0; d < VGPU_MAX_ORDINALS; d++) {
        uint64_t target = add_saturating(live[d], bytes[d]);
        extra[d] = target > charged[d] ? target - charged[d] : 0;
        if (extra[d] > 0 && !vgpu_charge(vgpu_entry_of(d), extra[d])) {
            vgpu_log(VGPU_LOG_INFO, "a graph allocating %llu bytes on device %d does not fit "
                     "the pod's limit", (unsigned long long)bytes[d], d);
            while (d-- > 0) {
                vgpu_uncharge(vgpu_entry_of(d), extra[d]);
            }
            return false;
        }
    }
    return true;
}

/* Instantiate through `call`, charging the graph's allocation nodes first. */
static CUresult instantiate_charged(CUgraphExec *phGraphExec, CUgraph hGraph,
                                    CUresult (*call)(void *), void *arguments) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    uint64_t bytes[VGPU_MAX_ORDINALS] = {0};
    bool any = false;
    if (hGraph != NULL && phGraphExec != NULL) {
        result = graph_bytes(hGraph, bytes, &any);
    }
    if (result == CUDA_ERROR_OUT_OF_MEMORY) {
        return result; /* the graph could not be read: never instantiate it uncharged */
    }
    if (result != CUDA_SUCCESS || !any) {
        return call(arguments); /* no graph memory, or the driver's own error */
    }
    pthread_once(&fork_once, watch_forks);
    uint64_t extra[VGPU_MAX_ORDINALS];
    pthread_mutex_lock(&graph_lock);
    if (!charge_graph(bytes, extra)) {
        pthread_mutex_unlock(&graph_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result = call(arguments);
    struct graph_exec *record = result == CUDA_SUCCESS ? malloc(sizeof *record) : NULL;
    for (int d = 0; d < VGPU_MAX_ORDINALS; d++) {
        if (result != CUDA_SUCCESS) {
            vgpu_uncharge(vgpu_entry_of(d), extra[d]);
            continue;
        }
        live[d] = add_saturating(live[d], bytes[d]);
        charged[d] += extra[d];
    }
    if (record != NULL) {
        *record = (struct graph_exec){.exec = *phGraphExec, .next = execs};
        memcpy(record->bytes, bytes, sizeof bytes);
        execs = record;
    } else if (result == CUDA_SUCCESS) {
        vgpu_log(VGPU_LOG_WARN, "out of memory recording a graph; its memory stays charged");
    }
    pthread_mutex_unlock(&graph_lock);
    return result;
}

/* instantiate_charged, and a graph with a collective's kernel noted for the compute limiter. */
static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUresult (*call)(void *),
                            void *arguments) {
    CUresult result = instantiate_charged(phGraphExec, hGraph, call, arguments);
    if (result == CUDA_SUCCESS && phGraphExec != NULL) {
        vgpu_gang_note_graph(*phGraphExec, hGraph);
    }
    return result;
}

struct instantiate_call {
    CUgraphExec *exec;
    CUgraph graph;
    CUgraphNode *error_node;
    char *log;
    size_t log_size;
    unsigned long long flags;
    CUDA_GRAPH_INSTANTIATE_PARAMS *params;
};

static CUresult call_v1(void *arguments) {
    struct instantiate_call *a = arguments;
    return VGPU_REAL(cuGraphInstantiate, a->exec, a->graph, a->error_node, a->log, a->log_size);
}

static CUresult call_v2(void *arguments) {
    struct instantiate_call *a = arguments;
    return VGPU_REAL(cuGraphInstantiate_v2, a->exec, a->graph, a->error_node, a->log,
                     a->log_size);
}

static CUresult call_flags(void *arguments) {
    struct instantiate_call *a = arguments;
    return VGPU_REAL(cuGraphInstantiateWithFlags, a->exec, a->graph, a->flags);
}

static CUresult call_params(void *arguments) {
    struct instantiate_call *a = arguments;
    return VGPU_REAL(cuGraphInstantiateWithParams, a->exec, a->graph, a->params);
}

static CUresult call_params_ptsz(void *arguments) {
    struct instantiate_call *a = arguments;
    return VGPU_REAL(cuGraphInstantiateWithParams_ptsz, a->exec, a->graph, a->params);
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                            char *logBuffer, size_t bufferSize) {
    struct instantiate_call a = {phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize, 0, NULL};
    return instantiate(phGraphExec, hGraph, call_v1, &a);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize) {
    struct instantiate_call a = {phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize, 0, NULL};
    return instantiate(phGraphExec, hGraph, call_v2, &a);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags) {
    struct instantiate_call a = {.exec = phGraphExec, .graph = hGraph, .flags = flags};
    return instantiate(phGraphExec, hGraph, call_flags, &a);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    struct instantiate_call a = {.exec = phGraphExec, .graph = hGraph, .params = instantiateParams};
    return instantiate(phGraphExec, hGraph, call_params, &a);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    struct instantiate_call a = {.exec = phGraphExec, .graph = hGraph, .params = instantiateParams};
    return instantiate(phGraphExec, hGraph, call_params_ptsz, &a);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    result = VGPU_REAL(cuGraphExecDestroy, hGraphExec);
    if (result != CUDA_SUCCESS) {
        return result;
    }
    vgpu_gang_forget_graph(hGraphExec);
    pthread_mutex_lock(&graph_lock);
    for (struct graph_exec **link = &execs; *link != NULL; link = &(*link)->next) {
        struct graph_exec *found = *link;
        if (found->exec != hGraphExec) {
            continue;
        }
        *link = found->next;
        for (int d = 0; d < VGPU_MAX_ORDINALS; d++) {
            if (found->bytes[d] > 0) {
                live[d] -= found->bytes[d] < live[d] ? found->bytes[d] : live[d];
                settle_device(d);
            }
        }
        free(found);
        break;
    }
    pthread_mutex_unlock(&graph_lock);
    return result;
}

CUresult cuDeviceGraphMemTrim(CUdevice device) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    result = VGPU_REAL(cuDeviceGraphMemTrim, device);
    if (result == CUDA_SUCCESS && device >= 0 && device < VGPU_MAX_ORDINALS) {
        pthread_mutex_lock(&graph_lock);
        if (charged[device] > 0) {
            settle_device(device);
        }
        pthread_mutex_unlock(&graph_lock);
    }
    return result;
}
