// Host side of the TMA: the tensor map (CUtensorMap) of a strided tensor of 16-bit elements of
// rank 2 to 4, the box one cp.async.bulk.tensor copy moves and its shared-memory swizzle.
// Encoded with the driver's cuTensorMapEncodeTiled, reached through the runtime (no -lcuda). The
// CPU emulator (tests/emulation/kernels/sm90/tensor_map.h) replaces this header with one that
// keeps the fields for its TMA copies.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flash_cuda {
namespace sm90 {

struct TensorMapDesc {
    const void* base = nullptr;       // element (0, ..., 0), 16-byte aligned
    int rank = 2;                     // 2..4
    uint64_t dims[4] = {};            // extents, dims[0] the contiguous one (elements)
    uint64_t strides_bytes[4] = {};   // strides of dims 1..rank-1 in bytes (multiples of 16)
    uint32_t box[4] = {1, 1, 1, 1};   // box extents; box[0] * 2 <= 128 with the swizzle
    uint32_t swizzle_bytes = 128;     // 128 (the wgmma operand layout) or 0
};

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
    if (m.rank < 2 || m.rank > 4) return CUDA_ERROR_INVALID_VALUE;
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    return static_cast<int>(encode(
        map, CU_TENSOR_MAP_DATA_TYPE_UINT16, static_cast<cuuint32_t>(m.rank),
        const_cast<void*>(m.base), m.dims, m.strides_bytes + 1, m.box, elem_strides,
        CU_TENSOR_MAP_INTERLEAVE_NONE,
        m.swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

// A row-major (rows, cols) matrix with rows row_stride_bytes apart, boxes of box_rows x box_cols.
inline TensorMapDesc matrix_map(const void* base, uint64_t rows, uint64_t cols,
                                uint64_t row_stride_bytes, uint32_t box_rows, uint32_t box_cols) {
    TensorMapDesc m;
    m.base = base;
    m.rank = 2;
    m.dims[0] = cols;
    m.dims[1] = rows;
    m.strides_bytes[1] = row_stride_bytes;
    m.box[0] = box_cols;
    m.box[1] = box_rows;
    return m;
}

}  // namespace sm90
}  // namespace flash_cuda
