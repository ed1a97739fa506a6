#include "checks.h"

#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

namespace flash_cuda {
namespace {

constexpr int64_t kMaxHeadDim = 256;

std::string dtype_name(at::ScalarType t) { return c10::toString(t); }

void check_defined(const at::Tensor& t, const char* name) {
    TORCH_CHECK_VALUE(t.defined(), "flash_cuda: ", name, " must be a tensor, got None");
}

// The dtype rule: fp16/bf16 on CUDA (as flash_attn); the CPU reference also takes fp32/fp64.
void check_attention_dtype(const at::Tensor& t, const char* name) {
    const auto dt = t.scalar_type();
    const bool half = dt == at::kHalf || dt == at::kBFloat16;
    if (t.is_cuda()) {
        TORCH_CHECK_TYPE(half, "flash_cuda on CUDA supports only fp16 and bf16: ", name, " is ",
                         dtype_name(dt), "; cast it with .to(torch.bfloat16) or .half()");
    } else {
        TORCH_CHECK_TYPE(half || dt == at::kFloat || dt == at::kDouble, "flash_cuda: ", name,
                         " must be fp16, bf16, fp32 or fp64 on CPU, got ", dtype_name(dt));
    }
    TORCH_CHECK_VALUE(t.is_cuda() || t.is_cpu(), "flash_cuda: ", name,
                      " must be on a CUDA or CPU device, got ", t.device());
}

void check_like(const at::Tensor& t, const at::Tensor& ref, const char* name,
                const char* ref_name) {
    TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), "flash_cuda: ", name,
                     " must have the same dtype as ", ref_name, " (",
                     dtype_name(ref.scalar_type()), "), got ", dtype_name(t.scalar_type()));
    TORCH_CHECK_VALUE(t.device() == ref.device(), "flash_cuda: ", name,
                      " must be on the same device as ", ref_name, " (", ref.device(), "), got ",
                      t.device());
}

void check_rank(const at::Tensor& t, int64_t rank, const char* name, const char* layout) {
    TORCH_CHECK_VALUE(t.dim() == rank, "flash_cuda: ", name, " must have ", rank,
                      " dimensions ", layout, ", got shape ", t.sizes());
}

// A paged cache's page and row strides fit in 32 bits: the kernels form a row's address with
// two 32 x 32 -> 64-bit multiply-adds (kernels/sm80/fwd.cuh load_kv_tile).
void check_paged_cache_strides(const at::Tensor& t, const char* name) {
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
    TORCH_CHECK_VALUE(t.stride(0) <= kMax && t.stride(1) <= kMax, "flash_cuda: ", name,
                      " with block_table must have page and row strides (stride(0), stride(1)) "
                      "below 2^31 elements, got ", t.strides());
}

void check_last_dim_contiguous(const at::Tensor& t, const char* name) {
    TORCH_CHECK_VALUE(t.size(-1) <= 1 || t.stride(-1) == 1, "flash_cuda: ", name,
                      " must have a contiguous last dimension (stride 1), got strides ",
                      t.strides(), "; call .contiguous()");
}

void check_shape(const at::Tensor& t, at::IntArrayRef expected, const char* name,
                 const char* layout) {
    TORCH_CHECK_VALUE(t.sizes() == expected, "flash_cuda: ", name, " must have shape ", expected,
                      " ", layout, ", got ", t.sizes());
}

void check_int32_vector(const at::Tensor& t, int64_t length, const at::Tensor& q,
                        const char* name) {
    TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, "flash_cuda: ", name, " must be int32, got ",
                     dtype_name(t.scalar_type()));
    TORCH_CHECK_VALUE(t.device() == q.device(), "flash_cuda: ", name,
                      " must be on the same device as q (", q.device(), "), got ", t.device());
    TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == length, "flash_cuda: ", name,
                      " must have shape (", length, "), got ", t.sizes());
    TORCH_CHECK_VALUE(t.is_contiguous(), "flash_cuda: ", name, " must be contiguous");
}

void check_head_dims(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     int64_t heads, int64_t heads_k, int64_t head_dim) {
    TORCH_CHECK_VALUE(head_dim >= 1 && head_dim <= kMaxHeadDim,
                      "flash_cuda: head dimension (last dim of q) must be between 1 and ",
                      kMaxHeadDim, ", got ", head_dim);
    TORCH_CHECK_VALUE(k.size(-1) == head_dim && v.size(-1) == head_dim,
                      "flash_cuda: q, k and v must have the same head dimension, got ", head_dim,
                      ", ", k.size(-1), " and ", v.size(-1));
    TORCH_CHECK_VALUE(heads_k >= 1 && heads % heads_k == 0,
                      "flash_cuda: the number of query heads (", heads,
                      ") must be divisible by the number of key/value heads (", heads_k, ")");
}

