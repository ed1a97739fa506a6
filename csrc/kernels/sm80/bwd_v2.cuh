// Second sm80 backward main kernel: the work of a query block split over warp grids of
// (queries x keys) and (keys x head-dim columns) instead of "each warp owns 16 keys" (bwd.cuh).
// The launcher (bwd_launch.cuh) runs it at head dims 64, 96, 128, 192 and 256 (BwdV2Config):
// causal / window, softcap, ALiBi, GQA, varlen, deterministic; dropout and every other head dim
// keep mha_bwd_sm80_kernel (bwd.cuh), whose preprocess / convert kernels, workspaces, BwdParams and
// deterministic mode this kernel shares.
//
// One CTA per (key block of kBlockN keys, batch, query head), kNWarps warps (BwdV2Traits: the
// d64 / d128 tile is 128 keys, 8 warps, query blocks of 64; d256: 64 keys). K, V -> shared
// memory once; loop over the query blocks (kBlockM) that see some key of the block:
//   phase 1, warp grid kSWarpsM (queries) x kSWarpsN (keys) (d64 / d128: 2 x 4, each warp
//          32 queries x 32 keys):
//     S  = Q K^T, P = exp2(S scale log2(e) - lse log2(e)) (0 where masked, branch-free;
//          softcap / ALiBi as bwd.cuh)
//     dP = dO V^T, dS = P (dP - D)  (times 1 - t^2 with softcap)
//     P, dS -> shared memory (Element, swizzled kBlockM x kBlockN tiles, queries x keys)
//   barrier
//   phase 2, warp grid kGWarpsN (keys) x kGWarpsD (head-dim columns) (d64 / d128: 4 x 2):
//     dV += P^T dO, dK += dS^T Q   (P^T, dS^T from shared memory with ldmatrix.trans; fp32
//                                   accumulators in registers for the whole key block)
//   [single-buffered Q / dO only: barrier, then the next query block's copies]
//   phase 3, warp grid kQWarpsM (queries) x kQWarpsD (head-dim columns) (d64 / d128: 2 x 4),
//   a warp's columns in kQChunks passes:
//     dQ += dS K -> fp32 red.global.add.v2.f32 into dq_accum (deterministic: own slice)
// Barriers per query block: 2, 3 single-buffered (see bench/NOTES_kernel_bwd.md, "Backward
// kernel v2" and "Backward v2 at d256 and tile variants").
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/mask.cuh"
#include "kernels/params.h"
#include "kernels/ptx.cuh"
#include "kernels/sm80/bwd.cuh"
#include "kernels/sm80/bwd_dkv_store.cuh"
#include "kernels/sm80/tile_io.cuh"
#include "kernels/sm80/warp_gemm.cuh"

namespace flash_cuda {
namespace sm80 {

// Whether a warp's block of `cols` B columns, starting at a multiple of `cols`, can be walked in
// 16-column steps from one per-thread base by SwizzledTile::stepped (no carry into the thread's
// own chunk bits): cols a power of two up to the atom width, or whole atoms.
constexpr bool bwd_v2_cols_step_safe(int cols, int atom_cols) {
    return cols % atom_cols == 0 || (cols <= atom_cols && (cols & (cols - 1)) == 0);
}

// Tile configuration (the defaults are the d64 / d128 tile):
//   BlockM queries per iteration, BlockN keys per CTA, NWarps warps;
//   SWarpsM: phase-1 warps along the queries (the rest along the keys);
//   GWarpsN: phase-2 warps along the keys (the rest along the head-dim columns);
//   QWarpsM: phase-3 warps along the queries (the rest along the head-dim columns);
//   QStages: 2 = Q / dO / lse / D double-buffered (the next query block is prefetched during
//            the current one), 1 = single-buffered (the next block is loaded after phase 2,
//            behind one more barrier, overlapping phase 3 only);
//   QChunks: phase 3 computes a warp's dQ columns in QChunks passes (fewer live accumulators
//            at large head dims: A fragments of dS re-read per pass).
template <int HeadDim, int BlockM = 64, int BlockN = 128, int NWarps = 8, int SWarpsM = 2,
          int GWarpsN = 4, int QWarpsM = 2, int QStages = 2, int QChunks = 1>
struct BwdV2Traits {
    static constexpr int kHeadDim = HeadDim;
    static constexpr int kBlockM = BlockM;
    static constexpr int kBlockN = BlockN;
    static constexpr int kNWarps = NWarps;
    static constexpr int kNThreads = NWarps * 32;
    // Phase 1 (S, dP): kSWarpsM x kSWarpsN warps over (queries x keys).
    static constexpr int kSWarpsM = SWarpsM;
    static constexpr int kSWarpsN = NWarps / kSWarpsM;
    static constexpr int kSRows = BlockM / kSWarpsM;  // queries per warp
    static constexpr int kSCols = BlockN / kSWarpsN;  // keys per warp
    // Phase 2 (dV, dK): kGWarpsN x kGWarpsD warps over (keys x head-dim columns).
    static constexpr int kGWarpsN = GWarpsN;
    static constexpr int kGWarpsD = NWarps / kGWarpsN;
    static constexpr int kGRows = BlockN / kGWarpsN;    // keys per warp
    static constexpr int kGCols = HeadDim / kGWarpsD;   // head-dim columns per warp
    // Phase 3 (dQ): kQWarpsM x kQWarpsD warps over (queries x head-dim columns), each warp's
    // kQCols columns in kQChunks passes of kQChunkCols.
    static constexpr int kQWarpsM = QWarpsM;
    static constexpr int kQWarpsD = NWarps / kQWarpsM;
    static constexpr int kQRows = BlockM / kQWarpsM;
    static constexpr int kQCols = HeadDim / kQWarpsD;
    static constexpr int kQChunks = QChunks;
    static constexpr int kQChunkCols = kQCols / QChunks;
    static constexpr int kQStages = QStages;

