/* The subset of the NVML ABI that vgpu uses, declared here so that building needs no CUDA
 * toolkit. Names, values and layouts follow the driver's nvml.h (NVML API 13); the limiter
 * intercepts calls that pass these structs, so every layout is checked below.
 *
 * VGPU_NVML_API is the one table of entry points: X(symbol, return_type, params, args).
 * symbol is the exported ABI name: nvml.h maps the plain names of some functions to versioned
 * ones (nvmlInit -> nvmlInit_v2), and old binaries still call the plain ones, so both appear. */
#ifndef VGPU_NVML_ABI_H
#define VGPU_NVML_ABI_H

#include <stddef.h>

#define NVML_API_VERSION 13

/* Every nvmlReturn_t with its value. The enum derives from it; -Wswitch holds the sim's
 * nvmlErrorString to it. */
#define VGPU_NVML_RETURNS(X) \
    X(NVML_SUCCESS, 0) \
    X(NVML_ERROR_UNINITIALIZED, 1) \
    X(NVML_ERROR_INVALID_ARGUMENT, 2) \
    X(NVML_ERROR_NOT_SUPPORTED, 3) \
    X(NVML_ERROR_NO_PERMISSION, 4) \
    X(NVML_ERROR_ALREADY_INITIALIZED, 5) \
    X(NVML_ERROR_NOT_FOUND, 6) \
    X(NVML_ERROR_INSUFFICIENT_SIZE, 7) \
    X(NVML_ERROR_INSUFFICIENT_POWER, 8) \
    X(NVML_ERROR_DRIVER_NOT_LOADED, 9) \
    X(NVML_ERROR_TIMEOUT, 10) \
    X(NVML_ERROR_IRQ_ISSUE, 11) \
    X(NVML_ERROR_LIBRARY_NOT_FOUND, 12) \
    X(NVML_ERROR_FUNCTION_NOT_FOUND, 13) \
    X(NVML_ERROR_CORRUPTED_INFOROM, 14) \
    X(NVML_ERROR_GPU_IS_LOST, 15) \
    X(NVML_ERROR_RESET_REQUIRED, 16) \
    X(NVML_ERROR_OPERATING_SYSTEM, 17) \
    X(NVML_ERROR_LIB_RM_VERSION_MISMATCH, 18) \
    X(NVML_ERROR_IN_USE, 19) \
    X(NVML_ERROR_MEMORY, 20) \
    X(NVML_ERROR_NO_DATA, 21) \
    X(NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, 22) \
    X(NVML_ERROR_INSUFFICIENT_RESOURCES, 23) \
    X(NVML_ERROR_FREQ_NOT_SUPPORTED, 24) \
    X(NVML_ERROR_ARGUMENT_VERSION_MISMATCH, 25) \
    X(NVML_ERROR_DEPRECATED, 26) \
    X(NVML_ERROR_NOT_READY, 27) \
    X(NVML_ERROR_GPU_NOT_FOUND, 28) \
    X(NVML_ERROR_INVALID_STATE, 29) \
    X(NVML_ERROR_RESET_TYPE_NOT_SUPPORTED, 30) \
    X(NVML_ERROR_UNKNOWN, 999)

