// flash_cuda's public C++ API.
//
// Header-only: every function looks up the registered `flash_cuda::*` op in the PyTorch
// dispatcher and calls it, so the kernel that runs is the one registered for the inputs' device
// (the CUDA kernels, the CPU reference, or any other backend someone registers for these
// schemas); fwd / varlen_fwd record their backward for autograd when an input requires grad
// (the library's csrc/autograd.cpp), and tracing keys registered from Python apply as usual.
// The ops themselves live in the flash_cuda shared library (libflash_cuda.so from CMake, or
// flash_cuda/_C.abi3.so from setup.py), which registers them when it is loaded. Link it so that
// the linker keeps it (CMake: link the `flash_cuda::ops` target, which adds --no-as-needed),
// or dlopen it / `torch.ops.load_library` it before the first call; otherwise the lookup throws
// "Could not find schema for flash_cuda::fwd".
//
// Conventions (semantics: flash_attn 2.x; DESIGN.md section 4):
//   q (batch, seqlen_q, heads, head_dim), k/v (batch, seqlen_k, heads_k, head_dim), heads a
//   multiple of heads_k (GQA/MQA); varlen: q (total_q, heads, head_dim), k/v (total_k, heads_k,
//   head_dim), cu_seqlens int32 (batch + 1). softmax_lse is fp32 (batch, heads, seqlen_q), varlen
//   (heads, total_q). Window sides of -1 mean unbounded. rng_state int64 (2) = (seed, offset).
//   CUDA takes fp16/bf16; the CPU reference also takes fp32/fp64.
//   A softmax_scale of std::nullopt means 1 / sqrt(head_dim).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

namespace flash_cuda {

using OptionalTensor = std::optional<at::Tensor>;
// (out, softmax_lse, S_dmask, rng_state). S_dmask is empty unless return_softmax; rng_state is
// what a backward call needs to replay the dropout mask.
using FwdOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using BwdOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;  // (dq, dk, dv)

namespace detail {

// The C++ signatures of the registered kernels (csrc/flash_api.h); typed<>() checks them.
using FwdSig = FwdOutputs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const OptionalTensor&, double, double, bool, int64_t, int64_t, double,
                          bool, const OptionalTensor&, bool);
using VarlenFwdSig = FwdOutputs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, const at::Tensor&, const OptionalTensor&,
                                const OptionalTensor&, const OptionalTensor&, int64_t, int64_t,
                                double, double, bool, int64_t, int64_t, double, bool,
                                const OptionalTensor&, bool);
using BwdSig = BwdOutputs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const OptionalTensor&, double, double, bool, int64_t, int64_t, double,
                          bool, const at::Tensor&);
using VarlenBwdSig = BwdOutputs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, const at::Tensor&, const OptionalTensor&,
                                int64_t, int64_t, double, double, bool, int64_t, int64_t, double,
                                bool, const at::Tensor&);
using KvcacheSig = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, at::Tensor&, at::Tensor&, const OptionalTensor&, const OptionalTensor&,
    const OptionalTensor&, const OptionalTensor&, const OptionalTensor&, const OptionalTensor&,
    const OptionalTensor&, const OptionalTensor&, const OptionalTensor&, double, bool, int64_t,
    int64_t, double, bool, int64_t);
using CombineSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                      at::ScalarType);

// The op handle, looked up once (a failed lookup throws and is retried on the next call).
template <typename Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").template typed<Sig>();
}

inline double scale_or_default(std::optional<double> softmax_scale, const at::Tensor& q) {
    return softmax_scale ? *softmax_scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

}  // namespace detail

// Fixed-length forward. q (b, sq, h, d), k/v (b, sk, hk, d); alibi_slopes fp32 (h) or (b, h).
// Returns (out (b, sq, h, d), softmax_lse fp32 (b, h, sq), S_dmask, rng_state). With
// dropout_p > 0, rng_state = (seed, offset) replays a given mask; nullopt draws from the default
// generator of q's device. `deterministic` is recorded for the backward (autograd).
inline FwdOutputs fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const OptionalTensor& alibi_slopes = std::nullopt, double dropout_p = 0.0,
                      std::optional<double> softmax_scale = std::nullopt, bool causal = false,
                      int64_t window_size_left = -1, int64_t window_size_right = -1,
                      double softcap = 0.0, bool return_softmax = false,
                      const OptionalTensor& rng_state = std::nullopt,
                      bool deterministic = false) {
    static const auto handle = detail::op<detail::FwdSig>("flash_cuda::fwd");
    return handle.call(q, k, v, alibi_slopes, dropout_p,
                       detail::scale_or_default(softmax_scale, q), causal, window_size_left,
                       window_size_right, softcap, return_softmax, rng_state, deterministic);
}

// Variable-length forward over packed sequences. q (total_q, h, d), k/v (total_k, hk, d) or, with
// block_table int32 (b, max_blocks), paged k/v (num_blocks, page_size, hk, d); cu_seqlens_q/k
// int32 (b + 1); seqused_k int32 (b) optionally limits the keys used per sequence.
// Returns (out (total_q, h, d), softmax_lse fp32 (h, total_q), S_dmask, rng_state).
inline FwdOutputs varlen_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                             const OptionalTensor& seqused_k, const OptionalTensor& block_table,
                             const OptionalTensor& alibi_slopes, int64_t max_seqlen_q,
                             int64_t max_seqlen_k, double dropout_p = 0.0,
                             std::optional<double> softmax_scale = std::nullopt,
                             bool causal = false, int64_t window_size_left = -1,
                             int64_t window_size_right = -1, double softcap = 0.0,
                             bool return_softmax = false,
                             const OptionalTensor& rng_state = std::nullopt,
                             bool deterministic = false) {
    static const auto handle = detail::op<detail::VarlenFwdSig>("flash_cuda::varlen_fwd");
    return handle.call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
                       max_seqlen_q, max_seqlen_k, dropout_p,
                       detail::scale_or_default(softmax_scale, q), causal, window_size_left,
                       window_size_right, softcap, return_softmax, rng_state, deterministic);
}

