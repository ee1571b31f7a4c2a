/* Stream capture: whether a launch is captured into a graph rather than run. A captured launch
 * is not paced (the graph's launch is), so every paced launch asks. cuStreamIsCapturing costs
 * 26-46 ns on an H100's host (benchmarks/host_call_costs.c), a tenth of the paced path, and while
 * the process has no capture open no stream can be capturing (a stream joins a capture only by
 * waiting on the work of one that captures). So the hooks that open and close captures keep a
 * count (vgpu_state.captures_open, in the cache line every launch reads), and the driver is
 * asked only while it is not 0.
 *
 * The count may only err high: it goes up before a capture opens and down only after a call
 * that ended one. A capture whose end is never seen (its stream destroyed while capturing)
 * leaves it up, and every launch asks the driver, as all did before. */
#define _GNU_SOURCE
#include "capture.h"

#include <stdatomic.h>

#include "core.h"

bool vgpu_capturing(CUstream stream) {
    if (atomic_load_explicit(&vgpu_state.captures_open, memory_order_acquire) == 0) {
        return false;
    }
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return VGPU_REAL(cuStreamIsCapturing, stream, &status) != CUDA_SUCCESS ||
           status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Counted before the driver opens it: a launch on another thread that sees the capture's
 * stream already sees the count. */
static CUresult opening(void) {
    CUresult result = vgpu_cuda_ready();
    if (result == CUDA_SUCCESS) {
        atomic_fetch_add_explicit(&vgpu_state.captures_open, 1, memory_order_acq_rel);
    }
    return result;
}

static CUresult opened(CUresult result) {
    if (result != CUDA_SUCCESS) {
        atomic_fetch_sub_explicit(&vgpu_state.captures_open, 1, memory_order_acq_rel);
    }
    return result;
}

#define VGPU_BEGIN_CAPTURE(symbol, params, args)                                             \
    CUresult symbol params {                                                                   \
        CUresult result = opening();                                                           \
        return result != CUDA_SUCCESS       ? result                                           \
               : vgpu_real.symbol == NULL ? opened(CUDA_ERROR_NOT_FOUND)                     \
                                          : opened(vgpu_real.symbol args);                     \
    }

VGPU_BEGIN_CAPTURE(cuStreamBeginCapture, (CUstream hStream), (hStream))
VGPU_BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, (CUstream hStream), (hStream))
VGPU_BEGIN_CAPTURE(cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode),
                   (hStream, mode))
VGPU_BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, (CUstream hStream, CUstreamCaptureMode mode),
                   (hStream, mode))
VGPU_BEGIN_CAPTURE(cuStreamBeginCaptureToGraph,
                   (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                    const CUgraphEdgeData *dependencyData, size_t numDependencies,
                    CUstreamCaptureMode mode),
                   (hStream, hGraph, dependencies, dependencyData, numDependencies, mode))
VGPU_BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz,
                   (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                    const CUgraphEdgeData *dependencyData, size_t numDependencies,
                    CUstreamCaptureMode mode),
                   (hStream, hGraph, dependencies, dependencyData, numDependencies, mode))

static bool capture_status(CUstream stream, CUstreamCaptureStatus *status) {
    return VGPU_REAL(cuStreamIsCapturing, stream, status) == CUDA_SUCCESS;
}

/* Down only when this call ended a capture: it was open before, is not after, and the call
 * says it ended it. Some errors end it too: a capture that broke the rules (invalidated,
 * unjoined), and one ended from another thread than began it (driver 580 closes it
 * and says WRONG_THREAD). Of two threads ending the same capture, the one that did not gets
 * another error (ILLEGAL_STATE) and counts nothing. */
static CUresult end_capture(CUresult (*end)(CUstream, CUgraph *), CUstream stream,
                            CUstream asked, CUgraph *graph) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS || end == NULL) {
        return result != CUDA_SUCCESS ? result : CUDA_ERROR_NOT_FOUND;
    }
    CUstreamCaptureStatus before = CU_STREAM_CAPTURE_STATUS_NONE;
    CUstreamCaptureStatus after = CU_STREAM_CAPTURE_STATUS_NONE;
    bool was_open = capture_status(stream, &before) && before != CU_STREAM_CAPTURE_STATUS_NONE;
    result = end(asked, graph);
    bool ended = result == CUDA_SUCCESS || result == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
                 result == CUDA_ERROR_STREAM_CAPTURE_UNJOINED ||
                 result == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (was_open && ended && capture_status(stream, &after) &&
        after == CU_STREAM_CAPTURE_STATUS_NONE) {
        atomic_fetch_sub_explicit(&vgpu_state.captures_open, 1, memory_order_acq_rel);
    }
    return result;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    return end_capture(vgpu_real.cuStreamEndCapture, hStream, hStream, phGraph);
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
    return end_capture(vgpu_real.cuStreamEndCapture_ptsz, vgpu_stream_named(hStream, true),
                       hStream, phGraph);
}