typedef enum nvmlReturn_enum {
#define VGPU_NVML_RETURN_ENUM(name, value) name = value,
    VGPU_NVML_RETURNS(VGPU_NVML_RETURN_ENUM)
#undef VGPU_NVML_RETURN_ENUM
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;

/* Buffer sizes callers are told to use (the terminating NUL included). */
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_UUID_BUFFER_SIZE 80
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_BUFFER_SIZE 64
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE 80

#define NVML_INIT_FLAG_NO_GPUS (1U << 0)
#define NVML_INIT_FLAG_NO_ATTACH (1U << 1)
#define NVML_INIT_FLAG_FORCE_INIT (1U << 2)

#define NVML_VALUE_NOT_AVAILABLE (-1)

/* Versioned structs carry sizeof(struct) | version << 24 in their first field. */
#define NVML_STRUCT_VERSION(data, ver) \
    (unsigned int)(sizeof(nvml##data##_v##ver##_t) | ((unsigned int)(ver) << 24U))

typedef enum nvmlEnableState_enum {
    NVML_FEATURE_DISABLED = 0,
    NVML_FEATURE_ENABLED = 1,
} nvmlEnableState_t;

typedef enum nvmlTemperatureSensors_enum {
    NVML_TEMPERATURE_GPU = 0,
    NVML_TEMPERATURE_GPU_MAX = 1,
    NVML_TEMPERATURE_COUNT,
} nvmlTemperatureSensors_t;

typedef enum nvmlComputeMode_enum {
    NVML_COMPUTEMODE_DEFAULT = 0,
    NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1,
    NVML_COMPUTEMODE_PROHIBITED = 2,
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3,
    NVML_COMPUTEMODE_COUNT,
} nvmlComputeMode_t;

typedef enum nvmlClockType_enum {
    NVML_CLOCK_GRAPHICS = 0,
    NVML_CLOCK_SM = 1,
    NVML_CLOCK_MEM = 2,
    NVML_CLOCK_VIDEO = 3,
    NVML_CLOCK_COUNT,
} nvmlClockType_t;

typedef enum nvmlPStates_enum {
    NVML_PSTATE_0 = 0,
    NVML_PSTATE_1 = 1,
    NVML_PSTATE_2 = 2,
    NVML_PSTATE_3 = 3,
    NVML_PSTATE_4 = 4,
    NVML_PSTATE_5 = 5,
    NVML_PSTATE_6 = 6,
    NVML_PSTATE_7 = 7,
    NVML_PSTATE_8 = 8,
    NVML_PSTATE_9 = 9,
    NVML_PSTATE_10 = 10,
    NVML_PSTATE_11 = 11,
    NVML_PSTATE_12 = 12,
    NVML_PSTATE_13 = 13,
    NVML_PSTATE_14 = 14,
    NVML_PSTATE_15 = 15,
    NVML_PSTATE_UNKNOWN = 32,
} nvmlPstates_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE]; /* "%04X:%02X:%02X.0" */
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId; /* device id << 16 | vendor id */
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE]; /* "%08X:%02X:%02X.0" */
} nvmlPciInfo_t;

typedef struct nvmlUtilization_st {
    unsigned int gpu;    /* percent of the sample period with a kernel running */
    unsigned int memory; /* percent of the sample period with device memory being accessed */
} nvmlUtilization_t;

/* v1: used includes what the driver reserves; total = free + used. */
typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* v2: the caller sets version = nvmlMemory_v2; reserved is reported apart from used. */
typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

/* Layout of the unversioned nvmlDeviceGetComputeRunningProcesses (before _v2). */
typedef struct nvmlProcessInfo_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* _v2 and _v3 of the process queries; the instance ids are 0xFFFFFFFF outside MIG. */
typedef struct nvmlProcessInfo_v2_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t, nvmlProcessInfo_t;

/* nvmlDeviceGetRunningProcessDetailList (R550 on): the list nvidia-smi reads. */
typedef struct nvmlProcessDetail_v1_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;

