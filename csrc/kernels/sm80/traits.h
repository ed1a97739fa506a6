// Tile configuration of the sm80 (mma.sync) forward kernel, per head dim.
//
// A CTA computes kBlockM query rows of one (batch, head) and streams the keys/values in blocks
// of kBlockN rows. Its kNWarps warps split the query rows: warp w owns rows
// [w * kWarpRows, (w + 1) * kWarpRows), i.e. kMTiles slices of 16 rows (the M of
// mma.m16n8k16), so a row's softmax statistics live in the 4 lanes of one quad.
// Per thread registers: the S accumulator kMTiles x kNTiles x 4 floats, the O accumulator
// kMTiles x kDTiles x 4 floats.
// Shared memory: Q tile (kBlockM x HeadDim), kStages K tiles and kStages V tiles
// (kBlockN x HeadDim each), 16-bit, swizzled (tile_io.cuh), then 128 bytes of CTA-wide
// scalars. The O tile reuses the Q tile.
#pragma once

#include <type_traits>

#include "kernels/sm80/tile_io.cuh"

namespace flash_cuda {
namespace sm80 {

template <int HeadDim, int BlockM, int BlockN, int NWarps, int Stages>
struct FwdTraits {
    static constexpr int kHeadDim = HeadDim;
    static constexpr int kBlockM = BlockM;
    static constexpr int kBlockN = BlockN;
    static constexpr int kNWarps = NWarps;
    static constexpr int kNThreads = NWarps * 32;
    // Warps that only copy K / V (the warp-specialised key-split tile, decode_keysplit.cuh):
    // none here, so the CTA is the kNThreads compute threads.
    static constexpr int kProducerWarps = 0;
    static constexpr int kProducerThreads = 0;
    static constexpr int kLaunchThreads = kNThreads;
    // K/V buffers: 1 = one K and one V tile (the V load overlaps S = QK^T, the next K load
    // overlaps softmax and PV); 2 = double buffered (the next block's K and V load during the
    // whole current iteration); 3 = the K/V tiles of the next two blocks in flight (decode).
    static constexpr int kStages = Stages;
    // Split-KV partial outputs and paged K/V loads (fwd.cuh) compiled in: only in the decode
    // tile (FwdDecodeTraits); the 128-row tile at d = 128 would spill registers with them.
    static constexpr bool kSplitKV = false;
    static constexpr bool kPagedKV = false;
    static constexpr bool kPackGQA = false;  // params.gqa_pack (in-kernel GQA packing)
    // Warps whose rows all lie past the tile's valid query rows skip the math of the key loop
    // (they still issue their share of the K/V copies and join every barrier). Decode tile
    // only: there a tile has 1..g real rows of 64; the 128-row tile keeps its loop unchanged.
    static constexpr bool kSkipIdleWarps = false;
    // Warps split the keys of a block instead of the rows: decode_keysplit.cuh's tile only.
    static constexpr bool kKeySplit = false;
    static constexpr bool kQInRegisters = false;
    // Key columns of several KV heads (params.head_group): decode_keysplit.cuh's head-group
    // twins only.
    static constexpr bool kHeadGroups = false;
    // Each block's V copy issued with its K copy: decode_keysplit.cuh's paged 128-key twin only.
    static constexpr bool kOverlapKV = false;

    static constexpr int kWarpRows = kBlockM / kNWarps;
    static constexpr int kKeySlices = 1;            // warps per row slice (key-split tile: > 1)
    static constexpr int kWarpKeys = kBlockN;       // keys of a block each warp computes
    static constexpr int kMTiles = kWarpRows / 16;  // 16-row slices per warp
    static constexpr int kNTiles = kBlockN / 8;     // 8-column tiles of S per slice
    static constexpr int kDTiles = kHeadDim / 8;    // 8-column tiles of O per slice

    using QTile = SwizzledTile<kBlockM, kHeadDim>;   // also the O tile of the epilogue
    using KVTile = SwizzledTile<kBlockN, kHeadDim>;
    using QCopy = TileCopy<QTile, kNThreads>;
    using KVCopy = TileCopy<KVTile, kNThreads>;
    using WarpGemm = FwdTraits;  // the geometry of the warp GEMMs (warp_gemm.cuh)
    __device__ __forceinline__ static uint32_t kv_row_byte_offset(int) { return 0u; }

