// Host side of the TMA: the tensor map (CUtensorMap) of a row-major matrix of 16-bit elements,
// the box one cp.async.bulk.tensor.2d moves and its shared-memory swizzle. Encoded with the
// driver's cuTensorMapEncodeTiled, reached through the runtime (no -lcuda). The CPU emulator
// (tests/emulation/kernels/sm90/tensor_map.h) replaces this header with one that keeps the
// fields for its TMA copies.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flash_cuda {
namespace sm90 {

struct TensorMap2d {
    const void* base = nullptr;     // element (row 0, column 0), 16-byte aligned
    uint32_t elem_bytes = 2;        // 16-bit elements (fp16 / bf16 alike to the copy)
    uint64_t cols = 0, rows = 0;    // contiguous (inner) and outer extent, in elements
    uint64_t row_stride_bytes = 0;  // a multiple of 16
    uint32_t box_cols = 0, box_rows = 0;  // box_cols * elem_bytes <= 128 with the swizzle
    uint32_t swizzle_bytes = 128;   // 128 (the wgmma operand layout) or 0
};

// Fills *map; returns the driver's CUresult (CUDA_SUCCESS, 0, when the map is valid).
inline int encode_tensor_map_2d(CUtensorMap* map, const TensorMap2d& m) {
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
    if (m.elem_bytes != 2) return CUDA_ERROR_INVALID_VALUE;
    const cuuint64_t dims[2] = {m.cols, m.rows};
    const cuuint64_t strides[1] = {m.row_stride_bytes};
    const cuuint32_t box[2] = {m.box_cols, m.box_rows};
    const cuuint32_t elem_strides[2] = {1, 1};
    return static_cast<int>(encode(
        map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(m.base), dims, strides, box,
        elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
        m.swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

}  // namespace sm90
}  // namespace flash_cuda
