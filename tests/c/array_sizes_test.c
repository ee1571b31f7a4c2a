/* What an array is charged (common/vgpu_cuda_sizes.c), built with its source and no driver:
 * every format of CUDA 12 and 13 by its layout, and one not known never as nothing. Prints
 * "N passed, M failed" and exits non-zero on failure. */
#include <stdint.h>

#include "unit_check.h"
#include "vgpu_cuda_sizes.h"

static uint64_t bytes(CUarray_format format, unsigned channels, size_t width, size_t height,
                      unsigned levels) {
    CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = width,
                                    .Height = height,
                                    .Depth = 0,
                                    .Format = format,
                                    .NumChannels = channels};
    return vgpu_array_bytes(&desc, levels);
}

int main(void) {
    /* The classic formats, as before. */
    CHECK(bytes(CU_AD_FORMAT_FLOAT, 4, 1024, 1024, 1) == 16ULL << 20);
    CHECK(bytes(CU_AD_FORMAT_UNSIGNED_INT8, 1, 2048, 2048, 3) ==
          2048 * 2048 + 1024 * 1024 + 512 * 512);
    CHECK(bytes(CU_AD_FORMAT_HALF, 2, 100, 0, 1) == 400);
    /* Normalized integer formats: their channels are in the name. */
    CHECK(bytes(CU_AD_FORMAT_UNORM_INT8X1, 1, 1000, 1000, 1) == 1000000);
    CHECK(bytes(CU_AD_FORMAT_SNORM_INT8X4, 4, 1000, 1000, 1) == 4000000);
    CHECK(bytes(CU_AD_FORMAT_UNORM_INT16X4, 4, 1000, 1000, 1) == 8000000);
    CHECK(bytes(CU_AD_FORMAT_SNORM_INT16X2, 2, 1000, 1000, 1) == 4000000);
    CHECK(bytes(CU_AD_FORMAT_UNORM_INT_101010_2, 4, 1000, 1000, 1) == 4000000);
    /* Block-compressed: 8 or 16 bytes per 4x4 block, a partial block whole. */
    CHECK(bytes(CU_AD_FORMAT_BC1_UNORM, 4, 1024, 1024, 1) == 256 * 256 * 8);
    CHECK(bytes(CU_AD_FORMAT_BC4_SNORM, 1, 1024, 1024, 1) == 256 * 256 * 8);
    CHECK(bytes(CU_AD_FORMAT_BC7_UNORM_SRGB, 4, 1024, 1024, 1) == 256 * 256 * 16);
    CHECK(bytes(CU_AD_FORMAT_BC6H_UF16, 3, 1024, 1024, 1) == 256 * 256 * 16);
    CHECK(bytes(CU_AD_FORMAT_BC2_UNORM, 4, 5, 5, 1) == 2 * 2 * 16);
    CHECK(bytes(CU_AD_FORMAT_BC3_UNORM, 4, 8, 8, 2) == 4 * 16 + 1 * 16);
    /* Video formats over all their planes. */
    CHECK(bytes(CU_AD_FORMAT_NV12, 3, 1920, 1080, 1) == 1920 * 1080 * 3 / 2);
    CHECK(bytes(CU_AD_FORMAT_UINT8_PLANAR_420, 3, 1920, 1080, 1) == 1920 * 1080 * 3 / 2);
    CHECK(bytes(CU_AD_FORMAT_P010, 3, 1920, 1080, 1) == 1920 * 1080 * 3);
    CHECK(bytes(CU_AD_FORMAT_UINT16_SEMIPLANAR_420, 3, 1920, 1080, 1) == 1920 * 1080 * 3);
    CHECK(bytes(CU_AD_FORMAT_NV16, 3, 1920, 1080, 1) == 1920 * 1080 * 2);
    CHECK(bytes(CU_AD_FORMAT_YUY2, 3, 1920, 1080, 1) == 1920 * 1080 * 2);
    CHECK(bytes(CU_AD_FORMAT_P216, 3, 1920, 1080, 1) == 1920 * 1080 * 4);
    CHECK(bytes(CU_AD_FORMAT_Y210, 3, 1920, 1080, 1) == 1920 * 1080 * 4);
    CHECK(bytes(CU_AD_FORMAT_Y444_PLANAR8, 3, 1920, 1080, 1) == 1920 * 1080 * 3);
    CHECK(bytes(CU_AD_FORMAT_YUV444_16bit_SemiPlanar, 3, 1920, 1080, 1) == 1920 * 1080 * 6);
    CHECK(bytes(CU_AD_FORMAT_UINT16_PLANAR_444, 3, 1920, 1080, 1) == 1920 * 1080 * 6);
    CHECK(bytes(CU_AD_FORMAT_AYUV, 4, 1920, 1080, 1) == 1920 * 1080 * 4);
    CHECK(bytes(CU_AD_FORMAT_Y416, 4, 1920, 1080, 1) == 1920 * 1080 * 8);
    /* Every format is charged something: at least half a byte a texel (BC1, BC4). */
    for (int format = 1; format <= 0xff; format++) {
        CHECK(bytes((CUarray_format)format, 1, 64, 64, 1) >= 64 * 64 / 2);
    }
    /* Not known, or a channel count the driver refuses: the largest element, never nothing. */
    CHECK(bytes((CUarray_format)0x4242, 1, 1000, 1000, 1) == 16000000);
    CHECK(bytes(CU_AD_FORMAT_FLOAT, 3, 1000, 1000, 1) == 16000000);
    /* Past 64 bits: more than any limit. */
    CHECK(bytes(CU_AD_FORMAT_FLOAT, 4, SIZE_MAX, SIZE_MAX, 1) == UINT64_MAX);
    return unit_report();
}
