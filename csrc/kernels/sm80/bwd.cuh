// FlashAttention-2-style backward on tensor cores with mma.sync (sm80+): fixed length or varlen
// (packed rows, cu_seqlens), softcap and ALiBi (template flags), deterministic dq (splits).
//
// Three kernels per call (bwd_launch.cuh):
//   1. preprocess: D[b, h, i] = sum_c dO[i, c] O[i, c] (fp32), d / 8 lanes (a power of two) per
//      (query row, head), 16-byte loads; it also zeroes dq_accum.
//   2. main: one CTA per (key block of kBlockN rows, batch, query head). K_n, V_n go to shared
//      memory once; the CTA loops over the query blocks that can see some key of the block:
//        Q_m, dO_m, lse_m, D_m -> shared (cp.async; the next query block loads during
//                                this one)
//        S^T  = K Q^T        (warps split the keys: each warp owns kKeyTiles x 16 key rows)
//        P^T  = exp2(S^T scale log2(e) - lse log2(e)),   0 where masked (exponent -inf: no
//                                              branch per element)
//        dV  += P^T dO                         (P^T straight from the accumulators into A
//                                              fragments, fp32 accumulators in registers)
//        dP^T = V dO^T, in kDpParts query slices after the dV GEMM (S^T and dP^T are never
//               live together), each slice turned into
//        dZ^T = P^T (dP^T - D)                 (gradient of the scaled scores z = scale s)
//        dK  += dZ^T Q
//        dZ^T -> shared (Element); dQ += dZ K  (warps split query rows x head-dim columns;
//                                              fp32 red.global.add.v2 into dq_accum)
//      Two passes per key block at d >= FLASH_CUDA_BWD_TWO_PASS_MIN_HDIM (224; BwdTraits::
//      kTwoPass): pass 0 runs S^T -> P^T -> dV only, pass 1 recomputes S^T -> P^T and runs the
//      rest without the dV GEMM, so one d-wide accumulator is live at a time (no spills).
//      At the end (bwd_dkv_store.cuh) dK, dV are written once by one CTA, no atomics: MHA
//      straight to dk / dv (scaled, Element); GQA fp32 unscaled to the per-query-head
//      workspaces dk_accum / dv_accum (b, h, seqlen_k_rounded, HeadDim).
//   3. postprocess: dq = scale * dq_accum; GQA: dk = scale * sum over the query heads of a KV
//      head of dk_accum (fixed order: bitwise reproducible), dv likewise without the scale;
//      converted to Element and written with the output strides.
// Rows with no visible key have lse = +inf: P = 0 there, so their gradients are 0.
// Scores are recomputed exactly as the forward does (fwd.cuh / mask.cuh): z = scale s, or with
// softcap z = softcap tanh(scale s / softcap); ALiBi subtracts slope |i + sk - sq - j|; then
// P = exp(z - lse). The gradient of the capped score w.r.t. scale s is (1 - tanh^2), so
// dZ^T = P^T (dP^T - D) (1 - t^2) with t the tanh value; ALiBi has no gradient (only P).
// Varlen (cu_seqlens_q / cu_seqlens_k set): rows are packed; lse and D are (h, total_q), the
// dq accumulator (h, total_q, HeadDim), the dk / dv workspaces (h, total_k, HeadDim).
// Deterministic mode (params.deterministic): the grid has params.num_splits CTAs along x; CTA x
// handles key blocks x, x + num_splits, ... in order and accumulates dQ into its own slice x of
// dq_accum (params.dq_accum_split_stride floats apart), so every dq_accum element is added to
// by one thread in a fixed order; the postprocess sums the slices in order 0, 1, ... Without
// it there is one CTA per key block and one slice (atomics from several CTAs: dq is not
// reproducible). dk / dv are always bitwise reproducible.
// Dropout (IsDropout; fixed length or varlen, deterministic or not, softcap / ALiBi or not)
// replays the forward's mask (dropout.cuh) in the P^T step: its rows and keys are relative to
// the sequence start and its stream is batch * h + head, as in the forward (varlen: batch = the
// sequence).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/convert.cuh"
#include "kernels/dropout.cuh"
#include "kernels/mask.cuh"
#include "kernels/params.h"
#include "kernels/ptx.cuh"
#include "kernels/sm80/bwd_dkv_store.cuh"
#include "kernels/sm80/tile_io.cuh"
#include "kernels/sm80/traits.h"
#include "kernels/sm80/warp_gemm.cuh"

// Head dims from which the main kernel makes two passes per key block (BwdTraits::kTwoPass:
// dV first, then dK and dQ); default 224 (d224, d256). 192 adds d192: spill-free then, but
// measured 3-5% slower fwd+bwd than one pass with its 136-192 B of spills (bench/NOTES.md run
// 22). A value above 256 turns the two passes off. For A/B timing.
#ifndef FLASH_CUDA_BWD_TWO_PASS_MIN_HDIM
#define FLASH_CUDA_BWD_TWO_PASS_MIN_HDIM 224
#endif

namespace flash_cuda {
namespace sm80 {

// Tile configuration of the backward. kBlockN keys per CTA, kBlockM queries per iteration,
// kNWarps warps. Warps split the keys for S^T, dP^T, dV, dK (kKeyTiles 16-row slices each) and
// split (query rows x head-dim columns) for dQ (kDqWarpsM x kDqWarpsD warps, each 16 rows x
// kDqCols columns).
// QStages: buffers of the per-query-block inputs (Q, dO, lse, D); 2 = the next query block
// loads while the current one computes.
template <int HeadDim, int BlockM, int BlockN, int NWarps, int QStages = 2>
struct BwdTraits {
    static constexpr int kHeadDim = HeadDim;
    static constexpr int kBlockM = BlockM;
    static constexpr int kBlockN = BlockN;
    static constexpr int kNWarps = NWarps;
    static constexpr int kNThreads = NWarps * 32;
    static constexpr int kQStages = QStages;
    // Two passes over the query blocks per key block (HeadDim >= FLASH_CUDA_BWD_TWO_PASS_MIN_HDIM,
    // default 224): pass 0 accumulates dV only, pass 1 recomputes S^T -> P^T and accumulates dK
    // (and dQ). One HeadDim-wide accumulator per thread instead of two (d256: 128 fp32
    // registers instead of 256; one pass spilled 0.5-1.2 KB per thread there), for one extra
    // S^T GEMM (6 GEMMs per query block instead of 5) and a second read of Q, dO, lse.
    // d160 and d192 keep one pass (d192 spills 136-192 B and is still faster than two, run 22;
    // only d192 dropout runs this kernel now, the rest of d192 runs bwd_v2.cuh).
    static constexpr bool kTwoPass = HeadDim >= FLASH_CUDA_BWD_TWO_PASS_MIN_HDIM;
    static constexpr int kKeyTiles = BlockN / (16 * NWarps);
    static constexpr int kDTiles = HeadDim / 8;
    static constexpr int kDqWarpsM = BlockM / 16;
    static constexpr int kDqWarpsD = NWarps / kDqWarpsM;
    static constexpr int kDqCols = HeadDim / kDqWarpsD;
    static constexpr int kDqDTiles = kDqCols / 8;

