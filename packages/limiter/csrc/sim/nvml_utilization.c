/* Utilization from the devices' busy intervals.
 *
 * Device: gpu = percent of the last second during which a kernel ran (the real driver samples
 * over 1/6 s to 1 s); memory = 2/5 of that, as a compute-bound kernel would keep device memory
 * busy less often than the SMs.
 *
 * Per process: one sample per process that ran kernels in the window (lastSeenTimeStamp, now],
 * bounded to the last second; smUtil = that process's share of the window, at least 1 when it
 * ran at all (the real API returns only processes with non-zero utilization). Timestamps are
 * wall-clock microseconds (CLOCK_REALTIME), as the real driver's; the intervals are
 * CLOCK_MONOTONIC, so lastSeenTimeStamp is converted with the current offset between the two
 * clocks. Each sample is stamped with the time of the query: passing the largest timeStamp
 * back as lastSeenTimeStamp then asks for what ran since. */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "nvml_sim.h"

#define MEMORY_SHARE_NUM 2
#define MEMORY_SHARE_DEN 5

unsigned nvml_sim_busy_percent_locked(const struct sim_device *device, int32_t pid, uint64_t from,
                                      uint64_t to) {
    if (to <= from) {
        return 0;
    }
    uint64_t span = to - from;
    uint64_t busy = sim_busy_locked(device, pid, from, to);
    busy = busy < span ? busy : span;
    /* span is at most the window (1 s), so busy * 100 cannot overflow. */
    return (unsigned)((busy * 100 + span / 2) / span);
}

static uint64_t window_start(uint64_t now) {
    return now > NVML_SIM_WINDOW_NS ? now - NVML_SIM_WINDOW_NS : 0;
}

unsigned nvml_sim_gpu_percent(struct sim_state *state, unsigned index) {
    uint64_t now = sim_now_ns();
    sim_lock(state);
    unsigned percent =
        nvml_sim_busy_percent_locked(&state->devices[index], 0, window_start(now), now);
    sim_unlock(state);
    return percent;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if (utilization == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned gpu = nvml_sim_gpu_percent(state, index);
    utilization->gpu = gpu;
    utilization->memory = gpu * MEMORY_SHARE_NUM / MEMORY_SHARE_DEN;
    return NVML_SUCCESS;
}

static uint64_t realtime_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

/* A wall-clock microsecond timestamp as a CLOCK_MONOTONIC time; 0 when it lies before the
 * monotonic epoch, UINT64_MAX when it is out of range. */
static uint64_t monotonic_from_realtime_us(uint64_t timestamp_us, uint64_t mono_now,
                                           uint64_t real_now) {
    if (timestamp_us > UINT64_MAX / 1000) {
        return UINT64_MAX;
    }
    uint64_t real = timestamp_us * 1000;
    if (real_now >= mono_now) {
        uint64_t offset = real_now - mono_now;
        return real > offset ? real - offset : 0;
    }
    uint64_t offset = mono_now - real_now; /* a wall clock set before the boot time */
    return real > UINT64_MAX - offset ? UINT64_MAX : real + offset;
}

struct process_sample {
    int32_t pid;
    unsigned percent;
};

/* Processes with kernels in [from, to), newest interval first, each once. Under the lock. */
static unsigned sample_processes_locked(const struct sim_device *device, uint64_t from,
                                        uint64_t to,
                                        struct process_sample samples[SIM_MAX_PROCESSES]) {
    unsigned count = 0;
    uint64_t stored = device->interval_count < SIM_INTERVALS ? device->interval_count
                                                             : SIM_INTERVALS;
    for (uint64_t i = 0; i < stored && count < SIM_MAX_PROCESSES; i++) {
        const struct sim_interval *interval =
            &device->intervals[(device->interval_count - 1 - i) % SIM_INTERVALS];
        if (interval->end_ns <= from) {
            break; /* the timeline is in order: older intervals end earlier still */
        }
        if (interval->start_ns >= to) {
            continue; /* queued, not run yet */
        }
        bool seen = false;
        for (unsigned j = 0; j < count && !seen; j++) {
            seen = samples[j].pid == interval->pid;
        }
        if (!seen) {
            samples[count++] = (struct process_sample){interval->pid, 0};
        }
    }
    for (unsigned j = 0; j < count; j++) {
        unsigned percent = nvml_sim_busy_percent_locked(device, samples[j].pid, from, to);
        samples[j].percent = percent > 0 ? percent : 1;
    }
    return count;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp) {
    struct sim_state *state;
    unsigned index;
    nvmlReturn_t result = nvml_sim_device(device, &state, &index);
    if (result != NVML_SUCCESS) {
        return result;
    }
    if (processSamplesCount == NULL) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    uint64_t now = sim_now_ns();
    uint64_t real_now = realtime_ns();
    uint64_t from = window_start(now);
    uint64_t last_seen = monotonic_from_realtime_us(lastSeenTimeStamp, now, real_now);
    from = last_seen > from ? last_seen : from;

    struct process_sample samples[SIM_MAX_PROCESSES];
    unsigned count = 0;
    if (from < now) {
        sim_lock(state);
        count = sample_processes_locked(&state->devices[index], from, now, samples);
        sim_unlock(state);
    }
    if (count == 0) {
        *processSamplesCount = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    /* NULL asks for the size; a short buffer is told the size it needs. */
    if (utilization == NULL || *processSamplesCount < count) {
        *processSamplesCount = count;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < count; i++) {
        memset(&utilization[i], 0, sizeof utilization[i]);
        utilization[i].pid = (unsigned)samples[i].pid;
        utilization[i].timeStamp = real_now / 1000;
        utilization[i].smUtil = samples[i].percent;
        utilization[i].memUtil = samples[i].percent * MEMORY_SHARE_NUM / MEMORY_SHARE_DEN;
    }
    *processSamplesCount = count;
    return NVML_SUCCESS;
}
