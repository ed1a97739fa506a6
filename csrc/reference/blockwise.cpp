// The blockwise online-softmax core of the reference (see blockwise.h for the layout).
#include "reference/blockwise.h"

#include <algorithm>
#include <limits>

namespace flash_cuda::reference::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Tile sizes for a problem: query positions per tile and G entries per tile.
struct Tiling {
    int64_t positions;
    int64_t groups;
};

Tiling tiling(const Problem& p) {
    const int64_t per_position = p.ratio * kKeyTile;
    const int64_t positions =
        std::clamp<int64_t>(kTileElems / per_position, 1, std::max<int64_t>(p.seqlen_q, 1));
    const int64_t groups = std::clamp<int64_t>(kTileElems / (positions * per_position), 1,
                                               std::max<int64_t>(p.q.size(0), 1));
    return {positions, groups};
}

// Keys [lo, hi) that some query position in [i0, i1) may see under the causal/local window.
std::pair<int64_t, int64_t> key_range(const Problem& p, const AttnOptions& opts, int64_t i0,
                                      int64_t i1) {
    const int64_t shift = p.seqlen_k - p.seqlen_q;
    int64_t lo = 0, hi = p.seqlen_k;
    if (opts.mask.window_left >= 0) lo = std::max(lo, i0 + shift - opts.mask.window_left);
    if (opts.mask.window_right >= 0) hi = std::min(hi, i1 - 1 + shift + opts.mask.window_right + 1);
    return {lo, std::max(lo, hi)};
}

// Final scores of a tile (Gc, (i1 - i0) * ratio, j1 - j0): scale, softcap, ALiBi, then -inf where
// masked. With softcap, *tanh_out receives tanh(scale * q.k / softcap) (for the backward).
Tensor scores(const Problem& p, const AttnOptions& opts, int64_t g0, int64_t g1, int64_t i0,
              int64_t i1, int64_t j0, int64_t j1, Tensor* tanh_out) {
    const int64_t ratio = p.ratio;
    const Tensor qt = p.q.slice(0, g0, g1).slice(1, i0 * ratio, i1 * ratio);
    const Tensor kt = p.k.slice(0, g0, g1).slice(1, j0, j1);
    Tensor s = at::bmm(qt, kt.transpose(1, 2));
    s.mul_(opts.softmax_scale);
    if (opts.softcap > 0.0) {
        Tensor t = at::tanh(s.div_(opts.softcap));
        s = t * opts.softcap;
        if (tanh_out != nullptr) *tanh_out = std::move(t);
    }
    const bool masked = opts.mask.window_left >= 0 || opts.mask.window_right >= 0;
    if (!p.slopes.defined() && !masked) return s;

    // Distance of key j from the diagonal of row i: i + sk - sq - j (rows repeat i ratio times).
    const auto long_opts = at::TensorOptions().dtype(at::kLong).device(p.q.device());
    const Tensor diag = (at::arange(i0, i1, long_opts) + (p.seqlen_k - p.seqlen_q))
                            .repeat_interleave(ratio)
                            .unsqueeze(1);
    const Tensor cols = at::arange(j0, j1, long_opts).unsqueeze(0);
    const Tensor offset = diag - cols;  // (M, N): i + sk - sq - j
    if (p.slopes.defined()) {
        const Tensor slopes = p.slopes.slice(0, g0, g1).repeat({1, i1 - i0}).unsqueeze(2);
        s.sub_(slopes * offset.abs().to(s.scalar_type()).unsqueeze(0));
    }
    if (masked) {
        // visible iff -right <= i + sk - sq - j <= left
        Tensor hidden = at::zeros_like(offset, offset.options().dtype(at::kBool));
        if (opts.mask.window_left >= 0) hidden.logical_or_(offset > opts.mask.window_left);
        if (opts.mask.window_right >= 0) hidden.logical_or_(offset < -opts.mask.window_right);
        s.masked_fill_(hidden.unsqueeze(0), -kInf);
    }
    return s;
}

}  // namespace

