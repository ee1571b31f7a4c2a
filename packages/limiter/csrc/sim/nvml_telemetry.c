/* Sensors and clocks. The simulator models no physics: each value moves linearly between an
 * idle and a full-load figure of an H100 SXM with the device's utilization over the last
 * second, so monitoring code sees numbers that react to work.
 *
 * Energy is counted from the busy time: the awake-idle power all along, plus the active power's
 * excess while a kernel runs. The active power is VGPU_SIM_ACTIVE_POWER_W (watts; default the
 * power limit): above the limit it stands for work that GPU Boost runs faster while the GPU is
 * partly idle than at the limit, which the daemon's boost estimate then sees. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "nvml_sim.h"

#define TEMP_IDLE_C 32U
#define TEMP_FULL_C 72U
#define TEMP_HOTSPOT_EXTRA_C 6U
#define POWER_IDLE_MW 72000U
#define POWER_LIMIT_MW 700000U
#define POWER_AWAKE_MW 126000U /* idle between kernels, clocks up: 18 % of the limit, as measured */
#define FAN_IDLE_PERCENT 30U
#define FAN_FULL_PERCENT 80U

struct clock_range {
    unsigned idle_mhz;
    unsigned max_mhz;
};

static const struct clock_range clocks[NVML_CLOCK_COUNT] = {
    [NVML_CLOCK_GRAPHICS] = {345, 1980},
    [NVML_CLOCK_SM] = {345, 1980},
    [NVML_CLOCK_MEM] = {2619, 2619},
    [NVML_CLOCK_VIDEO] = {765, 1755},
};

static unsigned between(unsigned idle, unsigned full, unsigned percent) {
    return idle + (unsigned)(((unsigned long long)(full - idle) * percent) / 100U);
}

/* Checks the call and gives the device's utilization, for functions with one output. */
static nvmlReturn_t load(nvmlDevice_t device, const void *out, unsigned *percent) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if (out == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *percent = nvml_sim_gpu_percent(state, index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                      unsigned int *temp) {
    unsigned percent;
    nvmlReturn_t result = load(device, temp, &percent);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if (sensorType != NVML_TEMPERATURE_GPU && sensorType != NVML_TEMPERATURE_GPU_MAX) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    *temp = between(TEMP_IDLE_C, TEMP_FULL_C, percent) +
            (sensorType == NVML_TEMPERATURE_GPU_MAX ? TEMP_HOTSPOT_EXTRA_C : 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    unsigned percent;
    nvmlReturn_t result = load(device, power, &percent);
    if (result == NVML_SUCCESS) {
        *power = between(POWER_IDLE_MW, POWER_LIMIT_MW, percent);
    }
    return result;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    unsigned percent;
    nvmlReturn_t result = load(device, limit, &percent);
    if (result == NVML_SUCCESS) {
        *limit = POWER_LIMIT_MW;
    }
    return result;
}

static unsigned long long active_power_mw(void) {
    const char *text = getenv("VGPU_SIM_ACTIVE_POWER_W");
    char *end = NULL;
    unsigned long watts = text != NULL ? strtoul(text, &end, 10) : 0;
    bool valid = text != NULL && end != text && *end == '\0' && watts >= 1 && watts <= 5000;
    return valid ? watts * 1000ULL : POWER_LIMIT_MW;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    static _Atomic unsigned long long reported[SIM_MAX_DEVICES]; /* the counter never goes back */
    struct sim_state *state;
    unsigned index, percent;
    nvmlReturn_t result = load(device, energy, &percent);
    if (result != NVML_SUCCESS) {
        return result;
    }
    nvml_sim_device(device, &state, &index);
    uint64_t now = sim_now_ns();
    sim_lock(state);
    const struct sim_device *target = &state->devices[index];
    uint64_t ahead = target->busy_until_ns > now ? target->busy_until_ns - now : 0;
    uint64_t busy = target->busy_total_ns > ahead ? target->busy_total_ns - ahead : 0;
    sim_unlock(state);
    unsigned long long active = active_power_mw();
    double extra_mw = active > POWER_AWAKE_MW ? (double)(active - POWER_AWAKE_MW) : 0.0;
    /* mW × s = mJ */
    unsigned long long total =
        (unsigned long long)(((double)POWER_AWAKE_MW * (double)now + extra_mw * (double)busy) / 1e9);
    unsigned long long last = atomic_load(&reported[index]);
    while (total > last && !atomic_compare_exchange_weak(&reported[index], &last, total)) {
    }
    *energy = total > last ? total : last;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) {
    return nvmlDeviceGetEnforcedPowerLimit(device, limit);
}

static nvmlReturn_t clock_info(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock,
                               bool current) {
    unsigned percent;
    nvmlReturn_t result = load(device, clock, &percent);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if ((unsigned)type >= NVML_CLOCK_COUNT) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    const struct clock_range *range = &clocks[type];
    *clock = current ? between(range->idle_mhz, range->max_mhz, percent) : range->max_mhz;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                    unsigned int *clock) {
    return clock_info(device, type, clock, true);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                       unsigned int *clock) {
    return clock_info(device, type, clock, false);
}

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    unsigned percent;
    nvmlReturn_t result = load(device, speed, &percent);
    if (result == NVML_SUCCESS) {
        *speed = between(FAN_IDLE_PERCENT, FAN_FULL_PERCENT, percent);
    }
    return result;
}

/* Data-center GPUs in persistence mode stay in P0, busy or not. */
nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState) {
    unsigned percent;
    nvmlReturn_t result = load(device, pState, &percent);
    if (result == NVML_SUCCESS) {
        *pState = NVML_PSTATE_0;
    }
    return result;
}

nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *pState) {
    return nvmlDeviceGetPerformanceState(device, pState);
}