// How the value checks get their host copies: FLASH_CUDA_CHECK_VALUES=always copies every call;
// by default a CUDA tensor's copy is kept for the next calls (HostCopies).
bool copy_every_call() {
    const char* env = std::getenv("FLASH_CUDA_CHECK_VALUES");
    return env != nullptr && std::strcmp(env, "always") == 0;
}

// Kept copies read by this thread, and whether a FreshHostCopies is alive (checks.h).
thread_local uint64_t tl_kept_copies_read = 0;
thread_local int tl_fresh_copies = 0;

// Host copies of the int32 tensors the value checks read. For a CUDA tensor the copy is a
// device-to-host transfer, a stream sync: the GPU then idles while the host launches what follows
// (bench/NOTES.md runs 20 and 95: 21-79 us per eager decode call). A model passes the same
// cache_seqlens, block_table or cu_seqlens to every layer of a step, so a copy is kept and reused
// while its tensor is the same object and PyTorch has not modified it: the same TensorImpl (held
// weakly, so that its address is not reused while the entry lives), version counter, data
// pointer, sizes and strides. A write PyTorch does not see (a CUDA graph's replay, a custom kernel
// writing through data_ptr(), an in-place op on .data) leaves the kept copy stale: it can then
// hide a bad value, but not reject a good call (recheck_on_fresh_copies, checks.h, runs failed
// checks again on fresh copies); FLASH_CUDA_CHECK_VALUES=always copies every call. Inference
// tensors (no version counter) are copied every call; CPU tensors need no transfer.
class HostCopies {
  public:
    at::Tensor get(const at::Tensor& t) {
        if (!t.is_cuda() || t.is_inference() || copy_every_call()) return copy(t);
        const int64_t version = t._version();
        if (tl_fresh_copies == 0) {
            std::lock_guard<std::mutex> lock(mutex_);
            for (Entry& e : entries_) {
                if (e.holds(t) && e.version == version && e.data == t.data_ptr() &&
                    t.sizes() == at::IntArrayRef(e.sizes) &&
                    t.strides() == at::IntArrayRef(e.strides)) {
                    e.last_use = ++clock_;
                    ++tl_kept_copies_read;
                    return e.host;
                }
            }
        }
        at::Tensor host = copy(t);  // outside the lock: it waits for the stream
        Entry entry{WeakImpl(t.getIntrusivePtr()), version, t.data_ptr(), t.sizes().vec(),
                    t.strides().vec(), host, 0};
        std::lock_guard<std::mutex> lock(mutex_);
        entry.last_use = ++clock_;
        // This tensor's entry, else a dead tensor's, else a new one, else the least recently used.
        auto slot = std::find_if(entries_.begin(), entries_.end(),
                                 [&](const Entry& e) { return e.holds(t); });
        if (slot == entries_.end()) {
            slot = std::find_if(entries_.begin(), entries_.end(),
                                [](const Entry& e) { return e.impl.expired(); });
        }
        if (slot == entries_.end() && entries_.size() < kEntries) {
            entries_.push_back(std::move(entry));
            return host;
        }
        if (slot == entries_.end()) {
            slot = std::min_element(entries_.begin(), entries_.end(),
                                    [](const Entry& a, const Entry& b) {
                                        return a.last_use < b.last_use;
                                    });
        }
        *slot = std::move(entry);
        return host;
    }

  private:
    using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
    static constexpr size_t kEntries = 16;
    static at::Tensor copy(const at::Tensor& t) { return t.to(at::kCPU, at::kInt).contiguous(); }

    struct Entry {
        WeakImpl impl;
        int64_t version;
        const void* data;
        std::vector<int64_t> sizes, strides;
        at::Tensor host;
        uint64_t last_use;

        bool holds(const at::Tensor& t) const {
            return !impl.expired() && impl._unsafe_get_target() == t.unsafeGetTensorImpl();
        }
    };
    std::mutex mutex_;
    std::vector<Entry> entries_;
    uint64_t clock_ = 0;
};

// An int32 tensor's values on the host (for value checks).
at::Tensor host_ints(const at::Tensor& t) {
    static HostCopies* copies = new HostCopies();  // never destroyed: no teardown-order questions
    return copies->get(t);
}

}  // namespace

uint64_t kept_host_copies_read() { return tl_kept_copies_read; }
FreshHostCopies::FreshHostCopies() { ++tl_fresh_copies; }
FreshHostCopies::~FreshHostCopies() { --tl_fresh_copies; }

