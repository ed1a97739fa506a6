// Host side of the TMA: a TensorMapDesc (tensor_map_desc.h) encoded into a CUtensorMap with the
// driver's cuTensorMapEncodeTiled, reached through the runtime (no -lcuda). The CPU emulator
// (tests/emulation/kernels/sm90/tensor_map.h) replaces this header with one that keeps the
// fields for its TMA copies.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/sm90/tensor_map_desc.h"

namespace flash_cuda {
namespace sm90 {

// Fills *map; returns the driver's CUresult (CUDA_SUCCESS, 0, when the map is valid).
inline int encode_tensor_map(CUtensorMap* map, const TensorMapDesc& m) {
    using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                     const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                     const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static EncodeTiled encode = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult status;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &status) != cudaSuccess ||
            status != cudaDriverEntryPointSuccess) {
            fn = nullptr;
        }
        return reinterpret_cast<EncodeTiled>(fn);
    }();
    if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
    if (m.rank < 2 || m.rank > 4 || (m.elem_bytes != 2 && m.elem_bytes != 4)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    auto run = [&] {
        return encode(
            map,
            m.elem_bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_UINT16,
            static_cast<cuuint32_t>(m.rank), const_cast<void*>(m.base), m.dims,
            m.strides_bytes + 1, m.box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            m.swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    };
    CUresult result = run();
    if (result == CUDA_ERROR_INVALID_CONTEXT) {
        // No context current on this thread yet (e.g. the autograd engine's device thread, whose
        // first CUDA work of the step this is: its allocations came from the caching allocator,
        // no runtime call bound the device's context). A runtime call binds the current device's
        // primary context; then again once.
        if (cudaFree(nullptr) == cudaSuccess) result = run();
    }
    return static_cast<int>(result);
}

}  // namespace sm90
}  // namespace flash_cuda
