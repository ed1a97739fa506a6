// Host side of the sm90 backward (kernels/sm90/bwd_sm90.cuh), shared by its launcher, flash_api.cpp
// and the CPU emulator: which calls the kernel covers, and the tensor maps of q, k, v and dO.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/params.h"
#include "kernels/sm90/fwd_sm90_host.h"

namespace flash_cuda {
namespace sm90 {

constexpr bool bwd_head_dim_supported(int d) { return d == 64 || d == 128 || d == 256; }

// Head dim 64, 128 or 256 exactly, no softcap, no dropout (those stay on the sm80 backward),
// deterministic only where dQ is split by columns (d >= 128: bwd_sm90.cuh DqTurns), at least one
// key row, grid limits; pointers and strides 16-byte aligned (the caller's).
inline bool bwd_supports(const BwdParams& p) {
    const bool varlen = p.cu_seqlens_q != nullptr;
    const bool has_keys = varlen ? p.total_k > 0 : p.seqlen_k > 0;
    const bool has_queries = varlen ? p.total_q > 0 : p.seqlen_q > 0;
    return bwd_head_dim_supported(p.d) && p.d == p.d_rounded && !(p.softcap > 0.f) &&
           p.p_keep >= 1.f && (!p.deterministic || p.d >= 128) && has_keys && has_queries &&
           p.is_seqlens_k_cumulative && p.b <= 65535 && p.h <= 65535;
}

// The forward's q, k, v maps and one of dO.
struct BwdTensorMaps : FwdTensorMaps {
    CUtensorMap d_o;
};

// Boxes of q_box_rows rows for q and dO, kv_box_rows rows for k and v.
inline int make_bwd_tensor_maps(const BwdParams& p, uint32_t q_box_rows, uint32_t kv_box_rows,
                                BwdTensorMaps* maps) {
    const int r = make_fwd_tensor_maps(p, q_box_rows, kv_box_rows, maps);
    if (r != 0) return r;
    const bool varlen = p.cu_seqlens_q != nullptr;
    return encode_rows_map(&maps->d_o, p.do_ptr, p.d, varlen ? p.total_q : p.seqlen_q, p.h, p.b,
                           varlen, p.do_row_stride, p.do_head_stride, p.do_batch_stride,
                           q_box_rows);
}

}  // namespace sm90
}  // namespace flash_cuda
