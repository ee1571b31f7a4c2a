#include "vgpu_cuda_sizes.h"

uint64_t vgpu_array_element_bytes(CUarray_format format, unsigned channels) {
    uint64_t size;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: size = 1; break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: size = 2; break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: size = 4; break;
    default: return 0;
    }
    return channels == 1 || channels == 2 || channels == 4 ? size * channels : 0;
}

static uint64_t level_extent(size_t value, unsigned level) {
    uint64_t shifted = (uint64_t)value >> level;
    return shifted == 0 ? 1 : shifted;
}

uint64_t vgpu_array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels) {
    uint64_t element = vgpu_array_element_bytes(desc->Format, desc->NumChannels);
    uint64_t total = 0;
    for (unsigned level = 0; element != 0 && level < levels && level < 64; level++) {
        unsigned __int128 bytes = (unsigned __int128)level_extent(desc->Width, level) *
                                  level_extent(desc->Height, level) *
                                  level_extent(desc->Depth, level) * element;
        if (bytes > UINT64_MAX - total) {
            return 0;
        }
        total += (uint64_t)bytes;
    }
    return total;
}
