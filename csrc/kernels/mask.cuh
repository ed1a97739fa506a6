// Score transforms applied to mma.m16n8k16 S-accumulator fragments, in this order:
//   softcap  s = tanh(s * scale / softcap)             (final score = softcap * s)
//   ALiBi    s = s * score_scale - slope * |i + sk - sq - j|   (s becomes the final score)
//   mask     s = -inf where key j is not visible from query i (head groups: also where key
//            column j belongs to another KV head than row i)
// Visibility (bottom-right aligned; window sides -1 = unbounded; causal = right side 0):
//   j < seqlen_k  and  i + sk - sq - left <= j <= i + sk - sq + right.
//
// Element positions: element (mt, nt, e) of a thread's fragment s[kMTiles][kNTiles][4] holds
//   query row  row0 + 16 mt + 8 (e / 2)   and key  col0 + 8 nt + (e % 2),
// where row0 = the warp's first row + lane / 4 and col0 = the block's first key + 2 (lane % 4),
// both in sequence coordinates.
#pragma once

#include <cmath>

#include "kernels/ptx.cuh"

namespace flash_cuda {

// Which keys each query row of one (batch, head) sequence may see.
struct AttentionMask {
    int seqlen_k;
    int diag;          // seqlen_k - seqlen_q: the key "level with" query i is i + diag
    int window_left;   // -1: unbounded
    int window_right;  // -1: unbounded; 0 for causal

    // First visible key of query `row` (may be negative or past the end).
    __device__ __forceinline__ int key_begin(int row) const {
        return window_left >= 0 ? row + diag - window_left : 0;
    }
    // One past the last visible key of query `row` (at most seqlen_k, may be <= key_begin).
    __device__ __forceinline__ int key_end(int row) const {
        return window_right >= 0 ? min(seqlen_k, row + diag + window_right + 1) : seqlen_k;
    }
};

// s = tanh(s * pre_scale), pre_scale = softmax_scale / softcap.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_softcap(float (&s)[kMTiles][kNTiles][4], float pre_scale) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = ptx::tanh_approx(s[mt][nt][e] * pre_scale);
        }
    }
}

// s = s * score_scale - slope * |row + diag - col|: converts S units to final (natural-log)
// scores with the ALiBi bias added. level0 = row0 + diag (the key level with the query row of
// s[0][0][0]), col0 = key of s[0][0][0].
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_alibi(float (&s)[kMTiles][kNTiles][4], float score_scale,
                                            float slope, int level0, int col0) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int level = level0 + 16 * mt + 8 * half - col0;  // distance to col0
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float distance = static_cast<float>(abs(level - 8 * nt - c));
                    float& x = s[mt][nt][2 * half + c];
                    x = fmaf(x, score_scale, -slope * distance);
                }
            }
        }
    }
}

// The visible keys of query rows, in a form that is the same for all threads of the CTA (so
// it lives in uniform registers): query row i sees keys [i + begin_shift,
// min(seqlen_k, i + end_shift)).
struct KeyRange {
    int begin_shift;
    int end_shift;
    int seqlen_k;

    __device__ __forceinline__ static KeyRange make(const AttentionMask& mask) {
        constexpr int kUnbounded = 1 << 30;  // far beyond any key index, no overflow when offset
        KeyRange range;
        range.begin_shift = mask.window_left >= 0 ? mask.diag - mask.window_left : -kUnbounded;
        range.end_shift = mask.window_right >= 0 ? mask.diag + mask.window_right + 1 : kUnbounded;
        range.seqlen_k = mask.seqlen_k;
        return range;
    }
};

// s = -inf where the key is not visible (only called for blocks that touch a mask edge), with
// explicit query positions per fragment row: pos[mt][half] is the query row of
// s[mt][*][2 half + c] (sequence coordinates; GQA-packed tiles pass (position, head) rows'
// positions), col0 the key of s[*][0][0]. kCheckBegin = false: the caller knows the block lies
// at or past every row's begin, and only the end is tested (one compare per element instead of
// two; the sm90 forward's causal blocks without a window).
template <int kMTiles, int kNTiles, bool kCheckBegin = true>
__device__ __forceinline__ void apply_mask_positions(float (&s)[kMTiles][kNTiles][4],
                                                     const KeyRange& range,
                                                     const int (&pos)[kMTiles][2], int col0) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = pos[mt][half];
            const int begin = row + range.begin_shift - col0;
            const int end = min(range.seqlen_k, row + range.end_shift) - col0;
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int col = 8 * nt + c;
                    if ((kCheckBegin && col < begin) || col >= end) {
                        s[mt][nt][2 * half + c] = -INFINITY;
                    }
                }
            }
        }
    }
}

// The same for a tile of consecutive query rows: row0 / col0 are the query row and key of the
// thread's element s[0][0][0] (sequence coordinates).
template <bool kCheckBegin = true, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_mask(float (&s)[kMTiles][kNTiles][4], const KeyRange& range,
                                           int row0, int col0) {
    int pos[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
        pos[mt][0] = row0 + 16 * mt;
        pos[mt][1] = row0 + 16 * mt + 8;
    }
    apply_mask_positions<kMTiles, kNTiles, kCheckBegin>(s, range, pos, col0);
}

// Head groups (sm80/fwd.cuh; kernels/decode.h pack_head_groups): s = -inf where the key
// column's KV head, col % G (group_mask = G - 1), is not the row's. row_head[mt][half] is the
// KV head in the group of the rows of s[mt][*][2 half + c] (>= G for rows past the group's
// rows: never matched); col0 is the column of s[*][0][0] modulo any multiple of G (the key
// block's first column is one).
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_head_group_mask(float (&s)[kMTiles][kNTiles][4],
                                                      const int (&row_head)[kMTiles][2],
                                                      int col0, int group_mask) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    if (((col0 + 8 * nt + c) & group_mask) != row_head[mt][half]) {
                        s[mt][nt][2 * half + c] = -INFINITY;
                    }
                }
            }
        }
    }
}

}  // namespace flash_cuda
