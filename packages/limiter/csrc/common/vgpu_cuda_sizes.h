/* Device memory that CUDA objects hold, shared by the simulated driver (which charges it) and the
 * limiter (which must charge the same). */
#ifndef VGPU_CUDA_SIZES_H
#define VGPU_CUDA_SIZES_H

#include <stdint.h>

#include "cuda_abi.h"

/* Allocations are rounded up to this page size by the driver. */
#define VGPU_PAGE_SIZE (2ULL << 20)

static inline uint64_t vgpu_round_up(uint64_t value, uint64_t unit) {
    return (value + unit - 1) / unit * unit;
}

/* Bytes of one array element (format × channels); 0 for a format or channel count that the
 * driver refuses. */
uint64_t vgpu_array_element_bytes(CUarray_format format, unsigned channels);

/* Bytes of `levels` mip levels of an array (a plain array has one); each level halves every
 * dimension (at least 1), a 0 height or depth means a lower-dimensional array. Every format of
 * CUDA 12 and 13 is counted by its layout; one not known here as the largest element there is,
 * never as nothing. UINT64_MAX on overflow (which no limit lets through). */
uint64_t vgpu_array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels);

#endif