    using QTile = SwizzledTile<BlockM, HeadDim>;   // Q and dO
    using KVTile = SwizzledTile<BlockN, HeadDim>;  // K and V
    using DSTile = SwizzledTile<BlockN, BlockM>;   // dZ^T (keys x queries)
    using QCopy = TileCopy<QTile, kNThreads>;
    using KVCopy = TileCopy<KVTile, kNThreads>;

    static constexpr int kSmemKOffset = 0;
    static constexpr int kSmemVOffset = kSmemKOffset + KVTile::kBytes;
    static constexpr int kSmemQOffset = kSmemVOffset + KVTile::kBytes;
    // Per query-block stage: Q tile, dO tile, lse (kBlockM floats), D (kBlockM floats).
    static constexpr int kSmemDOOffset = kSmemQOffset + QTile::kBytes;
    static constexpr int kSmemLseOffset = kSmemDOOffset + QTile::kBytes;
    static constexpr int kSmemDOffset = kSmemLseOffset + BlockM * 4;
    static constexpr int kSmemQStageBytes = 2 * QTile::kBytes + 2 * BlockM * 4;
    static constexpr int kSmemDSOffset = kSmemQOffset + QStages * kSmemQStageBytes;
    static constexpr int kSmemPointersOffset = kSmemDSOffset + DSTile::kBytes;  // BwdCtaPointers
    static constexpr int kSmemBytes = kSmemPointersOffset + 32;
    static_assert(kSmemPointersOffset % 16 == 0, "pointer area alignment");

    // S^T = K Q^T (and dP^T = V dO^T) in the shape warp_gemm_qk expects: A tile = K, B = Q.
    struct ScoreGemm {
        static constexpr int kHeadDim = HeadDim;
        static constexpr int kMTiles = kKeyTiles;
        static constexpr int kNTiles = BlockM / 8;
        using QTile = SwizzledTile<BlockN, HeadDim>;   // the A operand: K (or V)
        using KVTile = SwizzledTile<BlockM, HeadDim>;  // the B operand: Q (or dO)
    };
    // dP^T = V dO^T one query slice at a time (kDpParts slices of kBlockM / kDpParts rows):
    // two for the 64-query tile at d >= 128 (d128 plain: spill-free with two, the S^T + dP^T
    // peak otherwise). The 32-query tiles keep one: ptxas (CUDA 13) spilled more with two at
    // d160-d224 (d160 fp16: 60-68 B vs 0; d224: 612-684 B vs 492-584 B), d128 bias tile 0 B
    // either way.
    static constexpr int kDpParts = (HeadDim >= 128 && BlockM >= 64) ? 2 : 1;
    struct PartScoreGemm {
        static constexpr int kHeadDim = HeadDim;
        static constexpr int kMTiles = kKeyTiles;
        static constexpr int kNTiles = BlockM / 8 / kDpParts;
        using QTile = SwizzledTile<BlockN, HeadDim>;
        using KVTile = SwizzledTile<BlockM, HeadDim>;  // the whole dO tile (offset per slice)
    };
    static_assert((BlockM / 8 / kDpParts) % 2 == 0, "dP^T slices of whole 16-query steps");
    // dV += P^T dO (and dK += dZ^T Q) in the shape warp_gemm_pv expects: k dim = the queries.
    struct GradGemm {
        static constexpr int kHeadDim = HeadDim;
        static constexpr int kMTiles = kKeyTiles;
        static constexpr int kBlockN = BlockM;
        static constexpr int kNTiles = BlockM / 8;  // S^T accumulator tiles (the P^T source)
        static constexpr int kDTiles = HeadDim / 8;
        using KVTile = SwizzledTile<BlockM, HeadDim>;
    };

    static_assert(HeadDim % 32 == 0 && HeadDim <= 256, "head dim: multiple of 32, at most 256");
    static_assert(BlockN % (16 * NWarps) == 0, "each warp owns whole 16-key slices");
    static_assert(BlockM % 16 == 0 && NWarps % kDqWarpsM == 0, "dQ warp grid");
    static_assert(kDqCols % 8 == 0 && kDqCols * kDqWarpsD == HeadDim,
                  "dQ column slices: whole 8-column tiles");
    // The dQ GEMM steps its K fragment addresses with SwizzledTile::stepped when the warp's
    // first column is aligned to the slice width (power-of-two slices); else per-pair bases.
    static constexpr bool kDqColsPow2 = (kDqCols & (kDqCols - 1)) == 0;
    static_assert(128 % BlockM == 0 && 128 % BlockN == 0, "workspaces are rounded to 128 rows");
    static_assert(kSmemBytes <= 227 * 1024, "must fit a Hopper CTA's shared memory");
    static_assert(kSmemVOffset == kSmemKOffset + KVTile::kBytes,
                  "V follows K (the dQ GEMM's odd last tile reads past K)");
};

template <int HeadDim>
struct BwdConfig;
// Per thread: dK + dV accumulators kKeyTiles HeadDim floats (a warp owns 16 kKeyTiles keys x
// HeadDim twice), S^T + dP^T kKeyTiles kBlockM floats. Shared memory: K, V (kBlockN x d), Q, dO
// (kBlockM x d), dZ^T (kBlockN x kBlockM), 16-bit, + 2 kBlockM floats. BiasTraits (optional):
// the tile of the softcap / ALiBi kernels, which keep more values live in the P^T step.
// Registers, spills and shared memory per instantiation: bench/NOTES_kernel_bwd.md.
template <> struct BwdConfig<32> { using Traits = BwdTraits<32, 64, 128, 8>; };
template <> struct BwdConfig<64> {
    using Traits = BwdTraits<64, 64, 128, 8>;
    using BiasTraits = BwdTraits<64, 32, 128, 8>;
};
// d96: 64 x 128 / 8 warps spilled 12-36 B (all but the plain non-causal variant); 32 x 64 /
// 4 warps does not (32 x 128 / 8 warps is impossible: 32-wide atoms, see below).
template <> struct BwdConfig<96> { using Traits = BwdTraits<96, 32, 64, 4>; };
template <> struct BwdConfig<128> {
    using Traits = BwdTraits<128, 64, 128, 8>;
    using BiasTraits = BwdTraits<128, 32, 128, 8>;
};
// d >= 160: the accumulators alone exceed the register file (spills); 32 x 64, 4 warps keeps
// the S^T / dP^T part small and the shared memory under A100's 163 KB.
template <> struct BwdConfig<160> { using Traits = BwdTraits<160, 32, 64, 4>; };
template <> struct BwdConfig<192> { using Traits = BwdTraits<192, 32, 64, 4>; };
template <> struct BwdConfig<224> { using Traits = BwdTraits<224, 32, 64, 4>; };
template <> struct BwdConfig<256> { using Traits = BwdTraits<256, 32, 64, 4>; };

// The tile of the dropout kernels without softcap / ALiBi (with them: the bias tile): the
// 32-query bias tile at d >= 128 (the 64-query tile spilled 52-76 B at d128 with the Philox draws
// in the loop), else the main tile.
template <int HeadDim>
using bwd_dropout_traits_t =
    std::conditional_t<(HeadDim >= 128), bias_traits_t<BwdConfig<HeadDim>>,
                       typename BwdConfig<HeadDim>::Traits>;

// Where one (batch, query head) starts in every tensor and workspace, fixed length or varlen.
struct BwdSequence {
    int64_t q_offset, do_offset;  // elements: query row 0 of the sequence (head 0)
    int64_t k_offset, v_offset;   // elements: key row 0 of the sequence (head 0)
    int64_t lse_row0;             // lse index of query row 0 of this head
    int64_t acc_row0;             // D / dq_accum row of query row 0 of this head
    int64_t kv_row0;              // dk / dv workspace row of key row 0 of this query head
    int seqlen_q, seqlen_k;

