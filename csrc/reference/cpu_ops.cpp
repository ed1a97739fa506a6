// CPU implementations of the flash_cuda ops: the same argument checks, in the same order, as the
// CUDA ops of flash_api.cpp, then the exact blockwise reference (reference/reference.h).
#include "checks.h"
#include "flash_api.h"
#include "reference/reference.h"
#include "rng.h"

namespace flash_cuda {
namespace {

reference::AttnOptions make_options(double softmax_scale, const MaskArgs& mask, double softcap,
                                    const OptTensor& alibi_slopes, double dropout_p,
                                    const PhiloxSeed& seed) {
    reference::AttnOptions opts;
    opts.softmax_scale = softmax_scale;
    opts.mask = mask;
    opts.softcap = softcap;
    opts.alibi_slopes = alibi_slopes;
    opts.dropout_p = dropout_p;
    opts.philox_seed = seed.seed;
    opts.philox_offset = seed.offset;
    return opts;
}

// (seed, offset) as int64 (2) on the CPU.
at::Tensor rng_state_tensor(const PhiloxSeed& seed) {
    at::Tensor t = at::empty({2}, at::TensorOptions().dtype(at::kLong));
    t.data_ptr<int64_t>()[0] = static_cast<int64_t>(seed.seed);
    t.data_ptr<int64_t>()[1] = static_cast<int64_t>(seed.offset);
    return t;
}

}  // namespace

FwdResult mha_fwd_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                      const OptTensor& alibi_slopes, double dropout_p, double softmax_scale,
                      bool causal, int64_t window_size_left, int64_t window_size_right,
                      double softcap, bool return_softmax, const OptTensor& rng_state,
                       bool /*deterministic: used by the backward*/) {
    const AttnDims dims = check_fwd_inputs(q, k, v);
    check_scalar_args(dropout_p, softmax_scale, window_size_left, window_size_right, softcap);
    check_alibi(alibi_slopes, q, dims);
    if (rng_state.has_value()) check_rng_state(*rng_state, q, "rng_state");
    const MaskArgs mask = normalize_mask(causal, window_size_left, window_size_right, dims.seqlen_k);
    const PhiloxSeed seed = philox_seed_for(q, rng_state, dropout_p, dims.batch * dims.heads);
    auto [out, lse, s_dmask] = reference::fwd(
        q, k, v, make_options(softmax_scale, mask, softcap, alibi_slopes, dropout_p, seed),
        return_softmax);
    return {out, lse, s_dmask, rng_state_tensor(seed)};
}

FwdResult mha_varlen_fwd_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                             const OptTensor& seqused_k, const OptTensor& block_table,
                             const OptTensor& alibi_slopes, int64_t max_seqlen_q,
                             int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                             bool causal, int64_t window_size_left, int64_t window_size_right,
                             double softcap, bool return_softmax, const OptTensor& rng_state,
                       bool /*deterministic: used by the backward*/) {
    const AttnDims dims = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                              block_table, max_seqlen_q, max_seqlen_k);
    check_scalar_args(dropout_p, softmax_scale, window_size_left, window_size_right, softcap);
    check_alibi(alibi_slopes, q, dims);
    if (rng_state.has_value()) check_rng_state(*rng_state, q, "rng_state");
    // As flash_attn: window sides are normalized with max_seqlen_k, then applied per sequence.
    const MaskArgs mask = normalize_mask(causal, window_size_left, window_size_right, max_seqlen_k);
    const PhiloxSeed seed = philox_seed_for(q, rng_state, dropout_p, dims.batch * dims.heads);
    auto [out, lse, s_dmask] = reference::varlen_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_q, max_seqlen_k,
        make_options(softmax_scale, mask, softcap, alibi_slopes, dropout_p, seed), return_softmax);
    return {out, lse, s_dmask, rng_state_tensor(seed)};
}

