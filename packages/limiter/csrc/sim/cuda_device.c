/* Simulated driver: initialization, versions, device enumeration and attributes, error text. */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cuda_sim.h"

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;
static int visible[SIM_MAX_DEVICES]; /* CUDA ordinal → physical index */
static int visible_count;

/* CUDA_VISIBLE_DEVICES: comma-separated indices or UUIDs (a unique prefix is enough); the
 * list ends at the first entry that names no device, as with the real driver. */
static void select_visible_devices(const struct sim_state *state) {
    const char *setting = getenv("CUDA_VISIBLE_DEVICES");
    visible_count = 0;
    if (setting == NULL) {
        for (unsigned i = 0; i < state->device_count; i++) {
            visible[visible_count++] = (int)i;
        }
        return;
    }
    char entry[64];
    const char *cursor = setting;
    while (*cursor != '\0' && visible_count < SIM_MAX_DEVICES) {
        size_t length = strcspn(cursor, ",");
        if (length == 0 || length >= sizeof entry) {
            return;
        }
        memcpy(entry, cursor, length);
        entry[length] = '\0';
        int found = -1;
        char *end = NULL;
        long index = strtol(entry, &end, 10);
        if (*end == '\0' && index >= 0 && index < (long)state->device_count) {
            found = (int)index;
        } else if (strncasecmp(entry, "GPU-", 4) == 0) {
            for (unsigned i = 0; i < state->device_count; i++) {
                if (strncasecmp(state->devices[i].config.uuid, entry, length) == 0) {
                    found = found == -1 ? (int)i : -2; /* ambiguous prefix */
                }
            }
        }
        if (found < 0) {
            return;
        }
        for (int i = 0; i < visible_count; i++) {
            if (visible[i] == found) {
                return; /* a repeated device ends the list too */
            }
        }
        visible[visible_count++] = found;
        cursor += length;
        if (*cursor == ',') {
            cursor++;
        }
    }
}

/* Fork with the driver lock taken, so the child never inherits it held by a thread it lacks. */
static void lock_for_fork(void) {
    pthread_mutex_lock(&sim_driver_lock);
}

static void unlock_after_fork(void) {
    pthread_mutex_unlock(&sim_driver_lock);
}

static void initialize(void) {
    pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
    struct sim_state *state = sim_state();
    if (state == NULL) {
        init_result = CUDA_ERROR_NO_DEVICE; /* sim_state() said why on stderr */
        return;
    }
    select_visible_devices(state);
    init_result = visible_count == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

CUresult cuInit(unsigned int Flags) {
    if (Flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_once(&init_once, initialize);
    return init_result;
}

CUresult sim_initialized(void) {
    return init_result == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

struct sim_state *sim_driver_state(void) {
    return sim_state();
}

int sim_visible_count(void) {
    return visible_count;
}

int sim_physical_device(CUdevice ordinal) {
    if (init_result != CUDA_SUCCESS || ordinal < 0 || ordinal >= visible_count) {
        return -1;
    }
    return visible[ordinal];
}

CUresult sim_device_argument(CUdevice ordinal, int *physical) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    *physical = sim_physical_device(ordinal);
    return *physical < 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

/* The device's config after the common checks, or NULL with *result set. */
static const struct sim_device_config *device_config(CUdevice dev, CUresult *result) {
    *result = sim_initialized();
    if (*result != CUDA_SUCCESS) {
        return NULL;
    }
    int physical = sim_physical_device(dev);
    if (physical < 0) {
        *result = CUDA_ERROR_INVALID_DEVICE;
        return NULL;
    }
    return &sim_driver_state()->devices[physical].config;
}

CUresult cuDriverGetVersion(int *driverVersion) {
    if (driverVersion == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct sim_state *state = sim_state();
    *driverVersion = state != NULL ? state->cuda_version : 13000;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (count == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *count = visible_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    if (device == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (ordinal < 0 || ordinal >= visible_count) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    CUresult result;
    const struct sim_device_config *config = device_config(dev, &result);
    if (config == NULL) {
        return result;
    }
    if (name == NULL || len <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    snprintf(name, (size_t)len, "%s", config->name);
    return CUDA_SUCCESS;
}

static int hex_value(char digit) {
    if (digit >= '0' && digit <= '9') {
        return digit - '0';
    }
    return (digit | 0x20) - 'a' + 10;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    CUresult result;
    const struct sim_device_config *config = device_config(dev, &result);
    if (config == NULL) {
        return result;
    }
    if (uuid == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* "GPU-" then 32 hex digits with dashes → 16 bytes. */
    const char *cursor = config->uuid + 4;
    for (int i = 0; i < 16; i++) {
        if (*cursor == '-') {
            cursor++;
        }
        uuid->bytes[i] = (char)(hex_value(cursor[0]) << 4 | hex_value(cursor[1]));
        cursor += 2;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    return cuDeviceGetUuid_v2(uuid, dev);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CUresult result;
    const struct sim_device_config *config = device_config(dev, &result);
    if (config == NULL) {
        return result;
    }
    if (bytes == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *bytes = config->total_memory;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
    CUresult result;
    const struct sim_device_config *config = device_config(dev, &result);
    if (config == NULL) {
        return result;
    }
    if (pciBusId == NULL || len <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* The driver's form has a 4-digit domain: "0000:18:00.0". */
    snprintf(pciBusId, (size_t)len, "%.4s%s", config->pci_bus_id + 4, config->pci_bus_id + 8);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    CUresult result;
    const struct sim_device_config *config = device_config(dev, &result);
    if (config == NULL) {
        return result;
    }
    if (pi == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = (int)config->sm_count; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = (int)config->pci_bus; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *pi = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *pi = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *pi = 52428800; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = SIM_THREADS_PER_SM; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *pi = 3; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = (int)config->cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = (int)config->cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = 1; break;
    default:
        /* An attribute the simulation does not model: say so rather than invent a value. */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

/* Error names from the one list of results; descriptions for the ones programs show users. */
CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (pStr == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (error) {
#define VGPU_CU_RESULT_NAME(name, value) \
    case name: *pStr = #name; return CUDA_SUCCESS;
        VGPU_CU_RESULTS(VGPU_CU_RESULT_NAME)
#undef VGPU_CU_RESULT_NAME
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr) {
    if (pStr == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (error) {
    case CUDA_SUCCESS: *pStr = "no error"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *pStr = "invalid argument"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *pStr = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED: *pStr = "initialization error"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *pStr = "no CUDA-capable device is detected"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *pStr = "invalid device ordinal"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *pStr = "invalid device context"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_HANDLE: *pStr = "invalid resource handle"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_FOUND: *pStr = "named symbol not found"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_READY: *pStr = "device not ready"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_SUPPORTED: *pStr = "operation not supported"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_PERMITTED: *pStr = "operation not permitted"; return CUDA_SUCCESS;
    case CUDA_ERROR_UNKNOWN: *pStr = "unknown error"; return CUDA_SUCCESS;
    default: break;
    }
    return cuGetErrorName(error, pStr);
}

/* The CUDA 2.0 form: sizes over 4 GiB read as the most an unsigned int holds. */
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    if (bytes == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t total;
    CUresult result = cuDeviceTotalMem_v2(&total, dev);
    if (result == CUDA_SUCCESS) {
        *bytes = total > UINT_MAX ? UINT_MAX : (unsigned int)total;
    }
    return result;
}
