// Reference KV-cache attention: rotary on the new keys and on q, the in-place append of the new
// k/v into the (optionally paged) cache, then attention of each sequence over its cached keys.
#include <vector>

#include "reference/blockwise.h"
#include "reference/reference.h"

namespace flash_cuda::reference {
namespace {

using namespace detail;

std::vector<int64_t> host_ints(const Tensor& t) {
    const Tensor h = t.to(at::kCPU, at::kLong).contiguous();
    const int64_t* p = h.data_ptr<int64_t>();
    return std::vector<int64_t>(p, p + h.numel());
}

// Rotary embedding of x (n, heads, d) at positions (n) (long, on x's device), computed in the
// compute dtype and returned in x's dtype. Pairs (x[2m], x[2m+1]) when interleaved, else
// (x[m], x[m + rotary_dim / 2]); dims >= rotary_dim are unchanged.
Tensor apply_rotary(const Tensor& x, const Tensor& positions, const Tensor& cos_table,
                    const Tensor& sin_table, bool interleaved) {
    const int64_t half = cos_table.size(1), rotary_dim = 2 * half;
    const int64_t n = x.size(0), heads = x.size(1), d = x.size(2);
    TORCH_CHECK_VALUE(positions.numel() == 0 || positions.max().item<int64_t>() < cos_table.size(0),
                      "flash_cuda: rotary_cos/sin have ", cos_table.size(0),
                      " positions, but position ", positions.max().item<int64_t>(),
                      " is needed (cache_seqlens + row)");
    const at::ScalarType ct = compute_dtype(x.scalar_type());
    const Tensor xf = x.to(ct);
    const Tensor c = cos_table.index_select(0, positions).to(ct).unsqueeze(1);  // (n, 1, half)
    const Tensor s = sin_table.index_select(0, positions).to(ct).unsqueeze(1);
    Tensor a, b;
    if (interleaved) {
        const Tensor pairs = xf.narrow(2, 0, rotary_dim).reshape({n, heads, half, 2});
        a = pairs.select(3, 0);
        b = pairs.select(3, 1);
    } else {
        a = xf.narrow(2, 0, half);
        b = xf.narrow(2, half, half);
    }
    const Tensor ra = a * c - b * s;
    const Tensor rb = b * c + a * s;
    const Tensor rotated = interleaved ? at::stack({ra, rb}, 3).reshape({n, heads, rotary_dim})
                                       : at::cat({ra, rb}, 2);
    return at::cat({rotated, xf.narrow(2, rotary_dim, d - rotary_dim)}, 2).to(x.scalar_type());
}

// Where the cache rows of one sequence live.
struct CacheRows {
    bool paged = false;
    int64_t page = 0;
    int64_t cache_row = 0;             // unpaged: the batch row of the cache
    std::vector<int64_t> block_table;  // paged: this sequence's row of block_table

    // Cache positions [p0, p0 + n) as (n, hk, d) of `cache` (a copy when paged).
    Tensor read(const Tensor& cache, int64_t p0, int64_t n) const {
        if (!paged) return cache.select(0, cache_row).narrow(0, p0, n);
        const auto [blk, off] = index(cache, p0, n);
        return cache.index({blk, off});
    }
    void write(Tensor& cache, int64_t p0, const Tensor& rows) const {
        if (!paged) {
            cache.select(0, cache_row).narrow(0, p0, rows.size(0)).copy_(rows);
            return;
        }
        const auto [blk, off] = index(cache, p0, rows.size(0));
        cache.index_put_({blk, off}, rows);
    }