    __device__ __forceinline__ static BwdSequence make(const BwdParams& params, int batch,
                                                       int head) {
        BwdSequence seq;
        const int64_t bh = static_cast<int64_t>(batch) * params.h + head;
        if (params.cu_seqlens_q != nullptr) {
            const int start = params.cu_seqlens_q[batch];
            seq.seqlen_q = params.cu_seqlens_q[batch + 1] - start;
            seq.q_offset = static_cast<int64_t>(start) * params.q_row_stride;
            seq.do_offset = static_cast<int64_t>(start) * params.do_row_stride;
            seq.lse_row0 = static_cast<int64_t>(head) * params.total_q + start;
            seq.acc_row0 = seq.lse_row0;
        } else {
            seq.seqlen_q = params.seqlen_q;
            seq.q_offset = static_cast<int64_t>(batch) * params.q_batch_stride;
            seq.do_offset = static_cast<int64_t>(batch) * params.do_batch_stride;
            seq.lse_row0 = bh * params.seqlen_q;
            seq.acc_row0 = bh * params.seqlen_q_rounded;
        }
        if (params.cu_seqlens_k != nullptr) {
            const int start = params.cu_seqlens_k[batch];
            seq.seqlen_k = params.cu_seqlens_k[batch + 1] - start;
            seq.k_offset = static_cast<int64_t>(start) * params.k_row_stride;
            seq.v_offset = static_cast<int64_t>(start) * params.v_row_stride;
            seq.kv_row0 = static_cast<int64_t>(head) * params.total_k + start;
        } else {
            seq.seqlen_k = params.seqlen_k;
            seq.k_offset = static_cast<int64_t>(batch) * params.k_batch_stride;
            seq.v_offset = static_cast<int64_t>(batch) * params.v_batch_stride;
            seq.kv_row0 = bh * params.seqlen_k_rounded;
        }
        return seq;
    }
};

// Per-(batch, query head) pointers the query loop needs, kept in shared memory (written once
// by thread 0) instead of registers.
struct BwdCtaPointers {
    const void* q;
    const void* d_o;
    const float* lse;
    const float* dsum;

    // Written by thread 0 of the CTA (visible after the next barrier).
    template <typename Element>
    __device__ __forceinline__ void init(const BwdParams& params, const BwdSequence& seq,
                                         int head) {
        q = reinterpret_cast<const Element*>(params.q_ptr) + seq.q_offset +
            head * params.q_head_stride;
        d_o = reinterpret_cast<const Element*>(params.do_ptr) + seq.do_offset +
              head * params.do_head_stride;
        lse = params.softmax_lse_ptr + seq.lse_row0;
        dsum = reinterpret_cast<const float*>(params.dsoftmax_sum) + seq.acc_row0;
    }
};

// The forward's mask (fwd.cuh) for one sequence: window as normalised by the host,
// per-sequence lengths.
template <bool Causal>
__device__ __forceinline__ AttentionMask bwd_attention_mask(const BwdParams& params,
                                                            const BwdSequence& seq) {
    AttentionMask mask;
    mask.seqlen_k = seq.seqlen_k;
    mask.diag = seq.seqlen_k - seq.seqlen_q;
    mask.window_left = params.window_size_left;
    mask.window_right = Causal ? 0 : params.window_size_right;
    return mask;
}

// ALiBi slope of (batch, head) in base-2 score units (slope log2(e)).
__device__ __forceinline__ float bwd_alibi_slope_log2(const BwdParams& params, int batch,
                                                      int head) {
    return reinterpret_cast<const float*>(
               params.alibi_slopes_ptr)[batch * params.alibi_slopes_batch_stride + head] *
           static_cast<float>(M_LOG2E);
}

// The CTA's fp32 dQ accumulator rows of this (batch, head); deterministic: its own slice.
template <int HeadDim>
__device__ __forceinline__ float* bwd_dq_head(const BwdParams& params, const BwdSequence& seq) {
    return reinterpret_cast<float*>(params.dq_accum_ptr) +
           (params.deterministic ? blockIdx.x * params.dq_accum_split_stride : 0) +
           seq.acc_row0 * HeadDim;
}

// Query blocks [min, max) of kBlockM rows that see some key of [n0, n0 + valid_keys):
//   j >= i + begin_shift and j < i + end_shift  =>  n0 - end_shift < i <= last - begin_shift.
struct BwdQueryBlocks {
    int min, max;

