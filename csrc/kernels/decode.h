// Host-side decisions of the decode path (KV cache attention with few query rows), shared by
// flash_api.cpp and the CPU emulator harness (tests/emulation): GQA packing of the query heads
// into the tile rows, and the split-KV count. Plain C++ on FwdParams; no torch, no CUDA calls,
// nothing that depends on tensor contents (the decode step must be capturable in a CUDA graph).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "kernels/bias_flags.h"
#include "kernels/env_switch.h"  // env_is_zero, env_choice (the A/B switches below)
#include "kernels/params.h"

namespace flash_cuda {
namespace decode {

// The combine kernel (combine.cu) holds at most this many split weights per row.
constexpr int kMaxSplits = 128;
// Each split gets at least this many key blocks.
constexpr int kMinBlocksPerSplit = 2;
// Costs of the split count's estimate below, in key-block times of one CTA's chain: a CTA's
// fixed cost (prologue, epilogue, partial output), and the combine kernel that any split count
// above 1 adds (~3 us on the H200, about 8 key blocks of the 16-row tile at d128).
constexpr int kSplitOverheadBlocks = 2;
constexpr int kCombineBlocks = 8;
// CTAs per SM that make a full wave: one streams its SM's share of the bandwidth from a
// contiguous cache; a paged copy needs two (run 46): at one CTA per SM (one warp per scheduler)
// the kernel's time is its instruction stream, and the page arithmetic added 55% of
// instructions (bench/NOTES.md run 53). With the leaner paged copies (run 56) page 16 at one
// CTA per SM still ran at 0.81-1.01x of contiguous (geometric mean 0.93; at two: 0.89-1.00x,
// 0.97).
constexpr int kPagedCtasPerSm = 2;
// The 64-row decode tile (33..64 rows: MQA with 4-8 query tokens; every decode step at head dims
// without a key-split tile, as d96 was until session 18) counts two CTAs per SM on contiguous
// caches too, at kernel head dims up to 128, where two fit (d128: 112 KB of shared memory
// each, three stages), but the second CTA per SM may split a cache only down to
// kDecodeTileSecondCtaMinBlocks key blocks per split (num_splits). Run 69 (bench/NOTES.md
// session 12), two CTAs per SM against one: 1.05-1.39x on 21 of the 23 cells whose splits kept
// >= 8 blocks (MQA q4 / q8 b8-b32, d96 GQA b8; 1.00 on the other two), but 0.86-0.98x where
// they went down to 2-4 blocks from 4-8 (MQA q4 b1 kv32k, q8 b1 kv8k / b8 kv1k, d96 b1 kv8k).
// With this rule (run 70): MQA q4 / q8 1.06-1.38x on 17 cells, d96 1.04-1.24x, the rest
// unchanged.
// Paged calls (two CTAs per SM counted) take the same floor for their second CTA, except on the
// 16-row key-split tile (paged_floor_blocks). Without it their count cut the 64-row and 32-row
// tiles' splits to 2-4 blocks where contiguous's keeps 4-8: MQA q4 b1 kv32k page 16 at 0.81x of
// contiguous (run 72). With it (runs 73-74, page 16 / 256 over the plain two-CTA count): MQA q4
// b1 kv32k 1.16 / 1.17, q8 b1 kv8k 1.06 / 1.12, q8 b8 kv1k 1.15 / 1.18, q1 b32 kv1k 1.09 / 1.08,
// GQA q8 b1 kv8k 1.00 / 1.04, MQA q1 b8 kv8k 0.98-0.99 / 1.05. The 16-row tile's splits are
// cheap (8 KB of partials at d128, a quarter of a 64-key K/V block), and halving them lost: GQA
// b1 kv8k and MHA b1 kv1k paged at 0.94-0.98x (run 74, 1 and 4 query tokens).
// FLASH_CUDA_DECODE_PAGED_FLOOR=0 (read once per process) keeps the plain two-CTA count (A/B).
constexpr int kDecodeTileCtasPerSm = 2;
constexpr int kDecodeTileTwoCtasMaxHeadDim = 128;
constexpr int kDecodeTileSecondCtaMinBlocks = 8;

// Whether the decode tile runs a problem (kernels/sm80/fwd_launch.cuh: seqlen_q <= 64, paged,
// or GQA packed in the kernel).
inline bool uses_decode_tile(const FwdParams& p) {
    return p.seqlen_q <= 64 || p.block_table != nullptr || p.gqa_pack > 1;
}
// The key-split decode tile (kernels/sm80/decode_keysplit.cuh: 16 query rows and the 4 warps
// split each key block 4 ways, or 32 rows as 2 row slices x 2 key slices) takes the decode-tile
// calls whose tiles have at most kKeySplitMaxRows rows (seqlen_q x GQA pack <= 32;
// keysplit_rows) and no dropout, at the head dims that have it compiled in
// (sm80::kHasKeySplitTile: the launcher checks that); 0-9% faster than the 64-row tile on the
// small decode cells (bench/NOTES.md run 23). FLASH_CUDA_DECODE_KEYSPLIT=0 in the environment
// (read once per process, host side) keeps every call on the 64-row tile (A/B runs). Same key
// blocks and stages as the 64-row decode tile; its contiguous calls count one CTA per SM where
// the 64-row tile counts two (split_geometry), and see plan_key_blocks for d128.
constexpr int kKeySplitMaxRows = 32;
inline bool paged_floor_enabled() {
    static const bool on = !env_is_zero("FLASH_CUDA_DECODE_PAGED_FLOOR");
    return on;
}
inline bool keysplit_enabled() {
    static const bool on = !env_is_zero("FLASH_CUDA_DECODE_KEYSPLIT");
    return on;
}
// Rows of one (batch, KV head) tile problem: query rows x the in-kernel GQA pack.
inline int64_t keysplit_rows(const FwdParams& p) {
    return static_cast<int64_t>(p.seqlen_q) * (p.gqa_pack > 1 ? p.gqa_pack : 1);
}
inline bool uses_keysplit_tile(const FwdParams& p) {
    if (!keysplit_enabled() || !uses_decode_tile(p) || p.p_keep < 1.f) return false;
    return keysplit_rows(p) <= kKeySplitMaxRows;
}
// Kernel head dims with a key-split tile compiled in (sm80::kHasKeySplitTile is this): d64, d96
// (d65-d96 calls: d80 models), d128, d256. d160 / d192 / d224 would work as well; left out to
// keep the build small.
constexpr bool has_keysplit_tile(int kernel_head_dim) {
    return kernel_head_dim == 64 || kernel_head_dim == 96 || kernel_head_dim == 128 ||
           kernel_head_dim == 256;
}
// Kernel head dims with the 128-key key-split tiles compiled in (sm80::kHasWideKeySplitTile is
// this; d64's key-split tiles already have 128-key blocks).
constexpr bool has_wide_keysplit_tile(int kernel_head_dim) { return kernel_head_dim == 128; }
// Whether the launcher runs the key-split tile for p (else the 64-row decode tile, or the
// 128-row tile for longer queries).
inline bool runs_keysplit_tile(const FwdParams& p) {
    return uses_keysplit_tile(p) && has_keysplit_tile(p.d_rounded);
}

// Calls without a block table run the key-split tile's plain variant (no ALiBi, no softcap) as a
// kernel without the paged copy path (sm80/decode_keysplit.cuh FwdDecodeKeySplitConfig<D,
// false>); FLASH_CUDA_DECODE_CONTIG=0 (read once per process) keeps them on the paged-capable
// kernel (A/B runs). Same tile geometry, so the split count does not depend on it.
inline bool contiguous_keysplit(const FwdParams& p) {
    static const bool on = !env_is_zero("FLASH_CUDA_DECODE_CONTIG");
    return on && p.block_table == nullptr;
}

// The decode tile that runs a call on the sm80 path (uses_decode_tile): the key-split tile of 16
// or 32 rows (keysplit_rows), with 64-key blocks or, where plan_key_blocks set wide_key_blocks,
// 128-key ones; else the 64-row decode tile. The launcher (sm80/fwd_launch.cuh), the CPU
// emulator (tests/emulation/fwd_emulated.cpp) and scripts/decode_plan.cpp all dispatch on this.
// With params.kv_ring (plan_decode_tile: sm_90) the warp-specialised twins of the 64-key
// key-split tiles (kRing16, kRing32; sm80/kv_ring.cuh). With params.kv_overlap (plan_kv_overlap:
// paged calls) the 16-row 128-key tile's twin whose V copies travel with its K copies.
enum class DecodeTile {
    kDecode64,
    kKeySplit16,
    kKeySplit16Wide,
    kKeySplit16WideOverlap,
    kKeySplit32,
    kKeySplit32Wide,
    kRing16,
    kRing32,
};
inline DecodeTile decode_tile(const FwdParams& p) {
    if (!runs_keysplit_tile(p)) return DecodeTile::kDecode64;
    const bool sixteen = keysplit_rows(p) <= 16;
    if (p.kv_ring) return sixteen ? DecodeTile::kRing16 : DecodeTile::kRing32;
    if (sixteen && p.wide_key_blocks) {
        return p.kv_overlap ? DecodeTile::kKeySplit16WideOverlap : DecodeTile::kKeySplit16Wide;
    }
    if (sixteen) return DecodeTile::kKeySplit16;
    return p.wide_key_blocks ? DecodeTile::kKeySplit32Wide : DecodeTile::kKeySplit32;
}

// The kvcache op's key-split calls at d128 (16-row tiles; 32-row ones where there are as many
// tiles as SMs: plan_key_blocks) take 128-key blocks through one K/V stage
// (sm80/decode_keysplit.cuh FwdDecodeKeySplitConfig::TraitsWide / TraitsWide32): one barrier
// pair and one online-softmax step per 128 keys. With a single stage a CTA does not overlap its
// own loads with its math, so the split count below counts two CTAs per SM for it
// (kWideCtasPerSm), as for paged caches, and plan_key_blocks takes it only where a step can
// have two. bench/NOTES.md runs 65-67: with one CTA per SM counted it was 1-3% faster than the
// 64-key tile where steps had two CTAs per SM anyway and 10-23% slower where the count left one;
// as chosen now (run 67, d128 grid at 1 and 4 query tokens) 0.99-1.04x of the 64-key tile on the
// 48 GQA / MHA cells that take it, geometric mean 1.011x, and 30 of 44 one-token cells at >= 1.0x
// cuDNN (20 with the 64-key tile in the same run).
// FLASH_CUDA_DECODE_KV128=0 in the environment (read once per process, host side) keeps them on
// the 64-key tile (A/B runs). flash_attn_func's short queries, which never split, keep the
// 64-key tile.
constexpr int kWideKeyBlock = 128;
constexpr int kWideCtasPerSm = 2;
inline bool wide_key_blocks_enabled() {
    static const bool on = !env_is_zero("FLASH_CUDA_DECODE_KV128");
    return on;
}
// Tile geometry (kernels/sm80/traits.h: FwdDecodeConfig for the decode tile, else FwdConfig;
// only roughly for the latter, which never splits).
inline int block_m(bool decode_tile) { return decode_tile ? 64 : 128; }
inline int block_n(int head_dim) { return head_dim <= 64 ? 128 : 64; }

// GQA packing. With one query row per sequence the query heads of one KV head all attend to the
// same keys with the same mask, so they can be the rows of one tile: q (b, 1, h, d) is read as
// (b, g, h_k, d) with g = h / h_k (row stride = the head stride, head stride = g head strides),
// o likewise, and lse (b, h, 1) is exactly (b, h_k, g). Each K/V byte is then read once per KV
// head instead of g times.
// Exact only when every packed row has the same visible keys and the same bias: after packing the
// kernel sees g rows at positions 0..g-1 (diag = seqlen_k - g), so
//   - causal / a right window: no-ops for a single query row (it sits at the last key), and are
//     dropped when packing;
//   - a left window depends on the row position: not packed;
//   - ALiBi slopes depend on the head (= the packed row): not packed;
//   - varlen q: not packed (the decode path is fixed length).
inline bool gqa_packable(const FwdParams& p) {
    return p.seqlen_q == 1 && p.h_h_k_ratio > 1 && p.alibi_slopes_ptr == nullptr &&
           p.window_size_left < 0 && p.cu_seqlens_q == nullptr;
}

inline void pack_gqa(FwdParams& p) {
    const int g = p.h_h_k_ratio;
    p.q_row_stride = p.q_head_stride;
    p.q_head_stride *= g;
    p.o_row_stride = p.o_head_stride;
    p.o_head_stride *= g;
    p.seqlen_q = g;
    p.seqlen_q_rounded = (g + 127) / 128 * 128;
    p.h = p.h_k;
    p.h_h_k_ratio = 1;
    p.is_causal = false;
    p.window_size_right = -1;
}

// GQA packing in the kernel (params.gqa_pack, fwd.cuh PackedRow): tile row r is query position
// r / g of head kv_head * g + r % g, and the mask uses the position, so causal and windows stay
// exact for any number of query rows. Used where the re-striding above is not exact (several
// query rows: speculative decoding; a left window). Not with ALiBi (the kernel takes one slope
// per CTA), not varlen, and only up to 64 query rows (the decode regime).
inline bool gqa_packable_in_kernel(const FwdParams& p) {
    return p.seqlen_q >= 1 && p.seqlen_q <= 64 && p.h_h_k_ratio > 1 &&
           p.alibi_slopes_ptr == nullptr && p.cu_seqlens_q == nullptr;
}

// Head groups. A one-token step on a contiguous cache (b, s, h_k, d) reads, per KV head, rows of
// d elements h_k d elements apart; the head-major layout of cuDNN's call, where each head's rows
// are contiguous, streamed ~2% faster at the same kernel (bench/NOTES.md session 21,
// flash_cuda_hmajor). With head groups the query rows of G = head_group KV heads (R = h / h_k
// rows each, G R <= 16) share one 16-row key-split tile whose key columns are the (key, KV head)
// pairs of those heads in memory order: column j is key j / G of the tile's KV head j % G, so a
// CTA reads the G heads' rows of each key as one contiguous G d-element run, and a step has
// G times fewer tiles of G times more columns. Tile row r (query head g0 R + r) sees column j
// only where j % G == r / R (a mask on every block, sm80/fwd.cuh): the same MMAs per K/V byte
// as the packed GQA tile (R useful rows of 16). Re-strided on the host like pack_gqa: q / o rows
// are the G R query heads, h = h / (G R).
// Possible for one-token calls on contiguous caches without ALiBi, softcap, left window or
// dropout (the contiguous plain key-split kernels have a head-group twin: has_head_group_tile),
// with G a power of two dividing h_k (each copying thread's rows then stay at one head of the
// group: sm80/fwd.cuh load_kv_tile); plan_packing below says where they are taken.
// FLASH_CUDA_DECODE_HGROUP in the environment (read per call): 0 or 1 never, N > 1 the largest
// possible G <= N wherever one is possible (A/B runs); unset: plan_packing's rule.
constexpr int kMaxHeadGroup = 16;
constexpr bool has_head_group_tile(int kernel_head_dim) { return kernel_head_dim == 128; }
// 0: the rule; 1: off; N > 1: forced, at most N.
inline int head_group_forced() {
    const char* env = std::getenv("FLASH_CUDA_DECODE_HGROUP");
    if (env == nullptr || env[0] == '\0') return 0;
    return std::max(1, std::min(kMaxHeadGroup, std::atoi(env)));
}
// The largest G <= cap a call can take (1: none). Shapes and flags only.
inline int head_group_size(const FwdParams& p, int cap) {
    const ScoreBias bias = fwd_score_bias(p);
    const bool plain = !bias.alibi && !bias.softcap && p.p_keep >= 1.f;
    if (!plain || p.seqlen_q != 1 || p.block_table != nullptr || p.cu_seqlens_q != nullptr ||
        p.cu_seqlens_k != nullptr || p.window_size_left >= 0 || p.h_k < 2 ||
        p.h % p.h_k != 0 || !has_head_group_tile(p.d_rounded) || p.d != p.d_rounded ||
        !keysplit_enabled() || !contiguous_keysplit(p)) {
        return 1;
    }
    const int rows_per_head = p.h / p.h_k;
    int group = 1;
    cap = std::min(cap, kMaxHeadGroup / rows_per_head);
    while (group * 2 <= cap && p.h_k % (group * 2) == 0) group *= 2;
    // Column indices stay far inside int.
    if (static_cast<int64_t>(p.seqlen_k) * group >= (int64_t{1} << 30)) return 1;
    return group;
}
inline void pack_head_groups(FwdParams& p, int group) {
    const int rows = group * p.h_h_k_ratio;  // query heads of one tile
    p.head_group = group;
    p.head_group_rows = p.h_h_k_ratio;
    p.k_group_head_stride = p.k_head_stride;
    p.v_group_head_stride = p.v_head_stride;
    p.k_head_stride *= group;
    p.v_head_stride *= group;
    p.q_row_stride = p.q_head_stride;
    p.q_head_stride *= rows;
    p.o_row_stride = p.o_head_stride;
    p.o_head_stride *= rows;
    p.seqlen_q = rows;
    p.seqlen_q_rounded = 128;
    p.h /= rows;
    p.h_k /= group;
    p.h_h_k_ratio = 1;
    p.is_causal = false;  // one query row at the last key: causal / a right window are no-ops
    p.window_size_right = -1;
}
// Key columns of a tile's sequence of seqlen_k keys (the split count's unit): seqlen_k, or with
// head groups seqlen_k x head_group.
inline int key_columns(const FwdParams& p) {
    return p.head_group > 1 ? p.seqlen_k * p.head_group : p.seqlen_k;
}

// GQA packing of a call without head groups: re-strided when exact, else in the kernel where
// possible.
inline void plan_gqa_packing(FwdParams& p) {
    if (gqa_packable(p)) {
        pack_gqa(p);
    } else if (gqa_packable_in_kernel(p)) {
        p.gqa_pack = p.h_h_k_ratio;
    }
}

// CTAs of one split: batch x (KV) heads x m blocks.
inline int64_t num_tiles(const FwdParams& p) {
    const bool packed = p.gqa_pack > 1;
    const int64_t rows = static_cast<int64_t>(p.seqlen_q) * (packed ? p.gqa_pack : 1);
    const int heads = packed ? p.h / p.gqa_pack : p.h;
    const int bm = block_m(uses_decode_tile(p));
    return static_cast<int64_t>(p.b) * heads * ((rows + bm - 1) / bm);
}

// Key blocks of a `seqlen_k`-key cache in `key_block`-key blocks, and the most splits the
// heuristic gives it (at least kMinBlocksPerSplit blocks each, at most kMaxSplits).
inline int key_blocks(int seqlen_k, int key_block) {
    return std::max(1, (seqlen_k + key_block - 1) / key_block);
}
inline int most_splits(int seqlen_k, int key_block, int min_blocks = kMinBlocksPerSplit) {
    return std::min(kMaxSplits, std::max(1, key_blocks(seqlen_k, key_block) / min_blocks));
}

// What the split count needs to know of the tile a call runs: its key block, the key block the
// costs below are counted in (the 64-row decode tile's: block_n), the CTAs per SM that make a
// full wave, and (second_cta_min_blocks > 0: the 64-row tile's contiguous calls, paged calls) the
// fewest key blocks per split that the second CTA per SM may split down to.
struct SplitGeometry {
    int key_block;
    int cost_block;
    int ctas_per_sm;
    int second_cta_min_blocks = 0;
};
// The second CTA's floor of a paged call (see the note above kDecodeTileCtasPerSm): none on the
// 16-row key-split tile.
inline int paged_floor_blocks(const FwdParams& p) {
    const bool sixteen_rows = decode_tile(p) == DecodeTile::kKeySplit16;
    return paged_floor_enabled() && !sixteen_rows ? kDecodeTileSecondCtaMinBlocks : 0;
}
// The 128-key tile's: 128-key blocks, costs in the 64-row tile's blocks, two CTAs per SM.
inline SplitGeometry wide_split_geometry(const FwdParams& p) {
    return {kWideKeyBlock, block_n(p.d_rounded), kWideCtasPerSm};
}
// The warp-specialised tiles' (kv_ring): one CTA per SM (256 threads of up to 255 registers),
// paged or not (the producer warps do the page arithmetic: the compute warps' instructions per
// block are those of a contiguous cache).
inline SplitGeometry ring_split_geometry(const FwdParams& p) {
    const int bn = block_n(p.d_rounded);
    return {bn, bn, 1};
}
inline SplitGeometry split_geometry(const FwdParams& p) {
    const int bn = block_n(p.d_rounded);
    if (p.kv_ring) return ring_split_geometry(p);
    if (p.wide_key_blocks) return wide_split_geometry(p);
    if (p.block_table != nullptr) return {bn, bn, kPagedCtasPerSm, paged_floor_blocks(p)};
    // The key-split tiles' contiguous calls count one CTA per SM (d64 / d128 as measured in
    // runs 23-67). d96, which took the key-split tile in session 18, too: over the d96 grid
    // (1 and 4 tokens, bench/NOTES.md session 19) one CTA was 1.023x the 64-row tile it
    // replaced (geometric mean), two CTAs with the 64-row tile's floor 1.011x.
    if (decode_tile(p) == DecodeTile::kDecode64 && p.d_rounded <= kDecodeTileTwoCtasMaxHeadDim) {
        return {bn, bn, kDecodeTileCtasPerSm, kDecodeTileSecondCtaMinBlocks};
    }
    return {bn, bn, 1};
}

// The count s <= max_splits with the shortest estimated time (num_splits below), ties to the
// fewer splits.
inline int cheapest_splits(int64_t tiles, int n_blocks, int max_splits, int64_t slots,
                           int64_t block_cost) {
    int chosen = 1;
    int64_t chosen_cost = -1;
    for (int s = 1; s <= max_splits; ++s) {
        const int64_t waves = (tiles * s + slots - 1) / slots;
        const int64_t cost = waves * ((n_blocks + s - 1) / s * block_cost + kSplitOverheadBlocks) +
                             (s > 1 ? kCombineBlocks : 0);
        if (chosen_cost < 0 || cost < chosen_cost) {
            chosen = s;
            chosen_cost = cost;
        }
    }
    return chosen;
}

// Split count for a problem of `tiles` CTAs (batch x heads x m blocks) over key blocks of a
// `seqlen_k`-key cache (the capacity: shapes only). requested > 0: honoured, clamped to
// [1, min(kMaxSplits, key blocks)]. Always 1 without the decode tile (the 128-row tile has no
// split-KV code). requested == 0: the count s (at least kMinBlocksPerSplit key blocks per split)
// with the shortest estimated time, in cost blocks (geometry.cost_block keys),
//   waves(s) x (keys of the longest split / cost_block + kSplitOverheadBlocks)
//     + (s > 1) kCombineBlocks,
//   waves(s) = ceil(tiles x s / (num_sms x geometry.ctas_per_sm)),
// ties to the fewer splits. One CTA per SM counts as a full wave on a contiguous cache: a decode
// CTA keeps up to 5 K/V tiles in flight, enough to stream its SM's share of the bandwidth
// (bench/NOTES.md run 45: on the split-KV sweep over the issue-5 grid this rule is within 4% of
// the best measured count on every cell, geometric mean 0.4%; the previous rule, which filled two
// CTA slots per SM and took at least 8 blocks per split on long caches, lost up to 27%: MQA b1
// kv8k, b128 kv1k, GQA b8 kv1k). A paged cache counts two CTAs per SM (kPagedCtasPerSm): with
// one, the paged copies ran at 0.65-0.77x of contiguous on the large cells (run 46), with their
// pages shuffled or in cache order alike (run 50), and at 0.83-0.99x after the leaner copies of
// run 56 (page 16, kv32k / kv131k cells). So does the one-stage 128-key tile (kWideCtasPerSm).
// The 64-row tile's contiguous calls (kDecodeTileCtasPerSm): the count at two CTAs per SM with at
// least kDecodeTileSecondCtaMinBlocks blocks per split if its CTAs fill 3/4 of the SMs, else the
// count at one CTA per SM if that fills them, else the count at two with the usual minimum.
inline int num_splits(int requested, int64_t tiles, int seqlen_k, bool decode_tile,
                      const SplitGeometry& geometry, int num_sms) {
    if (!decode_tile) return 1;  // split-KV is compiled into the decode tile only
    const int bn = geometry.key_block;
    const int n_blocks = key_blocks(seqlen_k, bn);
    if (requested > 0) return std::max(1, std::min({requested, kMaxSplits, n_blocks}));
    if (tiles <= 0 || num_sms <= 0) return 1;
    const int64_t block_cost = std::max(1, bn / geometry.cost_block);
    const int64_t slots = static_cast<int64_t>(num_sms) * geometry.ctas_per_sm;
    if (geometry.second_cta_min_blocks > 0) {
        const int64_t filled = static_cast<int64_t>(num_sms) * 3 / 4;
        const int long_splits = cheapest_splits(
            tiles, n_blocks, most_splits(seqlen_k, bn, geometry.second_cta_min_blocks), slots,
            block_cost);
        if (tiles * long_splits >= filled) return long_splits;
        const int one_cta = cheapest_splits(tiles, n_blocks, most_splits(seqlen_k, bn), num_sms,
                                            block_cost);
        if (tiles * one_cta >= filled) return one_cta;
    }
    return cheapest_splits(tiles, n_blocks, most_splits(seqlen_k, bn), slots, block_cost);
}

// The kvcache op's choice of the 128-key tile (after plan_packing, before num_splits; the
// launcher, sm80/fwd_launch.cuh, follows params.wide_key_blocks): d128 key-split tiles, when the
// step can give the tile two CTAs per SM (tiles x its most splits >= num_sms x kWideCtasPerSm)
// and the split count it then gets puts more than one CTA on an SM; 32-row tiles (MQA, GQA with
// several query tokens) only where their tiles alone fill the SMs.
// Short caches of few heads cannot: run 66 (two CTAs per SM counted) had GQA b1 / b8 kv1k and
// MHA b1 kv1k at 0.83-0.97x of the 64-key tile, whose three stages and twice the splits (64-key
// blocks) keep more loads in flight; the second condition keeps the one-stage tile off steps of
// at most one CTA per SM. The 32-row tile with 128-key blocks (run 69): 1.01-1.04x of the 64-key
// one where tiles >= SMs (GQA 32/8 with 8 query tokens, b32 / b128), 0.975-1.009x where it
// needed more splits instead (MQA b8-b128 one token, GQA q8 b1 / b8). Shapes only (seqlen_k is
// the capacity).
inline void plan_key_blocks(FwdParams& p, int num_sms) {
    p.wide_key_blocks = false;
    if (!wide_key_blocks_enabled() || !has_wide_keysplit_tile(p.d_rounded) ||
        !runs_keysplit_tile(p)) {
        return;
    }
    const int64_t tiles = num_tiles(p);
    if (tiles * most_splits(key_columns(p), kWideKeyBlock) <
            static_cast<int64_t>(num_sms) * kWideCtasPerSm ||
        (keysplit_rows(p) > 16 && tiles < num_sms)) {
        return;
    }
    const int splits =
        num_splits(0, tiles, key_columns(p), true, wide_split_geometry(p), num_sms);
    p.wide_key_blocks = tiles * splits > num_sms;
}

// The warp-specialised key-split tiles (sm80/kv_ring.cuh: 4 producer warps copy K / V into a
// ring of 6 64-key slots while the 4 compute warps only compute; one CTA per SM, 256 threads),
// sm_90 only, at the head dims of has_ring_keysplit_tile. Measured against the plain key-split
// tiles (bench/NOTES.md session 21, runs 116-118), the ring is slower on contiguous caches
// (0.978-0.981 over the one-token grid) and on most paged 16-row calls, but takes the page
// arithmetic off the compute warps of paged 32-row calls (MQA) whose plain plan has at most one
// CTA per SM, the case where the plain tile's one warp per scheduler issues those instructions
// itself (run 53), if each CTA has kRingMinBlocks key blocks or more to amortise the ring's setup
// (its barriers, one more hand-off before the first block): page 16 MQA b128 kv1k (16 blocks per
// CTA) 1.066-1.086x in three runs, b1 kv131k (16) 1.025-1.050x, b8 kv8k (8) 1.004-1.044x; with
// 4 blocks per CTA b1 kv32k 0.953-0.973x and b32 kv1k 0.941-0.998x. So the kvcache op takes it
// there (plan_decode_tile). Paged calls of 16 or 32 rows whose tiles fill at most one wave at
// one CTA per SM, so that the ring runs them unsplit (no partials, no combine kernel), with at
// least kRingMinBlocks key blocks per tile, take it too (session 22, bench/NOTES.md runs
// 122-124): GQA b8 kv1k (64 tiles of 16 blocks; the plain plan has 4 splits at two CTAs per SM,
// and unsplit at one CTA per SM the plain paged copy ran at 0.77x contiguous, page 16), ring
// over plain at 1, 4 and 8 query tokens: page 16 1.022 / 1.042 / 1.097, page 256 1.081 / 1.088
// / 1.155 (run 123; run 122, one token: 1.03 / 1.06); MQA b128 kv8k (128 tiles) 1.028 / 1.044.
// Ring plans that kept 2-32 splits on 64-128 CTAs lost (MHA b1 kv1k 0.94, GQA b1 kv32k 0.97,
// MHA b1 kv8k 0.96). FLASH_CUDA_DECODE_RING in the environment (read per call): 0 never, 1 on
// every d128 key-split call (A/B runs), unset: the rule.
constexpr int kRingMinBlocks = 8;
inline EnvChoice ring_choice() { return env_choice("FLASH_CUDA_DECODE_RING"); }
constexpr bool has_ring_keysplit_tile(int kernel_head_dim) { return kernel_head_dim == 128; }

// The kvcache op's tile choice (after plan_packing, before num_splits): the key-split tiles
// of plan_key_blocks, or the ring tiles where `ring_device` (an sm_90 GPU with the sm_90
// kernels on) and ring_choice() allow: always with kAll, else paged calls with at least
// kRingMinBlocks key blocks per CTA either on 32-row tiles whose plain plan (the split
// heuristic's count) puts at most one CTA on each SM, or on tiles the ring's own plan (one CTA
// per SM) runs in one wave without a split. Never for head groups (contiguous caches, where the
// ring lost; no ring twin). Shapes only (seqlen_k is the capacity).
inline void plan_decode_tile(FwdParams& p, int num_sms, bool ring_device) {
    p.kv_ring = false;
    plan_key_blocks(p, num_sms);
    const EnvChoice ring = ring_device ? ring_choice() : EnvChoice::kOff;
    if (ring == EnvChoice::kOff || !has_ring_keysplit_tile(p.d_rounded) ||
        !runs_keysplit_tile(p) || p.head_group > 1) {  // head groups: no ring twin
        return;
    }
    if (ring == EnvChoice::kRule) {
        if (p.block_table == nullptr) return;
        const int64_t tiles = num_tiles(p);
        auto splits_of = [&](const SplitGeometry& geometry) {
            return num_splits(0, tiles, key_columns(p), true, geometry, num_sms);
        };
        // One wave (tiles x splits <= SMs) of CTAs with kRingMinBlocks key blocks or more.
        auto long_single_wave = [&](const SplitGeometry& geometry, int splits) {
            return tiles * splits <= num_sms &&
                   key_blocks(key_columns(p), geometry.key_block) / splits >= kRingMinBlocks;
        };
        const SplitGeometry plain = split_geometry(p);
        const bool plain_rule = keysplit_rows(p) > 16 && long_single_wave(plain, splits_of(plain));
        const SplitGeometry ring_geometry = ring_split_geometry(p);  // the ring's own plan
        const bool unsplit_rule =
            splits_of(ring_geometry) == 1 && long_single_wave(ring_geometry, 1);
        if (!plain_rule && !unsplit_rule) return;
    }
    p.kv_ring = true;
    p.wide_key_blocks = false;
}

// Paged calls on the 16-row 128-key tile: the twin kernel that issues each block's V copy with
// its K copy (FwdParams::kv_overlap, DecodeTile::kKeySplit16WideOverlap; sm80/fwd.cuh), on the
// steps where it measured faster. Runs 139-142 (one token, d128, the overlap forced on against
// off or main, two processes each):
//   - long CTAs (>= kOverlapMinBlocks key blocks) or several waves of CTAs, small pages:
//     page 16 1.008-1.032 (GQA b8 kv32k / kv131k, b32 kv8k-kv131k, b128, MHA b1 kv131k, b8
//     kv131k, b32, b128), page 32 1.001-1.029 on the same cells (run 142). The copies carry a
//     page lookup every 16 or 32 keys, and overlapping K and V hides them;
//   - the same long CTAs with larger pages: page 64 0.991-1.010 (run 142), page 256 0.983-1.009
//     (run 140), where a block's copy is nearly as cheap as a contiguous one: the contiguous
//     twins lost 0.5-1.7% with the overlap (run 139) and do not have it;
//   - short CTAs in several waves (GQA b128 kv1k, MHA b32 / b128 kv1k: 8 blocks per CTA, 1024-4096
//     CTAs) gain at every page size: 1.011-1.032 at pages 16, 32, 64 and 256;
//   - single-wave steps of 8-32 blocks per CTA lose 0.5-1.9% (GQA b1 kv32k, b32 kv1k, MHA b1
//     kv8k, b8 kv1k at page 16) and do not take it.
// 16-row tiles only (the 32-row one, MQA and several query tokens, was not measured with it, and
// has no such twin). Runs 139-143 measured a run-time switch inside one kernel; that switch cost
// the steps that kept the plain order 0.3-0.7% (page 64 / 256, runs 141 and 143), so the order is
// a kernel of its own. The rule is for sm_90 GPUs (sm90_device: plan_decode_tile's ring_device);
// the order was measured on the H200 only. FLASH_CUDA_DECODE_OVERLAP in the environment (read
// per call): 0 never, 1 on every paged 16-row 128-key call (tests, A/B runs), unset: the rule.
constexpr int kOverlapMinBlocks = 64;
constexpr int kOverlapMinWaves = 2;  // measured: 1024-4096 CTAs (3.9-15.5 waves) gain, <= 1 lose
constexpr int kOverlapMaxSmallPage = 32;
inline void plan_kv_overlap(FwdParams& p, int num_sms, bool sm90_device) {
    p.kv_overlap = false;
    // (The ring tiles have wide_key_blocks false: plan_decode_tile.)
    if (p.block_table == nullptr || !p.wide_key_blocks || keysplit_rows(p) > 16) return;
    const EnvChoice choice = env_choice("FLASH_CUDA_DECODE_OVERLAP");
    if (choice != EnvChoice::kRule) {
        p.kv_overlap = choice == EnvChoice::kAll;
        return;
    }
    if (!sm90_device) return;  // measured on the H200 only
    const int splits = std::max(p.num_splits, 1);
    const bool long_ctas = key_blocks(key_columns(p), kWideKeyBlock) / splits >= kOverlapMinBlocks;
    const bool several_waves =
        num_tiles(p) * splits >= static_cast<int64_t>(kOverlapMinWaves) * num_sms * kWideCtasPerSm;
    p.kv_overlap = p.page_block_size <= kOverlapMaxSmallPage ? long_ctas || several_waves
                                                              : several_waves && !long_ctas;
}

// The kvcache op's packing (before plan_decode_tile and num_splits): head groups where the rule
// takes them, else GQA packing (plan_gqa_packing). The rule takes the largest possible G whose
// own plan (plan_decode_tile and the split heuristic)
//   - runs the step unsplit on at least 3/4 of the CTAs the plan without head groups runs, up
//     to a full wave, or
//   - runs it on the 128-key tile with at least kHeadGroupMinSplitBlocks key blocks per split
//     (steps of several GB: the combine and the G R partial rows per CTA are noise there).
// bench/NOTES.md session 23 (runs 125-126, the one-token d128 grid at every G): head groups lost
// 3-11% where they turned unsplit steps of short caches into split ones (GQA b8 / b32 kv1k,
// MHA b8 kv1k: the combine and G R partial rows per CTA) and 1-3% on split steps of the 64-key
// tile at one CTA per SM (GQA b1 kv131k at G = 4: 2 tiles x 66 splits); they won on the steps
// the rule takes: unsplit GQA b128 kv1k 1.029-1.035x, MHA b32 kv1k at G = 4 1.029x, MHA b128
// kv1k 1.018x; split on the 128-key tile MHA b8 kv131k 1.017-1.022x at every G, GQA b32 kv131k
// 1.004-1.008x.
constexpr int kHeadGroupMinSplitBlocks = 96;
inline void plan_packing(FwdParams& p, int num_sms, bool ring_device) {
    p.head_group = 0;
    const int forced = head_group_forced();
    const int most = head_group_size(p, forced > 1 ? forced : kMaxHeadGroup);
    if (forced == 1 || most == 1) {
        plan_gqa_packing(p);
        return;
    }
    if (forced > 1) {
        pack_head_groups(p, most);
        return;
    }
    // A packed step's plan: tiles, the heuristic's splits, CTA slots of a wave, key blocks per
    // split, 128-key tile.
    struct Plan {
        int64_t tiles;
        int splits;
        int64_t slots;
        int blocks_per_split;
        bool wide;
    };
    auto plan_of = [&](const FwdParams& packed) {
        FwdParams q = packed;
        plan_decode_tile(q, num_sms, ring_device);
        const SplitGeometry geometry = split_geometry(q);
        const int64_t tiles = num_tiles(q);
        const int splits = num_splits(0, tiles, key_columns(q), true, geometry, num_sms);
        return Plan{tiles, splits, static_cast<int64_t>(num_sms) * geometry.ctas_per_sm,
                    key_blocks(key_columns(q), geometry.key_block) / splits,
                    q.wide_key_blocks};
    };
    FwdParams plain_packing = p;
    plan_gqa_packing(plain_packing);
    const Plan plain = plan_of(plain_packing);
    // The largest G of the first criterion, else the largest of the second.
    int unsplit_group = 0, long_group = 0;
    for (int group = most; group > 1 && unsplit_group == 0; group /= 2) {
        FwdParams grouped = p;
        pack_head_groups(grouped, group);
        const Plan g = plan_of(grouped);
        const int64_t wanted = std::min(plain.tiles * plain.splits, g.slots) * 3 / 4;
        if (g.splits == 1 && g.tiles >= wanted) {
            unsplit_group = group;
        } else if (long_group == 0 && g.wide && g.blocks_per_split >= kHeadGroupMinSplitBlocks) {
            long_group = group;
        }
    }
    const int group = unsplit_group > 0 ? unsplit_group : long_group;
    if (group > 1) {
        pack_head_groups(p, group);
    } else {
        p = plain_packing;
    }
}

}  // namespace decode
}  // namespace flash_cuda