    using QTile = SwizzledTile<BlockM, HeadDim>;   // Q and dO
    using KVTile = SwizzledTile<BlockN, HeadDim>;  // K and V
    using PTile = SwizzledTile<BlockM, BlockN>;    // P and dS (queries x keys)
    using QCopy = TileCopy<QTile, kNThreads>;
    using KVCopy = TileCopy<KVTile, kNThreads>;
    // Phase 2 reads dO / Q columns [g_col0, + kGCols), phase 3 K columns [q_col0 + pass
    // kQChunkCols, + kQChunkCols): one stepped base where the widths allow it.
    static constexpr bool kGStepSafe = bwd_v2_cols_step_safe(kGCols, QTile::kAtomCols);
    static constexpr bool kQStepSafe = bwd_v2_cols_step_safe(kQChunkCols, KVTile::kAtomCols);

    static constexpr int kSmemKOffset = 0;
    static constexpr int kSmemVOffset = kSmemKOffset + KVTile::kBytes;
    static constexpr int kSmemQOffset = kSmemVOffset + KVTile::kBytes;  // stage 0
    // Per query-block stage (kQStages of them): Q, dO, lse (kBlockM floats), D (kBlockM).
    static constexpr int kStageDOOffset = QTile::kBytes;
    static constexpr int kStageLseOffset = 2 * QTile::kBytes;
    static constexpr int kStageDOffset = kStageLseOffset + BlockM * 4;
    static constexpr int kSmemQStageBytes = 2 * QTile::kBytes + 2 * BlockM * 4;
    static constexpr int kSmemPOffset = kSmemQOffset + QStages * kSmemQStageBytes;
    static constexpr int kSmemDSOffset = kSmemPOffset + PTile::kBytes;
    static constexpr int kSmemPointersOffset = kSmemDSOffset + PTile::kBytes;  // BwdCtaPointers
    static constexpr int kSmemBytes = kSmemPointersOffset + 32;

    // S = Q K^T (dP = dO V^T) in warp_gemm_qk's shape: A = Q rows, B = K rows of the warp.
    struct ScoreGemm {
        static constexpr int kHeadDim = HeadDim;
        static constexpr int kMTiles = kSRows / 16;
        static constexpr int kNTiles = kSCols / 8;
        using QTile = SwizzledTile<BlockM, HeadDim>;
        using KVTile = SwizzledTile<BlockN, HeadDim>;
    };

