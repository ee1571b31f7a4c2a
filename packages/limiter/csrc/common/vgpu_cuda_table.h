/* The entry-point table of cuda_api.h as data, and the cuGetProcAddress selection rule on it
 * (shared by the simulated driver, which implements it, and the limiter, which routes by it). */
#ifndef VGPU_CUDA_TABLE_H
#define VGPU_CUDA_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vgpu_cuda_entry {
    const char *symbol;
    const char *base;
    int version;
    bool per_thread;
};

/* In the order of VGPU_CUDA_API. */
extern const struct vgpu_cuda_entry vgpu_cuda_entries[];
extern const size_t vgpu_cuda_entry_count;

/* The entry cuGetProcAddress hands out for `base` asked at `cuda_version` with `flags`: the
 * newest version <= cuda_version, the per-thread-stream variant when the flags ask for it and
 * one exists. -1 when none; *known tells whether `base` exists at all. */
int vgpu_cuda_select(const char *base, int cuda_version, uint64_t flags, bool *known);

#endif
