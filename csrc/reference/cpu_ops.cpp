// CPU implementations of the flash_cuda ops: the shared prologue (checks, mask, RNG; the same as
// the CUDA ops of flash_api.cpp), then the exact blockwise reference (reference/reference.h).
#include "flash_api.h"
#include "op_prologue.h"
#include "reference/reference.h"

namespace flash_cuda {

FwdResult mha_fwd_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                      const OptTensor& alibi_slopes, double dropout_p, double softmax_scale,
                      bool causal, int64_t window_size_left, int64_t window_size_right,
                      double softcap, bool return_softmax, const OptTensor& rng_state,
                      bool /*deterministic: used by the backward*/) {
    const CheckedCall call = fwd_prologue(q, k, v, alibi_slopes, dropout_p, softmax_scale, causal,
                                          window_size_left, window_size_right, softcap, rng_state);
    auto [out, lse, s_dmask] = reference::fwd(q, k, v, call.opts, return_softmax);
    return {out, lse, s_dmask, rng_state_tensor(q, call.opts)};
}

FwdResult mha_varlen_fwd_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                             const OptTensor& seqused_k, const OptTensor& block_table,
                             const OptTensor& alibi_slopes, int64_t max_seqlen_q,
                             int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                             bool causal, int64_t window_size_left, int64_t window_size_right,
                             double softcap, bool return_softmax, const OptTensor& rng_state,
                             bool /*deterministic: used by the backward*/) {
    const CheckedCall call = varlen_fwd_prologue(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
        softcap, rng_state);
    auto [out, lse, s_dmask] =
        reference::varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                              max_seqlen_q, max_seqlen_k, call.opts, return_softmax);
    return {out, lse, s_dmask, rng_state_tensor(q, call.opts)};
}

BwdResult mha_bwd_cpu(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& out, const Tensor& softmax_lse, const OptTensor& alibi_slopes,
                      double dropout_p, double softmax_scale, bool causal,
                      int64_t window_size_left, int64_t window_size_right, double softcap,
                      bool /*deterministic: the reference always is*/, const Tensor& rng_state) {
    const CheckedCall call =
        bwd_prologue(dout, q, k, v, out, softmax_lse, alibi_slopes, dropout_p, softmax_scale,
                     causal, window_size_left, window_size_right, softcap, rng_state);
    return reference::bwd(dout, q, k, v, out, softmax_lse, call.opts);
}

BwdResult mha_varlen_bwd_cpu(const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& softmax_lse,
                             const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                             const OptTensor& alibi_slopes, int64_t max_seqlen_q,
                             int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                             bool causal, int64_t window_size_left, int64_t window_size_right,
                             double softcap, bool /*deterministic: the reference always is*/,
                             const Tensor& rng_state) {
    const CheckedCall call = varlen_bwd_prologue(
        dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
        softcap, rng_state);
    return reference::varlen_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                                 max_seqlen_q, max_seqlen_k, call.opts);
}

std::tuple<Tensor, Tensor> mha_fwd_kvcache_cpu(
    const Tensor& q, Tensor& k_cache, Tensor& v_cache, const OptTensor& k, const OptTensor& v,
    const OptTensor& cache_seqlens, const OptTensor& rotary_cos, const OptTensor& rotary_sin,
    const OptTensor& cache_batch_idx, const OptTensor& cache_leftpad,
    const OptTensor& block_table, const OptTensor& alibi_slopes, double softmax_scale,
    bool causal, int64_t window_size_left, int64_t window_size_right, double softcap,
    bool rotary_interleaved, int64_t num_splits) {
    const CheckedCall call = kvcache_prologue(
        q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin, cache_batch_idx,
        cache_leftpad, block_table, alibi_slopes, softmax_scale, causal, window_size_left,
        window_size_right, softcap, num_splits);
    return reference::kvcache(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin,
                              cache_batch_idx, cache_leftpad, block_table, rotary_interleaved,
                              call.opts);
}

std::tuple<Tensor, Tensor> combine_splits_cpu(const Tensor& out_partial, const Tensor& lse_partial,
                                              at::ScalarType out_dtype) {
    check_combine_inputs(out_partial, lse_partial, out_dtype);
    return reference::combine_splits(out_partial, lse_partial, out_dtype);
}

}  // namespace flash_cuda