    template <int kBlockM>
    __device__ __forceinline__ static BwdQueryBlocks make(const KeyRange& range, int n0,
                                                          int valid_keys, int seqlen_q) {
        int64_t q_lo = static_cast<int64_t>(n0) - range.end_shift + 1;
        q_lo = q_lo < 0 ? 0 : q_lo;
        int64_t q_hi = static_cast<int64_t>(n0) + valid_keys - range.begin_shift;  // exclusive
        q_hi = q_hi > seqlen_q ? seqlen_q : q_hi;
        BwdQueryBlocks blocks;
        blocks.min = static_cast<int>(q_lo / kBlockM);
        blocks.max = q_hi > q_lo ? static_cast<int>((q_hi + kBlockM - 1) / kBlockM) : blocks.min;
        return blocks;
    }
};

// Lanes of the preprocess per (query row, head): one per 8 columns (a 16-byte load of O and of
// dO each), rounded up to a power of two (d96: 16, four idle), at most a warp.
constexpr int bwd_preprocess_lanes(int head_dim) {
    int lanes = 4;
    while (lanes < 32 && 8 * lanes < head_dim) lanes *= 2;
    return lanes;
}

// D = rowsum(dO * O), fp32: (b, h, seqlen_q_rounded), or (h, total_q) varlen. kLanes lanes per
// (query row, head), 8 columns each (params.d a multiple of 8, rows 16-byte aligned: the host
// pads them); the (row, head) pairs are taken heads fastest, so a warp reads 32 / kLanes
// consecutive rows of 2 d bytes in the (b, s, h, d) layout. Also zeroes dq_accum
// (params.dq_accum_zero_vec4 float4s). Both loops are grid-stride.
template <typename Element, int kLanes>
__global__ void __launch_bounds__(256) mha_bwd_preprocess_kernel(
    const __grid_constant__ BwdParams params) {
    static_assert(kLanes >= 1 && kLanes <= 32 && 32 % kLanes == 0, "a power of two <= 32");
    constexpr int kRowsPerWarp = 32 / kLanes;
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t n_threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
    float4* const dq_accum = reinterpret_cast<float4*>(params.dq_accum_ptr);
    for (int64_t i = thread; i < params.dq_accum_zero_vec4; i += n_threads) {
        dq_accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const bool varlen = params.cu_seqlens_q != nullptr;
    const int64_t tokens = varlen ? params.total_q
                                  : static_cast<int64_t>(params.b) * params.seqlen_q;
    const int64_t pairs = tokens * params.h;  // (token, head), heads fastest
    const int lane = threadIdx.x % kLanes;
    const int chunks = params.d / 8;
    // Warp-uniform trip count: every lane reaches the shuffles.
    for (int64_t pair0 = thread / 32 * kRowsPerWarp; pair0 < pairs;
         pair0 += n_threads / 32 * kRowsPerWarp) {
        const int64_t pair = pair0 + threadIdx.x % 32 / kLanes;
        float sum = 0.f;
        int64_t out_index = 0;
        if (pair < pairs) {
            const int head = static_cast<int>(pair % params.h);
            const int64_t token = pair / params.h;  // batch * seqlen_q + row, or the packed row
            int64_t o_offset, do_offset;
            if (varlen) {
                o_offset = token * params.o_row_stride + head * params.o_head_stride;
                do_offset = token * params.do_row_stride + head * params.do_head_stride;
                out_index = static_cast<int64_t>(head) * params.total_q + token;
            } else {
                const int batch = static_cast<int>(token / params.seqlen_q);
                const int row = static_cast<int>(token % params.seqlen_q);
                o_offset = batch * params.o_batch_stride + row * params.o_row_stride +
                           head * params.o_head_stride;
                do_offset = batch * params.do_batch_stride + row * params.do_row_stride +
                            head * params.do_head_stride;
                out_index = (static_cast<int64_t>(batch) * params.h + head) *
                                params.seqlen_q_rounded + row;
            }
            const Element* o = reinterpret_cast<const Element*>(params.o_ptr) + o_offset;
            const Element* d_o = reinterpret_cast<const Element*>(params.do_ptr) + do_offset;
            for (int c = lane; c < chunks; c += kLanes) {
                const uint4 o8 = *reinterpret_cast<const uint4*>(o + 8 * c);
                const uint4 do8 = *reinterpret_cast<const uint4*>(d_o + 8 * c);
                const uint32_t o_words[4] = {o8.x, o8.y, o8.z, o8.w};
                const uint32_t do_words[4] = {do8.x, do8.y, do8.z, do8.w};
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const float2 a = ptx::unpack_float2<Element>(o_words[w]);
                    const float2 b = ptx::unpack_float2<Element>(do_words[w]);
                    sum = fmaf(a.x, b.x, sum);
                    sum = fmaf(a.y, b.y, sum);
                }
            }
        }
#pragma unroll
        for (int off = kLanes / 2; off > 0; off /= 2) {
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
        }
        if (pair < pairs && lane == 0) {
            reinterpret_cast<float*>(params.dsoftmax_sum)[out_index] = sum;
        }
    }
}

// x, recomputed where used (opaque to the compiler, so lane-derived addresses are rebuilt in
// the query loop instead of being kept -- or spilled -- through it).
__device__ __forceinline__ int bwd_fresh(int x) {
    return ptx::opaque(x);
}

// One recomputed score, as the forward computed it, in base-2 units relative to the row's lse:
// returns log2 p for the raw score s (= q.k) and sets dscore = d(final score) / d(scale s)
// (1 - t^2 with softcap, t the tanh value; else 1). alibi_distance = |i + diag - j| (unused
// without ALiBi).
template <bool HasSoftcap, bool HasAlibi>
__device__ __forceinline__ float bwd_score_log2_p(float s, float& dscore, float score_log2,
                                                  float softcap_pre_scale, float alibi_slope_log2,
                                                  int alibi_distance, float lse_log2) {
    float x = s;
    if constexpr (!HasSoftcap && !HasAlibi) {
        x = fmaf(x, score_log2, -lse_log2);
    } else {
        if constexpr (HasSoftcap) {
            const float t = ptx::tanh_approx(x * softcap_pre_scale);
            dscore = fmaf(-t, t, 1.f);
            x = t;
        }
        x *= score_log2;
        if constexpr (HasAlibi) {
            x = fmaf(-alibi_slope_log2, static_cast<float>(alibi_distance), x);
        }
        x -= lse_log2;
    }
    return x;
}

// K and V rows [n0, n0 + valid_keys) of the (batch, head)'s KV head -> smem_k / smem_v
// (cp.async, one group; rows past valid_keys zero-filled). The pointers are re-derived per key
// block (opaque indices: not hoisted), so they are not kept (spilled) through the query loop.
template <typename Element, typename KVCopy>
__device__ __forceinline__ void load_bwd_kv_block(const BwdParams& params, int batch, int head,
                                                  int n0, int valid_keys, uint32_t smem_k,
                                                  uint32_t smem_v, int tid) {
    const int batch_o = ptx::opaque(batch), head_o = ptx::opaque(head);
    const BwdSequence seq_o = BwdSequence::make(params, batch_o, head_o);
    const int kv_head = head_o / params.h_h_k_ratio;
    const Element* k_seq = reinterpret_cast<const Element*>(params.k_ptr) + seq_o.k_offset +
                           kv_head * params.k_head_stride;
    const Element* v_seq = reinterpret_cast<const Element*>(params.v_ptr) + seq_o.v_offset +
                           kv_head * params.v_head_stride;
    KVCopy::load_async(smem_k, k_seq + static_cast<int64_t>(n0) * params.k_row_stride,
                       params.k_row_stride, valid_keys, params.d, bwd_fresh(tid));
    KVCopy::load_async(smem_v, v_seq + static_cast<int64_t>(n0) * params.v_row_stride,
                       params.v_row_stride, valid_keys, params.d, bwd_fresh(tid));
    ptx::cp_async_commit();
}

// Query-block inputs of rows [m0, m0 + valid_q): Q and dO tiles, lse and D (kBlockM floats
// each), all with cp.async, one group. Rows past valid_q are zero-filled: zero Q and dO rows
// and D = 0 make every product they enter zero, and their dQ rows are not written. The
// per-head pointers come from shared memory (written once by thread 0), not registers kept
// through the query loop (at d128 ptxas spilled them there).
template <typename Element, typename QCopy, int kBlockM, int kNThreads>
__device__ __forceinline__ void load_bwd_query_block(const BwdParams& params,
                                                     const BwdCtaPointers& ptrs, int m0,
                                                     int valid_q, uint32_t q_dst, uint32_t do_dst,
                                                     uint32_t lse_dst, uint32_t dsum_dst) {
    const Element* q_head = reinterpret_cast<const Element*>(ptrs.q);
    const Element* do_head = reinterpret_cast<const Element*>(ptrs.d_o);
    const float* lse_head = ptrs.lse;
    const float* dsum_head = ptrs.dsum;
    const int tid = bwd_fresh(threadIdx.x);
    QCopy::load_async(q_dst, q_head + static_cast<int64_t>(m0) * params.q_row_stride,
                      params.q_row_stride, valid_q, params.d, tid);
    QCopy::load_async(do_dst, do_head + static_cast<int64_t>(m0) * params.do_row_stride,
                      params.do_row_stride, valid_q, params.d, tid);
    for (int r = tid; r < kBlockM; r += kNThreads) {
        const bool ok = r < valid_q;
        ptx::cp_async_4(lse_dst + 4 * r, lse_head + (ok ? m0 + r : 0), ok);
        ptx::cp_async_4(dsum_dst + 4 * r, dsum_head + (ok ? m0 + r : 0), ok);
    }
    ptx::cp_async_commit();
}

// dQ (rows 16 wm .., columns col0 ..) += dZ (from the dZ^T tile, transposed by ldmatrix) K.
template <typename Element, typename Traits>
__device__ __forceinline__ void warp_gemm_dq(float (&acc)[Traits::kDqDTiles][4], uint32_t ds_smem,
                                             uint32_t k_smem, int wm, int col0, int lane) {
    using DSTile = typename Traits::DSTile;
    using KVTile = typename Traits::KVTile;
    lane = ptx::opaque(lane);
    // A (dZ, queries x keys) from dZ^T (keys x queries) with .trans: stored row (key)
    // lane % 8 + 8 (lane / 16), column (query) 16 wm + 8 ((lane / 8) % 2).
    const uint32_t a_base =
        ds_smem + DSTile::byte_offset(lane % 8 + 8 * (lane / 16), 16 * wm + 8 * ((lane / 8) % 2));
    // B (K, keys x head dim) with .trans, as V in the forward's P V.
    const int b_row = lane % 8 + 8 * ((lane / 8) % 2);
    const int b_col = col0 + 8 * (lane / 16);
    const uint32_t b_base = k_smem + KVTile::byte_offset(b_row, b_col);
    static_for_each<Traits::kBlockN / 16>([&](auto kk) {
        uint32_t a[4];
        ptx::ldmatrix_x4_trans(a, DSTile::template stepped<16 * kk, 0>(a_base));
        // Pairs of 8-column tiles; an odd last tile loads a whole pair (the second half lies in
        // the next warp's slice or, for the last warp, in the V tile that follows K in shared
        // memory) and uses only the first.
        static_for_each<(Traits::kDqDTiles + 1) / 2>([&](auto dp) {
            uint32_t b[4];
            if constexpr (Traits::kDqColsPow2) {
                ptx::ldmatrix_x4_trans(b, KVTile::template stepped<16 * kk, 16 * dp>(b_base));
            } else {  // column steps could carry into the warp's chunk bits: exact base per pair
                ptx::ldmatrix_x4_trans(
                    b, KVTile::template stepped<16 * kk, 0>(
                           k_smem + KVTile::byte_offset(b_row, b_col + 16 * dp)));
            }
            ptx::mma_16816<Element>(acc[2 * dp], a, b[0], b[1]);
            if constexpr (2 * dp + 1 < Traits::kDqDTiles) {
                ptx::mma_16816<Element>(acc[2 * dp + 1], a, b[2], b[3]);
            }
        });
    });
}

// Template parameters as the forward's: Causal (window right side 0), HasAlibi (bias from
// params.alibi_slopes_ptr), HasSoftcap (params.softcap > 0).
// IsDropout: P is dropped with the forward's mask (dropout.cuh): dV += (P o M / p_keep)^T dO,
// dZ = P o (dP o M / p_keep - D), with D = rowsum(dO o O) of the dropped output.
template <typename Element, typename Traits, bool Causal, bool HasAlibi, bool HasSoftcap,
          bool IsDropout = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    mha_bwd_sm80_kernel(const __grid_constant__ BwdParams params) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kKeyTiles = Traits::kKeyTiles;
    constexpr int kQTiles8 = kBlockM / 8;
    constexpr int kDTiles = Traits::kDTiles;
    using ScoreGemm = typename Traits::ScoreGemm;
    using GradGemm = typename Traits::GradGemm;
    // Two passes per key block (Traits::kTwoPass): dV first, then dK and dQ.
    constexpr bool kTwoPass = Traits::kTwoPass;
    [[maybe_unused]] constexpr int kPasses = kTwoPass ? 2 : 1;