at::ScalarType compute_dtype(at::ScalarType input) {
    return input == at::kDouble ? at::kDouble : at::kFloat;
}

Tensor to_rows(const Tensor& x, int64_t heads_k, at::ScalarType ct) {
    const int64_t nb = x.size(0), s = x.size(1), h = x.size(2), d = x.size(3);
    const int64_t ratio = h / heads_k;
    return x.reshape({nb, s, heads_k, ratio, d})
        .permute({0, 2, 1, 3, 4})
        .to(ct)
        .contiguous()
        .view({nb * heads_k, s * ratio, d});
}

void copy_rows_to(const Tensor& rows, const Tensor& dst, int64_t heads_k) {
    const int64_t nb = dst.size(0), s = dst.size(1), h = dst.size(2), d = dst.size(3);
    const int64_t ratio = h / heads_k;
    dst.view({nb, s, heads_k, ratio, d})
        .permute({0, 2, 1, 3, 4})
        .copy_(rows.view({nb, heads_k, s, ratio, d}));
}

Tensor to_keys(const Tensor& x, at::ScalarType ct) {
    const int64_t nb = x.size(0), s = x.size(1), hk = x.size(2), d = x.size(3);
    return x.permute({0, 2, 1, 3}).to(ct).contiguous().view({nb * hk, s, d});
}

void copy_keys_to(const Tensor& keys, const Tensor& dst) {
    const int64_t nb = dst.size(0), s = dst.size(1), hk = dst.size(2), d = dst.size(3);
    dst.permute({0, 2, 1, 3}).copy_(keys.view({nb, hk, s, d}));
}

Tensor lse_from_rows(const Tensor& rows, int64_t batch, int64_t heads, int64_t heads_k,
                     int64_t seqlen_q) {
    const int64_t ratio = heads / heads_k;
    return rows.view({batch, heads_k, seqlen_q, ratio})
        .permute({0, 1, 3, 2})
        .reshape({batch, heads, seqlen_q});
}

Tensor lse_to_rows(const Tensor& lse, int64_t heads_k, at::ScalarType ct) {
    const int64_t nb = lse.size(0), h = lse.size(1), s = lse.size(2);
    const int64_t ratio = h / heads_k;
    return lse.reshape({nb, heads_k, ratio, s})
        .permute({0, 1, 3, 2})
        .to(ct)
        .contiguous()
        .view({nb * heads_k, s * ratio});
}

Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v,
                     const OptTensor& alibi_slopes, int64_t batch_offset) {
    const at::ScalarType ct = compute_dtype(q.scalar_type());
    Problem p;
    p.batch = q.size(0);
    p.seqlen_q = q.size(1);
    p.heads = q.size(2);
    p.head_dim = q.size(3);
    p.seqlen_k = k.size(1);
    p.heads_k = k.size(2);
    p.ratio = p.heads / p.heads_k;
    p.batch_offset = batch_offset;
    p.q = to_rows(q, p.heads_k, ct);
    p.k = to_keys(k, ct);
    p.v = to_keys(v, ct);
    if (alibi_slopes.has_value()) {
        const Tensor& a = *alibi_slopes;
        const Tensor per_batch =
            a.dim() == 1 ? a.unsqueeze(0).expand({p.batch, p.heads}) : a.narrow(0, batch_offset, p.batch);
        p.slopes = per_batch.to(q.device(), ct).reshape({p.batch * p.heads_k, p.ratio});
    }
    return p;
}

