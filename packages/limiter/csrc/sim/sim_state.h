/* The simulated GPU's node-wide state: one file (VGPU_SIM_STATE) mapped by every process that
 * uses the simulated driver or NVML, so they all see the same devices, memory and busy time. */
#ifndef VGPU_SIM_STATE_H
#define VGPU_SIM_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define SIM_MAX_DEVICES 16
#define SIM_MAX_PROCESSES 256
#define SIM_INTERVALS 4096
#define SIM_STATE_MAGIC 0x31304d5355504756ULL /* "VGPUSM01" */
#define SIM_STATE_VERSION 3

struct sim_device_config {
    char name[96];
    char uuid[48];       /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    char pci_bus_id[32]; /* "00000000:18:00.0" */
    uint64_t total_memory;
    uint64_t context_overhead; /* device memory a context costs its process */
    uint32_t sm_count;
    uint32_t cc_major;
    uint32_t cc_minor;
    uint32_t pci_bus;
};

/* Kernel execution on a device's single timeline, by the process that queued it. */
struct sim_interval {
    uint64_t start_ns;
    uint64_t end_ns;
    int32_t pid;
    uint32_t reserved;
};

struct sim_device {
    struct sim_device_config config;
    uint64_t used_memory;   /* by all processes, context overheads included */
    uint64_t busy_until_ns; /* end of the last kernel queued on the device */
    uint64_t interval_count;
    uint64_t busy_total_ns; /* every kernel queued so far, those still ahead included */
    uint32_t lost;          /* nonzero: fallen off the bus, NVML's queries fail (vgpu_sim_set_lost) */
    uint32_t reserved;
    struct sim_interval intervals[SIM_INTERVALS]; /* ring: newest at (count - 1) % SIM_INTERVALS */
};

struct sim_process {
    int32_t pid; /* 0: free slot */
    uint32_t reserved;
    uint64_t start_time; /* /proc/<pid>/stat start time: a reused pid is another process */
    uint64_t memory[SIM_MAX_DEVICES];
    uint32_t contexts[SIM_MAX_DEVICES];
    uint64_t busy_ns[SIM_MAX_DEVICES];
};

struct sim_state {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;
    uint64_t total_size;
    uint32_t device_count;
    int32_t cuda_version;     /* as cuDriverGetVersion: 13000 */
    char driver_version[32];  /* as nvmlSystemGetDriverVersion: "580.95.05" */
    pthread_mutex_t lock;     /* robust and process-shared */
    struct sim_device devices[SIM_MAX_DEVICES];
    struct sim_process processes[SIM_MAX_PROCESSES];
};

/* The mapped state, created from VGPU_SIM_DEVICES on first use; NULL (after one line on
 * stderr) when the configuration or the file is bad. */
struct sim_state *sim_state(void);

void sim_lock(struct sim_state *state);
void sim_unlock(struct sim_state *state);

/* Gives the memory of processes that no longer exist back to their devices (under the lock). */
void sim_reap_locked(struct sim_state *state);

/* This process's slot, created on demand (under the lock); NULL when the table is full. */
struct sim_process *sim_self_locked(struct sim_state *state);

/* Charge or give back device memory for this process. Reserve fails (false) past capacity. */
bool sim_memory_reserve(int device, uint64_t bytes);
void sim_memory_release(int device, uint64_t bytes);

/* A context of this process on the device; each costs the device's context overhead. */
bool sim_context_attach(int device);
void sim_context_detach(int device);

/* Queue a kernel of `duration_ns` that may start at `ready_ns` or later; returns its end. */
uint64_t sim_enqueue(int device, uint64_t ready_ns, uint64_t duration_ns);

/* Busy nanoseconds of `pid` (0: anyone) on the device within [from, to). Under the lock. */
uint64_t sim_busy_locked(const struct sim_device *device, int32_t pid, uint64_t from, uint64_t to);

uint64_t sim_now_ns(void);
void sim_sleep_until(uint64_t deadline_ns);
bool sim_process_alive(int32_t pid, uint64_t start_time);

#endif