    unsigned char* smem = ptx::dynamic_smem();
    const uint32_t smem_base = ptx::smem_addr(smem);
    const uint32_t smem_k = smem_base + Traits::kSmemKOffset;
    const uint32_t smem_v = smem_base + Traits::kSmemVOffset;
    const uint32_t smem_ds = smem_base + Traits::kSmemDSOffset;

    const int tid = threadIdx.x;
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int batch = blockIdx.y;
    const int head = blockIdx.z;
    const BwdSequence seq = BwdSequence::make(params, batch, head);
    const int seqlen_q = seq.seqlen_q;
    const int seqlen_k = seq.seqlen_k;

    const AttentionMask mask = bwd_attention_mask<Causal>(params, seq);
    const KeyRange range = KeyRange::make(mask);

    // Score units (base 2): plain x = s scale log2(e); softcap x = tanh(s scale / softcap)
    // softcap log2(e); ALiBi then subtracts slope log2(e) |i + diag - j|.
    // (The factors set_score_scales() computed for the forward: the same bits, so P is
    // recomputed exactly as the forward computed it.)
    const float score_log2 = HasSoftcap ? params.softcap_log2 : params.scale_softmax_log2;
    const float softcap_pre_scale = HasSoftcap ? params.softcap_pre_scale : 0.f;
    const float alibi_slope_log2 = HasAlibi ? bwd_alibi_slope_log2(params, batch, head) : 0.f;

    float* dq_head = bwd_dq_head<Traits::kHeadDim>(params, seq);
    if (tid == 0) {  // visible after the barrier at the top of the first key block
        reinterpret_cast<BwdCtaPointers*>(smem + Traits::kSmemPointersOffset)
            ->template init<Element>(params, seq, head);
    }
    const int warp_key0 = warp * 16 * kKeyTiles;  // in the tile