    static_assert(HeadDim % 32 == 0 && HeadDim <= 256, "v2 head dims: multiples of 32 up to 256");
    static_assert(NWarps % SWarpsM == 0 && NWarps % GWarpsN == 0 && NWarps % QWarpsM == 0,
                  "warp grids");
    static_assert(QStages == 1 || QStages == 2, "one or two query-block stages");
    static_assert(kSRows % 16 == 0 && kSCols % 16 == 0, "phase 1 warp tiles");
    static_assert(kGRows % 16 == 0 && kGCols % 16 == 0, "phase 2 warp tiles");
    static_assert(kQRows % 16 == 0 && kQCols % QChunks == 0 && kQChunkCols % 16 == 0,
                  "phase 3 warp tiles");
    static_assert(kSmemQOffset % 128 == 0 && kSmemQStageBytes % 128 == 0 &&
                      kSmemPOffset % 128 == 0 && kSmemDSOffset % 128 == 0,
                  "tiles 128-byte aligned (SwizzledTile::stepped)");
    static_assert(128 % BlockM == 0 && 128 % BlockN == 0, "workspaces are rounded to 128 rows");
    static_assert(kSmemBytes <= 227 * 1024, "must fit a Hopper CTA's shared memory");
};

// Phase 1 in SPasses passes over the query block (tuning variants, bwd_tune_configs.h): the
// kSWarpsM x kSWarpsN grid covers kBlockM / SPasses queries per pass, so a warp's S / dP
// fragments stay those of a kBlockM / SPasses tile (e.g. 128 x 128 at d64 as two 64-query
// passes: S, dP 32 fp32 each instead of 64). P / dS are written for the whole block before B2,
// phases 2 / 3 unchanged. A wrapper rather than a BwdV2Traits argument: the BwdV2Config types
// (and so their kernels' PTX) stay as they are; plain BwdV2Traits run one pass
// (bwd_v2_s_passes).
template <typename Base, int SPasses>
struct BwdV2SplitS : Base {
    static constexpr int kSPasses = SPasses;
    static constexpr int kSPassRows = Base::kBlockM / SPasses;  // queries per pass
    static constexpr int kSRows = kSPassRows / Base::kSWarpsM;  // queries per warp and pass
    struct ScoreGemm : Base::ScoreGemm {
        static constexpr int kMTiles = kSRows / 16;
    };
    static_assert(SPasses >= 1 && Base::kBlockM % SPasses == 0, "phase 1 passes");
    static_assert(kSRows % 16 == 0 && kSRows * Base::kSWarpsM * SPasses == Base::kBlockM,
                  "phase 1 warp tiles per pass");
};

template <typename Traits>
constexpr int bwd_v2_s_passes() {
    if constexpr (requires { Traits::kSPasses; }) {
        return Traits::kSPasses;
    } else {
        return 1;
    }
}

template <int HeadDim>
struct BwdV2Config {
    static constexpr bool kSupported = false;
};
// d64: FA2's 128 x 128 tile on 8 warps, phase 1 in two 64-query passes (S / dP 32 fp32 per
// warp), phase 2 4 x 2 (32 keys x 32 columns), phase 3 4 x 2 (32 queries x 32 columns);
// double-buffered Q / dO, 165,920 B of shared memory (fits A100's 163 KB). Was tuning variant
// 4: fwd+bwd +4-8% over the 64 x 128 tile (bench/NOTES.md run 25).
template <>
struct BwdV2Config<64> {
    static constexpr bool kSupported = true;
    using Traits = BwdV2SplitS<BwdV2Traits<64, 128, 128, 8, 2, 4, 4, 2, 1>, 2>;
};
template <>
struct BwdV2Config<128> {
    static constexpr bool kSupported = true;
    using Traits = BwdV2Traits<128>;
};
// d256: 64 keys per CTA (dK + dV accumulators 64 x 256 x 2 fp32 = 128 registers per thread),
// 64 queries per iteration, phase 1 on 2 x 4 warps (32 queries x 16 keys each), phase 2 on
// 2 x 4 (32 keys x 64 columns), phase 3 on 2 x 4 (32 queries x 64 columns, in two passes of 32
// columns: 32 live dQ floats instead of 64). Double-buffered Q / dO: 214,048 B of shared memory
// (needs the H100 / H200's 227 KB; the launcher falls back to bwd.cuh where the device cannot
// reserve it, e.g. A100's 163 KB).
template <>
struct BwdV2Config<256> {
    static constexpr bool kSupported = true;
    using Traits = BwdV2Traits<256, 64, 64, 8, 2, 2, 2, 2, 2>;
};
// d96: the d128 tile's 128 keys and phase 1; phase 2 on 4 x 2 warps (32 keys x 48 columns),
// phase 3 on 4 x 2 (16 queries x 48 columns): 96 columns split in 16-multiples only in halves.
template <>
struct BwdV2Config<96> {
    static constexpr bool kSupported = true;
    using Traits = BwdV2Traits<96, 64, 128, 8, 2, 4, 4, 2, 1>;
};
// d160 keeps bwd.cuh: its v2 tile (64 keys, grids 2 x 4 / 4 x 2 / 4 x 2: BwdV2Traits<160, 64,
// 64, 8, 2, 4, 4, 2, 1>) measured 1.02-1.09x FA2 fwd+bwd against bwd.cuh's 1.07-1.18x
// (bench/NOTES.md run 23).
// d192: 64 keys, phase 1 2 x 4, phase 2 2 x 4 (32 keys x 48 columns), phase 3 2 x 4 (32 queries
// x 48 columns); 164,896 B of shared memory (fits A100's 163 KB).
template <>
struct BwdV2Config<192> {
    static constexpr bool kSupported = true;
    using Traits = BwdV2Traits<192, 64, 64, 8, 2, 2, 2, 2, 1>;
};

// acc[kMTiles][kNTiles][4] += A (16 kMTiles rows x 16 kKSteps) * B (16 kKSteps x 8 kNTiles),
// both from shared memory. B is stored k-major (tile row = k, as dO, Q, K for dV, dK, dQ) and
// read with ldmatrix.trans. A is stored m-major (tile row = m: dS for dQ, ldmatrix) or, with
// kATrans, k-major (tile row = k: P / dS read as P^T / dS^T, ldmatrix.trans).
// a_m0: the warp's first A row (m); b_n0: the warp's first B column (n). A, B start at k = 0.
// kBStepSafe: b_n0 is such that SwizzledTile::stepped may step the B columns from one per-thread
// base (bwd_v2_cols_step_safe); otherwise each 16-column pair gets its own base (byte_offset).
template <typename Element, typename ATile, typename BTile, int kMTiles, int kNTiles, int kKSteps,
          bool kATrans, bool kBStepSafe = true>
__device__ __forceinline__ void warp_gemm_smem(float (&acc)[kMTiles][kNTiles][4], uint32_t a_smem,
                                               int a_m0, uint32_t b_smem, int b_n0, int lane) {
    static_assert(kNTiles % 2 == 0, "B fragments in pairs of 8-column tiles");
    lane = ptx::opaque(lane);
    // ldmatrix lane addresses (lane l gives row l % 8 of matrix l / 8):
    //   A, m-major: row a_m0 + l % 16, col 8 (l / 16)      -> a0..a3 (rows 0-7 / 8-15, k 0-7 / 8-15)
    //   A, k-major (.trans): row (k) l % 8 + 8 (l / 16), col (m) a_m0 + 8 ((l / 8) % 2)
    //   B, k-major (.trans): row (k) l % 8 + 8 ((l / 8) % 2), col (n) b_n0 + 8 (l / 16)
    const uint32_t a_base =
        kATrans ? a_smem + ATile::byte_offset(lane % 8 + 8 * (lane / 16), a_m0 + 8 * ((lane / 8) % 2))
                : a_smem + ATile::byte_offset(a_m0 + lane % 16, 8 * (lane / 16));
    const uint32_t b_base =
        b_smem + BTile::byte_offset(lane % 8 + 8 * ((lane / 8) % 2), b_n0 + 8 * (lane / 16));
    [[maybe_unused]] uint32_t b_pair_base[kBStepSafe ? 1 : kNTiles / 2];
    if constexpr (!kBStepSafe) {
        static_for_each<kNTiles / 2>([&](auto np) {
            b_pair_base[np] = b_smem + BTile::byte_offset(lane % 8 + 8 * ((lane / 8) % 2),
                                                          b_n0 + 16 * np + 8 * (lane / 16));
        });
    }
    static_for_each<kKSteps>([&](auto kk) {
        uint32_t a[kMTiles][4];
        static_for_each<kMTiles>([&](auto mt) {
            if constexpr (kATrans) {
                ptx::ldmatrix_x4_trans(a[mt], ATile::template stepped<16 * kk, 16 * mt>(a_base));
            } else {
                ptx::ldmatrix_x4(a[mt], ATile::template stepped<16 * mt, 16 * kk>(a_base));
            }
        });
        static_for_each<kNTiles / 2>([&](auto np) {
            uint32_t b[4];
            if constexpr (kBStepSafe) {
                ptx::ldmatrix_x4_trans(b, BTile::template stepped<16 * kk, 16 * np>(b_base));
            } else {
                ptx::ldmatrix_x4_trans(b, BTile::template stepped<16 * kk, 0>(b_pair_base[np]));
            }
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                ptx::mma_16816<Element>(acc[mt][2 * np], a[mt], b[0], b[1]);
                ptx::mma_16816<Element>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        });
    });
}

// Stores a phase-1 accumulator (rows 16 mt + 8 half + lane / 4 of the warp's first row,
// columns 8 nt + 2 (lane % 4) (+1) of its first key) as Element pairs into a PTile.
template <typename Element, typename PTile, int kMTiles, int kNTiles>
__device__ __forceinline__ void store_p_tile(uint32_t tile, int row0, int col0,
                                             const float (&acc)[kMTiles][kNTiles][4], int lane) {
    lane = ptx::opaque(lane);
    const uint32_t base = tile + PTile::byte_offset(row0 + lane / 4, col0 + 2 * (lane % 4));
    static_for_each<kMTiles>([&](auto mt) {
        static_for_each<2>([&](auto half) {
            static_for_each<kNTiles>([&](auto nt) {
                ptx::st_shared_4(PTile::template stepped<16 * mt + 8 * half, 8 * nt>(base),
                                 ptx::pack_float2<Element>(acc[mt][nt][2 * half],
                                                           acc[mt][nt][2 * half + 1]));
            });
        });
    });
}

// Causal: window right side 0. HasAlibi / HasSoftcap as in mha_bwd_sm80_kernel (scores
// recomputed as the forward does; with softcap dS = P (dP - D) (1 - t^2), t the tanh value).
// No dropout (the launcher keeps it on mha_bwd_sm80_kernel).
template <typename Element, typename Traits, bool Causal, bool HasAlibi = false,
          bool HasSoftcap = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    mha_bwd_sm80_v2_kernel(const __grid_constant__ BwdParams params) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    using ScoreGemm = typename Traits::ScoreGemm;
    using QTile = typename Traits::QTile;
    using KVTile = typename Traits::KVTile;
    using PTile = typename Traits::PTile;
    constexpr int kSMTiles = ScoreGemm::kMTiles;  // 16-query tiles per warp (phase 1)
    constexpr int kSNTiles = ScoreGemm::kNTiles;  // 8-key tiles per warp (phase 1)
    constexpr int kSPasses = bwd_v2_s_passes<Traits>();  // phase 1 passes per query block
    constexpr int kGMTiles = Traits::kGRows / 16;  // 16-key tiles per warp (phase 2)
    constexpr int kGNTiles = Traits::kGCols / 8;   // 8-column tiles per warp (phase 2)
    constexpr int kQMTiles = Traits::kQRows / 16;  // 16-query tiles per warp (phase 3)
    constexpr int kQNTiles = Traits::kQChunkCols / 8;  // 8-column tiles per warp and pass (3)

