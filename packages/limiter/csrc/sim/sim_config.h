/* The simulated machine's description, read from the environment when the state is created. */
#ifndef VGPU_SIM_CONFIG_H
#define VGPU_SIM_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "sim_state.h"

/* Fill the device table and versions of a new state from VGPU_SIM_DEVICES,
 * VGPU_SIM_DRIVER_VERSION and VGPU_SIM_CUDA_VERSION. On a bad value, false and a one-line
 * message naming the variable in `error`. */
bool sim_config_load(struct sim_state *state, char *error, size_t error_size);

#endif
