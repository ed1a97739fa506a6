#include "op_prologue.h"

namespace flash_cuda {
namespace {

reference::AttnOptions make_options(double softmax_scale, const MaskArgs& mask, double softcap,
                                    const OptionalTensor& alibi_slopes, double dropout_p,
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

}  // namespace

CheckedCall fwd_prologue(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const OptionalTensor& alibi_slopes, double dropout_p,
                         double softmax_scale, bool causal, int64_t window_left,
                         int64_t window_right, double softcap, const OptionalTensor& rng_state) {
    const AttnDims dims = check_fwd_inputs(q, k, v);
    check_scalar_args(dropout_p, softmax_scale, window_left, window_right, softcap);
    check_alibi(alibi_slopes, q, dims);
    if (rng_state.has_value()) check_rng_state(*rng_state, q, "rng_state");
    const MaskArgs mask = normalize_mask(causal, window_left, window_right, dims.seqlen_k);
    const PhiloxSeed seed = philox_seed_for(q, rng_state, dropout_p, dims.batch * dims.heads);
    return {dims, make_options(softmax_scale, mask, softcap, alibi_slopes, dropout_p, seed), seed};
}

CheckedCall varlen_fwd_prologue(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                const OptionalTensor& seqused_k,
                                const OptionalTensor& block_table,
                                const OptionalTensor& alibi_slopes, int64_t max_seqlen_q,
                                int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                                bool causal, int64_t window_left, int64_t window_right,
                                double softcap, const OptionalTensor& rng_state) {
    const AttnDims dims = recheck_on_fresh_copies([&] {
        return check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                                   max_seqlen_q, max_seqlen_k);
    });
    check_scalar_args(dropout_p, softmax_scale, window_left, window_right, softcap);
    check_alibi(alibi_slopes, q, dims);
    if (rng_state.has_value()) check_rng_state(*rng_state, q, "rng_state");
    // flash_attn's rule: window sides normalised once with max_seqlen_k, then applied as is to
    // every sequence (with its own lengths) by the kernel and the reference alike.
    const MaskArgs mask = normalize_mask(causal, window_left, window_right, max_seqlen_k);
    const PhiloxSeed seed = philox_seed_for(q, rng_state, dropout_p, dims.batch * dims.heads);
    return {dims, make_options(softmax_scale, mask, softcap, alibi_slopes, dropout_p, seed), seed};
}

CheckedCall bwd_prologue(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& out,
                         const at::Tensor& softmax_lse, const OptionalTensor& alibi_slopes,
                         double dropout_p, double softmax_scale, bool causal,
                         int64_t window_left, int64_t window_right, double softcap,
                         const at::Tensor& rng_state) {
    const AttnDims dims = check_fwd_inputs(q, k, v);
    check_bwd_inputs(dout, q, out, softmax_lse, dims, /*varlen=*/false);
    check_scalar_args(dropout_p, softmax_scale, window_left, window_right, softcap);
    check_alibi(alibi_slopes, q, dims);
    check_rng_state(rng_state, q, "rng_state");
    const MaskArgs mask = normalize_mask(causal, window_left, window_right, dims.seqlen_k);
    // No copy of rng_state without dropout (a host sync, and not capturable in a CUDA graph).
    const PhiloxSeed seed = dropout_p > 0.0 ? philox_seed_from_state(rng_state) : PhiloxSeed{};
    return {dims, make_options(softmax_scale, mask, softcap, alibi_slopes, dropout_p, seed), seed};
}

CheckedCall varlen_bwd_prologue(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& out,
                                const at::Tensor& softmax_lse, const at::Tensor& cu_seqlens_q,
                                const at::Tensor& cu_seqlens_k,
                                const OptionalTensor& alibi_slopes, int64_t max_seqlen_q,
                                int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                                bool causal, int64_t window_left, int64_t window_right,
                                double softcap, const at::Tensor& rng_state) {
    const AttnDims dims = recheck_on_fresh_copies([&] {
        return check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, std::nullopt,
                                   std::nullopt, max_seqlen_q, max_seqlen_k);
    });
    check_bwd_inputs(dout, q, out, softmax_lse, dims, /*varlen=*/true);
    check_scalar_args(dropout_p, softmax_scale, window_left, window_right, softcap);
    check_alibi(alibi_slopes, q, dims);
    check_rng_state(rng_state, q, "rng_state");
    const MaskArgs mask = normalize_mask(causal, window_left, window_right, max_seqlen_k);
    // No copy of rng_state without dropout (a host sync, and not capturable in a CUDA graph).
    const PhiloxSeed seed = dropout_p > 0.0 ? philox_seed_from_state(rng_state) : PhiloxSeed{};
    return {dims, make_options(softmax_scale, mask, softcap, alibi_slopes, dropout_p, seed), seed};
}

CheckedCall kvcache_prologue(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const OptionalTensor& k,
                             const OptionalTensor& v, const OptionalTensor& cache_seqlens,
                             const OptionalTensor& rotary_cos, const OptionalTensor& rotary_sin,
                             const OptionalTensor& cache_batch_idx,
                             const OptionalTensor& cache_leftpad,
                             const OptionalTensor& block_table,
                             const OptionalTensor& alibi_slopes, double softmax_scale,
                             bool causal, int64_t window_left, int64_t window_right,
                             double softcap, int64_t num_splits) {
    struct Checked {
        AttnDims dims;
        MaskArgs mask;
    };
    const Checked c = recheck_on_fresh_copies([&] {
        at::Tensor cache_seqlens_host;  // one device-to-host copy, shared by both checks
        const AttnDims dims = check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens,
                                                   rotary_cos, rotary_sin, cache_batch_idx,
                                                   cache_leftpad, block_table, num_splits,
                                                   &cache_seqlens_host);
        check_scalar_args(0.0, softmax_scale, window_left, window_right, softcap);
        check_alibi(alibi_slopes, q, dims);
        // As flash_attn: normalised with the cache capacity (dims.seqlen_k), applied per sequence.
        const MaskArgs mask = normalize_mask(causal, window_left, window_right, dims.seqlen_k);
        check_kvcache_rotary_positions(
            q, cache_seqlens.has_value(), cache_seqlens_host, rotary_cos, dims.seqlen_k,
            mask.causal || mask.window_left >= 0 || mask.window_right >= 0);
        return Checked{dims, mask};
    });
    return {c.dims, make_options(softmax_scale, c.mask, softcap, alibi_slopes, 0.0, PhiloxSeed{}),
            PhiloxSeed{}};
}

at::Tensor rng_state_tensor(const at::Tensor& q, const reference::AttnOptions& opts) {
    if (opts.philox_seed == 0 && opts.philox_offset == 0) {
        // No dropout: a device-side fill, which a CUDA graph can capture.
        return at::zeros({2}, q.options().dtype(at::kLong));
    }
    at::Tensor t = at::empty({2}, at::TensorOptions().dtype(at::kLong));
    t.data_ptr<int64_t>()[0] = static_cast<int64_t>(opts.philox_seed);
    t.data_ptr<int64_t>()[1] = static_cast<int64_t>(opts.philox_offset);
    return q.is_cpu() ? t : t.to(q.device(), /*non_blocking=*/true);
}

}  // namespace flash_cuda