    unsigned char* smem = ptx::dynamic_smem();
    const uint32_t smem_base = ptx::smem_addr(smem);
    const uint32_t smem_k = smem_base + Traits::kSmemKOffset;
    const uint32_t smem_v = smem_base + Traits::kSmemVOffset;
    const uint32_t smem_p = smem_base + Traits::kSmemPOffset;
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
    // Score units (base 2), as bwd.cuh: plain x = s scale log2(e); softcap x = tanh(s scale /
    // softcap) softcap log2(e); ALiBi then subtracts slope log2(e) |i + diag - j|.
    const float score_log2 = HasSoftcap ? params.softcap_log2 : params.scale_softmax_log2;
    const float softcap_pre_scale = HasSoftcap ? params.softcap_pre_scale : 0.f;
    const float alibi_slope_log2 = HasAlibi ? bwd_alibi_slope_log2(params, batch, head) : 0.f;

    float* dq_head = bwd_dq_head<kHeadDim>(params, seq);
    if (tid == 0) {  // visible after the barrier at the top of the first key block
        reinterpret_cast<BwdCtaPointers*>(smem + Traits::kSmemPointersOffset)
            ->template init<Element>(params, seq, head);
    }

    // Warp positions in the three grids.
    const int s_row0 = (warp % Traits::kSWarpsM) * Traits::kSRows;  // phase 1 first query
    const int s_col0 = (warp / Traits::kSWarpsM) * Traits::kSCols;  // phase 1 first key
    const int g_row0 = (warp % Traits::kGWarpsN) * Traits::kGRows;  // phase 2 first key
    const int g_col0 = (warp / Traits::kGWarpsN) * Traits::kGCols;  // phase 2 first column
    const int q_row0 = (warp % Traits::kQWarpsM) * Traits::kQRows;  // phase 3 first query
    const int q_col0 = (warp / Traits::kQWarpsM) * Traits::kQCols;  // phase 3 first column

