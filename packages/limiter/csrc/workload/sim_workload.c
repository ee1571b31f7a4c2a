/* vgpu-sim-workload main program: allocate, run rounds of simulated kernels on S streams
 * (optionally as graph launches), synchronize, and print one JSON object.
 *
 * Simulated kernels take their duration in nanoseconds from kernelParams[0] (a uint64_t).
 * The work is issued in rounds of --batch kernels (or one graph launch of that many), rotating
 * over the streams; at most ROUNDS_IN_FLIGHT rounds are queued at once, as a real program is
 * bounded by the device's launch queue, so --duration does not queue unbounded work. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "workload.h"

#define MAX_STREAMS 64
#define ROUNDS_IN_FLIGHT 4
#define MAX_MARKS 100000

struct run {
    struct options options;
    struct cuda_api api;
    CUdevice device;
    CUcontext context;
    char device_name[128];
    int driver_version;
    CUdeviceptr memory;
    size_t free_bytes;
    size_t total_bytes;
    CUmodule module;
    CUfunction function;
    unsigned stream_count; /* at least 1: with --streams 0, the one stream is the legacy one */
    CUstream streams[MAX_STREAMS];
    CUevent start;
    CUevent end;
    CUevent joins[MAX_STREAMS];
    CUevent rounds[ROUNDS_IN_FLIGHT];
    CUgraph graph;
    CUgraphExec exec;
    uint64_t kernel_ns;
    void *params[1];
    uint64_t kernels_done;
    uint64_t issued[ROUNDS_IN_FLIGHT]; /* kernels_done once a round in flight was issued */
    double mark_s[MAX_MARKS];         /* when a round was seen finished (since the start) */
    uint64_t mark_done[MAX_MARKS];    /* and the kernels finished then */
    size_t marks;
    double round_ms[MAX_MARKS]; /* with --idle-ms: from each round's first launch to its end */
    size_t rounds_timed;
    double elapsed_s;
    float gpu_ms;
};

/* The ABI name of an entry point in the table, for messages. */
static const char *symbol_of(const char *base) {
#define SYMBOL_OF(name, symbol, need) \
    if (strcmp(base, #name) == 0) { \
        return #symbol; \
    }
    WORKLOAD_CALLS(SYMBOL_OF)
#undef SYMBOL_OF
    return base;
}

static void print_json_string(const char *text) {
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)text; *c != '\0'; c++) {
        if (*c == '"' || *c == '\\') {
            printf("\\%c", *c);
        } else if (*c < 0x20) {
            printf("\\u%04x", *c);
        } else {
            putchar(*c);
        }
    }
    putchar('"');
}

static _Noreturn void report_error(const struct run *run, CUresult result, const char *call,
                                   const char *detail) {
    const char *name = cuda_result_name(result);
    char text[256];
    if (name != NULL) {
        snprintf(text, sizeof text, "%s in %s", name, call);
    } else {
        snprintf(text, sizeof text, "CUresult %d in %s", (int)result, call);
    }
    printf("{\"error\": ");
    print_json_string(text);
    if (detail != NULL && detail[0] != '\0') {
        printf(", \"detail\": ");
        print_json_string(detail);
    }
    printf(", \"path\": \"%s\", \"device\": %d, \"pid\": %d}\n", path_name(run->options.path),
           run->options.device, (int)getpid());
    fflush(stdout);
    exit(1);
}

static void check(const struct run *run, CUresult result, const char *base) {
    if (result != CUDA_SUCCESS) {
        report_error(run, result, symbol_of(base), NULL);
    }
}

/* Call an entry point of the table; on failure report it and exit 1. */
#define CU(run, base, ...) check((run), (run)->api.base(__VA_ARGS__), #base)

