/* Device enumeration and identity: handles, lookups by index, UUID and PCI bus id, and the
 * static properties of each device. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "nvml_sim.h"

/* Handles point into this table; the state never moves devices, so they stay valid. */
struct nvmlDevice_st {
    unsigned index;
};

static struct nvmlDevice_st handles[SIM_MAX_DEVICES] = {
#define H(i) [i] = {i}
    H(0), H(1), H(2), H(3), H(4), H(5), H(6), H(7),
    H(8), H(9), H(10), H(11), H(12), H(13), H(14), H(15),
#undef H
};
_Static_assert(SIM_MAX_DEVICES == 16, "handles[] lists one entry per device");

/* An H100 SXM as seen on the PCI bus; the simulator does not vary it by name. */
#define SIM_PCI_DEVICE_ID 0x233010DEU
#define SIM_PCI_SUBSYSTEM_ID 0x16C110DEU

nvmlDevice_t nvml_sim_handle(unsigned index) {
    return &handles[index];
}

nvmlReturn_t nvml_sim_device(nvmlDevice_t device, struct sim_state **state, unsigned *index) {
    *state = nvml_sim_initialized();
    if (*state == NULL) {
        return NVML_ERROR_UNINITIALIZED;
    }
    /* Compare addresses as integers: any pointer a caller passes may be checked safely. */
    uintptr_t offset = (uintptr_t)device - (uintptr_t)handles;
    if (device == NULL || (uintptr_t)device < (uintptr_t)handles || offset >= sizeof handles ||
        offset % sizeof handles[0] != 0) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *index = (unsigned)(offset / sizeof handles[0]);
    if (*index >= (*state)->device_count) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    /* A device fallen off the bus answers no query, as with the real driver. */
    return __atomic_load_n(&(*state)->devices[*index].lost, __ATOMIC_ACQUIRE)
               ? NVML_ERROR_GPU_IS_LOST
               : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    struct sim_state *state = nvml_sim_initialized();
    if (state == NULL) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (deviceCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *deviceCount = state->device_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) {
    return nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    struct sim_state *state = nvml_sim_initialized();
    if (state == NULL) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (device == NULL || index >= state->device_count) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *device = nvml_sim_handle(index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* "GPU-" and 36 characters; letters compare without case, as UUIDs are hex. */
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    struct sim_state *state = nvml_sim_initialized();
    if (state == NULL) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (uuid == NULL || device == NULL || strncasecmp(uuid, "GPU-", 4) != 0 ||
        strnlen(uuid, NVML_DEVICE_UUID_V2_BUFFER_SIZE) != 40) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned i = 0; i < state->device_count; i++) {
        if (strncasecmp(state->devices[i].config.uuid, uuid, 41) == 0) {
            *device = nvml_sim_handle(i);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* Accepts "domain:bus:device.function" (any domain width) and "bus:device.function". */
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    struct sim_state *state = nvml_sim_initialized();
    if (state == NULL) {
        return NVML_ERROR_UNINITIALIZED;
    }
    if (pciBusId == NULL || device == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned domain = 0;
    unsigned bus = 0;
    unsigned slot = 0;
    unsigned function = 0;
    int consumed = 0;
    if (!(sscanf(pciBusId, "%x:%x:%x.%x%n", &domain, &bus, &slot, &function, &consumed) == 4 &&
          pciBusId[consumed] == '\0')) {
        domain = 0;
        consumed = 0;
        if (!(sscanf(pciBusId, "%x:%x.%x%n", &bus, &slot, &function, &consumed) == 3 &&
              pciBusId[consumed] == '\0')) {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
    }
    for (unsigned i = 0; i < state->device_count; i++) {
        if (domain == 0 && bus == state->devices[i].config.pci_bus && slot == 0 &&
            function == 0) {
            *device = nvml_sim_handle(i);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    struct sim_state *state;
    unsigned found;
    nvmlReturn_t result = nvml_sim_device(device, &state, &found);
    if (result == NVML_SUCCESS && index == NULL) {
        result = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (result == NVML_SUCCESS) {
        *index = found;
    }
    return result;
}

/* Bounded copy of a config string: the state file is shared and might lack a NUL. */
static nvmlReturn_t copy_field(char *out, unsigned int length, const char *field, size_t size) {
    char text[128];
    snprintf(text, sizeof text, "%.*s", (int)(size < sizeof text ? size - 1 : sizeof text - 1),
             field);
    return nvml_sim_copy_string(out, length, text);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result != NVML_SUCCESS) {
        return result;
    }
    const struct sim_device_config *config = &state->devices[index].config;
    return copy_field(name, length, config->name, sizeof config->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result != NVML_SUCCESS) {
        return result;
    }
    const struct sim_device_config *config = &state->devices[index].config;
    return copy_field(uuid, length, config->uuid, sizeof config->uuid);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if (pci == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned bus = state->devices[index].config.pci_bus & 0xFFU;
    memset(pci, 0, sizeof *pci);
    pci->domain = 0;
    pci->bus = bus;
    pci->device = 0;
    pci->pciDeviceId = SIM_PCI_DEVICE_ID;
    pci->pciSubSystemId = SIM_PCI_SUBSYSTEM_ID;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", 0U, bus, 0U);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", 0U, bus, 0U);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

/* /dev/nvidia<minor>: the simulator numbers them by index. */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    return nvmlDeviceGetIndex(device, minorNumber);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if (major == NULL || minor == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *major = (int)state->devices[index].config.cc_major;
    *minor = (int)state->devices[index].config.cc_minor;
    return NVML_SUCCESS;
}

/* Persistence on, default compute mode: how shared data-center GPUs are set up. */
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result == NVML_SUCCESS && mode == NULL) {
        result = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (result == NVML_SUCCESS) {
        *mode = NVML_FEATURE_ENABLED;
    }
    return result;
}

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result == NVML_SUCCESS && mode == NULL) {
        result = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (result == NVML_SUCCESS) {
        *mode = NVML_COMPUTEMODE_DEFAULT;
    }
    return result;
}

/* The simulated devices have no MIG, like GPUs that cannot be partitioned. */
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result == NVML_SUCCESS && (currentMode == NULL || pendingMode == NULL)) {
        result = NVML_ERROR_INVALID_ARGUMENT;
    }
    return result == NVML_SUCCESS ? NVML_ERROR_NOT_SUPPORTED : result;
}