namespace {

// cu_seqlens: starts at 0, non-decreasing, last entry <= total, max length <= max_seqlen.
void check_cu_seqlens_values(const at::Tensor& cu, int64_t total, int64_t max_seqlen,
                             const char* name, const char* max_name, const char* total_name) {
    const auto h = host_ints(cu);
    const int* p = h.data_ptr<int>();
    const int64_t n = h.numel();
    TORCH_CHECK_VALUE(p[0] == 0, "flash_cuda: ", name, "[0] must be 0, got ", p[0]);
    for (int64_t i = 0; i + 1 < n; ++i) {
        TORCH_CHECK_VALUE(p[i + 1] >= p[i], "flash_cuda: ", name,
                          " must be non-decreasing, but ", name, "[", i + 1, "] = ", p[i + 1],
                          " < ", name, "[", i, "] = ", p[i]);
        TORCH_CHECK_VALUE(p[i + 1] - p[i] <= max_seqlen, "flash_cuda: ", max_name, " (",
                          max_seqlen, ") is smaller than sequence ", i, " of ", name,
                          " (length ", p[i + 1] - p[i], ")");
    }
    TORCH_CHECK_VALUE(p[n - 1] <= total, "flash_cuda: ", name, "[-1] = ", p[n - 1],
                      " exceeds the number of rows of ", total_name, " (", total, ")");
}

// Every block_table entry a sequence of `lengths[i]` keys uses must be in [0, num_blocks).
void check_block_table_values(const at::Tensor& block_table, const std::vector<int64_t>& lengths,
                              int64_t page, int64_t num_blocks) {
    const int64_t max_blocks = block_table.size(1);
    const auto h = host_ints(block_table);
    const int* p = h.data_ptr<int>();
    for (size_t b = 0; b < lengths.size(); ++b) {
        const int64_t used = (lengths[b] + page - 1) / page;
        TORCH_CHECK_VALUE(used <= max_blocks, "flash_cuda: block_table has ", max_blocks,
                          " blocks per sequence, but sequence ", b, " needs ", used, " for ",
                          lengths[b], " keys at page size ", page);
        for (int64_t j = 0; j < used; ++j) {
            const int blk = p[b * max_blocks + j];
            TORCH_CHECK_VALUE(blk >= 0 && blk < num_blocks, "flash_cuda: block_table[", b, ", ",
                              j, "] = ", blk, " is out of range for ", num_blocks,
                              " cache blocks");
        }
    }
}

}  // namespace

bool value_checks_enabled(const at::Tensor& t) {
    if (!t.is_cuda()) return true;
    const char* env = std::getenv("FLASH_CUDA_CHECK_VALUES");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    return c10::cuda::currentStreamCaptureStatusMayInitCtx() ==
           c10::cuda::CaptureStatus::None;
}

MaskArgs normalize_mask(bool causal, int64_t window_left, int64_t window_right,
                        int64_t seqlen_k) {
    if (window_left >= seqlen_k) window_left = -1;
    if (window_right >= seqlen_k) window_right = -1;
    if (causal) window_right = 0;
    if (window_left < 0 && window_right == 0) causal = true;
    return MaskArgs{causal, window_left, window_right};
}

void check_scalar_args(double dropout_p, double softmax_scale, int64_t window_left,
                       int64_t window_right, double softcap) {
    TORCH_CHECK_VALUE(dropout_p >= 0.0 && dropout_p < 1.0,
                      "flash_cuda: dropout_p must be in [0, 1), got ", dropout_p);
    TORCH_CHECK_VALUE(std::isfinite(softmax_scale),
                      "flash_cuda: softmax_scale must be finite, got ", softmax_scale);
    TORCH_CHECK_VALUE(window_left >= -1, "flash_cuda: window_size[0] (left) must be >= -1 ",
                      "(-1 = unbounded), got ", window_left);
    TORCH_CHECK_VALUE(window_right >= -1, "flash_cuda: window_size[1] (right) must be >= -1 ",
                      "(-1 = unbounded), got ", window_right);
    TORCH_CHECK_VALUE(softcap >= 0.0 && std::isfinite(softcap),
                      "flash_cuda: softcap must be >= 0 (0 = off), got ", softcap);
}

