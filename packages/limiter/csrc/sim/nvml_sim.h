/* What the simulated NVML's files share: the initialization check, device handles, string
 * output and busy-time arithmetic over the node-wide state. */
#ifndef VGPU_NVML_SIM_H
#define VGPU_NVML_SIM_H

#include <stdint.h>

#include "nvml_abi.h"
#include "sim_state.h"

/* Utilization is measured over this trailing window, like the real driver's ~1 s sample period. */
#define NVML_SIM_WINDOW_NS 1000000000ULL

/* The state while NVML is initialized (reference count > 0); NULL otherwise. */
struct sim_state *nvml_sim_initialized(void);

/* Checks initialization and the handle: NVML_SUCCESS with the state and the device's index,
 * or the error the caller returns. */
nvmlReturn_t nvml_sim_device(nvmlDevice_t device, struct sim_state **state, unsigned *index);

/* The handle of device `index` (< SIM_MAX_DEVICES). */
nvmlDevice_t nvml_sim_handle(unsigned index);

/* Copies `text` with its NUL into `out` of `length` bytes, or reports why it cannot. */
nvmlReturn_t nvml_sim_copy_string(char *out, unsigned int length, const char *text);

/* Percent (0-100, rounded) of [from, to) during which `pid` (0: anyone) ran kernels on the
 * device. Under the lock. */
unsigned nvml_sim_busy_percent_locked(const struct sim_device *device, int32_t pid, uint64_t from,
                                      uint64_t to);

/* Device utilization over the last window; takes the lock. */
unsigned nvml_sim_gpu_percent(struct sim_state *state, unsigned index);

#endif
