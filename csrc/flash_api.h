// Implementations of the flash_cuda ops, one per backend. Schemas: torch_bindings.cpp.
//   *_cpu  : csrc/cpu/ (exact blockwise reference; the oracle and the path CPU tensors take)
//   *_cuda : csrc/flash_api.cpp (input checks, tensors -> params, kernel dispatch)
// Every implementation calls the shared argument checks of checks.h first.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

namespace flash_cuda {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using FwdResult = std::tuple<Tensor, Tensor, Tensor, Tensor>;  // out, lse, S_dmask, rng_state
using BwdResult = std::tuple<Tensor, Tensor, Tensor>;          // dq, dk, dv

#define FLASH_CUDA_DECLARE_OPS(SUFFIX)                                                            \
    FwdResult mha_fwd_##SUFFIX(const Tensor& q, const Tensor& k, const Tensor& v,                 \
                               const OptTensor& alibi_slopes, double dropout_p,                   \
                               double softmax_scale, bool causal, int64_t window_size_left,       \
                               int64_t window_size_right, double softcap, bool return_softmax,    \
                               const OptTensor& rng_state, bool deterministic);                   \
    FwdResult mha_varlen_fwd_##SUFFIX(                                                            \
        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,            \
        const Tensor& cu_seqlens_k, const OptTensor& seqused_k, const OptTensor& block_table,     \
        const OptTensor& alibi_slopes, int64_t max_seqlen_q, int64_t max_seqlen_k,                \
        double dropout_p, double softmax_scale, bool causal, int64_t window_size_left,            \
        int64_t window_size_right, double softcap, bool return_softmax,                           \
        const OptTensor& rng_state, bool deterministic);                                          \
    BwdResult mha_bwd_##SUFFIX(const Tensor& dout, const Tensor& q, const Tensor& k,              \
                               const Tensor& v, const Tensor& out, const Tensor& softmax_lse,     \
                               const OptTensor& alibi_slopes, double dropout_p,                   \
                               double softmax_scale, bool causal, int64_t window_size_left,       \
                               int64_t window_size_right, double softcap, bool deterministic,     \
                               const Tensor& rng_state);                                          \
    BwdResult mha_varlen_bwd_##SUFFIX(                                                            \
        const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, \
        const Tensor& softmax_lse, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,        \
        const OptTensor& alibi_slopes, int64_t max_seqlen_q, int64_t max_seqlen_k,               \
        double dropout_p, double softmax_scale, bool causal, int64_t window_size_left,            \
        int64_t window_size_right, double softcap, bool deterministic, const Tensor& rng_state);  \
    std::tuple<Tensor, Tensor> mha_fwd_kvcache_##SUFFIX(                                          \
        const Tensor& q, Tensor& k_cache, Tensor& v_cache, const OptTensor& k,                    \
        const OptTensor& v, const OptTensor& cache_seqlens, const OptTensor& rotary_cos,          \
        const OptTensor& rotary_sin, const OptTensor& cache_batch_idx,                            \
        const OptTensor& cache_leftpad, const OptTensor& block_table,                             \
        const OptTensor& alibi_slopes, double softmax_scale, bool causal,                         \
        int64_t window_size_left, int64_t window_size_right, double softcap,                      \
        bool rotary_interleaved, int64_t num_splits);                                             \
    std::tuple<Tensor, Tensor> combine_splits_##SUFFIX(                                           \
        const Tensor& out_partial, const Tensor& lse_partial, at::ScalarType out_dtype);

FLASH_CUDA_DECLARE_OPS(cpu)
FLASH_CUDA_DECLARE_OPS(cuda)

#undef FLASH_CUDA_DECLARE_OPS

// The kernel head dims this build has kernels for (FLASH_CUDA_HEADDIMS at build time), e.g.
// "64,128"; the others run the exact reference. flash_cuda._C.built_head_dims holds it.
std::string built_head_dims();

}  // namespace flash_cuda
