// The exact blockwise reference: online-softmax attention written with ATen tensor ops, tiled over
// keys so no seqlen_q x seqlen_k score matrix is ever held (memory linear in the sequence length).
// It is device-generic: the CPU ops are exactly this, and the CUDA ops fall back to it where no
// hand-written kernel covers a case yet. It is also the oracle every kernel is tested against.
//
// All functions take inputs already validated by checks.h, compute in fp32 (fp64 for fp64
// inputs) and return results in the input dtype; lse is always fp32 (the ops' contract). For fp64
// inputs bwd recomputes lse in fp64 from q and k (an fp32 lse would limit the gradients to ~1e-7).
// Implementation: blockwise.h/.cpp (the tiled online-softmax core), attention.cpp (fwd, bwd,
// varlen), kvcache.cpp, combine.cpp, dropout.cpp (the philox.cuh keep-mask of a tile).
// Semantics (DESIGN.md section 4, flash_attn 2.x): bottom-right aligned causal/window masks,
// softcap before masking, ALiBi bias -slope * |i + sk - sq - j|, rows with no visible key give
// out = 0 and lse = +inf, dropout mask of philox.cuh scaled by 1 / (1 - p).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "checks.h"

namespace flash_cuda::reference {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Everything that shapes the score matrix and the softmax, for one call.
struct AttnOptions {
    double softmax_scale = 1.0;
    MaskArgs mask{false, -1, -1};  // already normalized with normalize_mask
    double softcap = 0.0;          // 0 = off
    OptTensor alibi_slopes;        // fp32 (h) or (b, h)
    double dropout_p = 0.0;
    uint64_t philox_seed = 0;
    uint64_t philox_offset = 0;
};

// q (b, sq, h, d), k/v (b, sk, hk, d) -> out (b, sq, h, d), lse fp32 (b, h, sq),
// S_dmask (b, h, round128(sq), round128(sk)) when return_softmax (else an empty tensor).
std::tuple<Tensor, Tensor, Tensor> fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const AttnOptions& opts, bool return_softmax);

// Gradients of fwd: dq (b, sq, h, d), dk/dv (b, sk, hk, d); recomputes scores from lse.
std::tuple<Tensor, Tensor, Tensor> bwd(const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       const AttnOptions& opts);

// q (total_q, h, d), k/v (total_k, hk, d) or paged (num_blocks, page, hk, d) + block_table.
// -> out (total_q, h, d), lse fp32 (h, total_q), S_dmask (b, h, round128(max_sq), round128(max_sk)).
std::tuple<Tensor, Tensor, Tensor> varlen_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& cu_seqlens_q,
                                              const Tensor& cu_seqlens_k,
                                              const OptTensor& seqused_k,
                                              const OptTensor& block_table, int64_t max_seqlen_q,
                                              int64_t max_seqlen_k, const AttnOptions& opts,
                                              bool return_softmax);

std::tuple<Tensor, Tensor, Tensor> varlen_bwd(const Tensor& dout, const Tensor& q,
                                              const Tensor& k, const Tensor& v, const Tensor& out,
                                              const Tensor& lse, const Tensor& cu_seqlens_q,
                                              const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                              int64_t max_seqlen_k, const AttnOptions& opts);

// KV-cache attention: appends k/v (rotary applied to k) into the caches in place at
// cache_seqlens, rotates q, and attends over each sequence's keys. -> out (b, sq, h, d), lse.
std::tuple<Tensor, Tensor> kvcache(const Tensor& q, Tensor& k_cache, Tensor& v_cache,
                                   const OptTensor& k, const OptTensor& v,
                                   const OptTensor& cache_seqlens, const OptTensor& rotary_cos,
                                   const OptTensor& rotary_sin, const OptTensor& cache_batch_idx,
                                   const OptTensor& cache_leftpad, const OptTensor& block_table,
                                   bool rotary_interleaved, const AttnOptions& opts);

// out_partial fp32 (splits, b, h, sq, d), lse_partial (splits, b, h, sq)
// -> out (b, sq, h, d) in out_dtype, lse (b, h, sq).
std::tuple<Tensor, Tensor> combine_splits(const Tensor& out_partial, const Tensor& lse_partial,
                                          at::ScalarType out_dtype);

}  // namespace flash_cuda::reference
