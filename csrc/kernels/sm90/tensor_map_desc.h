// What a TMA tensor map describes (TensorMapDesc): a strided tensor of 16-bit elements (or fp32:
// the backward's dQ accumulator, which TMA reductions add to) of rank 2 to 4, the box one
// cp.async.bulk.tensor copy moves and its shared-memory swizzle. Shared by
// kernels/sm90/tensor_map.h (encodes it with the driver) and the CPU emulator's replacement of
// that header (keeps it for its TMA copies).
#pragma once

#include <cstdint>

namespace flash_cuda {
namespace sm90 {

struct TensorMapDesc {
    const void* base = nullptr;       // element (0, ..., 0), 16-byte aligned
    int rank = 2;                     // 2..4
    uint64_t dims[4] = {};            // extents, dims[0] the contiguous one (elements)
    uint64_t strides_bytes[4] = {};   // strides of dims 1..rank-1 in bytes (multiples of 16)
    uint32_t box[4] = {1, 1, 1, 1};   // box extents; box[0] elem_bytes <= 128 with the swizzle
    uint32_t swizzle_bytes = 128;     // 128 (the wgmma operand layout) or 0
    uint32_t elem_bytes = 2;          // 2 (bf16 / fp16, moved as 16-bit words) or 4 (fp32)
};

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
