/* Command-line options of vgpu-sim-workload. Bad input is one line on stderr and exit 2. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu_parse.h"
#include "workload.h"

#define PROGRAM "vgpu-sim-workload"
#define MAX_STREAMS 64
#define DEFAULT_KERNELS 10
#define DEFAULT_KERNEL_US 1000.0
#define DEFAULT_BATCH 10
#define DEFAULT_CUDA_VERSION 13000

static const char usage[] =
    "usage: " PROGRAM " [OPTIONS]\n"
    "Run simulated kernels on a CUDA device and print one JSON object with what was achieved.\n"
    "\n"
    "  --path linked|dlopen|procaddress  how to reach the driver (default linked)\n"
    "  --device N          device ordinal (default 0)\n"
    "  --alloc SIZE        device memory to allocate, bytes or with a unit: 512MiB, 4g (default 0)\n"
    "  --kernels N         kernels to run in all (default 10)\n"
    "  --duration SECONDS  instead of --kernels: issue rounds until this much wall time passed\n"
    "  --kernel-us D       duration of each kernel in microseconds (default 1000)\n"
    "  --streams S         streams the rounds rotate over; 0: the legacy default stream (default 1)\n"
    "  --fresh-streams     run each round on a stream of its own, destroyed right after its\n"
    "                      launches (before they finish)\n"
    "  --marks             report [seconds, kernels finished] as rounds finish, to count work\n"
    "                      per second\n"
    "  --batch B           kernels per round (default 10, or --kernels when smaller)\n"
    "  --graph[=capture|build]  run each round as one launch of a graph made of B kernels,\n"
    "                      captured from a stream (default) or built node by node\n"
    "  --idle-ms M         after each round, wait for it to finish and sleep M ms (a bursty,\n"
    "                      inference-like program); the report gives the rounds' latency\n"
    "  --hold SECONDS      after the report, keep the memory and context and sleep;\n"
    "                      SIGTERM or SIGINT end the hold early (then clean up, exit 0)\n"
    "  --cuda-version V    version asked of cuGetProcAddress_v2 (default 13000)\n"
    "  --kernel-name NAME  the kernel's name (default sleep_kernel); a collective's, such as\n"
    "                      ncclDevKernel_AllReduce, makes the program pace as a job's rank\n"
    "  --help              print this help\n"
    "\n"
    "Exit status: 0 done, 1 a CUDA call failed (the JSON has \"error\"), 2 bad options.\n";

static _Noreturn void usage_error(const char *format, ...) {
    va_list arguments;
    va_start(arguments, format);
    fputs(PROGRAM ": error: ", stderr);
    vfprintf(stderr, format, arguments);
    fputc('\n', stderr);
    va_end(arguments);
    exit(2);
}

static uint64_t parse_size(const char *option, const char *text) {
    uint64_t bytes = 0;
    if (!vgpu_parse_size(text, &bytes)) {
        usage_error("%s %s: expected a size such as 1048576, 512MiB or 4g", option, text);
    }
    return bytes;
}

static const char *parse_name(const char *option, const char *text) {
    if (text[0] == '\0') {
        usage_error("%s: expected a name", option);
    }
    return text;
}

static uint64_t parse_count(const char *option, const char *text, uint64_t low, uint64_t high) {
    uint64_t value = 0;
    if (!vgpu_parse_u64(text, &value) || value < low || value > high) {
        usage_error("%s %s: expected a whole number from %llu to %llu", option, text,
                    (unsigned long long)low, (unsigned long long)high);
    }
    return value;
}

static double parse_decimal(const char *option, const char *text, double high) {
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    /* strtod accepts "inf", "nan" and hex: insist on a plain decimal number. */
    bool plain = text[0] != '\0' && strspn(text, "0123456789.") == strlen(text);
    if (!plain || errno != 0 || end == text || *end != '\0' || !isfinite(value) || value > high) {
        usage_error("%s %s: expected a number of at least 0 and at most %g", option, text, high);
    }
    return value;
}

const char *path_name(enum call_path path) {
    switch (path) {
    case PATH_LINKED:
        return "linked";
    case PATH_DLOPEN:
        return "dlopen";
    case PATH_PROCADDRESS:
        return "procaddress";
    }
    return "?";
}

const char *graph_mode_name(enum graph_mode mode) {
    switch (mode) {
    case GRAPH_NONE:
        return "none";
    case GRAPH_CAPTURE:
        return "capture";
    case GRAPH_BUILD:
        return "build";
    }
    return "?";
}

enum {
    OPT_PATH = 256,
    OPT_DEVICE,
    OPT_ALLOC,
    OPT_KERNELS,
    OPT_KERNEL_US,
    OPT_STREAMS,
    OPT_FRESH_STREAMS,
    OPT_MARKS,
    OPT_BATCH,
    OPT_GRAPH,
    OPT_DURATION,
    OPT_HOLD,
    OPT_IDLE_MS,
    OPT_CUDA_VERSION,
    OPT_KERNEL_NAME,
    OPT_HELP,
};