RowsFwd forward(const Problem& p, const AttnOptions& opts, bool need_out) {
    const int64_t G = p.q.size(0), rows = p.q.size(1), d = p.head_dim, ratio = p.ratio;
    const bool dropout = need_out && opts.dropout_p > 0.0;
    const double keep_scale = 1.0 / (1.0 - opts.dropout_p);
    RowsFwd r;
    r.lse = at::empty({G, rows}, p.q.options());
    if (need_out) r.out = at::empty({G, rows, d}, p.q.options());
    const Tiling t = tiling(p);
    for (int64_t g0 = 0; g0 < G; g0 += t.groups) {
        const int64_t g1 = std::min(G, g0 + t.groups);
        for (int64_t i0 = 0; i0 < p.seqlen_q; i0 += t.positions) {
            const int64_t i1 = std::min(p.seqlen_q, i0 + t.positions);
            const int64_t m_rows = (i1 - i0) * ratio;
            Tensor m = at::full({g1 - g0, m_rows}, -kInf, p.q.options());
            Tensor l = at::zeros({g1 - g0, m_rows}, p.q.options());
            Tensor acc;
            if (need_out) acc = at::zeros({g1 - g0, m_rows, d}, p.q.options());
            const auto [lo, hi] = key_range(p, opts, i0, i1);
            for (int64_t j0 = lo; j0 < hi; j0 += kKeyTile) {
                const int64_t j1 = std::min(hi, j0 + kKeyTile);
                Tensor s = scores(p, opts, g0, g1, i0, i1, j0, j1, nullptr);
                const Tensor m_new = at::maximum(m, std::get<0>(s.max(-1)));
                // A row with no visible key so far keeps max -inf; subtract 0 there (no NaN).
                const Tensor m_safe = m_new.masked_fill(m_new == -kInf, 0.0);
                const Tensor alpha = at::exp(m - m_safe);
                s.sub_(m_safe.unsqueeze(2)).exp_();  // s is now exp(s - m)
                l.mul_(alpha).add_(s.sum(-1));
                if (need_out) {
                    if (dropout) {
                        const Tensor keep = dropout_keep(p, opts, g0, g1, i0, i1, j0, j1);
                        s.masked_fill_(keep.logical_not(), 0.0).mul_(keep_scale);
                    }
                    const Tensor vt = p.v.slice(0, g0, g1).slice(1, j0, j1);
                    acc.mul_(alpha.unsqueeze(2)).baddbmm_(s, vt);
                }
                m = m_new;
            }
            const Tensor seen = l > 0;
            r.lse.slice(0, g0, g1).slice(1, i0 * ratio, i1 * ratio)
                .copy_(at::where(seen, m + at::log(l), kInf));
            if (need_out) {
                r.out.slice(0, g0, g1).slice(1, i0 * ratio, i1 * ratio)
                    .copy_(at::where(seen.unsqueeze(2), acc / l.unsqueeze(2), 0.0));
            }
        }
    }
    return r;
}

void write_softmax(const Problem& p, const AttnOptions& opts, const Tensor& lse_rows,
                   const Tensor& dst) {
    const int64_t G = p.q.size(0), ratio = p.ratio;
    const Tensor dst_g = dst.view({G, ratio, dst.size(2), dst.size(3)});
    const Tiling t = tiling(p);
    for (int64_t g0 = 0; g0 < G; g0 += t.groups) {
        const int64_t g1 = std::min(G, g0 + t.groups);
        for (int64_t i0 = 0; i0 < p.seqlen_q; i0 += t.positions) {
            const int64_t i1 = std::min(p.seqlen_q, i0 + t.positions);
            const Tensor lse = lse_rows.slice(0, g0, g1).slice(1, i0 * ratio, i1 * ratio);
            for (int64_t j0 = 0; j0 < p.seqlen_k; j0 += kKeyTile) {
                const int64_t j1 = std::min(p.seqlen_k, j0 + kKeyTile);
                Tensor prob = scores(p, opts, g0, g1, i0, i1, j0, j1, nullptr);
                prob.sub_(lse.unsqueeze(2)).exp_();
                if (opts.dropout_p > 0.0) {
                    const Tensor keep = dropout_keep(p, opts, g0, g1, i0, i1, j0, j1);
                    prob = at::where(keep, prob, -prob);
                }
                dst_g.slice(0, g0, g1).slice(2, i0, i1).slice(3, j0, j1)
                    .copy_(prob.view({g1 - g0, i1 - i0, ratio, j1 - j0}).permute({0, 2, 1, 3}));
            }
        }
    }
}