    for (int n_block = blockIdx.x; n_block * kBlockN < seqlen_k; n_block += gridDim.x) {
        const int n0 = n_block * kBlockN;
        const int valid_keys = min(kBlockN, seqlen_k - n0);
        // Barrier K0: every warp is done with the previous key block (K in the dQ GEMM, the
        // stage buffers) before they are refilled.
        __syncthreads();

        const BwdQueryBlocks m_blocks =
            BwdQueryBlocks::make<kBlockM>(range, n0, valid_keys, seqlen_q);
        const int m_block_min = m_blocks.min;
        const int m_block_max = m_blocks.max;

        load_bwd_kv_block<Element, typename Traits::KVCopy>(params, batch, head, n0, valid_keys,
                                                            smem_k, smem_v, tid);

        // Query block m_block's Q, dO, lse, D -> stage buffer `stage` (load_bwd_query_block).
        auto load_query_block = [&](int m_block, int stage) {
            const int m0 = m_block * kBlockM;
            const uint32_t stage_base =
                smem_base + Traits::kSmemQOffset + stage * Traits::kSmemQStageBytes;
            load_bwd_query_block<Element, typename Traits::QCopy, kBlockM, Traits::kNThreads>(
                params,
                *reinterpret_cast<const BwdCtaPointers*>(smem + Traits::kSmemPointersOffset), m0,
                min(kBlockM, seqlen_q - m0), stage_base, stage_base + Traits::kStageDOOffset,
                stage_base + Traits::kStageLseOffset, stage_base + Traits::kStageDOffset);
        };

        float acc_dv[kGMTiles][kGNTiles][4];
        float acc_dk[kGMTiles][kGNTiles][4];
#pragma unroll
        for (int mt = 0; mt < kGMTiles; ++mt) {
#pragma unroll
            for (int nt = 0; nt < kGNTiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    acc_dv[mt][nt][e] = 0.f;
                    acc_dk[mt][nt][e] = 0.f;
                }
            }
        }
        if (m_block_min < m_block_max) load_query_block(m_block_min, 0);

