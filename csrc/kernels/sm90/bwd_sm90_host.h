// Host side of the sm90 backward (kernels/sm90/bwd_sm90.cuh), shared by its launcher, flash_api.cpp
// and the CPU emulator: which calls the kernel covers, and the tensor maps of q, k, v, dO and the
// dQ accumulator.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/env_switch.h"
#include "kernels/params.h"
#include "kernels/sm90/fwd_sm90_host.h"

namespace flash_cuda {
namespace sm90 {

constexpr bool bwd_head_dim_supported(int d) {
    return d == 64 || d == 128 || d == 192 || d == 256;
}

// The sm90 backward kernel that runs head dim d (a multiple of 8, at most 256): the smallest of 64
// / 128 / 192 / 256 that holds it, as the forward's fwd_kernel_head_dim. The tensor maps' column
// extent is d, so the TMA zero-fills Q, K, V and dO past it (S^T, dP^T exact; the padded columns
// of dQ, dK and dV come out zero), the dQ reductions clip at d, and dK / dV are stored with d
// columns (MHA) or into workspaces of the kernel's head dim (GQA; the caller sizes them from
// d_rounded, which it sets to this). fwd+bwd against the sm80 backward those calls ran before
// (bench/NOTES.md runs 212, 214, 215; an H100; the forward's change included, d160 / d192 then on
// the d256 kernel): d32 1.02-1.17x, d48 1.24-1.70x, d80-d112 1.13-2.06x, d160 1.06-1.49x, d192
// 1.18-1.64x, d224 1.52-2.35x; the d192 kernel against the d256 one at d160 / d192 (run 219, an
// H100): fwd+bwd 1.07-1.21x. d192 = false: d129-d192 on the d256 kernel too (as before the d192
// kernel, session 46). 0 when none holds d.
constexpr int bwd_kernel_head_dim(int d, bool d192 = true) {
    return d <= 0     ? 0
           : d <= 64  ? 64
           : d <= 128 ? 128
           : d <= 192 && d192 ? 192
           : d <= 256 ? 256
                      : 0;
}

// The kernel head dim of a call: bwd_kernel_head_dim, d129-d192 on the d256 kernel where
// FLASH_CUDA_SM90_BWD192=0 (an A/B switch; read per call).
inline int bwd_call_head_dim(const BwdParams& p) {
    return bwd_kernel_head_dim(p.d, env_choice("FLASH_CUDA_SM90_BWD192") != EnvChoice::kOff);
}

// A head dim of at most 256 (a multiple of 8; bwd_kernel_head_dim's kernel), no softcap, dropout
// only without ALiBi (those stay on the sm80 backward), at least one key row, grid limits;
// pointers and strides 16-byte aligned (the caller's).
inline bool bwd_supports(const BwdParams& p) {
    const bool varlen = p.cu_seqlens_q != nullptr;
    const bool has_keys = varlen ? p.total_k > 0 : p.seqlen_k > 0;
    const bool has_queries = varlen ? p.total_q > 0 : p.seqlen_q > 0;
    const bool dropout_ok = p.p_keep >= 1.f || p.alibi_slopes_ptr == nullptr;
    return bwd_kernel_head_dim(p.d) > 0 && p.d % 8 == 0 && !(p.softcap > 0.f) &&
           dropout_ok && has_keys && has_queries &&
           p.is_seqlens_k_cumulative && p.b <= 65535 && p.h <= 65535;
}

// The forward's q, k, v maps, one of dO and one of the dQ accumulator.
struct BwdTensorMaps : FwdTensorMaps {
    CUtensorMap d_o, dq_accum;
};

// Whether the call runs the main kernel without pingpong (BwdSm90Config's OrderedTraits; the
// same kernel as Traits at d256): deterministic=True, whose dQ turns need it, or
// FLASH_CUDA_SM90_BWD_PINGPONG=0 (an A/B switch; read per call).
inline bool bwd_sm90_ordered_kernel(const BwdParams& p) {
    return p.deterministic || env_choice("FLASH_CUDA_SM90_BWD_PINGPONG") == EnvChoice::kOff;
}

// The dQ accumulator as a 2-D fp32 map, for the main kernels' TMA reductions: its rows (b h
// seqlen_q_rounded, or varlen h total_q) of d_rounded floats, of which the first d are the map's
// columns (the reductions clip the padding), boxes of 32 columns x box_rows rows with the
// 128-byte swizzle (the layout the kernels stage dQ in).
inline int make_dq_accum_map(const BwdParams& p, uint32_t box_rows, CUtensorMap* map) {
    *map = CUtensorMap{};
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int64_t rows = varlen ? static_cast<int64_t>(p.h) * p.total_q
                                : static_cast<int64_t>(p.b) * p.h * p.seqlen_q_rounded;
    // The kernel's row coordinates are 32-bit (2^31 rows of fp32 would be >= 512 GB).
    if (rows >= (int64_t{1} << 31)) return CUDA_ERROR_INVALID_VALUE;
    TensorMapDesc m =
        matrix_map(p.dq_accum_ptr, static_cast<uint64_t>(rows), static_cast<uint64_t>(p.d),
                   static_cast<uint64_t>(p.d_rounded) * 4, box_rows, 32);
    m.elem_bytes = 4;
    return encode_tensor_map(map, m);
}

// Boxes of q_box_rows rows for q and dO, kv_box_rows rows for k and v.
inline int make_bwd_tensor_maps(const BwdParams& p, uint32_t q_box_rows, uint32_t kv_box_rows,
                                BwdTensorMaps* maps) {
    const int r = make_fwd_tensor_maps(p, q_box_rows, kv_box_rows, maps);
    if (r != 0) return r;
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int r_do = encode_rows_map(&maps->d_o, p.do_ptr, p.d, varlen ? p.total_q : p.seqlen_q,
                                     p.h, p.b, varlen, p.do_row_stride, p.do_head_stride,
                                     p.do_batch_stride, q_box_rows);
    return r_do != 0 ? r_do : make_dq_accum_map(p, q_box_rows, &maps->dq_accum);
}

}  // namespace sm90
}  // namespace flash_cuda