    // One key block per CTA, or (deterministic) key blocks blockIdx.x, + gridDim.x, ... in order.
    for (int n_block = blockIdx.x; n_block * kBlockN < seqlen_k; n_block += gridDim.x) {
        const int n0 = n_block * kBlockN;
        const int valid_keys = min(kBlockN, seqlen_k - n0);
        __syncthreads();  // every warp is done with the previous key block's K (dQ GEMM)

        const BwdQueryBlocks m_blocks =
            BwdQueryBlocks::make<kBlockM>(range, n0, valid_keys, seqlen_q);
        const int m_block_min = m_blocks.min;
        const int m_block_max = m_blocks.max;

        load_bwd_kv_block<Element, typename Traits::KVCopy>(params, batch, head, n0, valid_keys,
                                                            smem_k, smem_v, tid);

        // Query block m_block's Q, dO, lse, D -> buffer `stage` (load_bwd_query_block).
        auto load_query_block = [&](int m_block, int stage) {
            const int m0 = m_block * kBlockM;
            const uint32_t stage_base = smem_base + stage * Traits::kSmemQStageBytes;
            load_bwd_query_block<Element, typename Traits::QCopy, kBlockM, Traits::kNThreads>(
                params,
                *reinterpret_cast<const BwdCtaPointers*>(smem + Traits::kSmemPointersOffset), m0,
                min(kBlockM, seqlen_q - m0), stage_base + Traits::kSmemQOffset,
                stage_base + Traits::kSmemDOOffset, stage_base + Traits::kSmemLseOffset,
                stage_base + Traits::kSmemDOffset);
        };

        // One pass over the query blocks, or two (kTwoPass, d >= 224): pass 0 computes only
        // dV += P^T dO (no dP^T, dZ^T, dQ), pass 1 recomputes S^T -> P^T and computes dP^T,
        // dK += dZ^T Q and dQ += dZ K. Only one HeadDim-wide accumulator is live at a time.
        // (always_inline: without it the single-pass kernels' code changed -- d128 64 x 128 SASS
        // differed, same registers -- with it their SASS is identical to the loop without the
        // lambda.)
        static_for_each<kPasses>([&](auto pass_c) __attribute__((always_inline)) {
        constexpr int pass = decltype(pass_c)::value;
        constexpr bool kDoDv = !kTwoPass || pass == 0;  // this pass accumulates dV
        constexpr bool kDoDk = !kTwoPass || pass == 1;  // this pass accumulates dK and dQ
        float acc_dk[kKeyTiles][kDTiles][4];
        float acc_dv[kKeyTiles][kDTiles][4];
#pragma unroll
        for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc_dk[mt][dt][e] = 0.f;
                    acc_dv[mt][dt][e] = 0.f;
                }
            }
        }
        if (Traits::kQStages == 2 && m_block_min < m_block_max && pass == 0) {
            // Buffer 0 is free: every warp passed the barrier at the top of this key block.
            // (Pass 1's first block was loaded by pass 0's last iteration.)
            load_query_block(m_block_min, 0);
        }
        // Pass 1 continues pass 0's buffer alternation: its first block sits in the buffer after
        // pass 0's last one.
        const int stage0 = pass == 0 ? 0 : (m_block_max - m_block_min) & 1;

        for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
            const int m0 = m_block * kBlockM;
            const int valid_q = min(kBlockM, seqlen_q - m0);
            const int stage = Traits::kQStages == 2 ? (m_block - m_block_min + stage0) & 1 : 0;
            if constexpr (Traits::kQStages == 1) {
                __syncthreads();  // every warp is done with the previous Q, dO, dZ^T, lse, D
                load_query_block(m_block, 0);
            }
            ptx::cp_async_wait<0>();  // this block's inputs (and, first, K and V) have landed
            // Everyone's copies are visible, and every warp is done with the previous iteration
            // (its buffer, refilled next, and the dZ^T tile).
            __syncthreads();
            if constexpr (Traits::kQStages == 2) {
                // The pass's next block or, after pass 0's last block, pass 1's first (one call
                // site: the copy code is inlined once).
                const bool next_in_pass = m_block + 1 < m_block_max;
                if (next_in_pass || (kTwoPass && pass == 0)) {
                    load_query_block(next_in_pass ? m_block + 1 : m_block_min, stage ^ 1);
                }
            }
            const uint32_t smem_q =
                smem_base + stage * Traits::kSmemQStageBytes + Traits::kSmemQOffset;
            const uint32_t smem_do = smem_q - Traits::kSmemQOffset + Traits::kSmemDOOffset;
            const float* smem_lse = reinterpret_cast<const float*>(
                smem + stage * Traits::kSmemQStageBytes + Traits::kSmemLseOffset);
            const float* smem_dsum = reinterpret_cast<const float*>(
                smem + stage * Traits::kSmemQStageBytes + Traits::kSmemDOffset);
            [[maybe_unused]] uint32_t keep[kKeyTiles][(kQTiles8 + 7) / 8];  // dropout: kept P^T
            if constexpr (IsDropout) {
                dropout_keep_bits_transposed<kKeyTiles, kQTiles8>(
                    keep, params, static_cast<int64_t>(batch) * params.h + head, n0 + warp_key0,
                    m0, lane);
            }

            // S^T = K Q^T; the P^T step turns it into P^T (16-bit A fragments for dV += P^T dO,
            // dropped and scaled with dropout) and keeps p dscore in fp32 for dZ^T. dP^T = V dO^T
            // comes after the dV GEMM, in kDpParts query slices, each turned into dZ^T fragments
            // at once: S^T and dP^T are never live together (kBlockM kKeyTiles / 2 fewer
            // registers at the peak than computing both first).
            float acc_s[kKeyTiles][kQTiles8][4];
#pragma unroll
            for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
                for (int nt = 0; nt < kQTiles8; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
                }
            }
            warp_gemm_qk<Element, ScoreGemm>(acc_s, smem_k, smem_q, warp_key0, lane);