typedef struct nvmlProcessDetailList_v1_st {
    unsigned int version;
    unsigned int mode; /* NVML_PROCESS_MODE_* */
    unsigned int numProcArrayEntries;
    nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_v1_t, nvmlProcessDetailList_t;

#define nvmlProcessDetailList_v1 NVML_STRUCT_VERSION(ProcessDetailList, 1)
#define NVML_PROCESS_MODE_COMPUTE 0U
#define NVML_PROCESS_MODE_GRAPHICS 1U
#define NVML_PROCESS_MODE_MPS 2U

typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp; /* CPU time in microseconds (wall clock) */
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

/* The layouts of the official header on LP64 Linux. */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t.busId");
_Static_assert(sizeof(nvmlUtilization_t) == 8, "nvmlUtilization_t");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t");
_Static_assert(offsetof(nvmlMemory_v2_t, total) == 8, "nvmlMemory_v2_t.total");
_Static_assert(nvmlMemory_v2 == 0x02000028U, "nvmlMemory_v2");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(offsetof(nvmlProcessInfo_v2_t, gpuInstanceId) == 16, "gpuInstanceId");
_Static_assert(sizeof(nvmlProcessDetail_v1_t) == 32, "nvmlProcessDetail_v1_t");
_Static_assert(sizeof(nvmlProcessDetailList_v1_t) == 24, "nvmlProcessDetailList_v1_t");
_Static_assert(nvmlProcessDetailList_v1 == 0x01000018U, "nvmlProcessDetailList_v1");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t");
_Static_assert(offsetof(nvmlProcessUtilizationSample_t, smUtil) == 16, "smUtil");

#define VGPU_NVML_API(X) \
    X(nvmlInit, nvmlReturn_t, (void), ()) \
    X(nvmlInit_v2, nvmlReturn_t, (void), ()) \
    X(nvmlInitWithFlags, nvmlReturn_t, (unsigned int flags), (flags)) \
    X(nvmlShutdown, nvmlReturn_t, (void), ()) \
    X(nvmlErrorString, const char *, (nvmlReturn_t result), (result)) \
    X(nvmlSystemGetDriverVersion, nvmlReturn_t, (char *version, unsigned int length), (version, length)) \
    X(nvmlSystemGetNVMLVersion, nvmlReturn_t, (char *version, unsigned int length), (version, length)) \
    X(nvmlSystemGetCudaDriverVersion, nvmlReturn_t, (int *cudaDriverVersion), (cudaDriverVersion)) \
    X(nvmlSystemGetCudaDriverVersion_v2, nvmlReturn_t, (int *cudaDriverVersion), (cudaDriverVersion)) \
    X(nvmlDeviceGetCount, nvmlReturn_t, (unsigned int *deviceCount), (deviceCount)) \
    X(nvmlDeviceGetCount_v2, nvmlReturn_t, (unsigned int *deviceCount), (deviceCount)) \
    X(nvmlDeviceGetHandleByIndex, nvmlReturn_t, (unsigned int index, nvmlDevice_t *device), (index, device)) \
    X(nvmlDeviceGetHandleByIndex_v2, nvmlReturn_t, (unsigned int index, nvmlDevice_t *device), (index, device)) \
    X(nvmlDeviceGetHandleByUUID, nvmlReturn_t, (const char *uuid, nvmlDevice_t *device), (uuid, device)) \
    X(nvmlDeviceGetHandleByPciBusId, nvmlReturn_t, (const char *pciBusId, nvmlDevice_t *device), \
      (pciBusId, device)) \
    X(nvmlDeviceGetHandleByPciBusId_v2, nvmlReturn_t, (const char *pciBusId, nvmlDevice_t *device), \
      (pciBusId, device)) \
    X(nvmlDeviceGetIndex, nvmlReturn_t, (nvmlDevice_t device, unsigned int *index), (device, index)) \
    X(nvmlDeviceGetName, nvmlReturn_t, (nvmlDevice_t device, char *name, unsigned int length), \
      (device, name, length)) \
    X(nvmlDeviceGetUUID, nvmlReturn_t, (nvmlDevice_t device, char *uuid, unsigned int length), \
      (device, uuid, length)) \
    X(nvmlDeviceGetPciInfo_v2, nvmlReturn_t, (nvmlDevice_t device, nvmlPciInfo_t *pci), (device, pci)) \
    X(nvmlDeviceGetPciInfo_v3, nvmlReturn_t, (nvmlDevice_t device, nvmlPciInfo_t *pci), (device, pci)) \
    X(nvmlDeviceGetMinorNumber, nvmlReturn_t, (nvmlDevice_t device, unsigned int *minorNumber), \
      (device, minorNumber)) \
    X(nvmlDeviceGetCudaComputeCapability, nvmlReturn_t, (nvmlDevice_t device, int *major, int *minor), \
      (device, major, minor)) \
    X(nvmlDeviceGetPersistenceMode, nvmlReturn_t, (nvmlDevice_t device, nvmlEnableState_t *mode), \
      (device, mode)) \
    X(nvmlDeviceGetComputeMode, nvmlReturn_t, (nvmlDevice_t device, nvmlComputeMode_t *mode), (device, mode)) \
    X(nvmlDeviceGetMigMode, nvmlReturn_t, \
      (nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode), \
      (device, currentMode, pendingMode)) \
    X(nvmlDeviceGetMemoryInfo, nvmlReturn_t, (nvmlDevice_t device, nvmlMemory_t *memory), (device, memory)) \
    X(nvmlDeviceGetMemoryInfo_v2, nvmlReturn_t, (nvmlDevice_t device, nvmlMemory_v2_t *memory), \
      (device, memory)) \
    X(nvmlDeviceGetComputeRunningProcesses, nvmlReturn_t, \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos), (device, infoCount, infos)) \
    X(nvmlDeviceGetComputeRunningProcesses_v2, nvmlReturn_t, \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos), (device, infoCount, infos)) \
    X(nvmlDeviceGetComputeRunningProcesses_v3, nvmlReturn_t, \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos), (device, infoCount, infos)) \
    X(nvmlDeviceGetGraphicsRunningProcesses, nvmlReturn_t, \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos), (device, infoCount, infos)) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlReturn_t, \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos), (device, infoCount, infos)) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlReturn_t, \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos), (device, infoCount, infos)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses, nvmlReturn_t, \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos), (device, infoCount, infos)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlReturn_t, \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v2_t *infos), (device, infoCount, infos)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlReturn_t, \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos), (device, infoCount, infos)) \
    X(nvmlDeviceGetRunningProcessDetailList, nvmlReturn_t, \
      (nvmlDevice_t device, nvmlProcessDetailList_t *plist), (device, plist)) \
    X(nvmlDeviceGetUtilizationRates, nvmlReturn_t, (nvmlDevice_t device, nvmlUtilization_t *utilization), \
      (device, utilization)) \
    X(nvmlDeviceGetProcessUtilization, nvmlReturn_t, \
      (nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization, unsigned int *processSamplesCount, \
       unsigned long long lastSeenTimeStamp), \
      (device, utilization, processSamplesCount, lastSeenTimeStamp)) \
    X(nvmlDeviceGetTemperature, nvmlReturn_t, \
      (nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp), (device, sensorType, temp)) \
    X(nvmlDeviceGetPowerUsage, nvmlReturn_t, (nvmlDevice_t device, unsigned int *power), (device, power)) \
    X(nvmlDeviceGetEnforcedPowerLimit, nvmlReturn_t, (nvmlDevice_t device, unsigned int *limit), (device, limit)) \
    X(nvmlDeviceGetTotalEnergyConsumption, nvmlReturn_t, (nvmlDevice_t device, unsigned long long *energy), \
      (device, energy)) \
    X(nvmlDeviceGetPowerManagementLimit, nvmlReturn_t, (nvmlDevice_t device, unsigned int *limit), \
      (device, limit)) \
    X(nvmlDeviceGetClockInfo, nvmlReturn_t, (nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock), \
      (device, type, clock)) \
    X(nvmlDeviceGetMaxClockInfo, nvmlReturn_t, (nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock), \
      (device, type, clock)) \
    X(nvmlDeviceGetFanSpeed, nvmlReturn_t, (nvmlDevice_t device, unsigned int *speed), (device, speed)) \
    X(nvmlDeviceGetPerformanceState, nvmlReturn_t, (nvmlDevice_t device, nvmlPstates_t *pState), (device, pState)) \
    X(nvmlDeviceGetPowerState, nvmlReturn_t, (nvmlDevice_t device, nvmlPstates_t *pState), (device, pState))

/* A library that defines these (the simulated NVML, or the limiter's wrappers) is built with
 * VGPU_API_VISIBILITY=VGPU_EXPORT to export them. */
#include "vgpu_export.h"
#ifndef VGPU_API_VISIBILITY
#define VGPU_API_VISIBILITY
#endif
#define VGPU_NVML_DECLARE(symbol, return_type, params, args) \
    VGPU_API_VISIBILITY return_type symbol params;
VGPU_NVML_API(VGPU_NVML_DECLARE)
#undef VGPU_NVML_DECLARE

#endif