        for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
            const int m0 = m_block * kBlockM;
            const int valid_q = min(kBlockM, seqlen_q - m0);
            const int stage = Traits::kQStages == 2 ? (m_block - m_block_min) & 1 : 0;
            ptx::cp_async_wait<0>();  // this block's inputs (and, first, K and V) have landed
            // Barrier B1: every thread's copies are visible; every warp is done with the
            // previous query block (the other stage buffer, refilled next, and the P / dS
            // tiles, rewritten in phase 1).
            __syncthreads();
            if constexpr (Traits::kQStages == 2) {
                if (m_block + 1 < m_block_max) load_query_block(m_block + 1, stage ^ 1);
            }
            const uint32_t stage_base =
                smem_base + Traits::kSmemQOffset + stage * Traits::kSmemQStageBytes;
            const uint32_t smem_q = stage_base;
            const uint32_t smem_do = stage_base + Traits::kStageDOOffset;
            const float* smem_lse = reinterpret_cast<const float*>(
                smem + Traits::kSmemQOffset + stage * Traits::kSmemQStageBytes +
                Traits::kStageLseOffset);
            const float* smem_dsum = reinterpret_cast<const float*>(
                smem + Traits::kSmemQOffset + stage * Traits::kSmemQStageBytes +
                Traits::kStageDOffset);