            // Only blocks that touch a mask edge or the end of the keys test each element
            // (zero-filled key rows past seqlen_k must get p = 0: with a very negative lse their
            // p would overflow). Query rows past seqlen_q need no mask (see load_query_block).
            const bool block_needs_mask =
                !(n0 >= m0 + kBlockM - 1 + range.begin_shift &&
                  n0 + kBlockN <= min(range.seqlen_k, m0 + range.end_shift));
            const int key0 = n0 + warp_key0 + bwd_fresh(lane) / 4;  // key of element (0, 0, 0)
            const int qcol0 = 2 * (bwd_fresh(lane) % 4);  // query (in the block) of (0, 0, 0)
            // frag[mt][nt / 2][2 (nt % 2) + half] packs elements (mt, nt, 2 half + c), c = 0, 1:
            // the A-fragment layout of convert_p_to_a_fragments. P^T first, dZ^T later.
            uint32_t frag[kKeyTiles][kBlockM / 16][4];
            // Two copies of the loop, picked per block (uniform branch): blocks inside every
            // row's key range skip the per-element visibility test (the masked copy is exact
            // for any block).
            auto p_step = [&](auto masked) {
#pragma unroll
                for (int nt = 0; nt < kQTiles8; ++nt) {
                    float lse_log2[2];
                    int key_lo[2], key_hi[2];
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int qi = qcol0 + 8 * nt + c;
                        lse_log2[c] = smem_lse[qi] * static_cast<float>(M_LOG2E);
                        // Keys this query sees, relative to key0: [key_lo, key_hi). Masked
                        // elements get exponent -inf (p = +0): the exponential is
                        // unconditional, no branch per element.
                        const int query = m0 + qi;
                        key_lo[c] = query + range.begin_shift - key0;
                        key_hi[c] = min(range.seqlen_k, query + range.end_shift) - key0;
                    }
#pragma unroll
                    for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            float p_dv[2];  // P in dV += P^T dO (dropped and scaled)
#pragma unroll
                            for (int c = 0; c < 2; ++c) {
                                const int e = 2 * half + c;
                                const int kofs = 16 * mt + 8 * half;  // key - key0
                                const bool visible = !decltype(masked)::value ||
                                                     (kofs >= key_lo[c] && kofs < key_hi[c]);
                                float dscore = 1.f;  // d(final score) / d(scale s)
                                const int distance =
                                    HasAlibi ? abs(m0 + qcol0 + 8 * nt + c + mask.diag - key0 - kofs)
                                             : 0;
                                const float x = bwd_score_log2_p<HasSoftcap, HasAlibi>(
                                    acc_s[mt][nt][e], dscore, score_log2, softcap_pre_scale,
                                    alibi_slope_log2, distance, lse_log2[c]);
                                const float p = ptx::exp2_approx(visible ? x : -INFINITY);
                                p_dv[c] = p;
                                if constexpr (IsDropout) {
                                    p_dv[c] = kept_transposed(keep[mt], nt, e) ? p * params.rp_keep
                                                                               : 0.f;
                                }
                                acc_s[mt][nt][e] = HasSoftcap ? p * dscore : p;
                            }
                            frag[mt][nt / 2][2 * (nt % 2) + half] =
                                ptx::pack_float2<Element>(p_dv[0], p_dv[1]);
                        }
                    }
                }
            };
            if constexpr (IsDropout) {
                p_step(std::true_type{});  // one copy (two spilled 68-88 B at d128)
            } else if (block_needs_mask) {
                p_step(std::true_type{});
            } else {
                p_step(std::false_type{});
            }
            if constexpr (kDoDv) warp_gemm_pv<Element, GradGemm>(acc_dv, frag, smem_do, lane);
            if constexpr (kDoDk) {
            // dP^T = V dO^T, query slice by slice; dZ^T = p dscore (dP^T - D) (dP^T dropped and
            // scaled with dropout) straight into the fragments.
            static_for_each<Traits::kDpParts>([&](auto part) {
                // (Traits:: members: g++, used by the CPU emulator, does not take the
                // enclosing function's constants as array bounds two lambdas deep.)
                constexpr int kPartTiles = Traits::kBlockM / 8 / Traits::kDpParts;
                float acc_dp[Traits::kKeyTiles][kPartTiles][4];
#pragma unroll
                for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
                    for (int nt = 0; nt < kPartTiles; ++nt) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc_dp[mt][nt][e] = 0.f;
                    }
                }
                // The slice's dO rows: a whole-8-row offset keeps the swizzle (tile_io.cuh).
                warp_gemm_qk<Element, typename Traits::PartScoreGemm>(
                    acc_dp, smem_v,
                    smem_do + Traits::QTile::byte_offset(part * 8 * kPartTiles, 0), warp_key0,
                    lane);
#pragma unroll
                for (int ntp = 0; ntp < kPartTiles; ++ntp) {
                    const int nt = part * kPartTiles + ntp;
                    float dsum[2];
#pragma unroll
                    for (int c = 0; c < 2; ++c) dsum[c] = smem_dsum[qcol0 + 8 * nt + c];
#pragma unroll
                    for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            float dz[2];
#pragma unroll
                            for (int c = 0; c < 2; ++c) {
                                const int e = 2 * half + c;
                                float dp = acc_dp[mt][ntp][e];
                                if constexpr (IsDropout) {
                                    dp = kept_transposed(keep[mt], nt, e) ? dp * params.rp_keep
                                                                          : 0.f;
                                }
                                dz[c] = acc_s[mt][nt][e] * (dp - dsum[c]);
                            }
                            frag[mt][nt / 2][2 * (nt % 2) + half] =
                                ptx::pack_float2<Element>(dz[0], dz[1]);
                        }
                    }
                }
            });
            warp_gemm_pv<Element, GradGemm>(acc_dk, frag, smem_q, lane);
            }  // kDoDk

            if constexpr (kDoDk) {
            // dZ^T -> shared memory: thread's element (mt, nt, 2 half + c) at key row
            // warp_key0 + 16 mt + 8 half + lane / 4, query column 8 nt + 2 (lane % 4) + c.
            {
                const uint32_t ds_thread =
                    smem_ds + Traits::DSTile::byte_offset(warp_key0 + bwd_fresh(lane) / 4,
                                                          2 * (bwd_fresh(lane) % 4));
                static_for_each<kKeyTiles>([&](auto mt) {
                    static_for_each<2>([&](auto half) {
                        static_for_each<kQTiles8>([&](auto nt) {
                            ptx::st_shared_4(
                                Traits::DSTile::template stepped<16 * mt + 8 * half, 8 * nt>(
                                    ds_thread),
                                frag[mt][nt / 2][(nt % 2) * 2 + half]);
                        });
                    });
                });
            }
            __syncthreads();

            // dQ += dZ K: warp (wm, wd) owns query rows 16 wm .. +15, columns wd kDqCols .. .
            {
                const int lane_q = bwd_fresh(lane);
                const int wm = bwd_fresh(warp) % Traits::kDqWarpsM;
                const int wd = bwd_fresh(warp) / Traits::kDqWarpsM;
                float acc_dq[Traits::kDqDTiles][4];
#pragma unroll
                for (int dt = 0; dt < Traits::kDqDTiles; ++dt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc_dq[dt][e] = 0.f;
                }
                warp_gemm_dq<Element, Traits>(acc_dq, smem_ds, smem_k, wm, wd * Traits::kDqCols,
                                              lane_q);
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int row = 16 * wm + 8 * half + lane_q / 4;
                    if (row < valid_q) {
                        float* dq_row = dq_head +
                                        static_cast<int64_t>(m0 + row) * Traits::kHeadDim +
                                        wd * Traits::kDqCols + 2 * (lane_q % 4);
#pragma unroll
                        for (int dt = 0; dt < Traits::kDqDTiles; ++dt) {
                            // One 8-byte vector reduction (sm_90; two atomics before).
                            ptx::red_add_f32x2(dq_row + 8 * dt, acc_dq[dt][2 * half],
                                               acc_dq[dt][2 * half + 1]);
                        }
                    }
                }
            }
            }  // kDoDk
        }

        // A key block without query blocks still has K / V in flight (pass 0 of two leaves
        // pass 1's first query block in flight: not waited for here).
        if constexpr (kDoDk) ptx::cp_async_wait<0>();

        store_dk_dv<Element, Traits::kHeadDim, kDoDk, kDoDv>(
            params, batch, head, BwdSequence::make(params, ptx::opaque(batch), head).kv_row0, n0,
            warp_key0, 0, lane, valid_keys, acc_dk, acc_dv);
        });  // passes
    }
}

