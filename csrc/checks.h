// Argument checks shared by every backend of every op. Each failure raises a Python-visible
// exception (TypeError for dtypes, ValueError for shapes and values, RuntimeError otherwise)
// naming the argument and the rule, before any kernel runs and before anything is written.
//
// Value checks that read tensor contents (cu_seqlens monotone, max_seqlen, block_table range,
// cache bounds) copy a few integers to the host. On CUDA they are skipped while a CUDA graph is
// being captured and when the environment sets FLASH_CUDA_CHECK_VALUES=0 (no host sync then);
// a CUDA tensor's copy is kept while PyTorch has not modified the tensor (checks.cpp HostCopies;
// FLASH_CUDA_CHECK_VALUES=always copies every call).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace flash_cuda {

// Sizes of one attention call, after the shape checks.
struct AttnDims {
    int64_t batch = 0;
    int64_t seqlen_q = 0;  // fixed length; varlen: max_seqlen_q
    int64_t seqlen_k = 0;  // fixed length; varlen: max_seqlen_k
    int64_t heads = 0;
    int64_t heads_k = 0;
    int64_t head_dim = 0;
    int64_t total_q = 0;  // varlen only
};

// Mask arguments in canonical form (flash_attn's rules): window sides >= seqlen_k become -1
// (unbounded), causal means window_right = 0, and causal is set when left = -1 and right = 0.
struct MaskArgs {
    bool causal;
    int64_t window_left;
    int64_t window_right;
};
MaskArgs normalize_mask(bool causal, int64_t window_left, int64_t window_right, int64_t seqlen_k);

// Scalar arguments common to the attention ops.
void check_scalar_args(double dropout_p, double softmax_scale, int64_t window_left,
                       int64_t window_right, double softcap);

// q (b, sq, h, d), k/v (b, sk, hk, d).
AttnDims check_fwd_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// q (total_q, h, d), k/v (total_k, hk, d) or paged (num_blocks, page, hk, d) with block_table
// int32 (b, max_blocks); cu_seqlens int32 (b + 1); seqused_k int32 (b).
AttnDims check_varlen_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                             const std::optional<at::Tensor>& seqused_k,
                             const std::optional<at::Tensor>& block_table, int64_t max_seqlen_q,
                             int64_t max_seqlen_k);

// alibi_slopes fp32 (h) or (b, h) on q's device.
void check_alibi(const std::optional<at::Tensor>& alibi_slopes, const at::Tensor& q,
                 const AttnDims& dims);

// rng_state int64 (2) on q's device.
void check_rng_state(const at::Tensor& rng_state, const at::Tensor& q, const char* name);

// dout and out shaped like q, lse fp32 (b, h, sq) or (h, total_q) for varlen.
void check_bwd_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out,
                      const at::Tensor& softmax_lse, const AttnDims& dims, bool varlen);

// Everything fwd_kvcache takes; returns the dims with seqlen_k = the cache capacity per sequence.
// cache_seqlens_host (if given) receives the host copy of cache_seqlens the value checks made
// (undefined when they did not run), for check_kvcache_rotary_positions.
AttnDims check_kvcache_inputs(const at::Tensor& q, const at::Tensor& k_cache,
                              const at::Tensor& v_cache, const std::optional<at::Tensor>& k,
                              const std::optional<at::Tensor>& v,
                              const std::optional<at::Tensor>& cache_seqlens,
                              const std::optional<at::Tensor>& rotary_cos,
                              const std::optional<at::Tensor>& rotary_sin,
                              const std::optional<at::Tensor>& cache_batch_idx,
                              const std::optional<at::Tensor>& cache_leftpad,
                              const std::optional<at::Tensor>& block_table, int64_t num_splits,
                              at::Tensor* cache_seqlens_host = nullptr);

// fwd_kvcache with rotary: every query row's position (cache_seqlens[b], + row when per_row, i.e.
// with a causal or local mask; the cache length without cache_seqlens) is in the cos/sin table.
// cache_seqlens_host: check_kvcache_inputs' host copy (undefined: value checks off, skipped).
void check_kvcache_rotary_positions(const at::Tensor& q, bool has_cache_seqlens,
                                    const at::Tensor& cache_seqlens_host,
                                    const std::optional<at::Tensor>& rotary_cos, int64_t capacity,
                                    bool per_row);

// out_partial fp32 (splits, b, h, sq, d), lse_partial fp32 (splits, b, h, sq).
void check_combine_inputs(const at::Tensor& out_partial, const at::Tensor& lse_partial,
                          at::ScalarType out_dtype);

// Whether value checks (which read tensor contents) should run for tensors on this device.
bool value_checks_enabled(const at::Tensor& t);

// How many host copies the value checks have taken from the kept ones on this thread; while a
// FreshHostCopies lives, they copy anew (and keep the new copies).
uint64_t kept_host_copies_read();
class FreshHostCopies {
  public:
    FreshHostCopies();
    ~FreshHostCopies();
    FreshHostCopies(const FreshHostCopies&) = delete;
    FreshHostCopies& operator=(const FreshHostCopies&) = delete;
};

// Runs `checks`, the argument checks of one call (no side effects), which may read host copies
// of CUDA tensors. Those copies are kept between calls while PyTorch has not modified their
// tensors, and a write it does not track can leave one stale; so when `checks` throws after
// reading a kept copy, it runs again on fresh copies: a stale copy never rejects a good call.
template <typename Checks>
auto recheck_on_fresh_copies(Checks&& checks) -> decltype(checks()) {
    const uint64_t kept = kept_host_copies_read();
    try {
        return checks();
    } catch (const c10::Error&) {
        if (kept_host_copies_read() == kept) throw;
        const FreshHostCopies fresh;
        return checks();
    }
}

}  // namespace flash_cuda