AttnDims check_fwd_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    check_defined(q, "q");
    check_defined(k, "k");
    check_defined(v, "v");
    check_attention_dtype(q, "q");
    check_like(k, q, "k", "q");
    check_like(v, q, "v", "q");
    check_rank(q, 4, "q", "(batch, seqlen_q, nheads, headdim)");
    check_rank(k, 4, "k", "(batch, seqlen_k, nheads_k, headdim)");
    check_rank(v, 4, "v", "(batch, seqlen_k, nheads_k, headdim)");
    check_last_dim_contiguous(q, "q");
    check_last_dim_contiguous(k, "k");
    check_last_dim_contiguous(v, "v");
    AttnDims d;
    d.batch = q.size(0);
    d.seqlen_q = q.size(1);
    d.heads = q.size(2);
    d.head_dim = q.size(3);
    d.seqlen_k = k.size(1);
    d.heads_k = k.size(2);
    TORCH_CHECK_VALUE(d.batch >= 1, "flash_cuda: batch size must be >= 1, got ", d.batch);
    check_head_dims(q, k, v, d.heads, d.heads_k, d.head_dim);
    check_shape(k, {d.batch, d.seqlen_k, d.heads_k, d.head_dim}, "k",
                "(batch, seqlen_k, nheads_k, headdim) matching q");
    check_shape(v, {d.batch, d.seqlen_k, d.heads_k, d.head_dim}, "v", "(the shape of k)");
    return d;
}

AttnDims check_varlen_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                             const std::optional<at::Tensor>& seqused_k,
                             const std::optional<at::Tensor>& block_table, int64_t max_seqlen_q,
                             int64_t max_seqlen_k) {
    check_defined(q, "q");
    check_defined(k, "k");
    check_defined(v, "v");
    check_attention_dtype(q, "q");
    check_like(k, q, "k", "q");
    check_like(v, q, "v", "q");
    const bool paged = block_table.has_value();
    check_rank(q, 3, "q", "(total_q, nheads, headdim)");
    if (paged) {
        check_rank(k, 4, "k", "(num_blocks, page_block_size, nheads_k, headdim) with block_table");
        check_rank(v, 4, "v", "(num_blocks, page_block_size, nheads_k, headdim) with block_table");
    } else {
        check_rank(k, 3, "k", "(total_k, nheads_k, headdim)");
        check_rank(v, 3, "v", "(total_k, nheads_k, headdim)");
    }
    check_last_dim_contiguous(q, "q");
    check_last_dim_contiguous(k, "k");
    check_last_dim_contiguous(v, "v");
    TORCH_CHECK_VALUE(cu_seqlens_q.defined() && cu_seqlens_q.dim() == 1 && cu_seqlens_q.numel() >= 2,
                      "flash_cuda: cu_seqlens_q must have shape (batch + 1) with batch >= 1, got ",
                      cu_seqlens_q.sizes());
    AttnDims d;
    d.batch = cu_seqlens_q.numel() - 1;
    d.total_q = q.size(0);
    d.heads = q.size(1);
    d.head_dim = q.size(2);
    d.heads_k = k.size(-2);
    d.seqlen_q = max_seqlen_q;
    d.seqlen_k = max_seqlen_k;
    check_int32_vector(cu_seqlens_q, d.batch + 1, q, "cu_seqlens_q");
    check_int32_vector(cu_seqlens_k, d.batch + 1, q, "cu_seqlens_k");
    check_head_dims(q, k, v, d.heads, d.heads_k, d.head_dim);
    TORCH_CHECK_VALUE(k.sizes() == v.sizes(), "flash_cuda: v must have the shape of k ",
                      k.sizes(), ", got ", v.sizes());
    TORCH_CHECK_VALUE(max_seqlen_q >= 0, "flash_cuda: max_seqlen_q must be >= 0, got ",
                      max_seqlen_q);
    TORCH_CHECK_VALUE(max_seqlen_k >= 0, "flash_cuda: max_seqlen_k must be >= 0, got ",
                      max_seqlen_k);
    if (seqused_k.has_value()) check_int32_vector(*seqused_k, d.batch, q, "seqused_k");
    if (paged) {
        const auto& bt = *block_table;
        TORCH_CHECK_TYPE(bt.scalar_type() == at::kInt, "flash_cuda: block_table must be int32, got ",
                         dtype_name(bt.scalar_type()));
        TORCH_CHECK_VALUE(bt.device() == q.device(),
                          "flash_cuda: block_table must be on the device of q");
        TORCH_CHECK_VALUE(bt.dim() == 2 && bt.size(0) == d.batch,
                          "flash_cuda: block_table must have shape (batch, max_blocks_per_seq) = (",
                          d.batch, ", ...), got ", bt.sizes());
        TORCH_CHECK_VALUE(bt.stride(-1) == 1,
                          "flash_cuda: block_table must have a contiguous last dimension");
        check_paged_cache_strides(k, "k");
        check_paged_cache_strides(v, "v");
    }
    if (value_checks_enabled(q)) {
        const int64_t total_k = paged ? block_table->size(1) * k.size(1) * d.batch : k.size(0);
        check_cu_seqlens_values(cu_seqlens_q, d.total_q, max_seqlen_q, "cu_seqlens_q",
                                "max_seqlen_q", "q");
        if (!paged) {
            check_cu_seqlens_values(cu_seqlens_k, total_k, max_seqlen_k, "cu_seqlens_k",
                                    "max_seqlen_k", "k");
        }
        const auto cuk = host_ints(cu_seqlens_k);
        std::vector<int64_t> lengths(d.batch);
        for (int64_t b = 0; b < d.batch; ++b) {
            lengths[b] = cuk.data_ptr<int>()[b + 1] - cuk.data_ptr<int>()[b];
        }
        if (seqused_k.has_value()) {
            const auto used = host_ints(*seqused_k);
            for (int64_t b = 0; b < d.batch; ++b) {
                const int u = used.data_ptr<int>()[b];
                TORCH_CHECK_VALUE(u >= 0 && u <= lengths[b], "flash_cuda: seqused_k[", b, "] = ",
                                  u, " must be in [0, ", lengths[b], "] (its cu_seqlens_k length)");
            }
        }
        if (paged) {
            for (int64_t b = 0; b < d.batch; ++b) {
                TORCH_CHECK_VALUE(lengths[b] >= 0 && lengths[b] <= max_seqlen_k,
                                  "flash_cuda: max_seqlen_k (", max_seqlen_k,
                                  ") is smaller than sequence ", b, " of cu_seqlens_k (length ",
                                  lengths[b], ")");
            }
            check_block_table_values(*block_table, lengths, k.size(1), k.size(0));
        }
    }
    return d;
}