   private:
    std::pair<Tensor, Tensor> index(const Tensor& cache, int64_t p0, int64_t n) const {
        std::vector<int64_t> blk(n), off(n);
        for (int64_t t = 0; t < n; ++t) {
            blk[t] = block_table[(p0 + t) / page];
            off[t] = (p0 + t) % page;
        }
        const auto opts = at::TensorOptions().dtype(at::kLong);
        return {at::tensor(blk, opts).to(cache.device()), at::tensor(off, opts).to(cache.device())};
    }
};

}  // namespace

std::tuple<Tensor, Tensor> kvcache(const Tensor& q, Tensor& k_cache, Tensor& v_cache,
                                   const OptTensor& k, const OptTensor& v,
                                   const OptTensor& cache_seqlens, const OptTensor& rotary_cos,
                                   const OptTensor& rotary_sin, const OptTensor& cache_batch_idx,
                                   const OptTensor& cache_leftpad, const OptTensor& block_table,
                                   bool rotary_interleaved, const AttnOptions& opts) {
    const int64_t batch = q.size(0), sq = q.size(1), h = q.size(2), hk = k_cache.size(2);
    const bool paged = block_table.has_value();
    const int64_t capacity = paged ? block_table->size(1) * k_cache.size(1) : k_cache.size(1);
    const int64_t s_new = k.has_value() ? k->size(1) : 0;
    const std::vector<int64_t> seqlens = cache_seqlens.has_value()
                                             ? host_ints(*cache_seqlens)
                                             : std::vector<int64_t>(batch, capacity);
    const std::vector<int64_t> batch_idx =
        cache_batch_idx.has_value() ? host_ints(*cache_batch_idx) : std::vector<int64_t>();
    const std::vector<int64_t> leftpad =
        cache_leftpad.has_value() ? host_ints(*cache_leftpad) : std::vector<int64_t>(batch, 0);
    const std::vector<int64_t> table = paged ? host_ints(*block_table) : std::vector<int64_t>();
    const bool rotary = rotary_cos.has_value();
    // flash_attn's rule: with a causal or local mask query row t sits at cache_seqlens + t,
    // otherwise every query row sits at cache_seqlens.
    const bool per_row_positions =
        opts.mask.causal || opts.mask.window_left >= 0 || opts.mask.window_right >= 0;
    const auto long_opts = at::TensorOptions().dtype(at::kLong).device(q.device());

    std::vector<CacheRows> seq_cache(batch);
    for (int64_t i = 0; i < batch; ++i) {
        seq_cache[i].paged = paged;
        if (paged) {
            seq_cache[i].page = k_cache.size(1);
            const int64_t m = block_table->size(1);
            seq_cache[i].block_table.assign(table.begin() + i * m, table.begin() + (i + 1) * m);
        } else {
            seq_cache[i].cache_row = batch_idx.empty() ? i : batch_idx[i];
        }
    }

    // 1. Append the new keys/values (rotary on k) at cache positions cache_seqlens[i] + t.
    if (k.has_value()) {
        for (int64_t i = 0; i < batch; ++i) {
            Tensor k_new = k->select(0, i);
            if (rotary) {
                k_new = apply_rotary(k_new, at::arange(seqlens[i], seqlens[i] + s_new, long_opts),
                                     *rotary_cos, *rotary_sin, rotary_interleaved);
            }
            seq_cache[i].write(k_cache, seqlens[i], k_new);
            seq_cache[i].write(v_cache, seqlens[i], v->select(0, i));
        }
    }

    // 2. Attention of each sequence over cache positions [leftpad, cache_seqlens + s_new).
    Tensor out = at::empty(q.sizes(), q.options());
    Tensor lse = at::empty({batch, h, sq}, q.options().dtype(at::kFloat));
    for (int64_t i = 0; i < batch; ++i) {
        const int64_t sk = seqlens[i] + s_new - leftpad[i];
        Tensor qi = q.select(0, i);
        if (rotary && sq > 0) {
            const Tensor pos = per_row_positions ? at::arange(seqlens[i], seqlens[i] + sq, long_opts)
                                                 : at::full({sq}, seqlens[i], long_opts);
            qi = apply_rotary(qi, pos, *rotary_cos, *rotary_sin, rotary_interleaved);
        }
        const Tensor ki = seq_cache[i].read(k_cache, leftpad[i], sk).unsqueeze(0);
        const Tensor vi = seq_cache[i].read(v_cache, leftpad[i], sk).unsqueeze(0);
        const Problem p = make_problem(qi.unsqueeze(0), ki, vi, opts.alibi_slopes, i);
        const RowsFwd r = forward(p, opts, /*need_out=*/true);
        copy_rows_to(r.out, out.narrow(0, i, 1), hk);
        lse.narrow(0, i, 1).copy_(lse_from_rows(r.lse, 1, h, hk, sq));
    }
    return {out, lse};
}

}  // namespace flash_cuda::reference