static double now_s(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/* SIGTERM and SIGINT end --hold early so that the workload still cleans up. They are blocked
 * before the report is printed, so one sent as soon as the report is read is not lost. */
static void block_stop_signals(sigset_t *signals) {
    sigemptyset(signals);
    sigaddset(signals, SIGTERM);
    sigaddset(signals, SIGINT);
    sigprocmask(SIG_BLOCK, signals, NULL);
}

static void hold(const sigset_t *signals, double seconds) {
    double deadline = now_s() + seconds;
    for (double left = seconds; left > 0; left = deadline - now_s()) {
        time_t whole = (time_t)left;
        struct timespec timeout = {whole, (long)((left - (double)whole) * 1e9)};
        if (sigtimedwait(signals, NULL, &timeout) >= 0) {
            return;
        }
    }
}

static void set_up(struct run *run) {
    CU(run, cuInit, 0);
    CU(run, cuDriverGetVersion, &run->driver_version);
    CU(run, cuDeviceGet, &run->device, run->options.device);
    CU(run, cuDeviceGetName, run->device_name, (int)sizeof run->device_name, run->device);
    CU(run, cuDevicePrimaryCtxRetain, &run->context, run->device);
    CU(run, cuCtxSetCurrent, run->context);
    if (run->options.alloc_bytes > 0) {
        CU(run, cuMemAlloc, &run->memory, (size_t)run->options.alloc_bytes);
    }
    CU(run, cuMemGetInfo, &run->free_bytes, &run->total_bytes);
    /* The simulated driver accepts any image and any kernel name. */
    static const char image[] = "vgpu-sim-workload";
    CU(run, cuModuleLoadData, &run->module, image);
    CU(run, cuModuleGetFunction, &run->function, run->module, run->options.kernel_name);

    run->stream_count = run->options.streams > 0 ? run->options.streams : 1;
    for (unsigned s = 0; s < run->options.streams; s++) {
        CU(run, cuStreamCreate, &run->streams[s], CU_STREAM_NON_BLOCKING);
    }
    CU(run, cuEventCreate, &run->start, CU_EVENT_DEFAULT);
    CU(run, cuEventCreate, &run->end, CU_EVENT_DEFAULT);
    for (unsigned s = 1; s < run->stream_count; s++) {
        CU(run, cuEventCreate, &run->joins[s], CU_EVENT_DISABLE_TIMING);
    }
    for (unsigned r = 0; r < ROUNDS_IN_FLIGHT; r++) {
        CU(run, cuEventCreate, &run->rounds[r], CU_EVENT_DISABLE_TIMING);
    }
    run->kernel_ns = (uint64_t)(run->options.kernel_us * 1000.0 + 0.5);
    run->params[0] = &run->kernel_ns;
}

static void launch(struct run *run, CUstream stream) {
    CU(run, cuLaunchKernel, run->function, 1, 1, 1, 1, 1, 1, 0, stream, run->params, NULL);
}

static void make_graph(struct run *run) {
    CUstream stream = run->streams[0];
    if (run->options.graph == GRAPH_CAPTURE) {
        CU(run, cuStreamBeginCapture, stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
        for (uint64_t k = 0; k < run->options.batch; k++) {
            launch(run, stream);
        }
        CU(run, cuStreamEndCapture, stream, &run->graph);
    } else {
        CU(run, cuGraphCreate, &run->graph, 0);
        CUgraphNode previous = NULL;
        for (uint64_t k = 0; k < run->options.batch; k++) {
            CUDA_KERNEL_NODE_PARAMS_v2 node_params = {
                .func = run->function,
                .gridDimX = 1,
                .gridDimY = 1,
                .gridDimZ = 1,
                .blockDimX = 1,
                .blockDimY = 1,
                .blockDimZ = 1,
                .kernelParams = run->params,
            };
            CUgraphNode node = NULL;
            /* A chain: each node depends on the one before, as a captured stream would. */
            CU(run, cuGraphAddKernelNode, &node, run->graph, previous != NULL ? &previous : NULL,
               previous != NULL ? 1 : 0, &node_params);
            previous = node;
        }
    }
    CU(run, cuGraphInstantiate, &run->exec, run->graph, 0);
}

/* A bursty program's round: wait for it, note how long it took, and idle. */
static void pause_after(struct run *run, CUevent done, double began) {
    CU(run, cuEventSynchronize, done);
    if (run->rounds_timed < MAX_MARKS) {
        run->round_ms[run->rounds_timed++] = (now_s() - began) * 1000.0;
    }
    double idle_s = run->options.idle_ms / 1000.0;
    struct timespec pause = {(time_t)idle_s, (long)((idle_s - (double)(time_t)idle_s) * 1e9)};
    while (nanosleep(&pause, &pause) != 0) {
    }
}

static int by_value(const void *left, const void *right) {
    double a = *(const double *)left;
    double b = *(const double *)right;
    return a < b ? -1 : a > b;
}

/* The rounds' latency at `percent` (sorted). */
static double percentile(const struct run *run, size_t percent) {
    size_t at = run->rounds_timed * percent / 100;
    return run->round_ms[at < run->rounds_timed ? at : run->rounds_timed - 1];
}

/* The rounds' latency, p50, p90 and p99, as JSON fields. */
static void print_rounds(struct run *run) {
    if (run->rounds_timed == 0) {
        return;
    }
    qsort(run->round_ms, run->rounds_timed, sizeof run->round_ms[0], by_value);
    printf("\"round_ms_p50\": %.4g, \"round_ms_p90\": %.4g, \"round_ms_p99\": %.4g, "
           "\"rounds\": %zu, ",
           percentile(run, 50), percentile(run, 90), percentile(run, 99), run->rounds_timed);
}

static void run_rounds(struct run *run) {
    const struct options *options = &run->options;
    CUstream first = run->streams[0];
    double started = now_s();
    CU(run, cuEventRecord, run->start, first);
    for (unsigned s = 1; s < run->stream_count; s++) {
        CU(run, cuStreamWaitEvent, run->streams[s], run->start, 0);
    }
    for (uint64_t round = 0;; round++) {
        CUevent *slot = &run->rounds[round % ROUNDS_IN_FLIGHT];
        if (round >= ROUNDS_IN_FLIGHT) {
            CU(run, cuEventSynchronize, *slot);
            if (run->marks < MAX_MARKS) {
                run->mark_s[run->marks] = now_s() - started;
                run->mark_done[run->marks++] = run->issued[round % ROUNDS_IN_FLIGHT];
            }
        }
        uint64_t count = options->batch;
        if (options->duration_s > 0) {
            if (now_s() - started >= options->duration_s) {
                break;
            }
        } else if (run->kernels_done >= options->kernels) {
            break;
        } else if (options->kernels - run->kernels_done < count) {
            count = options->kernels - run->kernels_done;
        }
        double round_began = now_s();
        CUstream stream = run->streams[round % run->stream_count];
        if (options->fresh_streams) {
            CU(run, cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
            CU(run, cuStreamWaitEvent, stream, run->start, 0);
        }
        if (options->graph != GRAPH_NONE) {
            CU(run, cuGraphLaunch, run->exec, stream);
        } else {
            for (uint64_t k = 0; k < count; k++) {
                launch(run, stream);
            }
        }
        CU(run, cuEventRecord, *slot, stream);
        if (options->fresh_streams) {
            /* The end event follows this round's work; the stream goes while it still runs. */
            CU(run, cuStreamWaitEvent, first, *slot, 0);
            CU(run, cuStreamDestroy, stream);
        }
        run->kernels_done += count;
        run->issued[round % ROUNDS_IN_FLIGHT] = run->kernels_done;
        if (options->idle_ms > 0) {
            pause_after(run, *slot, round_began);
        }
    }
    /* Join every stream into the first, so the end event follows all the work. */
    for (unsigned s = 1; s < run->stream_count; s++) {
        CU(run, cuEventRecord, run->joins[s], run->streams[s]);
        CU(run, cuStreamWaitEvent, first, run->joins[s], 0);
    }
    CU(run, cuEventRecord, run->end, first);
    CU(run, cuEventSynchronize, run->end);
    run->elapsed_s = now_s() - started;
    CU(run, cuEventElapsedTime, &run->gpu_ms, run->start, run->end);
    for (unsigned s = 0; s < run->stream_count; s++) {
        CU(run, cuStreamSynchronize, run->streams[s]);
    }
}

/* Everything but the memory and the context, which --hold keeps. */
static void tear_down_work(struct run *run) {
    if (run->exec != NULL) {
        CU(run, cuGraphExecDestroy, run->exec);
    }
    if (run->graph != NULL) {
        CU(run, cuGraphDestroy, run->graph);
    }
    for (unsigned r = 0; r < ROUNDS_IN_FLIGHT; r++) {
        CU(run, cuEventDestroy, run->rounds[r]);
    }
    for (unsigned s = 1; s < run->stream_count; s++) {
        CU(run, cuEventDestroy, run->joins[s]);
    }
    CU(run, cuEventDestroy, run->start);
    CU(run, cuEventDestroy, run->end);
    for (unsigned s = 0; s < run->options.streams; s++) {
        CU(run, cuStreamDestroy, run->streams[s]);
    }
    CU(run, cuModuleUnload, run->module);
}

static void print_report(struct run *run) {
    const struct options *options = &run->options;
    double rate = run->elapsed_s > 0 ? (double)run->kernels_done / run->elapsed_s : 0.0;
    printf("{\"path\": \"%s\", ", path_name(options->path));
    if (options->path == PATH_PROCADDRESS) {
        printf("\"cuda_version\": %d, ", options->cuda_version);
    }
    printf("\"pid\": %d, \"device\": %d, \"device_name\": ", (int)getpid(), options->device);
    print_json_string(run->device_name);
    printf(", \"driver_version\": %d, \"allocated_bytes\": %llu, \"free_bytes\": %llu, "
           "\"total_bytes\": %llu, ",
           run->driver_version, (unsigned long long)options->alloc_bytes,
           (unsigned long long)run->free_bytes, (unsigned long long)run->total_bytes);
    printf("\"kernels\": %llu, \"kernel_us\": %.10g, \"streams\": %u, \"batch\": %llu, "
           "\"graph\": %s, \"graph_mode\": \"%s\", ",
           (unsigned long long)run->kernels_done, options->kernel_us, options->streams,
           (unsigned long long)options->batch, options->graph != GRAPH_NONE ? "true" : "false",
           graph_mode_name(options->graph));
    if (options->duration_s > 0) {
        printf("\"duration_s\": %.10g, ", options->duration_s);
    }
    print_rounds(run);
    if (options->marks) {
        /* The program's progress over time, as the GPU benchmarks record it: [seconds, kernels
         * finished], one pair per finished round. */
        printf("\"marks\": [");
        for (size_t m = 0; m < run->marks; m++) {
            printf("%s[%.6f, %llu]", m > 0 ? ", " : "", run->mark_s[m],
                   (unsigned long long)run->mark_done[m]);
        }
        printf("], ");
    }
    printf("\"elapsed_s\": %.6f, \"gpu_time_s\": %.6f, \"achieved_kernels_per_s\": %.3f, "
           "\"hold_s\": %.10g}\n",
           run->elapsed_s, (double)run->gpu_ms / 1000.0, rate, options->hold_s);
    fflush(stdout);
}

/* After the report only stderr is left to say what went wrong. */
static void release(CUresult result, const char *base) {
    if (result != CUDA_SUCCESS) {
        const char *name = cuda_result_name(result);
        fprintf(stderr, "vgpu-sim-workload: %s in %s\n", name != NULL ? name : "CUresult ?",
                symbol_of(base));
        exit(1);
    }
}

int main(int argc, char **argv) {
    static struct run run;
    options_parse(argc, argv, &run.options);
    struct load_error error;
    if (!api_load(&run.api, &run.options, run.options.graph != GRAPH_NONE, &error)) {
        report_error(&run, error.result, error.call, error.detail);
    }
    set_up(&run);
    if (run.options.graph != GRAPH_NONE) {
        make_graph(&run);
    }
    run_rounds(&run);
    tear_down_work(&run);
    sigset_t stop_signals;
    if (run.options.hold_s > 0) {
        block_stop_signals(&stop_signals);
    }
    print_report(&run);
    if (run.options.hold_s > 0) {
        hold(&stop_signals, run.options.hold_s);
    }
    if (run.memory != 0) {
        release(run.api.cuMemFree(run.memory), "cuMemFree");
    }
    release(run.api.cuDevicePrimaryCtxRelease(run.device), "cuDevicePrimaryCtxRelease");
    return 0;
}