RowsBwd backward(const Problem& p, const AttnOptions& opts, const Tensor& dout_rows,
                 const Tensor& out_rows, const Tensor& lse_rows_in) {
    const int64_t G = p.q.size(0), ratio = p.ratio;
    const bool dropout = opts.dropout_p > 0.0;
    const double keep_scale = 1.0 / (1.0 - opts.dropout_p);
    // The saved lse is fp32; for fp64 inputs recompute it in fp64 so the gradients are exact to
    // fp64 precision (an fp32 lse would limit P = exp(s - lse) to ~1e-7 relative).
    const Tensor lse_rows =
        p.q.scalar_type() == at::kDouble ? forward(p, opts, /*need_out=*/false).lse : lse_rows_in;
    const Tensor delta = (dout_rows * out_rows).sum(-1);  // D = rowsum(dO * O)
    RowsBwd r;
    r.dq = at::zeros_like(p.q);
    r.dk = at::zeros_like(p.k);
    r.dv = at::zeros_like(p.v);
    const Tiling t = tiling(p);
    for (int64_t g0 = 0; g0 < G; g0 += t.groups) {
        const int64_t g1 = std::min(G, g0 + t.groups);
        for (int64_t i0 = 0; i0 < p.seqlen_q; i0 += t.positions) {
            const int64_t i1 = std::min(p.seqlen_q, i0 + t.positions);
            const int64_t r0 = i0 * ratio, r1 = i1 * ratio;
            const Tensor qt = p.q.slice(0, g0, g1).slice(1, r0, r1);
            const Tensor dot = dout_rows.slice(0, g0, g1).slice(1, r0, r1);
            const Tensor lse = lse_rows.slice(0, g0, g1).slice(1, r0, r1).unsqueeze(2);
            const Tensor dl = delta.slice(0, g0, g1).slice(1, r0, r1).unsqueeze(2);
            Tensor dq = r.dq.slice(0, g0, g1).slice(1, r0, r1);
            const auto [lo, hi] = key_range(p, opts, i0, i1);
            for (int64_t j0 = lo; j0 < hi; j0 += kKeyTile) {
                const int64_t j1 = std::min(hi, j0 + kKeyTile);
                const Tensor kt = p.k.slice(0, g0, g1).slice(1, j0, j1);
                const Tensor vt = p.v.slice(0, g0, g1).slice(1, j0, j1);
                Tensor dk = r.dk.slice(0, g0, g1).slice(1, j0, j1);
                Tensor dv = r.dv.slice(0, g0, g1).slice(1, j0, j1);
                Tensor tanh_s;
                Tensor prob = scores(p, opts, g0, g1, i0, i1, j0, j1, &tanh_s);
                prob.sub_(lse).exp_();  // P; 0 where masked and in rows with lse = +inf
                Tensor dprob = at::bmm(dot, vt.transpose(1, 2));
                if (dropout) {
                    const Tensor drop = dropout_keep(p, opts, g0, g1, i0, i1, j0, j1).logical_not();
                    const Tensor kept = prob.masked_fill(drop, 0.0).mul_(keep_scale);
                    dv.baddbmm_(kept.transpose(1, 2), dot);
                    dprob.masked_fill_(drop, 0.0).mul_(keep_scale);
                } else {
                    dv.baddbmm_(prob.transpose(1, 2), dot);
                }
                Tensor ds = prob.mul_(dprob.sub_(dl));  // dS = P * (dP - D)
                if (tanh_s.defined()) ds.mul_(1.0 - tanh_s * tanh_s);
                dq.baddbmm_(ds, kt, 1.0, opts.softmax_scale);
                dk.baddbmm_(ds.transpose(1, 2), qt, 1.0, opts.softmax_scale);
            }
        }
    }
    return r;
}

}  // namespace flash_cuda::reference::detail
