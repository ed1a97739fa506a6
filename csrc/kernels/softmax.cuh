// Online softmax on mma.m16n8k16 accumulator fragments.
//
// Fragment ownership (see ptx.cuh): for every 16-row slice `mt` a thread holds rows g and g + 8
// (g = lane / 4) -- index `half` 0 and 1 below -- and columns 2t, 2t + 1 (t = lane % 4) of
// every 8-column tile. The four lanes of a quad (same g) together hold whole rows, so row
// reductions need two butterfly shuffles (xor 1, xor 2) and no shared memory.
//
// Scores arrive in "S units": the softmax input is s * log2_scale in base 2, i.e. the final
// natural-log score is s * log2_scale / log2(e). (log2_scale = softmax_scale * log2(e) for
// plain attention; see fwd.cuh for softcap and ALiBi.) Per row and key block:
//   m_new = max(m_old, max_j s_j)
//   p_j   = 2^(s_j * log2_scale - m_new * log2_scale)       one FFMA + ex2 per element
//   l     = l * 2^((m_old - m_new) * log2_scale)             (then l += P 1, see row_sum)
//   o     = o * 2^((m_old - m_new) * log2_scale)             (then o += P V)
// Masked scores are -inf and give p = 0; a row whose scores are all -inf so far keeps
// m = -inf and uses 0 as its exponent offset, so no inf - inf NaN appears. log2_scale > 0.
// l is the sum of P as rounded to 16 bits for P V, computed by the tensor cores as P times a
// matrix of ones next to P V (warp_gemm.cuh). Out = (P V) / l is then an exact convex
// combination of the rounded P: a one-hot row gives its value exactly, although its maximum
// has p = 2^r with r the rounding residual of m_new * log2_scale (|r| ~ 5e-4 at |s| ~ 1e4),
// which the 16-bit P and an fp32 sum of the unrounded p would each see differently. It also
// saves the per-element FADD of the sum and the final quad reduction.
#pragma once

#include <cmath>

#include "kernels/ptx.cuh"

namespace flash_cuda {

__device__ __forceinline__ float quad_allreduce_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_allreduce_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int kMTiles>
struct OnlineSoftmax {
    float row_max[kMTiles][2];  // running max of the row's scores (S units); -inf: none yet
    // l of rows g and g + 8: whole rows (P times ones sums over all keys of the block), so no
    // quad reduction is needed.
    float row_sum[kMTiles][2];

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                row_max[mt][half] = -INFINITY;
                row_sum[mt][half] = 0.f;
            }
        }
    }

    // Folds one key block into the running statistics: turns the scores `s` (kMTiles x kNTiles
    // x 4) into probabilities p (fp32, relative to the new row max) in place and rescales the
    // output accumulator `o` (kMTiles x kDTiles x 4) and the row sums to the new max; the caller
    // then adds P V to o and P 1 to row_sum.
    template <int kNTiles, int kDTiles>
    __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4],
                                           float (&o)[kMTiles][kDTiles][4], float log2_scale) {
        update_rows(s, log2_scale, [&](int mt, int half, float o_scale) {
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt) {
                o[mt][dt][2 * half] *= o_scale;
                o[mt][dt][2 * half + 1] *= o_scale;
            }
        });
    }

    // The default on_pair of update_scores / update_rows: nothing.
    struct NoPair {
        __device__ __forceinline__ void operator()(int, int, int, float, float) const {}
    };
    // The same as update, with the output's rescale factors returned in `o_scale` instead of
    // applied (rescale() applies them): the sm90 kernel computes P while the previous block's
    // P V is still accumulating into o, and rescales o once that has landed. Each pair of
    // probabilities is also handed to on_pair(mt, nt, half, p0, p1) right after its exponentials
    // (the sm90 kernel packs them into P V's A fragments there).
    template <int kNTiles, typename OnPair = NoPair>
    __device__ __forceinline__ void update_scores(float (&s)[kMTiles][kNTiles][4],
                                                  float log2_scale, float (&o_scale)[kMTiles][2],
                                                  OnPair&& on_pair = {}) {
        update_rows(
            s, log2_scale, [&](int mt, int half, float scale) { o_scale[mt][half] = scale; },
            on_pair);
    }
    template <int kDTiles>
    __device__ __forceinline__ static void rescale(float (&o)[kMTiles][kDTiles][4],
                                                   const float (&o_scale)[kMTiles][2]) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) o[mt][dt][e] *= o_scale[mt][e / 2];
            }
        }
    }

    // Per row: the new max, p = 2^(s log2_scale - max log2_scale) in place, row_sum rescaled, and
    // scale_o(mt, half, factor) with the output's rescale factor (update / update_scores).
    template <int kNTiles, typename ScaleO, typename OnPair = NoPair>
    __device__ __forceinline__ void update_rows(float (&s)[kMTiles][kNTiles][4], float log2_scale,
                                                ScaleO&& scale_o, OnPair&& on_pair = {}) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                float block_max = row_max[mt][half];
#pragma unroll
                for (int nt = 0; nt < kNTiles; ++nt) {
                    block_max = fmaxf(block_max, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
                }
                const float new_max = quad_allreduce_max(block_max);
                // Exponent offset of this row; 0 while the row has seen only masked keys.
                const float max_scaled = new_max == -INFINITY ? 0.f : new_max * log2_scale;
                // Rescale factor of o and l: 0 when the old max was -inf (o and l are 0 then),
                // exactly 1 when the max did not move. Subtract before scaling: the fused form
                // old * scale - max_scaled leaves the rounding residual of max_scaled, a factor
                // 1 + ~1e-6 that compounds over the key blocks (lse off by 0.66 at 2^24 keys).
                const float o_scale =
                    new_max == -INFINITY
                        ? 1.f
                        : ptx::exp2_approx((row_max[mt][half] - new_max) * log2_scale);
                row_max[mt][half] = new_max;
#pragma unroll
                for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                    for (int e = 2 * half; e < 2 * half + 2; ++e) {
                        s[mt][nt][e] = ptx::exp2_approx(fmaf(s[mt][nt][e], log2_scale, -max_scaled));
                    }
                    on_pair(mt, nt, half, s[mt][nt][2 * half], s[mt][nt][2 * half + 1]);
                }
                row_sum[mt][half] *= o_scale;
                scale_o(mt, half, o_scale);
            }
        }
    }

    // End of the key loop: divides `o` by the row sums and returns each row's natural-log
    // logsumexp in `lse`. Rows that saw no key (l = 0) get o = 0 and lse = +inf.
    template <int kDTiles>
    __device__ __forceinline__ void finalize(float (&o)[kMTiles][kDTiles][4],
                                             float (&lse)[kMTiles][2], float log2_scale) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const float sum = row_sum[mt][half];
                const bool empty = !(sum > 0.f);  // also catches NaN
                const float inv_sum = empty ? 0.f : 1.f / sum;
                lse[mt][half] = empty ? INFINITY
                                      : (row_max[mt][half] * log2_scale + __log2f(sum)) *
                                            static_cast<float>(M_LN2);
#pragma unroll
                for (int dt = 0; dt < kDTiles; ++dt) {
                    o[mt][dt][2 * half] *= inv_sum;
                    o[mt][dt][2 * half + 1] *= inv_sum;
                }
            }
        }
    }
};

}  // namespace flash_cuda
