/* Faults a test puts on the simulated node: a device that falls off the bus (every NVML query
 * of it answers NVML_ERROR_GPU_IS_LOST) and comes back. Not part of NVML: tf-limiter sim
 * lose-gpu calls it. */
#define _GNU_SOURCE
#include "nvml_sim.h"
#include "vgpu_export.h"

/* Marks device `index` of the node's state lost (nonzero) or back (0): 0, or -1 when the state
 * cannot be mapped or has no such device. Needs no nvmlInit. */
VGPU_EXPORT int vgpu_sim_set_lost(unsigned index, int lost) {
    struct sim_state *state = sim_state();
    if (state == NULL || index >= state->device_count) {
        return -1;
    }
    __atomic_store_n(&state->devices[index].lost, lost ? 1U : 0U, __ATOMIC_RELEASE);
    return 0;
}