            // ---- Phase 1: S, P, dP, dS on the (queries x keys) warp grid ----
            // (kSPasses > 1: the grid covers kBlockM / kSPasses queries per pass.)
#pragma unroll
            for (int s_pass = 0; s_pass < kSPasses; ++s_pass) {
                const int s_pass_row = s_pass * (kBlockM / kSPasses);
                const int srow0 = bwd_fresh(s_row0) + s_pass_row;
                const int scol0 = bwd_fresh(s_col0);
                float acc_s[kSMTiles][kSNTiles][4];
#pragma unroll
                for (int mt = 0; mt < kSMTiles; ++mt) {
#pragma unroll
                    for (int nt = 0; nt < kSNTiles; ++nt) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
                    }
                }
                warp_gemm_qk<Element, ScoreGemm>(acc_s, smem_q,
                                                 smem_k + KVTile::byte_offset(scol0, 0), srow0,
                                                 lane);
                // Blocks inside every row's key range skip the visibility test (uniform
                // branch); the masked copy is exact for any block. Zero-filled key rows past
                // seqlen_k must get p = 0 (a very negative lse would overflow otherwise).
                const bool block_needs_mask =
                    !(n0 >= m0 + kBlockM - 1 + range.begin_shift &&
                      n0 + kBlockN <= min(range.seqlen_k, m0 + range.end_shift));
                const int lane_f = bwd_fresh(lane);
                // Element (mt, nt, e): query m0 + srow0 + 16 mt + 8 (e / 2) + lane / 4,
                // key n0 + scol0 + 8 nt + 2 (lane % 4) + e % 2.
                const int row_t = srow0 + lane_f / 4;   // in the query block
                const int key_t = scol0 + 2 * (lane_f % 4);  // in the key block
                // Softcap: P packed here for the store (acc_s becomes p (1 - t^2), for dS).
                [[maybe_unused]] uint32_t p_pack[HasSoftcap ? kSMTiles : 1][2]
                                                [HasSoftcap ? kSNTiles : 1];
                auto p_step = [&](auto masked) {
#pragma unroll
                    for (int mt = 0; mt < kSMTiles; ++mt) {
#pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            const int qi = row_t + 16 * mt + 8 * half;
                            const float lse_log2 = smem_lse[qi] * static_cast<float>(M_LOG2E);
                            // Keys this query sees, relative to n0 + key_t: [key_lo, key_hi).
                            const int query = m0 + qi;
                            const int key_lo = query + range.begin_shift - n0 - key_t;
                            const int key_hi =
                                min(range.seqlen_k, query + range.end_shift) - n0 - key_t;
#pragma unroll
                            for (int nt = 0; nt < kSNTiles; ++nt) {
                                [[maybe_unused]] float p_pair[2];
#pragma unroll
                                for (int c = 0; c < 2; ++c) {
                                    const int kofs = 8 * nt + c;
                                    float dscore = 1.f;  // d(final score) / d(scale s)
                                    const bool visible = !decltype(masked)::value ||
                                                         (kofs >= key_lo && kofs < key_hi);
                                    const int distance =
                                        HasAlibi ? abs(query + mask.diag - n0 - key_t - kofs) : 0;
                                    const float x = bwd_score_log2_p<HasSoftcap, HasAlibi>(
                                        acc_s[mt][nt][2 * half + c], dscore, score_log2,
                                        softcap_pre_scale, alibi_slope_log2, distance, lse_log2);
                                    const float p = ptx::exp2_approx(visible ? x : -INFINITY);
                                    p_pair[c] = p;
                                    acc_s[mt][nt][2 * half + c] = HasSoftcap ? p * dscore : p;
                                }
                                if constexpr (HasSoftcap) {
                                    p_pack[mt][half][nt] =
                                        ptx::pack_float2<Element>(p_pair[0], p_pair[1]);
                                }
                            }
                        }
                    }
                };
                if (block_needs_mask) {
                    p_step(std::true_type{});
                } else {
                    p_step(std::false_type{});
                }
                if constexpr (HasSoftcap) {
                    const uint32_t base =
                        smem_p + PTile::byte_offset(srow0 + lane_f / 4, scol0 + 2 * (lane_f % 4));
                    static_for_each<kSMTiles>([&](auto mt) {
                        static_for_each<2>([&](auto half) {
                            static_for_each<kSNTiles>([&](auto nt) {
                                ptx::st_shared_4(
                                    PTile::template stepped<16 * mt + 8 * half, 8 * nt>(base),
                                    p_pack[mt][half][nt]);
                            });
                        });
                    });
                } else {
                    store_p_tile<Element, PTile>(smem_p, srow0, scol0, acc_s, lane);
                }