void check_alibi(const std::optional<at::Tensor>& alibi_slopes, const at::Tensor& q,
                 const AttnDims& dims) {
    if (!alibi_slopes.has_value()) return;
    const auto& a = *alibi_slopes;
    TORCH_CHECK_TYPE(a.scalar_type() == at::kFloat, "flash_cuda: alibi_slopes must be float32, got ",
                     dtype_name(a.scalar_type()));
    TORCH_CHECK_VALUE(a.device() == q.device(), "flash_cuda: alibi_slopes must be on the device of q (",
                      q.device(), "), got ", a.device());
    const bool per_head = a.dim() == 1 && a.size(0) == dims.heads;
    const bool per_batch_head = a.dim() == 2 && a.size(0) == dims.batch && a.size(1) == dims.heads;
    TORCH_CHECK_VALUE(per_head || per_batch_head, "flash_cuda: alibi_slopes must have shape (",
                      dims.heads, ") or (", dims.batch, ", ", dims.heads, "), got ", a.sizes());
    TORCH_CHECK_VALUE(a.stride(-1) == 1, "flash_cuda: alibi_slopes must have a contiguous last dimension");
}

void check_rng_state(const at::Tensor& rng_state, const at::Tensor& q, const char* name) {
    TORCH_CHECK_TYPE(rng_state.scalar_type() == at::kLong, "flash_cuda: ", name,
                     " must be int64, got ", dtype_name(rng_state.scalar_type()));
    TORCH_CHECK_VALUE(rng_state.numel() == 2 && rng_state.is_contiguous(), "flash_cuda: ", name,
                      " must be a contiguous (seed, offset) pair of 2 elements, got shape ",
                      rng_state.sizes());
    TORCH_CHECK_VALUE(rng_state.device() == q.device(), "flash_cuda: ", name,
                      " must be on the device of q (", q.device(), "), got ", rng_state.device());
}

void check_bwd_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out,
                      const at::Tensor& softmax_lse, const AttnDims& dims, bool varlen) {
    check_defined(dout, "dout");
    check_defined(out, "out");
    check_like(dout, q, "dout", "q");
    check_like(out, q, "out", "q");
    TORCH_CHECK_VALUE(dout.sizes() == q.sizes(), "flash_cuda: dout must have the shape of q ",
                      q.sizes(), ", got ", dout.sizes());
    TORCH_CHECK_VALUE(out.sizes() == q.sizes(), "flash_cuda: out must have the shape of q ",
                      q.sizes(), ", got ", out.sizes());
    check_last_dim_contiguous(dout, "dout");
    check_last_dim_contiguous(out, "out");
    TORCH_CHECK_TYPE(softmax_lse.scalar_type() == at::kFloat,
                     "flash_cuda: softmax_lse must be float32, got ",
                     dtype_name(softmax_lse.scalar_type()));
    TORCH_CHECK_VALUE(softmax_lse.device() == q.device(),
                      "flash_cuda: softmax_lse must be on the device of q");
    if (varlen) {
        check_shape(softmax_lse, {dims.heads, dims.total_q}, "softmax_lse", "(nheads, total_q)");
    } else {
        check_shape(softmax_lse, {dims.batch, dims.heads, dims.seqlen_q}, "softmax_lse",
                    "(batch, nheads, seqlen_q)");
    }
}