    static constexpr int kSmemQBytes = QTile::kBytes;
    static constexpr int kSmemKVTileBytes = KVTile::kBytes;
    static constexpr int kSmemKOffset = kSmemQBytes;
    static constexpr int kSmemVOffset = kSmemKOffset + kStages * kSmemKVTileBytes;
    // A few CTA-wide scalars (fwd.cuh: CtaScalars) after the tiles.
    static constexpr int kSmemScalarsOffset = kSmemVOffset + kStages * kSmemKVTileBytes;
    static constexpr int kSmemScalarsBytes = 128;
    static constexpr int kSmemBytes = kSmemScalarsOffset + kSmemScalarsBytes;

    static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dim: multiple of 32, at most 256");
    static_assert(kBlockM % (16 * kNWarps) == 0, "each warp owns whole 16-row slices");
    static_assert(kBlockN % 16 == 0, "key block: whole k16 steps of the PV product");
    static_assert(kStages >= 1 && kStages <= 3, "one to three K/V buffers");
    static_assert(kSmemBytes <= 227 * 1024, "must fit a Hopper CTA's shared memory");
    static_assert(kMTiles * (kNTiles + kDTiles) * 4 <= 192,
                  "accumulators alone would exceed the register file of a thread");
};

// Per-head-dim choices: starting points (FlashAttention-2's A100 tiles, adjusted so that no
// kernel spills registers on sm_90a), to be tuned on the H200 (bench/NOTES_kernel_fwd.md).
// Per thread: S and O accumulator floats; per CTA: dynamic shared memory.
// With 4 warps each warp owns 32 rows (2 slices of 16), so every K/V fragment read from shared
// memory feeds two mma; 8 warps (16 rows each) for d >= 160 keep the O accumulator in registers.
template <int HeadDim>
struct FwdConfig;

// The tile of the ALiBi / softcap kernels: Config::BiasTraits where a head dim defines one,
// else Config::Traits.
template <typename Config, typename = void>
struct BiasTraitsOf {
    using type = typename Config::Traits;
};
template <typename Config>
struct BiasTraitsOf<Config, std::void_t<typename Config::BiasTraits>> {
    using type = typename Config::BiasTraits;
};
template <typename Config>
using bias_traits_t = typename BiasTraitsOf<Config>::type;
// The tile of the kernels with both ALiBi and softcap: Config::AlibiSoftcapTraits where a head
// dim defines one, else the bias tile.
template <typename Config, typename = void>
struct AlibiSoftcapTraitsOf {
    using type = bias_traits_t<Config>;
};
template <typename Config>
struct AlibiSoftcapTraitsOf<Config, std::void_t<typename Config::AlibiSoftcapTraits>> {
    using type = typename Config::AlibiSoftcapTraits;
};
template <typename Config>
using alibi_softcap_traits_t = typename AlibiSoftcapTraitsOf<Config>::type;
// The tile of the dropout kernels: Config::DropoutTraits where a head dim defines one, else
// Config::Traits (the mask's Philox draws keep more values live in the score loop).
template <typename Config, typename = void>
struct DropoutTraitsOf {
    using type = typename Config::Traits;
};
template <typename Config>
struct DropoutTraitsOf<Config, std::void_t<typename Config::DropoutTraits>> {
    using type = typename Config::DropoutTraits;
};
template <typename Config>
using dropout_traits_t = typename DropoutTraitsOf<Config>::type;
// 128 x 128, 4 warps: S 128 + O 32 floats. 40 KB.
template <> struct FwdConfig<32> { using Traits = FwdTraits<32, 128, 128, 4, 2>; };
// 128 x 128, 4 warps: S 128 + O 64 floats, 80 KB; 5-8% faster than 128 x 64 on the H200
// (bench/NOTES.md, tuning run 2). The ALiBi / softcap kernels spill with it (8-56 bytes), so
// they keep 128 x 64 (S 64 + O 64 floats, 48 KB).
// Dropout takes 128 x 64 too: on 128 x 128 its unrolled draws (dropout.cuh) spill 8-68 bytes
// (sm_80 / sm_90a builds).
template <> struct FwdConfig<64> {
    using Traits = FwdTraits<64, 128, 128, 4, 2>;
    using BiasTraits = FwdTraits<64, 128, 64, 4, 2>;
    using DropoutTraits = BiasTraits;
};
// 128 x 64, 4 warps: S 64 + O 96 floats. 72 KB.
template <> struct FwdConfig<96> { using Traits = FwdTraits<96, 128, 64, 4, 2>; };
// 128 x 64, 4 warps: S 64 + O 128 floats (255 registers, no spills). 96 KB: 2 CTAs per
// H100/H200 SM. With both ALiBi and softcap it spills 8 bytes; that rare combination takes
// 128 x 32 (S 32 floats). So does dropout (the causal dropout kernel spilled 8 bytes).
template <> struct FwdConfig<128> {
    using Traits = FwdTraits<128, 128, 64, 4, 2>;
    using AlibiSoftcapTraits = FwdTraits<128, 128, 32, 4, 2>;
    using DropoutTraits = FwdTraits<128, 128, 32, 4, 2>;
};
// 64 x 64, 4 warps: S 32 + O 80 floats. 100 KB: two CTAs per SM, whose barriers do not wait
// for each other; 1.19-1.25x the 128 x 64 / 8 warps tile (one CTA per SM) on the H200
// (bench/NOTES.md, tuning run 9).
template <> struct FwdConfig<160> { using Traits = FwdTraits<160, 64, 64, 4, 2>; };
// 64 x 64, 4 warps, single K/V buffers: S 32 + O 96 floats. 72 KB (two CTAs per SM by
// registers); 1.09-1.15x the 128 x 64 / 8 warps tile on the H200 (bench/NOTES.md, run 9).
template <> struct FwdConfig<192> { using Traits = FwdTraits<192, 64, 64, 4, 1>; };
// 128 x 64, 8 warps, single K/V buffers (A100 shared memory): S 32 + O 112 floats. 112 KB.
template <> struct FwdConfig<224> { using Traits = FwdTraits<224, 128, 64, 8, 1>; };
// 64 x 64, 4 warps, single K/V buffers: S 32 + O 128 floats. 96 KB: two CTAs per SM; 1.12-1.17x
// the 128 x 64 / 8 warps tile (one CTA per SM: each barrier stalls all its 8 warps) on the H200
// (bench/NOTES.md, run 9).
template <> struct FwdConfig<256> { using Traits = FwdTraits<256, 64, 64, 4, 1>; };

// Decode / short-query tile (used when seqlen_q, after GQA packing, is at most kBlockM = 64, and
// for every paged-KV call; the only tile with split-KV and paged loads compiled in):
// 64 query rows, 4 warps of 16 rows (kMTiles = 1: half the MMA work of the 128-row tile on
// rows that are mostly padding, and half the accumulator registers), key blocks of 64 rows
// (128 for d <= 64), 3 stages at d <= 128 (else 2). Decode is a stream of K/V bytes: at
// d = 128 a CTA has up to five 16 KB K/V tiles in flight (V_j, K_j+1, V_j+1, K_j+2, V_j+2 while
// computing on K_j) and takes 112 KB of shared memory, so two CTAs still share an SM (2 stages:
// three tiles, 80 KB; the measured b1/b8 cells stayed at 2-3.9 TB/s, latency bound, with 68 KB
// of each SM's shared memory unused). Idle warps (rows all padding) skip the math
// (kSkipIdleWarps). bench/NOTES_decode.md has the reasoning and measurements.
constexpr int decode_stages(int head_dim) { return head_dim <= 128 ? 3 : 2; }
template <int HeadDim>
struct FwdDecodeTraits
    : FwdTraits<HeadDim, 64, (HeadDim <= 64 ? 128 : 64), 4, decode_stages(HeadDim)> {
    static constexpr bool kSplitKV = true;
    static constexpr bool kPagedKV = true;
    static constexpr bool kPackGQA = true;
    static constexpr bool kSkipIdleWarps = true;
};
template <int HeadDim>
struct FwdDecodeConfig {
    static constexpr int kBlockM = 64;
    using Traits = FwdDecodeTraits<HeadDim>;
};

}  // namespace sm80
}  // namespace flash_cuda
