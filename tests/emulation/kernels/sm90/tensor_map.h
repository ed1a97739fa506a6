// Host emulation of csrc/kernels/sm90/tensor_map.h: the map keeps the TensorMap2d fields
// (checked like the driver checks them) for the emulated TMA copies (kernels/sm90/ptx_sm90.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>

namespace flash_cuda {
namespace sm90 {

struct TensorMap2d {
    const void* base = nullptr;
    uint32_t elem_bytes = 2;
    uint64_t cols = 0, rows = 0;
    uint64_t row_stride_bytes = 0;
    uint32_t box_cols = 0, box_rows = 0;
    uint32_t swizzle_bytes = 128;
};

constexpr uint64_t kEmuTensorMapMagic = 0x5445'4e53'4f52'4d41ull;  // "TENSORMA"

inline int encode_tensor_map_2d(CUtensorMap* map, const TensorMap2d& m) {
    const bool ok = m.base != nullptr && reinterpret_cast<uintptr_t>(m.base) % 16 == 0 &&
                    m.elem_bytes == 2 && m.row_stride_bytes % 16 == 0 && m.cols >= 1 &&
                    m.rows >= 1 && m.box_cols >= 1 && m.box_cols <= 256 && m.box_rows >= 1 &&
                    m.box_rows <= 256 && (m.box_cols * m.elem_bytes) % 16 == 0 &&
                    (m.swizzle_bytes == 0 || (m.swizzle_bytes == 128 &&
                                              m.box_cols * m.elem_bytes <= 128));
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    static_assert(sizeof(TensorMap2d) + 8 <= sizeof(CUtensorMap), "fields fit the opaque map");
    std::memset(map, 0, sizeof(CUtensorMap));
    std::memcpy(map, &kEmuTensorMapMagic, 8);
    std::memcpy(reinterpret_cast<unsigned char*>(map) + 8, &m, sizeof(m));
    return CUDA_SUCCESS;
}

inline const TensorMap2d& tensor_map_fields(const void* map) {
    uint64_t magic;
    std::memcpy(&magic, map, 8);
    if (magic != kEmuTensorMapMagic) emu::fail("TMA copy from a map not encoded", 0);
    return *reinterpret_cast<const TensorMap2d*>(static_cast<const unsigned char*>(map) + 8);
}

}  // namespace sm90
}  // namespace flash_cuda
