// Internal to the reference: the blockwise online-softmax core shared by fwd, bwd, varlen and
// kvcache, and the layout helpers around it.
//
// Working layout ("rows"): the query heads that share a kv head are folded into the row
// dimension, so each tile of keys is read once for all of them (GQA without repeating K/V):
//   q, out, dout : (G, seqlen_q * ratio, d), G = batch * heads_k, row = i * ratio + r
//                  (query position i, query head kv * ratio + r)
//   k, v         : (G, seqlen_k, d)
//   lse          : (G, seqlen_q * ratio)
// All in the compute dtype (fp32, or fp64 for fp64 inputs), contiguous.
//
// Tiles cover a range of query positions (all `ratio` heads of each), a range of keys and a
// chunk of G, sized so a score tile holds about kTileElems elements: memory stays linear in the
// sequence lengths. Key tiles outside the causal/local window of a row tile are skipped.
#pragma once

#include "reference/reference.h"

namespace flash_cuda::reference::detail {

constexpr int64_t kKeyTile = 256;
constexpr int64_t kTileElems = int64_t{1} << 20;

// One attention problem (a batch of sequences of equal lengths) in the working layout.
struct Problem {
    Tensor q, k, v;
    Tensor slopes;  // ALiBi slopes (G, ratio) in the compute dtype, or undefined
    int64_t batch = 0, heads = 0, heads_k = 0, ratio = 1, seqlen_q = 0, seqlen_k = 0;
    int64_t head_dim = 0;
    int64_t batch_offset = 0;  // global batch index of this problem's batch 0 (dropout streams)
};

// fp64 for fp64 inputs, else fp32.
at::ScalarType compute_dtype(at::ScalarType input);

// (nb, s, h, d) -> rows (nb * hk, s * ratio, d) in dtype `ct` (any input strides).
Tensor to_rows(const Tensor& x, int64_t heads_k, at::ScalarType ct);
// rows (nb * hk, s * ratio, d) -> written into dst (nb, s, h, d) (a contiguous tensor or slice).
void copy_rows_to(const Tensor& rows, const Tensor& dst, int64_t heads_k);
// (nb, s, hk, d) -> (nb * hk, s, d) in dtype `ct`.
Tensor to_keys(const Tensor& x, at::ScalarType ct);
// (nb * hk, s, d) -> written into dst (nb, s, hk, d).
void copy_keys_to(const Tensor& keys, const Tensor& dst);
// lse rows (nb * hk, s * ratio) -> (nb, h, s), and back.
Tensor lse_from_rows(const Tensor& rows, int64_t batch, int64_t heads, int64_t heads_k,
                     int64_t seqlen_q);
Tensor lse_to_rows(const Tensor& lse, int64_t heads_k, at::ScalarType ct);

// q (nb, sq, h, d), k/v (nb, sk, hk, d); batches [batch_offset, batch_offset + nb) of the call
// (selects the ALiBi slopes of shape (b, h) and the dropout streams).
Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v,
                     const OptTensor& alibi_slopes, int64_t batch_offset);

struct RowsFwd {
    Tensor out;  // (G, rows, d), undefined when not asked for
    Tensor lse;  // (G, rows), +inf for rows with no visible key
};
RowsFwd forward(const Problem& p, const AttnOptions& opts, bool need_out);

// Writes P = exp(s - lse) (negated where dropout drops it) into dst (nb, h, >= sq, >= sk).
void write_softmax(const Problem& p, const AttnOptions& opts, const Tensor& lse_rows,
                   const Tensor& dst);

struct RowsBwd {
    Tensor dq;      // (G, rows, d)
    Tensor dk, dv;  // (G, sk, d)
};
RowsBwd backward(const Problem& p, const AttnOptions& opts, const Tensor& dout_rows,
                 const Tensor& out_rows, const Tensor& lse_rows);

// Dropout keep-mask (bool, on the problem's device) of the tile G [g0, g1) x query positions
// [i0, i1) (all ratio heads each, in row order) x keys [j0, j1): philox.cuh's definition.
Tensor dropout_keep(const Problem& p, const AttnOptions& opts, int64_t g0, int64_t g1, int64_t i0,
                    int64_t i1, int64_t j0, int64_t j1);

inline int64_t round_up_128(int64_t x) { return (x + 127) / 128 * 128; }

}  // namespace flash_cuda::reference::detail