AttnDims check_kvcache_inputs(const at::Tensor& q, const at::Tensor& k_cache,
                              const at::Tensor& v_cache, const std::optional<at::Tensor>& k,
                              const std::optional<at::Tensor>& v,
                              const std::optional<at::Tensor>& cache_seqlens,
                              const std::optional<at::Tensor>& rotary_cos,
                              const std::optional<at::Tensor>& rotary_sin,
                              const std::optional<at::Tensor>& cache_batch_idx,
                              const std::optional<at::Tensor>& cache_leftpad,
                              const std::optional<at::Tensor>& block_table, int64_t num_splits,
                              at::Tensor* cache_seqlens_host) {
    check_defined(q, "q");
    check_defined(k_cache, "k_cache");
    check_defined(v_cache, "v_cache");
    check_attention_dtype(q, "q");
    check_like(k_cache, q, "k_cache", "q");
    check_like(v_cache, q, "v_cache", "q");
    check_rank(q, 4, "q", "(batch, seqlen_q, nheads, headdim)");
    const bool paged = block_table.has_value();
    const char* cache_layout = paged ? "(num_blocks, page_block_size, nheads_k, headdim)"
                                     : "(batch_cache, seqlen_cache, nheads_k, headdim)";
    check_rank(k_cache, 4, "k_cache", cache_layout);
    check_rank(v_cache, 4, "v_cache", cache_layout);
    check_last_dim_contiguous(q, "q");
    check_last_dim_contiguous(k_cache, "k_cache");
    check_last_dim_contiguous(v_cache, "v_cache");
    AttnDims d;
    d.batch = q.size(0);
    d.seqlen_q = q.size(1);
    d.heads = q.size(2);
    d.head_dim = q.size(3);
    d.heads_k = k_cache.size(2);
    TORCH_CHECK_VALUE(d.batch >= 1, "flash_cuda: batch size must be >= 1, got ", d.batch);
    check_head_dims(q, k_cache, v_cache, d.heads, d.heads_k, d.head_dim);
    TORCH_CHECK_VALUE(v_cache.sizes() == k_cache.sizes(), "flash_cuda: v_cache must have the shape of k_cache ",
                      k_cache.sizes(), ", got ", v_cache.sizes());
    TORCH_CHECK_VALUE(num_splits >= 0 && num_splits <= 128,
                      "flash_cuda: num_splits must be in [0, 128] (0 = automatic), got ", num_splits);

    int64_t capacity = 0;  // keys one sequence can hold
    if (paged) {
        const auto& bt = *block_table;
        TORCH_CHECK_TYPE(bt.scalar_type() == at::kInt, "flash_cuda: block_table must be int32, got ",
                         dtype_name(bt.scalar_type()));
        TORCH_CHECK_VALUE(bt.device() == q.device(), "flash_cuda: block_table must be on the device of q");
        TORCH_CHECK_VALUE(bt.dim() == 2 && bt.size(0) == d.batch,
                          "flash_cuda: block_table must have shape (batch, max_blocks_per_seq) = (",
                          d.batch, ", ...), got ", bt.sizes());
        TORCH_CHECK_VALUE(bt.stride(-1) == 1, "flash_cuda: block_table must have a contiguous last dimension");
        TORCH_CHECK_VALUE(!cache_batch_idx.has_value(),
                          "flash_cuda: cache_batch_idx cannot be used with a paged cache (block_table)");
        TORCH_CHECK_VALUE(!cache_leftpad.has_value(),
                          "flash_cuda: cache_leftpad cannot be used with a paged cache (block_table)");
        TORCH_CHECK_VALUE(k_cache.size(1) >= 1, "flash_cuda: the page size (k_cache.size(1) with "
                          "block_table) must be >= 1, got ", k_cache.size(1));
        check_paged_cache_strides(k_cache, "k_cache");
        check_paged_cache_strides(v_cache, "v_cache");
        capacity = bt.size(1) * k_cache.size(1);
    } else {
        capacity = k_cache.size(1);
        if (!cache_batch_idx.has_value()) {
            TORCH_CHECK_VALUE(k_cache.size(0) >= d.batch, "flash_cuda: k_cache has ", k_cache.size(0),
                              " sequences, fewer than the batch of q (", d.batch, ")");
        }
    }
    d.seqlen_k = capacity;

    int64_t seqlen_new = 0;
    TORCH_CHECK_VALUE(k.has_value() == v.has_value(),
                      "flash_cuda: k and v (new tokens) must be given together");
    if (k.has_value()) {
        check_like(*k, q, "k", "q");
        check_like(*v, q, "v", "q");
        check_rank(*k, 4, "k", "(batch, seqlen_new, nheads_k, headdim)");
        seqlen_new = k->size(1);
        check_shape(*k, {d.batch, seqlen_new, d.heads_k, d.head_dim}, "k",
                    "(batch, seqlen_new, nheads_k, headdim)");
        check_shape(*v, {d.batch, seqlen_new, d.heads_k, d.head_dim}, "v", "(the shape of k)");
        check_last_dim_contiguous(*k, "k");
        check_last_dim_contiguous(*v, "v");
        TORCH_CHECK_VALUE(cache_seqlens.has_value(),
                          "flash_cuda: cache_seqlens is required when new k/v are appended");
    }
    if (cache_seqlens.has_value()) check_int32_vector(*cache_seqlens, d.batch, q, "cache_seqlens");
    if (cache_batch_idx.has_value()) check_int32_vector(*cache_batch_idx, d.batch, q, "cache_batch_idx");
    if (cache_leftpad.has_value()) {
        check_int32_vector(*cache_leftpad, d.batch, q, "cache_leftpad");
        TORCH_CHECK_VALUE(cache_seqlens.has_value(), "flash_cuda: cache_leftpad needs cache_seqlens");
    }

    TORCH_CHECK_VALUE(rotary_cos.has_value() == rotary_sin.has_value(),
                      "flash_cuda: rotary_cos and rotary_sin must be given together");
    if (rotary_cos.has_value()) {
        const auto& cos = *rotary_cos;
        const auto& sin = *rotary_sin;
        check_like(cos, q, "rotary_cos", "q");
        check_like(sin, q, "rotary_sin", "q");
        TORCH_CHECK_VALUE(cos.dim() == 2 && sin.sizes() == cos.sizes(),
                          "flash_cuda: rotary_cos and rotary_sin must both have shape "
                          "(seqlen_ro, rotary_dim / 2), got ", cos.sizes(), " and ", sin.sizes());
        TORCH_CHECK_VALUE(cos.is_contiguous() && sin.is_contiguous(),
                          "flash_cuda: rotary_cos and rotary_sin must be contiguous");
        const int64_t rotary_dim = 2 * cos.size(1);
        TORCH_CHECK_VALUE(rotary_dim >= 2 && rotary_dim <= d.head_dim,
                          "flash_cuda: rotary_dim (2 * rotary_cos.size(1) = ", rotary_dim,
                          ") must be even, >= 2 and <= headdim (", d.head_dim, ")");
        TORCH_CHECK_VALUE(cos.size(0) >= std::min<int64_t>(capacity, 1),
                          "flash_cuda: rotary_cos has no positions");
    }

    if (value_checks_enabled(q)) {
        std::vector<int64_t> lengths(d.batch, 0);  // keys per sequence after the append
        if (cache_seqlens.has_value()) {
            const auto sl = host_ints(*cache_seqlens);
            if (cache_seqlens_host != nullptr) *cache_seqlens_host = sl;
            const at::Tensor lp = cache_leftpad.has_value() ? host_ints(*cache_leftpad) : at::Tensor();
            for (int64_t b = 0; b < d.batch; ++b) {
                const int s = sl.data_ptr<int>()[b];
                TORCH_CHECK_VALUE(s >= 0, "flash_cuda: cache_seqlens[", b, "] = ", s, " must be >= 0");
                if (lp.defined()) {
                    const int l = lp.data_ptr<int>()[b];
                    TORCH_CHECK_VALUE(l >= 0 && l <= s, "flash_cuda: cache_leftpad[", b, "] = ", l,
                                      " must be in [0, cache_seqlens[", b, "] = ", s, "]");
                }
                lengths[b] = s + seqlen_new;
                TORCH_CHECK_VALUE(paged || lengths[b] <= capacity, "flash_cuda: cache_seqlens[", b,
                                  "] + new tokens = ", lengths[b], " exceeds the cache length ",
                                  capacity);
                if (rotary_cos.has_value()) {
                    TORCH_CHECK_VALUE(lengths[b] <= rotary_cos->size(0), "flash_cuda: rotary_cos/sin have ",
                                      rotary_cos->size(0), " positions, but sequence ", b,
                                      " needs ", lengths[b], " (cache_seqlens + new tokens)");
                }
            }
        } else {
            std::fill(lengths.begin(), lengths.end(), capacity);
        }
        if (cache_batch_idx.has_value()) {
            const auto idx = host_ints(*cache_batch_idx);
            for (int64_t b = 0; b < d.batch; ++b) {
                const int i = idx.data_ptr<int>()[b];
                TORCH_CHECK_VALUE(i >= 0 && i < k_cache.size(0), "flash_cuda: cache_batch_idx[", b,
                                  "] = ", i, " is out of range for ", k_cache.size(0),
                                  " cache sequences");
            }
        }
        if (paged) {
            check_block_table_values(*block_table, lengths, k_cache.size(1), k_cache.size(0));
        }
    }
    return d;
}

