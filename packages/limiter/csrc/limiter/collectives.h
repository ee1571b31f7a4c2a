/* Which kernels are a collective's: no driver, so that it can be tested alone
 * (tests/c/limiter_pacing_test.c). */
#ifndef VGPU_LIMITER_COLLECTIVES_H
#define VGPU_LIMITER_COLLECTIVES_H

#include <stdbool.h>

/* Whether a kernel of this name (as cuFuncGetName gives it: C++ names mangled) is one of
 * NCCL's, which wait on the kernels of the same collective on other GPUs: ncclDevKernel_*
 * since NCCL 2.19, ncclKernel_* before. */
bool vgpu_collective_kernel_name(const char *name);

#endif
