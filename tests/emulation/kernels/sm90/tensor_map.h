// Host emulation of csrc/kernels/sm90/tensor_map.h: the map keeps the TensorMapDesc fields
// (checked like the driver checks them) for the emulated TMA copies (kernels/sm90/ptx_sm90.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>

#include "kernels/sm90/tensor_map_desc.h"

namespace flash_cuda {
namespace sm90 {

constexpr uint64_t kEmuTensorMapMagic = 0x5445'4e53'4f52'4d41ull;  // "TENSORMA"

inline int encode_tensor_map(CUtensorMap* map, const TensorMapDesc& m) {
    bool ok = m.base != nullptr && reinterpret_cast<uintptr_t>(m.base) % 16 == 0 && m.rank >= 2 &&
              m.rank <= 4 && (m.elem_bytes == 2 || m.elem_bytes == 4) &&
              (m.box[0] * m.elem_bytes) % 16 == 0 &&
              (m.swizzle_bytes == 0 || (m.swizzle_bytes == 128 && m.box[0] * m.elem_bytes <= 128));
    for (int i = 0; i < m.rank; ++i) {
        ok = ok && m.dims[i] >= 1 && m.box[i] >= 1 && m.box[i] <= 256;
        if (i > 0) ok = ok && m.strides_bytes[i] % 16 == 0 && m.strides_bytes[i] < (1ull << 40);
    }
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    static_assert(sizeof(TensorMapDesc) + 8 <= sizeof(CUtensorMap), "fields fit the opaque map");
    std::memset(map, 0, sizeof(CUtensorMap));
    std::memcpy(map, &kEmuTensorMapMagic, 8);
    std::memcpy(reinterpret_cast<unsigned char*>(map) + 8, &m, sizeof(m));
    return CUDA_SUCCESS;
}

inline const TensorMapDesc& tensor_map_fields(const void* map) {
    uint64_t magic;
    std::memcpy(&magic, map, 8);
    if (magic != kEmuTensorMapMagic) emu::fail("TMA copy from a map not encoded", 0);
    return *reinterpret_cast<const TensorMapDesc*>(static_cast<const unsigned char*>(map) + 8);
}

}  // namespace sm90
}  // namespace flash_cuda
