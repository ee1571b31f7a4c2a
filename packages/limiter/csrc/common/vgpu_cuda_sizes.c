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

/* How a format lays its texels out: blocks of width x height texels, `bytes` each. Planar and
 * semi-planar video formats are counted over all their planes (4:2:0 chroma adds half the luma,
 * 4:2:2 as much, 4:4:4 twice), packed 4:2:2 ones by their pairs of texels. */
struct layout {
    unsigned width;
    unsigned height;
    uint64_t bytes;
};

/* The largest element of any format (four 32-bit channels): what a format not known here is
 * charged per texel, as the driver may well take it now and it must never be charged nothing. */
#define LARGEST_ELEMENT 16

static struct layout layout_of(CUarray_format format, unsigned channels) {
    uint64_t element = vgpu_array_element_bytes(format, channels);
    if (element != 0) {
        return (struct layout){1, 1, element};
    }
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return (struct layout){1, 1, 4}; /* refused channel count */
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return (struct layout){1, 1, 8};
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1: return (struct layout){1, 1, 1};
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1: return (struct layout){1, 1, 2};
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
    case CU_AD_FORMAT_UNORM_INT_101010_2:
    case CU_AD_FORMAT_AYUV:
    case CU_AD_FORMAT_Y410:
    case CU_AD_FORMAT_UINT8_PACKED_444: return (struct layout){1, 1, 4};
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
    case CU_AD_FORMAT_Y416: return (struct layout){1, 1, 8};
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC1_UNORM_SRGB:
    case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM: return (struct layout){4, 4, 8};
    case CU_AD_FORMAT_BC2_UNORM:
    case CU_AD_FORMAT_BC2_UNORM_SRGB:
    case CU_AD_FORMAT_BC3_UNORM:
    case CU_AD_FORMAT_BC3_UNORM_SRGB:
    case CU_AD_FORMAT_BC5_UNORM:
    case CU_AD_FORMAT_BC5_SNORM:
    case CU_AD_FORMAT_BC6H_UF16:
    case CU_AD_FORMAT_BC6H_SF16:
    case CU_AD_FORMAT_BC7_UNORM:
    case CU_AD_FORMAT_BC7_UNORM_SRGB: return (struct layout){4, 4, 16};
    case CU_AD_FORMAT_NV12:
    case CU_AD_FORMAT_UINT8_SEMIPLANAR_420:
    case CU_AD_FORMAT_UINT8_PLANAR_420: return (struct layout){2, 2, 6};
    case CU_AD_FORMAT_P010:
    case CU_AD_FORMAT_P016:
    case CU_AD_FORMAT_UINT16_SEMIPLANAR_420:
    case CU_AD_FORMAT_UINT16_PLANAR_420: return (struct layout){2, 2, 12};
    case CU_AD_FORMAT_NV16:
    case CU_AD_FORMAT_UINT8_SEMIPLANAR_422:
    case CU_AD_FORMAT_UINT8_PLANAR_422:
    case CU_AD_FORMAT_YUY2:
    case CU_AD_FORMAT_UINT8_PACKED_422: return (struct layout){2, 1, 4};
    case CU_AD_FORMAT_P210:
    case CU_AD_FORMAT_P216:
    case CU_AD_FORMAT_UINT16_SEMIPLANAR_422:
    case CU_AD_FORMAT_UINT16_PLANAR_422:
    case CU_AD_FORMAT_Y210:
    case CU_AD_FORMAT_Y216: return (struct layout){2, 1, 8};
    case CU_AD_FORMAT_Y444_PLANAR8:
    case CU_AD_FORMAT_YUV444_8bit_SemiPlanar:
    case CU_AD_FORMAT_UINT8_SEMIPLANAR_444:
    case CU_AD_FORMAT_UINT8_PLANAR_444: return (struct layout){1, 1, 3};
    case CU_AD_FORMAT_Y444_PLANAR10:
    case CU_AD_FORMAT_YUV444_16bit_SemiPlanar:
    case CU_AD_FORMAT_UINT16_SEMIPLANAR_444:
    case CU_AD_FORMAT_UINT16_PLANAR_444: return (struct layout){1, 1, 6};
    default: return (struct layout){1, 1, LARGEST_ELEMENT};
    }
}

static uint64_t level_extent(size_t value, unsigned level) {
    uint64_t shifted = (uint64_t)value >> level;
    return shifted == 0 ? 1 : shifted;
}

/* Whole blocks: a partial block at an edge takes as much as a full one. */
static uint64_t blocks(uint64_t extent, unsigned block) {
    return extent / block + (extent % block != 0);
}

uint64_t vgpu_array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels) {
    struct layout layout = layout_of(desc->Format, desc->NumChannels);
    uint64_t total = 0;
    for (unsigned level = 0; level < levels && level < 64; level++) {
        unsigned __int128 bytes = (unsigned __int128)blocks(level_extent(desc->Width, level),
                                                            layout.width) *
                                  blocks(level_extent(desc->Height, level), layout.height) *
                                  level_extent(desc->Depth, level) * layout.bytes;
        if (bytes > UINT64_MAX - total) {
            return UINT64_MAX;
        }
        total += (uint64_t)bytes;
    }
    return total;
}