void check_kvcache_rotary_positions(const at::Tensor& q, bool has_cache_seqlens,
                                    const at::Tensor& cache_seqlens_host,
                                    const std::optional<at::Tensor>& rotary_cos, int64_t capacity,
                                    bool per_row) {
    const int64_t sq = q.size(1);
    if (!rotary_cos.has_value() || sq == 0) return;
    const int64_t seqlen_ro = rotary_cos->size(0);
    const int64_t last_row = per_row ? sq - 1 : 0;
    if (!has_cache_seqlens) {
        TORCH_CHECK_VALUE(capacity + last_row < seqlen_ro, "flash_cuda: rotary_cos/sin have ",
                          seqlen_ro, " positions, but without cache_seqlens query row ", last_row,
                          " sits at position ", capacity + last_row, " (the cache length + row)");
        return;
    }
    if (!cache_seqlens_host.defined()) return;  // value checks off (or graph capture)
    const int* sl = cache_seqlens_host.data_ptr<int>();
    for (int64_t b = 0; b < cache_seqlens_host.numel(); ++b) {
        const int64_t pos = sl[b] + last_row;
        TORCH_CHECK_VALUE(pos < seqlen_ro, "flash_cuda: rotary_cos/sin have ", seqlen_ro,
                          " positions, but query row ", last_row, " of sequence ", b,
                          " sits at position ", pos, " (cache_seqlens[", b, "]",
                          per_row ? " + row, causal/local mask)" : ", no causal/local mask)");
    }
}