                float acc_dp[kSMTiles][kSNTiles][4];
#pragma unroll
                for (int mt = 0; mt < kSMTiles; ++mt) {
#pragma unroll
                    for (int nt = 0; nt < kSNTiles; ++nt) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc_dp[mt][nt][e] = 0.f;
                    }
                }
                warp_gemm_qk<Element, ScoreGemm>(acc_dp, smem_do,
                                                 smem_v + KVTile::byte_offset(bwd_fresh(s_col0), 0),
                                                 bwd_fresh(s_row0) + s_pass_row, lane);
#pragma unroll
                for (int mt = 0; mt < kSMTiles; ++mt) {
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const float dsum = smem_dsum[(bwd_fresh(s_row0) + s_pass_row) +
                                                     bwd_fresh(lane) / 4 + 16 * mt + 8 * half];
#pragma unroll
                        for (int nt = 0; nt < kSNTiles; ++nt) {
#pragma unroll
                            for (int c = 0; c < 2; ++c) {
                                const int e = 2 * half + c;
                                acc_dp[mt][nt][e] = acc_s[mt][nt][e] * (acc_dp[mt][nt][e] - dsum);
                            }
                        }
                    }
                }
                store_p_tile<Element, PTile>(smem_ds, bwd_fresh(s_row0) + s_pass_row,
                                             bwd_fresh(s_col0), acc_dp, lane);
            }
            // Barrier B2: the whole P and dS tiles are written (phases 2 and 3 read every
            // warp's part).
            __syncthreads();

            // ---- Phase 2: dV += P^T dO, dK += dS^T Q on the (keys x columns) warp grid ----
            warp_gemm_smem<Element, PTile, QTile, kGMTiles, kGNTiles, kBlockM / 16, true,
                           Traits::kGStepSafe>(acc_dv, smem_p, bwd_fresh(g_row0), smem_do,
                                               bwd_fresh(g_col0), lane);
            warp_gemm_smem<Element, PTile, QTile, kGMTiles, kGNTiles, kBlockM / 16, true,
                           Traits::kGStepSafe>(acc_dk, smem_ds, bwd_fresh(g_row0), smem_q,
                                               bwd_fresh(g_col0), lane);

            if constexpr (Traits::kQStages == 1) {
                // Barrier B3 (single stage only): every warp is done with Q / dO (phase 2)
                // and lse / D (phase 1); the next block's copies overlap phase 3, which reads
                // only dS and K.
                __syncthreads();
                if (m_block + 1 < m_block_max) load_query_block(m_block + 1, 0);
            }

            // ---- Phase 3: dQ += dS K on the (queries x columns) warp grid ----
            #pragma unroll
            for (int chunk = 0; chunk < Traits::kQChunks; ++chunk) {
                float acc_dq[kQMTiles][kQNTiles][4];
#pragma unroll
                for (int mt = 0; mt < kQMTiles; ++mt) {
#pragma unroll
                    for (int nt = 0; nt < kQNTiles; ++nt) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc_dq[mt][nt][e] = 0.f;
                    }
                }
                const int qrow0 = bwd_fresh(q_row0);
                const int qcol0 = bwd_fresh(q_col0) + chunk * Traits::kQChunkCols;
                warp_gemm_smem<Element, PTile, KVTile, kQMTiles, kQNTiles, kBlockN / 16, false,
                               Traits::kQStepSafe>(acc_dq, smem_ds, qrow0, smem_k, qcol0, lane);
                const int lane_q = bwd_fresh(lane);
#pragma unroll
                for (int mt = 0; mt < kQMTiles; ++mt) {
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const int row = qrow0 + 16 * mt + 8 * half + lane_q / 4;
                        if (row < valid_q) {
                            float* dq_row = dq_head + static_cast<int64_t>(m0 + row) * kHeadDim +
                                            qcol0 + 2 * (lane_q % 4);
#pragma unroll
                            for (int nt = 0; nt < kQNTiles; ++nt) {
                                ptx::red_add_f32x2(dq_row + 8 * nt, acc_dq[mt][nt][2 * half],
                                                   acc_dq[mt][nt][2 * half + 1]);
                            }
                        }
                    }
                }
            }
        }
        // A key block without query blocks still has K / V in flight.
        ptx::cp_async_wait<0>();

        store_dk_dv<Element, kHeadDim, true, true>(
            params, batch, head, BwdSequence::make(params, ptx::opaque(batch), head).kv_row0, n0,
            g_row0, g_col0, lane, valid_keys, acc_dk, acc_dv);
    }
}

}  // namespace sm80
}  // namespace flash_cuda
