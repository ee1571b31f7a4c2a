/* Library lifetime (reference-counted init and shutdown), error strings and system versions. */
#define _GNU_SOURCE
#include <stdio.h>

#include "nvml_sim.h"

/* Lock-free, so that a fork while another thread initializes cannot leave it held. */
static unsigned init_count;

struct sim_state *nvml_sim_initialized(void) {
    if (__atomic_load_n(&init_count, __ATOMIC_ACQUIRE) == 0) {
        return NULL;
    }
    return sim_state(); /* already mapped by the init that counted */
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags; /* NO_GPUS, NO_ATTACH: a node without devices initializes anyway */
    /* sim_state() says on stderr why it cannot open the state (a bad VGPU_SIM_DEVICES...). */
    if (sim_state() == NULL) {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    __atomic_fetch_add(&init_count, 1, __ATOMIC_ACQ_REL);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) {
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlInit(void) {
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void) {
    unsigned count = __atomic_load_n(&init_count, __ATOMIC_ACQUIRE);
    do {
        if (count == 0) {
            return NVML_ERROR_UNINITIALIZED;
        }
    } while (!__atomic_compare_exchange_n(&init_count, &count, count - 1, false, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded (simulated GPU state unavailable)";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    case NVML_ERROR_OPERATING_SYSTEM: return "Operating System Error";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "vGPU ECC not supported";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    }
    return "Unknown Error";
}

nvmlReturn_t nvml_sim_copy_string(char *out, unsigned int length, const char *text) {
    if (out == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    int needed = snprintf(NULL, 0, "%s", text);
    if (needed < 0 || (unsigned)needed >= length) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    snprintf(out, length, "%s", text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    struct sim_state *state = nvml_sim_initialized();
    if (state == NULL) {
        return NVML_ERROR_UNINITIALIZED;
    }
    char text[sizeof state->driver_version + 1];
    snprintf(text, sizeof text, "%.*s", (int)sizeof state->driver_version - 1,
             state->driver_version);
    return nvml_sim_copy_string(version, length, text);
}

/* The NVML API major version, then the driver version: "13.580.95.05". */
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    struct sim_state *state = nvml_sim_initialized();
    if (state == NULL) {
        return NVML_ERROR_UNINITIALIZED;
    }
    char text[NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE];
    snprintf(text, sizeof text, "%d.%.*s", NVML_API_VERSION, (int)sizeof state->driver_version - 1,
             state->driver_version);
    return nvml_sim_copy_string(version, length, text);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    struct sim_state *state = nvml_sim_initialized();
    if (state == NULL) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (cudaDriverVersion == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *cudaDriverVersion = state->cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}