void check_combine_inputs(const at::Tensor& out_partial, const at::Tensor& lse_partial,
                          at::ScalarType out_dtype) {
    TORCH_CHECK_TYPE(out_partial.scalar_type() == at::kFloat, "flash_cuda: out_partial must be float32, got ",
                     dtype_name(out_partial.scalar_type()));
    TORCH_CHECK_TYPE(lse_partial.scalar_type() == at::kFloat, "flash_cuda: lse_partial must be float32, got ",
                     dtype_name(lse_partial.scalar_type()));
    check_rank(out_partial, 5, "out_partial", "(num_splits, batch, nheads, seqlen_q, headdim)");
    check_rank(lse_partial, 4, "lse_partial", "(num_splits, batch, nheads, seqlen_q)");
    TORCH_CHECK_VALUE(out_partial.sizes().slice(0, 4) == lse_partial.sizes(),
                      "flash_cuda: lse_partial must have shape out_partial.shape[:4] = ",
                      out_partial.sizes().slice(0, 4), ", got ", lse_partial.sizes());
    TORCH_CHECK_VALUE(out_partial.device() == lse_partial.device(),
                      "flash_cuda: out_partial and lse_partial must be on one device");
    TORCH_CHECK_VALUE(out_partial.size(0) >= 1 && out_partial.size(0) <= 128,
                      "flash_cuda: num_splits (out_partial.size(0)) must be in [1, 128], got ",
                      out_partial.size(0));
    TORCH_CHECK_VALUE(out_partial.size(-1) <= kMaxHeadDim, "flash_cuda: head dimension must be <= ",
                      kMaxHeadDim, ", got ", out_partial.size(-1));
    const bool ok = out_dtype == at::kHalf || out_dtype == at::kBFloat16 ||
                    (out_partial.is_cpu() && (out_dtype == at::kFloat || out_dtype == at::kDouble));
    TORCH_CHECK_TYPE(ok, "flash_cuda: out_dtype must be fp16 or bf16 (CPU also fp32/fp64), got ",
                     dtype_name(out_dtype));
}

}  // namespace flash_cuda
