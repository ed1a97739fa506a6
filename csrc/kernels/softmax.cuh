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
// l by input type (kRowSumsOfFp32P below):
// - fp16: the sum of the P that P V multiplies, computed by the tensor cores as P times a matrix
//   of ones next to P V (sm80/warp_gemm.cuh warp_gemm_p_rowsum; the sm90 kernel's wgmma m64n8),
//   or by FADDs of the unpacked P. Out = (P V) / l is then an exact convex combination of the
//   rounded P: a one-hot row gives its value exactly, although its maximum has p = 2^r with r
//   the rounding residual of m_new * log2_scale (|r| ~ 5e-4 at |s| ~ 1e4), which the 16-bit P
//   and an fp32 sum of the unrounded p would each see differently. lse is within fp16's
//   rounding of P (2^-11) of exact.
// - bf16: the sum of the fp32 p, by FADDs (add_row_sums, or update_scores' kSumP), per thread,
//   made whole rows by reduce_row_sums. With bf16's 8 significant bits, sums of the rounded P
//   put lse up to ~1.7e-3 off on rows of a few keys; these put it ~1e-6 off. Out divides the
//   bf16 P's products by a sum that differs from theirs by bf16's rounding of P.
#pragma once

#include <cmath>
#include <type_traits>

#include "kernels/ptx.cuh"

namespace flash_cuda {

// Whether the row sums are of the fp32 P (bf16 inputs) or of the P that P V multiplies (fp16).
template <typename Element>
inline constexpr bool kRowSumsOfFp32P = std::is_same_v<Element, __nv_bfloat16>;

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
    template <bool kSumP = false, int kNTiles, typename OnPair = NoPair>
    __device__ __forceinline__ void update_scores(float (&s)[kMTiles][kNTiles][4],
                                                  float log2_scale, float (&o_scale)[kMTiles][2],
                                                  OnPair&& on_pair = {}) {
        update_rows<kSumP>(
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
    // kSumP: row_sum also gains this thread's share of the row's fp32 p, added pair by pair right
    // behind the exponentials (add_row_sums adds them after all of them instead). The shares are
    // per thread: quad_allreduce_sum makes them whole rows at the end.
    template <bool kSumP = false, int kNTiles, typename ScaleO, typename OnPair = NoPair>
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
                if constexpr (kSumP) row_sum[mt][half] *= o_scale;
#pragma unroll
                for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                    for (int e = 2 * half; e < 2 * half + 2; ++e) {
                        s[mt][nt][e] = ptx::exp2_approx(fmaf(s[mt][nt][e], log2_scale, -max_scaled));
                    }
                    on_pair(mt, nt, half, s[mt][nt][2 * half], s[mt][nt][2 * half + 1]);
                    if constexpr (kSumP) {
                        row_sum[mt][half] += s[mt][nt][2 * half] + s[mt][nt][2 * half + 1];
                    }
                }
                if constexpr (!kSumP) row_sum[mt][half] *= o_scale;
                scale_o(mt, half, o_scale);
            }
        }
    }

    // row_sum += this thread's share of each row's p (fp32, as update / update_scores left it in
    // `p`), four chains of adds per row; quad_allreduce_sum makes them whole rows at the end.
    template <int kNTiles>
    __device__ __forceinline__ void add_row_sums(const float (&p)[kMTiles][kNTiles][4]) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int nt = 0; nt < kNTiles; ++nt) {
                    part[2 * (nt % 2)] += p[mt][nt][2 * half];
                    part[2 * (nt % 2) + 1] += p[mt][nt][2 * half + 1];
                }
                row_sum[mt][half] += (part[0] + part[1]) + (part[2] + part[3]);
            }
        }
    }

    // After the key loop: whole-row sums from the per-thread shares of add_row_sums / kSumP /
    // the FADDs of the unpacked P. The rescales and the key-split decode tile's merge
    // (sm80/decode_keysplit.cuh) are linear in the shares, so they may come before this.
    __device__ __forceinline__ void reduce_row_sums() {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                row_sum[mt][half] = quad_allreduce_sum(row_sum[mt][half]);
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