// Fixed-length backward: dout/out like q, softmax_lse and rng_state as returned by fwd (pass the
// same mask arguments and scale). Returns (dq, dk, dv) shaped like q, k, v. deterministic=true
// asks for a reproducible dq accumulation order.
inline BwdOutputs bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& out, const at::Tensor& softmax_lse,
                      const OptionalTensor& alibi_slopes, double dropout_p,
                      double softmax_scale, bool causal, int64_t window_size_left,
                      int64_t window_size_right, double softcap, bool deterministic,
                      const at::Tensor& rng_state) {
    static const auto handle = detail::op<detail::BwdSig>("flash_cuda::bwd");
    return handle.call(dout, q, k, v, out, softmax_lse, alibi_slopes, dropout_p, softmax_scale,
                       causal, window_size_left, window_size_right, softcap, deterministic,
                       rng_state);
}

// Variable-length backward (layouts as varlen_fwd; softmax_lse (h, total_q)).
inline BwdOutputs varlen_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor& out,
                             const at::Tensor& softmax_lse, const at::Tensor& cu_seqlens_q,
                             const at::Tensor& cu_seqlens_k, const OptionalTensor& alibi_slopes,
                             int64_t max_seqlen_q, int64_t max_seqlen_k, double dropout_p,
                             double softmax_scale, bool causal, int64_t window_size_left,
                             int64_t window_size_right, double softcap, bool deterministic,
                             const at::Tensor& rng_state) {
    static const auto handle = detail::op<detail::VarlenBwdSig>("flash_cuda::varlen_bwd");
    return handle.call(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                       max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                       window_size_left, window_size_right, softcap, deterministic, rng_state);
}

// Decode / KV-cache forward. q (b, sq, h, d); k_cache/v_cache (b_cache, s_cache, hk, d), or paged
// (num_blocks, page_size, hk, d) with block_table int32 (b, max_blocks). New k/v (b, s_new, hk, d)
// are written into the caches IN PLACE at cache_seqlens (int32 (b)); rotary_cos/sin
// (s_ro, rotary_dim / 2) rotate q and the new k at their positions. num_splits = 0 picks the
// split-KV count. Returns (out (b, sq, h, d), softmax_lse fp32 (b, h, sq)).
inline std::tuple<at::Tensor, at::Tensor> fwd_kvcache(
    const at::Tensor& q, at::Tensor& k_cache, at::Tensor& v_cache,
    const OptionalTensor& k = std::nullopt, const OptionalTensor& v = std::nullopt,
    const OptionalTensor& cache_seqlens = std::nullopt,
    const OptionalTensor& rotary_cos = std::nullopt,
    const OptionalTensor& rotary_sin = std::nullopt,
    const OptionalTensor& cache_batch_idx = std::nullopt,
    const OptionalTensor& cache_leftpad = std::nullopt,
    const OptionalTensor& block_table = std::nullopt,
    const OptionalTensor& alibi_slopes = std::nullopt,
    std::optional<double> softmax_scale = std::nullopt, bool causal = false,
    int64_t window_size_left = -1, int64_t window_size_right = -1, double softcap = 0.0,
    bool rotary_interleaved = true, int64_t num_splits = 0) {
    static const auto handle = detail::op<detail::KvcacheSig>("flash_cuda::fwd_kvcache");
    return handle.call(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin,
                       cache_batch_idx, cache_leftpad, block_table, alibi_slopes,
                       detail::scale_or_default(softmax_scale, q), causal, window_size_left,
                       window_size_right, softcap, rotary_interleaved, num_splits);
}

// Merge split-KV partial results: out_partial fp32 (splits, b, h, sq, d), lse_partial fp32
// (splits, b, h, sq) -> (out (b, sq, h, d) in out_dtype, softmax_lse fp32 (b, h, sq)).
inline std::tuple<at::Tensor, at::Tensor> combine_splits(const at::Tensor& out_partial,
                                                         const at::Tensor& lse_partial,
                                                         at::ScalarType out_dtype) {
    static const auto handle = detail::op<detail::CombineSig>("flash_cuda::combine_splits");
    return handle.call(out_partial, lse_partial, out_dtype);
}

// Convenience: softmax(q k^T * scale) v, bottom-right-aligned causal mask if `causal`.
// q (b, sq, h, d), k/v (b, sk, hk, d) -> out (b, sq, h, d).
inline at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool causal = false,
                            std::optional<double> softmax_scale = std::nullopt) {
    return std::get<0>(fwd(q, k, v, std::nullopt, 0.0, softmax_scale, causal));
}

// Convenience: varlen attention without dropout / window / softcap. Returns out (total_q, h, d).
inline at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& cu_seqlens_q,
                                   const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                   int64_t max_seqlen_k, bool causal = false,
                                   std::optional<double> softmax_scale = std::nullopt) {
    return std::get<0>(varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, std::nullopt,
                                  std::nullopt, std::nullopt, max_seqlen_q, max_seqlen_k, 0.0,
                                  softmax_scale, causal));
}

}  // namespace flash_cuda