static const struct option long_options[] = {
    {"path", required_argument, NULL, OPT_PATH},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"alloc", required_argument, NULL, OPT_ALLOC},
    {"kernels", required_argument, NULL, OPT_KERNELS},
    {"kernel-us", required_argument, NULL, OPT_KERNEL_US},
    {"streams", required_argument, NULL, OPT_STREAMS},
    {"fresh-streams", no_argument, NULL, OPT_FRESH_STREAMS},
    {"marks", no_argument, NULL, OPT_MARKS},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"graph", optional_argument, NULL, OPT_GRAPH},
    {"duration", required_argument, NULL, OPT_DURATION},
    {"hold", required_argument, NULL, OPT_HOLD},
    {"idle-ms", required_argument, NULL, OPT_IDLE_MS},
    {"cuda-version", required_argument, NULL, OPT_CUDA_VERSION},
    {"kernel-name", required_argument, NULL, OPT_KERNEL_NAME},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static enum call_path parse_path(const char *text) {
    for (enum call_path path = PATH_LINKED; path <= PATH_PROCADDRESS; path++) {
        if (strcmp(text, path_name(path)) == 0) {
            return path;
        }
    }
    usage_error("--path %s: expected linked, dlopen or procaddress", text);
}

static enum graph_mode parse_graph(const char *text) {
    if (text == NULL || strcmp(text, "capture") == 0) {
        return GRAPH_CAPTURE;
    }
    if (strcmp(text, "build") == 0) {
        return GRAPH_BUILD;
    }
    usage_error("--graph=%s: expected capture or build", text);
}

/* Once every option is read: the ones that exclude or depend on each other, and the batch when
 * none was given. */
static void settle(struct options *options, bool kernels_given, bool batch_given,
                   bool duration_given) {
    if (duration_given && kernels_given) {
        usage_error("--kernels and --duration exclude each other");
    }
    if (duration_given && options->duration_s <= 0) {
        usage_error("--duration must be more than 0");
    }
    if (!batch_given) {
        options->batch = DEFAULT_BATCH;
        if (!duration_given && options->kernels > 0 && options->kernels < DEFAULT_BATCH) {
            options->batch = options->kernels;
        }
    }
    if (options->graph != GRAPH_NONE && !duration_given && options->kernels % options->batch != 0) {
        usage_error("--graph: --kernels %llu is not a multiple of --batch %llu",
                    (unsigned long long)options->kernels, (unsigned long long)options->batch);
    }
}

void options_parse(int argc, char **argv, struct options *options) {
    *options = (struct options){
        .path = PATH_LINKED,
        .kernels = DEFAULT_KERNELS,
        .kernel_us = DEFAULT_KERNEL_US,
        .streams = 1,
        .graph = GRAPH_NONE,
        .cuda_version = DEFAULT_CUDA_VERSION,
        .kernel_name = "sleep_kernel",
    };
    bool kernels_given = false;
    bool batch_given = false;
    bool duration_given = false;
    opterr = 0; /* getopt's own messages are not one line in our format */
    int option;
    while ((option = getopt_long(argc, argv, ":", long_options, NULL)) != -1) {
        switch (option) {
        case OPT_PATH:
            options->path = parse_path(optarg);
            break;
        case OPT_DEVICE:
            options->device = (int)parse_count("--device", optarg, 0, 1023);
            break;
        case OPT_ALLOC:
            options->alloc_bytes = parse_size("--alloc", optarg);
            break;
        case OPT_KERNELS:
            options->kernels = parse_count("--kernels", optarg, 0, UINT32_MAX);
            kernels_given = true;
            break;
        case OPT_KERNEL_US:
            options->kernel_us = parse_decimal("--kernel-us", optarg, 3600e6);
            break;
        case OPT_STREAMS:
            options->streams = (unsigned)parse_count("--streams", optarg, 0, MAX_STREAMS);
            break;
        case OPT_FRESH_STREAMS:
            options->fresh_streams = true;
            break;
        case OPT_MARKS:
            options->marks = true;
            break;
        case OPT_BATCH:
            options->batch = parse_count("--batch", optarg, 1, 100000);
            batch_given = true;
            break;
        case OPT_GRAPH:
            options->graph = parse_graph(optarg);
            break;
        case OPT_DURATION:
            options->duration_s = parse_decimal("--duration", optarg, 86400);
            duration_given = true;
            break;
        case OPT_HOLD:
            options->hold_s = parse_decimal("--hold", optarg, 86400);
            break;
        case OPT_IDLE_MS:
            options->idle_ms = parse_decimal("--idle-ms", optarg, 10000);
            break;
        case OPT_CUDA_VERSION:
            options->cuda_version = (int)parse_count("--cuda-version", optarg, 1, 1000000);
            break;
        case OPT_KERNEL_NAME:
            options->kernel_name = parse_name("--kernel-name", optarg);
            break;
        case OPT_HELP:
            fputs(usage, stdout);
            exit(0);
        case ':':
            usage_error("%s: expected a value", argv[optind - 1]);
        default:
            usage_error("%s: unknown option (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc) {
        usage_error("%s: unexpected argument (see --help)", argv[optind]);
    }
    settle(options, kernels_given, batch_given, duration_given);
}