BwdResult mha_bwd_cpu(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& out, const Tensor& softmax_lse, const OptTensor& alibi_slopes,
                      double dropout_p, double softmax_scale, bool causal,
                      int64_t window_size_left, int64_t window_size_right, double softcap,
                      bool deterministic, const Tensor& rng_state) {
    const AttnDims dims = check_fwd_inputs(q, k, v);
    check_bwd_inputs(dout, q, out, softmax_lse, dims, /*varlen=*/false);
    check_scalar_args(dropout_p, softmax_scale, window_size_left, window_size_right, softcap);
    check_alibi(alibi_slopes, q, dims);
    check_rng_state(rng_state, q, "rng_state");
    const MaskArgs mask = normalize_mask(causal, window_size_left, window_size_right, dims.seqlen_k);
    (void)deterministic;  // the reference is always deterministic
    const PhiloxSeed seed = philox_seed_from_state(rng_state);
    return reference::bwd(dout, q, k, v, out, softmax_lse,
                          make_options(softmax_scale, mask, softcap, alibi_slopes, dropout_p, seed));
}

BwdResult mha_varlen_bwd_cpu(const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& softmax_lse,
                             const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                             const OptTensor& alibi_slopes, int64_t max_seqlen_q,
                             int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                             bool causal, int64_t window_size_left, int64_t window_size_right,
                             double softcap, bool deterministic, const Tensor& rng_state) {
    const AttnDims dims = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, std::nullopt,
                                              std::nullopt, max_seqlen_q, max_seqlen_k);
    check_bwd_inputs(dout, q, out, softmax_lse, dims, /*varlen=*/true);
    check_scalar_args(dropout_p, softmax_scale, window_size_left, window_size_right, softcap);
    check_alibi(alibi_slopes, q, dims);
    check_rng_state(rng_state, q, "rng_state");
    const MaskArgs mask = normalize_mask(causal, window_size_left, window_size_right, max_seqlen_k);
    (void)deterministic;
    const PhiloxSeed seed = philox_seed_from_state(rng_state);
    return reference::varlen_bwd(
        dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        make_options(softmax_scale, mask, softcap, alibi_slopes, dropout_p, seed));
}

std::tuple<Tensor, Tensor> mha_fwd_kvcache_cpu(
    const Tensor& q, Tensor& k_cache, Tensor& v_cache, const OptTensor& k, const OptTensor& v,
    const OptTensor& cache_seqlens, const OptTensor& rotary_cos, const OptTensor& rotary_sin,
    const OptTensor& cache_batch_idx, const OptTensor& cache_leftpad,
    const OptTensor& block_table, const OptTensor& alibi_slopes, double softmax_scale,
    bool causal, int64_t window_size_left, int64_t window_size_right, double softcap,
    bool rotary_interleaved, int64_t num_splits) {
    const AttnDims dims = check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens,
                                               rotary_cos, rotary_sin, cache_batch_idx,
                                               cache_leftpad, block_table, num_splits);
    check_scalar_args(0.0, softmax_scale, window_size_left, window_size_right, softcap);
    check_alibi(alibi_slopes, q, dims);
    // As flash_attn: normalized with the cache capacity (dims.seqlen_k), applied per sequence.
    const MaskArgs mask = normalize_mask(causal, window_size_left, window_size_right, dims.seqlen_k);
    return reference::kvcache(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin,
                              cache_batch_idx, cache_leftpad, block_table, rotary_interleaved,
                              make_options(softmax_scale, mask, softcap, alibi_slopes, 0.0,
                                           PhiloxSeed{}));
}

std::tuple<Tensor, Tensor> combine_splits_cpu(const Tensor& out_partial, const Tensor& lse_partial,
                                              at::ScalarType out_dtype) {
    check_combine_inputs(out_partial, lse_partial, out_dtype);
    return reference::combine_splits(out_partial, lse_partial, out_dtype);
}

}  // namespace flash_cuda
