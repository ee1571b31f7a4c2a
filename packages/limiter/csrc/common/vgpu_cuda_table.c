#include "vgpu_cuda_table.h"

#include <string.h>

#include "cuda_api.h"

enum { LEGACY = 0, PTSZ = 1 };

const struct vgpu_cuda_entry vgpu_cuda_entries[] = {
#define VGPU_TABLE_ENTRY(symbol, base, version, stream, params, args) \
    {#symbol, #base, version, stream == PTSZ},
    VGPU_CUDA_API(VGPU_TABLE_ENTRY)
#undef VGPU_TABLE_ENTRY
};

const size_t vgpu_cuda_entry_count = sizeof vgpu_cuda_entries / sizeof vgpu_cuda_entries[0];

int vgpu_cuda_select(const char *base, int cuda_version, uint64_t flags, bool *known) {
    bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1;
    *known = false;
    for (size_t i = 0; i < vgpu_cuda_entry_count; i++) {
        const struct vgpu_cuda_entry *candidate = &vgpu_cuda_entries[i];
        if (strcmp(candidate->base, base) != 0) {
            continue;
        }
        *known = true;
        if (candidate->version > cuda_version || (candidate->per_thread && !per_thread)) {
            continue;
        }
        const struct vgpu_cuda_entry *chosen = best < 0 ? NULL : &vgpu_cuda_entries[best];
        /* Prefer the requested stream kind, then the newest version. */
        if (chosen == NULL || (candidate->per_thread == per_thread && chosen->per_thread != per_thread) ||
            (candidate->per_thread == chosen->per_thread && candidate->version > chosen->version)) {
            best = (int)i;
        }
    }
    return best;
}