// The postprocess kernels below: one thread per 8 head-dim columns of one (row, head), grid
// (row chunks, heads). Reads are float4 pairs of the fp32 workspace rows, writes one 16-byte
// vector of 8 Elements (the host pads the head dim to a multiple of 8 and allocates the
// gradients contiguous, so every 8-column chunk is 16-byte aligned). Workspace columns at or
// past params.d (the kernel head dim's padding) are not converted.
template <int HeadDim>
__device__ __forceinline__ void add_8_floats(float (&v)[8], const float* p) {
    const float4 lo = *reinterpret_cast<const float4*>(p);
    const float4 hi = *reinterpret_cast<const float4*>(p + 4);
    v[0] += lo.x; v[1] += lo.y; v[2] += lo.z; v[3] += lo.w;
    v[4] += hi.x; v[5] += hi.y; v[6] += hi.z; v[7] += hi.w;
}

template <typename Element>
__device__ __forceinline__ void store_8_scaled(Element* out, const float (&v)[8], float scale) {
    uint4 packed;
    packed.x = ptx::pack_float2<Element>(v[0] * scale, v[1] * scale);
    packed.y = ptx::pack_float2<Element>(v[2] * scale, v[3] * scale);
    packed.z = ptx::pack_float2<Element>(v[4] * scale, v[5] * scale);
    packed.w = ptx::pack_float2<Element>(v[6] * scale, v[7] * scale);
    *reinterpret_cast<uint4*>(out) = packed;
}

// dq = scale * dq_accum (summed over the deterministic slices in order) -> Element. dq (b,
// seqlen_q, h, d) / accumulator (b, h, seqlen_q_rounded, HeadDim), or varlen dq (total_q, h, d) /
// accumulator (h, total_q, HeadDim). Grid: (row chunks, h).
template <typename Element, int HeadDim>
__global__ void mha_bwd_convert_dq_kernel(const __grid_constant__ BwdParams params) {
    constexpr int kChunks = HeadDim / 8;
    const bool varlen = params.cu_seqlens_q != nullptr;
    const int rows = varlen ? params.total_q : params.b * params.seqlen_q;
    const int head = blockIdx.y;
    const float* acc = reinterpret_cast<const float*>(params.dq_accum_ptr);
    Element* dq = reinterpret_cast<Element*>(params.dq_ptr);
    const int splits = params.deterministic ? params.num_splits : 1;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         idx < static_cast<int64_t>(rows) * kChunks;
         idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int col = 8 * static_cast<int>(idx % kChunks);
        const int row = static_cast<int>(idx / kChunks);  // fixed: batch * seqlen_q + row
        if (col >= params.d) continue;
        int64_t acc_index, out_index;
        if (varlen) {
            acc_index = (static_cast<int64_t>(head) * params.total_q + row) * HeadDim + col;
            out_index = row * params.dq_row_stride + head * params.dq_head_stride + col;
        } else {
            const int batch = static_cast<int>(static_cast<unsigned>(row) / params.seqlen_q);
            const int r = row - batch * params.seqlen_q;
            acc_index = ((static_cast<int64_t>(batch) * params.h + head) * params.seqlen_q_rounded +
                         r) * HeadDim + col;
            out_index = batch * params.dq_batch_stride + r * params.dq_row_stride +
                        head * params.dq_head_stride + col;
        }
        float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < splits; ++s) {
            add_8_floats<HeadDim>(v, acc + acc_index + s * params.dq_accum_split_stride);
        }
        store_8_scaled(dq + out_index, v, params.scale_softmax);
    }
}

// GQA only (MHA stores dk / dv from the main kernel, bwd_dkv_store.cuh): dk (b, seqlen_k, h_k,
// d) = scale * sum_g dk_accum[b, kv_head * ratio + g], dv likewise without the scale; g in
// increasing order (bitwise reproducible). Varlen: dk (total_k, h_k, d), workspace (h, total_k,
// HeadDim). Grid: (row chunks, h_k).
template <typename Element, int HeadDim>
__global__ void mha_bwd_convert_dkv_kernel(const __grid_constant__ BwdParams params) {
    constexpr int kChunks = HeadDim / 8;
    const bool varlen = params.cu_seqlens_k != nullptr;
    const int rows = varlen ? params.total_k : params.b * params.seqlen_k;
    const int kv_head = blockIdx.y;
    const float* acc_k = reinterpret_cast<const float*>(params.dk_accum_ptr);
    const float* acc_v = reinterpret_cast<const float*>(params.dv_accum_ptr);
    Element* dk = reinterpret_cast<Element*>(params.dk_ptr);
    Element* dv = reinterpret_cast<Element*>(params.dv_ptr);
    const int ratio = params.h_h_k_ratio;
    const int64_t head_stride =
        (varlen ? static_cast<int64_t>(params.total_k) : params.seqlen_k_rounded) * HeadDim;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         idx < static_cast<int64_t>(rows) * kChunks;
         idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int col = 8 * static_cast<int>(idx % kChunks);
        const int row = static_cast<int>(idx / kChunks);  // fixed: batch * seqlen_k + row
        if (col >= params.d) continue;
        int64_t base, k_index, v_index;
        if (varlen) {
            base = static_cast<int64_t>(kv_head) * ratio * head_stride +
                   static_cast<int64_t>(row) * HeadDim + col;
            k_index = row * params.dk_row_stride + kv_head * params.dk_head_stride + col;
            v_index = row * params.dv_row_stride + kv_head * params.dv_head_stride + col;
        } else {
            const int batch = static_cast<int>(static_cast<unsigned>(row) / params.seqlen_k);
            const int r = row - batch * params.seqlen_k;
            base = ((static_cast<int64_t>(batch) * params.h + kv_head * ratio) *
                        params.seqlen_k_rounded + r) * HeadDim + col;
            k_index = batch * params.dk_batch_stride + r * params.dk_row_stride +
                      kv_head * params.dk_head_stride + col;
            v_index = batch * params.dv_batch_stride + r * params.dv_row_stride +
                      kv_head * params.dv_head_stride + col;
        }
        float sk[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        float sv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int g = 0; g < ratio; ++g) {
            add_8_floats<HeadDim>(sk, acc_k + base + g * head_stride);
            add_8_floats<HeadDim>(sv, acc_v + base + g * head_stride);
        }
        store_8_scaled(dk + k_index, sk, params.scale_softmax);
        store_8_scaled(dv + v_index, sv, 1.f);
    }
}

}  // namespace sm80
}  // namespace flash_cuda
