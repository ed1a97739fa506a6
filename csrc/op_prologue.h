// What every implementation of an attention op does first, on any backend: check the arguments
// (checks.h), normalise the mask the way flash_attn does, and fix the dropout RNG's (seed,
// offset). The CPU ops (reference/cpu_ops.cpp) and the CUDA ops (flash_api.cpp) both start here,
// so the two backends reject and interpret arguments identically.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "checks.h"
#include "reference/reference.h"
#include "rng.h"

namespace flash_cuda {

struct CheckedCall {
    AttnDims dims;
    reference::AttnOptions opts;  // scale, normalised mask, softcap, alibi, dropout + seed
    PhiloxSeed philox;            // the dropout seed as drawn (also on-device, graph capture)
};

using OptionalTensor = std::optional<at::Tensor>;

// fwd: draws (seed, offset) from the default generator of q's device unless rng_state is given.
CheckedCall fwd_prologue(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const OptionalTensor& alibi_slopes, double dropout_p,
                         double softmax_scale, bool causal, int64_t window_left,
                         int64_t window_right, double softcap, const OptionalTensor& rng_state);

// varlen_fwd: the window is normalised with max_seqlen_k.
CheckedCall varlen_fwd_prologue(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                const OptionalTensor& seqused_k,
                                const OptionalTensor& block_table,
                                const OptionalTensor& alibi_slopes, int64_t max_seqlen_q,
                                int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                                bool causal, int64_t window_left, int64_t window_right,
                                double softcap, const OptionalTensor& rng_state);

// bwd / varlen_bwd: (seed, offset) read from the forward's rng_state (only with dropout).
CheckedCall bwd_prologue(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& out,
                         const at::Tensor& softmax_lse, const OptionalTensor& alibi_slopes,
                         double dropout_p, double softmax_scale, bool causal,
                         int64_t window_left, int64_t window_right, double softcap,
                         const at::Tensor& rng_state);
CheckedCall varlen_bwd_prologue(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& out,
                                const at::Tensor& softmax_lse, const at::Tensor& cu_seqlens_q,
                                const at::Tensor& cu_seqlens_k,
                                const OptionalTensor& alibi_slopes, int64_t max_seqlen_q,
                                int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                                bool causal, int64_t window_left, int64_t window_right,
                                double softcap, const at::Tensor& rng_state);

// fwd_kvcache: the window is normalised with the cache capacity; no dropout.
CheckedCall kvcache_prologue(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const OptionalTensor& k,
                             const OptionalTensor& v, const OptionalTensor& cache_seqlens,
                             const OptionalTensor& rotary_cos, const OptionalTensor& rotary_sin,
                             const OptionalTensor& cache_batch_idx,
                             const OptionalTensor& cache_leftpad,
                             const OptionalTensor& block_table,
                             const OptionalTensor& alibi_slopes, double softmax_scale,
                             bool causal, int64_t window_left, int64_t window_right,
                             double softcap, int64_t num_splits);

// The (seed, offset) of a call as the int64 (2) rng_state output, on q's device.
at::Tensor rng_state_tensor(const at::Tensor& q, const reference::AttnOptions& opts);

}  // namespace flash_cuda
