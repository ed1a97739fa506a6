// Forward on Hopper (sm_90a): TMA loads and wgmma, warp-specialised (../shared/DESIGN.md
// section 6).
// The next block's S overlaps this block's softmax inside each consumer warpgroup; the pingpong
// variant also makes the two consumer warpgroups take turns issuing their GEMMs (below).
//
// One tile = kBlockM = 128 query rows of one (batch, head); a CTA, 3 warpgroups (384 threads):
//   warpgroup 0, the producer (registers lowered to 24; 40 in the kernels with dynamic tiles,
//     whose consumers get 232): one thread issues the TMA copies --
//     Q once (kSlabs boxes of 128 rows x 64 columns), then for key blocks n = last .. first the
//     K and V tiles (kSlabs boxes of kBlockN rows x 64 columns each) into kStages buffers, each
//     buffer guarded by a `full` mbarrier (arrive.expect_tx + the copies' bytes) and an `empty`
//     mbarrier (one arrival per consumer thread once its wgmma no longer reads it).
//   warpgroups 1 and 2, the consumers (registers raised to 240, or 232): rows 64 (wg - 1) .. + 63.
//     Per key block:
//       S = Q K^T      wgmma m64 n kBlockN k16, both operands K-major from shared memory (SS)
//       softcap / ALiBi / mask, online softmax on the accumulators (the per-warp layout is the
//       mma.m16n8 C layout of the sm80 kernels: mask.cuh and softmax.cuh apply as they are)
//       O += P V       wgmma m64 n HeadDim k16, P from registers (the S accumulators converted
//                      to A fragments in place), V MN-major from shared memory (RS)
//       l += P 1       bf16: FADDs of the fp32 P (OnlineSoftmax add_row_sums, or in d64's
//                      non-causal kernels right behind the exponentials, kSumP). fp16: the
//                      same rounded P that P V multiplies: a wgmma m64 n8 k16 beside each P V
//                      step, B = 1024 bytes of ones in shared memory (no ALU work per score),
//                      rescaled with O, when causal and in d64's 128-key kernel; else FADDs of
//                      the unpacked P (add_p_row_sums). FADD sums are per thread, quad-reduced
//                      at the epilogue (kRowSumsOnTensorCores)
//       dropout        (DropoutTraits) P's A fragments masked after the FADD row sums, under
//                      the next S (dropout.cuh apply_dropout_via_smem at d64 / d128, with a
//                      scratch of 2 KB (d64) / 1 KB (d128) per consumer warp;
//                      apply_dropout_keep_bits at d192 / d256; the sm80 forward's mask)
//   Epilogue: O / l, lse per row. O either straight from the accumulators to global (4-byte
//     stores) or (StagedOTraits, the calls the launcher picks: fwd_sm90_store_o_by_tma, fixed
//     length) through shared memory and out by TMA stores (one thread per warpgroup, 64-row
//     boxes): at d128 a buffer of its own laid out as Q, which the warpgroup waits for at its
//     next epilogue; at d192 / d256 (no room for one) the K and V buffers of the tile's last key
//     block, which go back to the producer once the stores have read them, under the next tile's
//     first S.
// Shared memory, each operand as 64-column slabs of rows of 128 bytes, the 128-byte swizzle
// (what the TMA writes for a 64-element box and the wgmma descriptors read):
//   Q    [kSlabs][kBlockM][64]     K, V  [kStages][kSlabs][kBlockN][64]     O as Q (d128's staged
//   O only)     ones [8][64]     then the mbarriers
//
// Tensors as in sm80/fwd.cuh (q, k, v, o, lse; fixed length or varlen), read through rank-4
// tensor maps (column, row, head, batch) built by the launcher (fwd_sm90_launch.cuh). Their
// column extent is the call's head dim d, which may be less than HeadDim (d a multiple of 8;
// fwd_sm90_host.h fwd_kernel_head_dim): the TMA zero-fills the columns past d, which then add
// zeros to S and make zero columns of O, and O's stores write d columns (the TMA store clips
// at the extent, the register stores test the column).
//   fixed length: rows = seqlen, the batch coordinate = the batch: rows past a sequence's end are
//     zero-filled by the TMA;
//   varlen: rows = the packed total, batch extent 1, row coordinate = the sequence's start + the
//     tile's row: rows past the sequence's end belong to the next sequence (keys masked; query
//     rows never stored).
// Not here (the launcher keeps these on the sm80 kernels): dropout with softcap or ALiBi, KV
// caches (paged, cache_batch_idx, leftpad, seqused_k), split-KV, GQA packing, head dims over
// 256. Kernels exist for head dims 64 / 128 / 192 / 256 (whole 64-column slabs); smaller head
// dims run the next one up, zero-padded (above).
// Persistent: each CTA walks the tiles blockIdx.x, + gridDim.x, ... in the order of a grid
// (m blocks, h, b), or causal in the level order, longest first, in a snake (FwdTile); or, with
// dynamic tiles (causal calls without dropout), takes its next tile in the grid's order from a
// counter in global memory whenever its producer is done loading one (TileRing). A CTA's
// barriers run on from one tile to the next, so its producer loads the next tile's Q and first
// K / V under the last block and the epilogue of the current one. The launcher (fwd_sm90_host.h
// fwd_sm90_persistent) starts one CTA per SM for fixed-length calls without a window (causal ones
// up to a length), else one CTA per tile.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/mask.cuh"
#include "kernels/params.h"
#include "kernels/ptx.cuh"
#include "kernels/sm80/fwd.cuh"  // SequenceInfo, OutputTile
#include "kernels/sm80/warp_gemm.cuh"
#include "kernels/sm90/fwd_sm90_host.h"  // the variant rules (with_fwd_sm90_traits)
#include "kernels/sm90/mbarrier_wait.cuh"
#include "kernels/sm90/ptx_sm90.cuh"
#include "kernels/softmax.cuh"

namespace flash_cuda {
namespace sm90 {

template <int HeadDim, int BlockN, int Stages, bool Pingpong, bool StoreOByTma = false,
          bool Dropout = false, bool Carry = true>
struct FwdSm90Traits {
    static constexpr int kHeadDim = HeadDim;
    // Dropout of P (dropout.cuh's mask, the sm80 kernels' and the reference's): the dropped
    // elements zeroed on P's A fragments after the row sums (l and lse stay those of the
    // undropped softmax), O scaled by 1 / p_keep at the end. Without softcap / ALiBi.
    static constexpr bool kDropout = Dropout;
    static constexpr int kBlockM = 128;
    static constexpr int kBlockN = BlockN;
    static constexpr int kStages = Stages;
    static constexpr int kConsumerWarpgroups = 2;
    static constexpr int kNThreads = 128 * (1 + kConsumerWarpgroups);
    static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
    static constexpr int kSlabs = HeadDim / 64;  // 64-column slabs of every operand
    // Pingpong (FlashAttention-3's inter-warpgroup overlap): the consumer warpgroups take turns
    // issuing their GEMMs (named barriers 1 and 2), so one's softmax runs while the other's
    // GEMMs have the tensor cores.
    static constexpr bool kPingpong = Pingpong;
    // Whether a tile's first S is issued at the end of the tile before (the kernel's
    // issue_first_s), as soon as that tile's last P V has landed, so that the tensor cores have
    // work under that tile's O stores and this tile's set-up, which otherwise leave them idle
    // between tiles. d64's kernels, without dropout or the pingpong turns. Session 52's
    // non-causal kernel (an H100, run 246): s512-2k 1.04-1.07x. The causal one (an H100, run 252,
    // against the same traits with Carry = false): s1k-16k 1.02-1.05x, s512 0.93-0.97x (hence
    // fwd_sm90_carry_first_s's length rule). Not d128's kernels: non-causal 0.97-1.02x at
    // s512-2k, 0.93-1.10x beyond (runs 247, 249), causal 0.98-1.02x (run 251) and 0.95-1.01x (run
    // 252), no more than identical kernels moved between processes (0.95-1.07x, run 253); at d192
    // / d256 ptxas serialises the wgmma for want of registers. (Session 52's first form, before
    // the stores under the S were predicated, had ptxas inject waits at d128: C7517 / C7518.)
    // Carry = false: the causal kernel without it (FwdSm90Config's UncarriedTraits, for the calls
    // fwd_sm90_carry_first_s leaves out), a separate instantiation: one kernel with both walks (a
    // run-time choice, session 54) cost both (runs 249 and 251: its non-causal s512-1k 0.97-0.99x
    // the kernel with the carried walk alone).
    static constexpr bool carries_first_s(bool /*causal: both ways*/) {
        return Carry && HeadDim == 64 && !Dropout && !Pingpong;
    }
    // The causal kernel carries it only on the calls fwd_sm90_carry_first_s picks, all of them
    // with work in every tile (params.sm90_every_tile_has_work): searching for the next tile with
    // work under the S (the dynamic tiles' ring, empty tiles stored) cost ptxas its proof that the
    // warps converged inside the key loop (BRA.DIV / WARPSYNC before its shuffles and wgmma;
    // 0.87-0.94x at s512-4k, run 246), so its carried walk has no search.
    static constexpr bool carries_first_s_on_every_call(bool causal) {
        return carries_first_s(causal) && !causal;
    }

    static constexpr int kQSlabBytes = kBlockM * 128;
    static constexpr int kKVSlabBytes = kBlockN * 128;
    static constexpr int kQBytes = kSlabs * kQSlabBytes;
    static constexpr int kKVTileBytes = kSlabs * kKVSlabBytes;
    static constexpr int kSmemQOffset = 0;
    static constexpr int kSmemKOffset = kQBytes;
    static constexpr int kSmemVOffset = kSmemKOffset + kStages * kKVTileBytes;
    // The ones of the row sums' B operand (l += P 1): one K-major swizzle atom (8 rows x 64
    // elements); then the mbarriers: full Q, then per stage full K, full V, empty K, empty V;
    // then empty Q; last the tile ring (TileRing: full and empty of its 2 slots, then the slots'
    // tile indices, 8 bytes).
    static constexpr int kOnesBytes = 1024;
    static constexpr int kNumBarriers = 2 + 4 * kStages + 5;
    static constexpr int kMaxSmemBytes = 227 * 1024;  // a Hopper CTA's
    // The CTA's shared memory but an O buffer after K and V: Q, K, V, the ones, the mbarriers,
    // and 1024 bytes to align the tiles (the dynamic shared memory is only 128-byte aligned).
    static constexpr int kSmemOOffset = kSmemVOffset + kStages * kKVTileBytes;
    static constexpr int kSmemBytesButO = 1024 + kSmemOOffset + kOnesBytes + 8 * kNumBarriers;
    // O leaves through shared memory and TMA stores (fixed length only: the launcher's
    // StagedOTraits), else by 4-byte stores from the registers. The staged O goes into a buffer
    // of its own laid out as Q where the shared memory has room for one (d128), else
    // (kOInKVBuffers, d192 / d256) into the K and V buffers of the tile's last key block,
    // kOSlabsPerBuffer of its 128-row slabs in each, held until the stores have read them.
    static constexpr bool kStoreOByTma = StoreOByTma;
    static constexpr bool kOInKVBuffers = StoreOByTma && kSmemBytesButO + kQBytes > kMaxSmemBytes;
    static constexpr int kOBytes = kStoreOByTma && !kOInKVBuffers ? kQBytes : 0;
    static constexpr int kOSlabsPerBuffer = kKVTileBytes / kQSlabBytes;
    static_assert(!kOInKVBuffers || 2 * kOSlabsPerBuffer >= kSlabs,
                  "the staged O must fit the last key block's K and V buffers");
    // Dropout at d64 / d128 (apply_dropout_via_smem): each consumer warp's kDropoutChunk x 512
    // bytes where its quads exchange Philox words; d192 / d256 keep fewer registers live
    // (shuffles, apply_dropout_keep_bits).
    static constexpr bool kDropoutViaSmem = Dropout && HeadDim <= 128;
    // Rounds of draws in flight (4 S tiles each); 4 at d128 spill (4 bytes).
    static constexpr int kDropoutChunk = HeadDim == 64 ? 4 : 2;
    static constexpr int kDropoutScratchBytes =
        kDropoutViaSmem ? 4 * kConsumerWarpgroups * kDropoutChunk * 512 : 0;
    // Draws in flight per row without the exchange (apply_dropout_keep_bits): d256 all three of
    // its 80-key block's; d192 two of its 112-key block's four (four spilled 20 bytes in the
    // non-causal bf16 kernel, local ptxas; two and three none).
    static constexpr int kDropoutDrawUnroll = HeadDim == 192 ? 2 : 4;
    static constexpr int kSmemScratchOffset = kSmemOOffset + kOBytes;
    static constexpr int kSmemOnesOffset = kSmemScratchOffset + kDropoutScratchBytes;
    static constexpr int kSmemBarOffset = kSmemOnesOffset + kOnesBytes;
    static constexpr int kSmemBytes = kSmemBytesButO + kOBytes + kDropoutScratchBytes;

    // The geometry the sm80 helpers (warp_gemm.cuh: P -> A fragments) see: one 16-row
    // slice per warp, kBlockN keys.
    struct PTile {
        static constexpr int kMTiles = 1;
        static constexpr int kBlockN = BlockN;
        static constexpr int kNTiles = BlockN / 8;
    };

    static_assert(HeadDim == 64 || HeadDim == 128 || HeadDim == 192 || HeadDim == 256,
                  "sm90 forward: head dims 64, 128, 192 and 256");
    static_assert(BlockN % 16 == 0 && BlockN <= 256, "wgmma N: a multiple of 16, at most 256");
    static_assert(kSmemBytes <= kMaxSmemBytes, "must fit a Hopper CTA's shared memory");
    static_assert(!StoreOByTma || !Pingpong, "the staged O is not built with the pingpong turns");
    static_assert(!Dropout || (!Pingpong && !StoreOByTma), "dropout: the default tile only");
};

// Traits: the default tile; PingpongTraits: the same with the warpgroups taking turns
// (FLASH_CUDA_SM90=pingpong, for A/B runs). Key blocks of 128, at d256 of 80 (FlashAttention-3's
// d256 tile): Q 64 KB + 2 stages of K and V 160 KB = 225 KB of shared memory, and O takes 128
// of a consumer thread's 240 registers; at d192 of 112 (Q 48 KB + 2 stages of K and V 168 KB =
// 217 KB; O 96 registers, S 56, P 28; 128 keys would need 241 KB). d64 keeps 3 stages of K and
// V (112 KB; causal s1k-8k 1.02-1.05x two stages, the rest within 2%: bench/NOTES.md run 161).
// WideTraits (d64 only): key blocks of 192, 3 stages (160 KB), for long non-causal calls
// (fwd_sm90_wide_key_blocks: s4k-16k 1.06-1.19x the 128-key blocks; 0.79-0.97x at s512-2k,
// where the last block's padding and mask cost more than the fewer, longer blocks save). At
// d128-d256 wider blocks do not fit the consumers' registers (d128: 160 or 176 keys serialise
// the wgmma). (A variant without the overlap inside the warpgroup measured 0-5% slower,
// bench/NOTES.md run 33, and was dropped.)
// StagedOTraits (d128, d192, d256): Traits with O leaving through shared memory and TMA stores,
// for the fixed-length calls fwd_sm90_store_o_by_tma picks: d128's short ones (a 32 KB buffer of
// its own; bench/NOTES.md run 165: 1.06-1.18x on short tiles, 0.95-0.99x on long ones), every
// d256 one (the last K and V buffers; run 169: 1.01-1.21x) and every d192 one (as d256; run 211:
// 1.01-1.12x). A separate instantiation, so the other calls keep the kernel without it. d64 has
// none: 0.82-1.01x with a buffer of its own (run 165), 0.85-0.90x in the last V buffer (run 169).
template <int HeadDim>
struct FwdSm90Config {
    static constexpr int kBlockN = HeadDim <= 128 ? 128 : HeadDim == 192 ? 112 : 80;
    static constexpr int kStages = HeadDim == 64 ? 3 : 2;
    using Traits = FwdSm90Traits<HeadDim, kBlockN, kStages, false>;
    using PingpongTraits = FwdSm90Traits<HeadDim, kBlockN, kStages, true>;
    using WideTraits = FwdSm90Traits<HeadDim, 192, 3, false>;  // HeadDim 64 only
    using StagedOTraits = FwdSm90Traits<HeadDim, kBlockN, kStages, false, true>;  // d >= 128
    using DropoutTraits = FwdSm90Traits<HeadDim, kBlockN, kStages, false, false, true>;
    // Traits without the first-S carry (FwdSm90Traits::carries_first_s: d64's causal kernel has a
    // twin of these), for the causal calls fwd_sm90_carry_first_s leaves out.
    using UncarriedTraits = FwdSm90Traits<HeadDim, kBlockN, kStages, false, false, false, false>;
};

// The traits a call runs, passed as f(Traits{}) (the launcher and the CPU emulator): dropout's
// (the default tile with the mask), d64's wide key blocks (fwd_sm90_wide_key_blocks), the staged
// O (fwd_sm90_store_o_by_tma), else the pingpong or the default tile (params.sm90_pingpong). The
// rules never pick a variant with pingpong. The default tile without the first-S carry where
// fwd_sm90_carry_first_s leaves it out (after sm90_every_tile_has_work is set).
template <int HeadDim, bool Causal, typename F>
void with_fwd_sm90_traits(const FwdParams& params, F&& f) {
    using Config = FwdSm90Config<HeadDim>;
    if (params.p_keep < 1.f) return f(typename Config::DropoutTraits{});
    if constexpr (HeadDim == 64 && !Causal) {
        if (fwd_sm90_wide_key_blocks(params)) return f(typename Config::WideTraits{});
    }
    if constexpr (HeadDim != 64) {
        if (fwd_sm90_store_o_by_tma(params)) return f(typename Config::StagedOTraits{});
    }
    if (params.sm90_pingpong) return f(typename Config::PingpongTraits{});
    if constexpr (Config::Traits::carries_first_s(Causal) &&
                  !Config::Traits::carries_first_s_on_every_call(Causal)) {
        if (!fwd_sm90_carry_first_s(params)) {
            return f(typename Config::UncarriedTraits{});
        }
    }
    f(typename Config::Traits{});
}

// Shared-memory addresses of the CTA's tiles and barriers.
template <typename Traits>
struct Sm90Smem {
    uint32_t q, k, v, o, scratch, ones, bar;
    __device__ __forceinline__ static Sm90Smem make() {
        const uint32_t raw = ptx::smem_addr(ptx::dynamic_smem());
        Sm90Smem s;
        s.q = (raw + 1023u) & ~1023u;
        s.k = s.q + Traits::kSmemKOffset;
        s.v = s.q + Traits::kSmemVOffset;
        s.o = s.q + Traits::kSmemOOffset;
        s.scratch = s.q + Traits::kSmemScratchOffset;
        s.ones = s.q + Traits::kSmemOnesOffset;
        s.bar = s.q + Traits::kSmemBarOffset;
        return s;
    }
    __device__ __forceinline__ uint32_t full_q() const { return bar; }
    __device__ __forceinline__ uint32_t full_k(int stage) const { return bar + 8 * (1 + stage); }
    __device__ __forceinline__ uint32_t full_v(int stage) const {
        return bar + 8 * (1 + Traits::kStages + stage);
    }
    __device__ __forceinline__ uint32_t empty_k(int stage) const {
        return bar + 8 * (1 + 2 * Traits::kStages + stage);
    }
    __device__ __forceinline__ uint32_t empty_v(int stage) const {
        return bar + 8 * (1 + 3 * Traits::kStages + stage);
    }
    __device__ __forceinline__ uint32_t empty_q() const {
        return bar + 8 * (1 + 4 * Traits::kStages);
    }
    __device__ __forceinline__ uint32_t full_tile(int slot) const {
        return bar + 8 * (2 + 4 * Traits::kStages + slot);
    }
    __device__ __forceinline__ uint32_t empty_tile(int slot) const {
        return bar + 8 * (4 + 4 * Traits::kStages + slot);
    }
    __device__ __forceinline__ uint32_t tile_slot(int slot) const {
        return bar + 8 * (6 + 4 * Traits::kStages) + 4 * slot;
    }
};

// One tile of the persistent schedule (fwd_sm90_host.h fwd_sm90_persistent): tile t = blockIdx.x,
// blockIdx.x + gridDim.x, ... (or, dynamic tiles, the indices TileRing hands out) is query block
// t % num_m_blocks of head (t / num_m_blocks) % h and batch t / (num_m_blocks h), the order of a
// grid (m blocks, h, b), so that the CTAs running together share a head's K / V in L2 (and a GQA
// group's heads theirs). Causal with a CTA per tile: the m blocks last to first (longest first,
// the order in which the hardware starts them).
// Causal with fewer CTAs than tiles (level order): the (batch, head) pairs in chunks of `chunk`
// (fwd_sm90_host.h fwd_sm90_tile_chunk; the last chunk may be shorter), chunk after chunk;
// inside a chunk the m blocks are the slowest index, last to first, then the batch, the head
// fastest (a GQA group's heads together). Dynamic tiles take chunks of one pair by default: the
// grid's order, each pair's blocks longest first; but their last `tail` pairs (fwd_sm90_host.h
// fwd_sm90_tail_pairs) form one chunk of their own, so that the last tiles handed out are the
// short ones of several pairs, not the long ones of the last pair. The fixed walk takes as many
// pairs as the L2 holds the K / V of, and its CTAs walk the rounds of gridDim.x tiles in a snake
// (index): the tiles shorten as t grows within a chunk, so a CTA that takes one of a round's
// longer tiles takes one of the next round's shorter ones, and the CTAs' work stays even (a plain
// walk gives CTA gridDim.x - 1 the shorter tile of every round). Without the chunks (one chunk of
// all the pairs) every level would read every head's K / V again, from memory once they no longer
// fit the L2.
struct FwdTile {
    int m_block, batch, head;
    // The CTA's tile in its round r (r = 0, 1, ...; the walk ends at the first index past the
    // tiles): blockIdx.x + r gridDim.x, in the level order odd rounds mirrored.
    __device__ __forceinline__ static int index(int round, bool level_order) {
        const int cta = level_order && (round & 1) != 0
                            ? static_cast<int>(gridDim.x - 1 - blockIdx.x)
                            : static_cast<int>(blockIdx.x);
        return round * static_cast<int>(gridDim.x) + cta;
    }
    // The divisors are the params' (prepare_fwd_sm90_divisors: the query blocks per (batch,
    // head), the heads; prepare_fwd_sm90_level_order: the level order's chunks and tail).
    __device__ __forceinline__ static FwdTile make(int t, const FwdParams& params, bool causal,
                                                   bool level_order) {
        FwdTile tile;
        const FastDivisor& m_div = params.num_m_blocks_div;
        const FastDivisor& h_div = params.sm90_heads_div;
        const int num_m_blocks = m_div.value(), heads = h_div.value();
        if (level_order) {
            const int body = params.b * heads - params.sm90_tail_pairs;  // pairs before the tail
            int first;                // the chunk's first pair
            FastDivisor chunk_pairs;  // its pairs
            if (t >= body * num_m_blocks) {
                first = body;
                chunk_pairs = params.sm90_tail_pairs_div;
            } else {
                const int chunk = params.sm90_chunk_pairs_div.value();
                first = params.sm90_chunk_tiles_div.div(t) * chunk;
                chunk_pairs = first + chunk > body ? params.sm90_last_chunk_pairs_div
                                                   : params.sm90_chunk_pairs_div;
            }
            // Its tiles: level after level (the query blocks, last first), a pair per tile.
            const int in_chunk = t - first * num_m_blocks;
            const int level_index = chunk_pairs.div(in_chunk);
            const int pair = first + (in_chunk - level_index * chunk_pairs.value());
            tile.m_block = num_m_blocks - 1 - level_index;
            tile.batch = h_div.div(pair);
            tile.head = pair - tile.batch * heads;
            return tile;
        }
        const int rest = m_div.div(t);
        const int m_index = t - rest * num_m_blocks;
        tile.m_block = causal ? num_m_blocks - 1 - m_index : m_index;
        tile.batch = h_div.div(rest);
        tile.head = rest - tile.batch * heads;
        return tile;
    }
};

// A CTA's tiles with dynamic tiles (params.sm90_tile_counter; fwd_sm90_host.h
// fwd_sm90_dynamic_tiles; FwdTile maps the indices): round 0 is tile blockIdx.x; for each later
// round the producer takes gridDim.x + the counter's old value (an atomic add of 1) once it has
// issued the previous tile's last K / V load, and hands it to the consumers through a ring of 2
// slots in shared memory. Each slot has a full mbarrier (one arrival: the producer's, after
// storing the index) and an empty one (an arrival per consumer thread, after loading it). An
// index of num_tiles or more ends both roles' walks (the producer publishes it too). The
// producer runs at most one round ahead of the slowest consumer's load: it waits for round
// r - 2's slot to be emptied before storing round r.
template <typename Traits>
struct TileRing {
    // Producer (one thread): round `round`'s tile index into its slot.
    __device__ __forceinline__ static void publish(const Sm90Smem<Traits>& smem, int round,
                                                   int tile_index) {
        const int slot = round & 1;
        wait_phase(smem.empty_tile(slot), ((round >> 1) & 1) ^ 1);  // round 0 / 1: at once
        ptx::st_shared_4(smem.tile_slot(slot), static_cast<uint32_t>(tile_index));
        ptx90::mbarrier_arrive(smem.full_tile(slot));
    }
    // Consumer thread: round `round`'s tile index (warp-uniform).
    __device__ __forceinline__ static int take(const Sm90Smem<Traits>& smem, int round) {
        const int slot = round & 1;
        wait_phase(smem.full_tile(slot), (round >> 1) & 1);
        const int tile_index = static_cast<int>(ptx::ld_shared_4(smem.tile_slot(slot)));
        ptx90::mbarrier_arrive(smem.empty_tile(slot));
        return ptx::warp_uniform(tile_index);
    }
};

// The tile's rows in the tensor maps: row and batch coordinates of the first query row / key 0.
struct MapRows {
    int q_row, k_row, batch;
    __device__ __forceinline__ static MapRows make(const FwdParams& params, int batch, int m0) {
        MapRows r;
        if (params.cu_seqlens_q != nullptr) {  // varlen: packed rows, batch extent 1
            r.q_row = params.cu_seqlens_q[batch] + m0;
            r.k_row = params.cu_seqlens_k[batch];
            r.batch = 0;
        } else {
            r.q_row = m0;
            r.k_row = 0;
            r.batch = batch;
        }
        return r;
    }
};

// row_sum[0][half] += this thread's share of row g (half 0) / g + 8 (half 1) of P (fp16), as
// rounded to 16 bits for P V (p_frag: the A fragments of P; registers 0 / 2 hold row g, 1 / 3 row
// g + 8): FADDs of the unpacked values, four partial sums per row. The sums stay per thread
// through the key loop (the rescale is linear); quad_allreduce_sum makes them whole rows before
// the epilogue. The same rounded P as sm80::warp_gemm_p_rowsum's P * ones, without its chain of
// dependent mma.sync before the next block's wgmma is issued.
template <typename Element, int kKSteps>
__device__ __forceinline__ void add_p_row_sums(float (&row_sum)[1][2],
                                               const uint32_t (&p_frag)[1][kKSteps][4]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
            const float2 lo = ptx::unpack_float2<Element>(p_frag[0][kk][half]);
            const float2 hi = ptx::unpack_float2<Element>(p_frag[0][kk][2 + half]);
            part[0] += lo.x;
            part[1] += lo.y;
            part[2] += hi.x;
            part[3] += hi.y;
        }
        row_sum[0][half] += (part[0] + part[1]) + (part[2] + part[3]);
    }
}

template <typename Element, typename Traits, bool Causal, bool HasAlibi, bool HasSoftcap>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    mha_fwd_sm90_kernel(const __grid_constant__ FwdParams params,
                        const __grid_constant__ CUtensorMap q_map,
                        const __grid_constant__ CUtensorMap k_map,
                        const __grid_constant__ CUtensorMap v_map,
                        const __grid_constant__ CUtensorMap o_map) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // A pass for an architecture without wgmma / setmaxnreg (the instantiation files compile
    // for every architecture of the build): no body. flash_api.cpp launches this kernel only
    // on an sm_90 device of a build with sm_90a (FLASH_CUDA_HAS_SM90).
    __trap();
#else
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kStages = Traits::kStages;
    constexpr int kSlabs = Traits::kSlabs;
    using PTile = typename Traits::PTile;

    // Where the row sums l = P 1 are formed (softmax.cuh kRowSumsOfFp32P).
    // bf16: of the fp32 P, by FADDs (lse ~1e-6 off instead of up to ~1.7e-3 on short rows):
    // after the exponentials (add_row_sums), or pair by pair behind them (kSumP) in d64's
    // non-causal kernels, whose P leaves the scores' registers as it is packed (kPackPairs) or
    // spans 192 keys; each form was 5-18% slower in the other's kernels. Against the sums of the
    // rounded P they replace: d64 causal s1k-16k, d128 and d192 1-7% faster; d64 causal s512
    // 5-10% and the 192-key calls 2-7% slower (bench/NOTES.md session 56, runs 258-261).
    // fp16: of the P that P V multiplies, on the tensor cores (a wgmma m64 n8 beside each P V
    // step, against ones) in the causal kernels and the d64 128-key kernel, where the consumers'
    // ALU work limits; else by FADDs of the unpacked P (add_p_row_sums), where the extra wgmma
    // costs more tensor-core time than the adds cost (measured on bf16 calls when they summed
    // the rounded P: d128 / d256 non-causal 0.89-1.00x, bench/NOTES.md run 160; d64's 192-key
    // blocks, the long non-causal calls: FADDs 1.03x, 128-key d64 calls 0.94-0.98x, run 240).
    // Dropout: by FADDs (the row sums are of the undropped P, the P V operand is dropped).
    constexpr bool kDropout = Traits::kDropout;
    // P packed into P V's A fragments pair by pair right behind its exponentials
    // (update_scores' on_pair), so the MUFUs interleave with the packs: taken where it was measured
    // to win, d64's non-causal 128-key kernel (1.01-1.06x, bench/NOTES.md run 245). d64 causal:
    // 0.99-1.02x; d64's 192-key kernel: 0.99x; at d128 / d256 the next S's accumulators and P's
    // temporaries, live together, spill 100-212 bytes.
    constexpr bool kPackPairs =
        Traits::kHeadDim == 64 && kBlockN == 128 && !Causal && !kDropout;
    constexpr bool kCarryFirstS = Traits::carries_first_s(Causal);
    constexpr bool kFp32RowSums = kRowSumsOfFp32P<Element>;
    constexpr bool kSumP = kFp32RowSums && (kPackPairs || kBlockN == 192);
    constexpr bool kRowSumsOnTensorCores =
        (Causal || (Traits::kHeadDim == 64 && kBlockN == 128)) && !kDropout && !kFp32RowSums;
    static_assert(!kDropout || (!HasAlibi && !HasSoftcap), "dropout without softcap / ALiBi");
    const Sm90Smem<Traits> smem = Sm90Smem<Traits>::make();
    const int tid = threadIdx.x;
    const int num_m_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
    const int num_tiles = num_m_blocks * params.b * params.h;
    // Dynamic tiles (TileRing; the host's fwd_sm90_dynamic_tiles) are built into the causal
    // kernels without dropout only. Their producer holds the counter's values in registers, so
    // it gets 40 registers and each consumer 232 instead of 24 and 240 (with 24 the producer
    // spilled 4-24 bytes in most kernels; the dropout consumers need their 240, the other
    // kernels keep the split as it was).
    constexpr bool kDynamicTiles = Causal && !kDropout;
    constexpr int kProducerRegisters = kDynamicTiles ? 40 : 24;
    constexpr int kConsumerRegisters = kDynamicTiles ? 232 : 240;
    static_assert(kProducerRegisters + 2 * kConsumerRegisters <= 504,
                  "a CTA's 64512 registers (168 per thread at launch) over its 3 warpgroups");
    auto dynamic_tiles = [&] { return kDynamicTiles && params.sm90_tile_counter != nullptr; };
    const bool level_order = Causal && static_cast<int>(gridDim.x) < num_tiles;

    // A tile's query rows and key blocks (both roles compute them; the producer's registers are
    // few, so it keeps only what it needs).
    struct TileWork {
        FwdTile tile;
        sm80::SequenceInfo seq;
        AttentionMask mask;
        int m0, valid_q_rows, n_block_min, n_block_max;
        __device__ __forceinline__ bool has_rows() const { return m0 < seq.seqlen_q; }
        __device__ __forceinline__ int n_iters() const { return n_block_max - n_block_min; }
    };
    auto tile_work = [&](int t) {
        TileWork w;
        w.tile = FwdTile::make(t, params, Causal, level_order);
        w.seq = sm80::SequenceInfo::make(params, w.tile.batch);
        w.m0 = w.tile.m_block * kBlockM;
        w.valid_q_rows = min(kBlockM, w.seq.seqlen_q - w.m0);
        w.mask.seqlen_k = w.seq.seqlen_k;
        w.mask.diag = w.seq.seqlen_k - w.seq.seqlen_q;
        w.mask.window_left = params.window_size_left;
        w.mask.window_right = Causal ? 0 : params.window_size_right;
        const int keys_begin = max(0, w.mask.key_begin(w.m0));
        const int keys_end = w.mask.key_end(w.m0 + w.valid_q_rows - 1);
        w.n_block_min = keys_begin / kBlockN;
        w.n_block_max = keys_end > keys_begin ? (keys_end + kBlockN - 1) / kBlockN : 0;
        return w;
    };

    // The ones of l += P 1 (read by the consumers' wgmma, the async proxy: fenced).
    if constexpr (kRowSumsOnTensorCores) {
        const uint32_t one_pair = ptx::pack_float2<Element>(1.f, 1.f);
        for (int i = tid; i < Traits::kOnesBytes / 4; i += Traits::kNThreads) {
            ptx::st_shared_4(smem.ones + 4 * i, one_pair);
        }
        ptx90::fence_proxy_async_shared();
    }
    if (tid == 0) {
        ptx90::mbarrier_init(smem.full_q(), 1);
        ptx90::mbarrier_init(smem.empty_q(), Traits::kConsumerThreads);
        for (int s = 0; s < kStages; ++s) {
            ptx90::mbarrier_init(smem.full_k(s), 1);
            ptx90::mbarrier_init(smem.full_v(s), 1);
            ptx90::mbarrier_init(smem.empty_k(s), Traits::kConsumerThreads);
            ptx90::mbarrier_init(smem.empty_v(s), Traits::kConsumerThreads);
        }
        for (int slot = 0; slot < 2; ++slot) {
            ptx90::mbarrier_init(smem.full_tile(slot), 1);
            ptx90::mbarrier_init(smem.empty_tile(slot), Traits::kConsumerThreads);
        }
        ptx90::fence_barrier_init();
    }
    __syncthreads();  // the last CTA-wide barrier: the warpgroups go their own ways from here

    // Both roles walk the same tiles (fixed: FwdTile::index; dynamic: the producer's, through
    // TileRing) and skip the same ones (no rows, or no visible key), and count what they pass
    // through the barriers: `q_round` Q tiles, `kv_base` K / V blocks (block g of the CTA uses
    // stage g % kStages in round g / kStages).
    const int warpgroup = tid / 128;
    if (warpgroup == 0) {
        // ---- Producer.
        ptx90::setmaxnreg_dec<kProducerRegisters>();
        if (tid != 0) return;
        if constexpr (kDropout) write_rng_state(params, tid);  // CTA 0 (dropout.cuh)
        int q_round = 0, kv_base = 0;
        auto next_tile = [&](int round) {
            return dynamic_tiles() && round > 0
                       ? static_cast<int>(gridDim.x) +
                             ptx::atomic_add_global(params.sm90_tile_counter, 1)
                       : FwdTile::index(round, level_order);
        };
        for (int round = 0, tile_index = next_tile(0);; tile_index = next_tile(++round)) {
            if (dynamic_tiles()) TileRing<Traits>::publish(smem, round, tile_index);
            if (tile_index >= num_tiles) break;
            const TileWork w = tile_work(tile_index);
            const int n_iters = w.n_iters();
            if (!w.has_rows() || n_iters <= 0) continue;
            const MapRows rows = MapRows::make(params, w.tile.batch, w.m0);
            const int kv_head = params.h_h_k_ratio_div.div(w.tile.head);
            // The consumers are done with the previous tile's Q (first tile: passes at once).
            wait_phase(smem.empty_q(), (q_round & 1) ^ 1);
            ptx90::mbarrier_arrive_expect_tx(smem.full_q(), Traits::kQBytes);
            for (int slab = 0; slab < kSlabs; ++slab) {
                ptx90::tma_load_4d(smem.q + slab * Traits::kQSlabBytes, &q_map, 64 * slab,
                                   rows.q_row, w.tile.head, rows.batch, smem.full_q());
            }
            ++q_round;
            for (int it = 0; it < n_iters; ++it) {
                const int g = kv_base + it;
                const int stage = g % kStages;
                const uint32_t phase = (g / kStages) & 1;
                const int key0 = rows.k_row + (w.n_block_max - 1 - it) * kBlockN;
                const uint32_t stage_offset = stage * Traits::kKVTileBytes;
                // The consumers released this buffer's previous block (first round: at once).
                wait_phase(smem.empty_k(stage), phase ^ 1);
                ptx90::mbarrier_arrive_expect_tx(smem.full_k(stage), Traits::kKVTileBytes);
                for (int slab = 0; slab < kSlabs; ++slab) {
                    ptx90::tma_load_4d(smem.k + stage_offset + slab * Traits::kKVSlabBytes,
                                       &k_map, 64 * slab, key0, kv_head, rows.batch,
                                       smem.full_k(stage));
                }
                wait_phase(smem.empty_v(stage), phase ^ 1);
                ptx90::mbarrier_arrive_expect_tx(smem.full_v(stage), Traits::kKVTileBytes);
                for (int slab = 0; slab < kSlabs; ++slab) {
                    ptx90::tma_load_4d(smem.v + stage_offset + slab * Traits::kKVSlabBytes,
                                       &v_map, 64 * slab, key0, kv_head, rows.batch,
                                       smem.full_v(stage));
                }
            }
            kv_base += n_iters;
        }
        return;
    }

    // ---- Consumers: warpgroup 1 + c owns tile rows 64 c .. 64 c + 63.
    ptx90::setmaxnreg_inc<kConsumerRegisters>();
    const int c = ptx::warp_uniform(warpgroup - 1);  // uniform: so are the Q descriptors
    const int t = tid % 128;
    const int lane = t % 32;
    const int warp_row0 = 64 * c + 16 * (t / 32);  // the warp's first row in the tile

    const float softcap_pre_scale = HasSoftcap ? params.softcap_pre_scale : 0.f;
    const float score_scale = HasSoftcap ? params.softcap : params.scale_softmax;
    const float log2_scale =
        HasAlibi ? static_cast<float>(M_LOG2E)
                 : (HasSoftcap ? params.softcap_log2 : params.scale_softmax_log2);

    float acc_o[Traits::kHeadDim / 2];  // O (64 x HeadDim) of the warpgroup, wgmma layout
    float acc_s[kBlockN / 2];           // S (64 x kBlockN)
    float acc_l[4];                     // l = P 1 (64 x 8, every column the row's sum; if
                                        // kRowSumsOnTensorCores)
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) acc_s[i] = 0.f;
    // The same registers in the sm80 fragment shape [1][N / 8][4] (mask.cuh, softmax.cuh).
    auto& s_frag = *reinterpret_cast<float(*)[1][kBlockN / 8][4]>(&acc_s);
    auto& o_frag = *reinterpret_cast<float(*)[1][Traits::kHeadDim / 8][4]>(&acc_o);
    auto& l_frag = *reinterpret_cast<float(*)[1][1][4]>(&acc_l);
    const uint64_t desc_ones = ptx90::make_smem_desc_sw128(smem.ones);  // K-major, any k step
    uint32_t p_frag[1][kBlockN / 16][4];
    const uint32_t q_rows = smem.q + 64 * c * 128;  // this warpgroup's 64 rows of each Q slab
    // O through shared memory and TMA stores (kStoreOByTma; o_map: (column, row, head, batch),
    // boxes of 64 x 64; fixed length only: a varlen tile's rows past its sequence belong to the
    // next one), else by 4-byte stores from the registers. Named barriers kOStoreBarrier + c: the
    // warpgroup's rows of the staged O; kOStoreBarrier + 2: both consumer warpgroups (1 and 2 are
    // the pingpong turns).
    constexpr bool o_by_tma = Traits::kStoreOByTma;
    constexpr bool o_in_kv = Traits::kOInKVBuffers;
    constexpr uint32_t kOStoreBarrier = 3;
    // O in the last K and V buffers (o_in_kv): their stage, whose empty_k / empty_v arrivals
    // (128 each, by thread 0 for the warpgroup) wait until this warpgroup's TMA stores have read
    // them -- under the next tile's first S, or at the end (release_o_buffers). -1: none held.
    int o_stage = -1;
    auto release_o_buffers = [&] {
        if constexpr (o_in_kv) {
            if (o_stage >= 0) {
                if (t == 0) {
                    ptx90::bulk_wait_group_read<0>();
                    ptx90::mbarrier_arrive_count(smem.empty_k(o_stage), 128);
                    ptx90::mbarrier_arrive_count(smem.empty_v(o_stage), 128);
                }
                o_stage = -1;
            }
        }
    };

    // Pingpong: each batch of GEMMs (the first S; then each step's next S and P V) is issued
    // between bar.sync on this warpgroup's barrier (1 + c) and bar.arrive on the other's, so the
    // warpgroups issue in turn, warpgroup 0 first (warpgroup 1's arrival before its first
    // batch), tile after tile (n_iters + 1 batches each). A warpgroup's arrivals on a barrier
    // thus alternate with its syncs on the other one, so no warp arrives twice in one phase;
    // warpgroup 0's one more sync after the last tile takes warpgroup 1's last arrival, so
    // every barrier phase gets exactly its 256 threads.
    auto my_turn = [&] {
        if constexpr (Traits::kPingpong) ptx90::named_barrier_sync(1 + c, 256);
    };
    auto their_turn = [&] {
        if constexpr (Traits::kPingpong) ptx90::named_barrier_arrive(2 - c, 256);
    };

    if constexpr (Traits::kPingpong) {
        if (c == 1) ptx90::named_barrier_arrive(1, 256);  // warpgroup 0 goes first
    }
    int q_round = 0, kv_base = 0;
    auto take_tile = [&](int round) {
        return dynamic_tiles() ? TileRing<Traits>::take(smem, round)
                               : FwdTile::index(round, level_order);
    };
    // Block `it` of a tile is the CTA's block kv_base + it: its stage and phase.
    auto stage_of = [&](int it) { return (kv_base + it) % kStages; };
    auto phase_of = [&](int it) {
        return static_cast<uint32_t>(((kv_base + it) / kStages) & 1);
    };
    // S = Q K^T of iteration `it` into acc_s (issued, committed, not waited for). K-major
    // operands: k16 step ks reads 32 bytes into every 128-byte row of slab ks / 4.
    auto issue_qk = [&](int it) {
        const uint32_t k_tile = smem.k + stage_of(it) * Traits::kKVTileBytes;
        // Opaque: the Q descriptors are rebuilt per block, not hoisted out of the loop (at
        // d256 they would take 16 registers); warp-uniform, so rebuilt in uniform registers.
        const uint64_t desc_q =
            ptx90::make_smem_desc_sw128(ptx::warp_uniform(ptx::opaque(q_rows)));
        const uint64_t desc_k = ptx90::make_smem_desc_sw128(k_tile);
        ptx90::fence_operand(acc_s);
        ptx90::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < Traits::kHeadDim / 16; ++ks) {
            const uint32_t offset = 32 * (ks % 4);
            ptx90::wgmma_ss<kBlockN, Element>(
                acc_s,
                ptx90::smem_desc_advance(desc_q, (ks / 4) * Traits::kQSlabBytes + offset),
                ptx90::smem_desc_advance(desc_k, (ks / 4) * Traits::kKVSlabBytes + offset),
                ks > 0);
        }
        ptx90::wgmma_commit();
    };
    // A tile with no visible key for any row: out = 0, lse = +inf.
    auto store_empty_tile = [&](const sm80::OutputTile<Element>& out) {
        release_o_buffers();
        for (int i = tid - 128; i < out.valid_rows * params.d; i += Traits::kConsumerThreads) {
            const int row = i / params.d, col = i - row * params.d;
            out.o[static_cast<int64_t>(row) * params.o_row_stride + col] = Element(0.f);
        }
        for (int row = tid - 128; row < out.valid_rows; row += Traits::kConsumerThreads) {
            out.lse[row] = INFINITY;
        }
    };
    // The CTA's next tile with work, from round `round` on (round then its round, w its work):
    // tiles without rows (varlen: a sequence shorter than the grid) are skipped, those without
    // a visible key stored empty. False at the end of the walk.
    auto next_tile_with_work = [&](int& round, TileWork& w) {
        for (;; ++round) {
            const int tile_index = take_tile(round);
            if (tile_index >= num_tiles) return false;
            w = tile_work(tile_index);
            if (!w.has_rows()) continue;
            if (w.n_iters() > 0) return true;
            store_empty_tile(sm80::OutputTile<Element>::make(params, w.seq, w.tile.batch,
                                                             w.tile.head, w.m0, kBlockM));
        }
    };
    // A tile's first S (kv_base and q_round count from the tile's first block and Q).
    auto issue_first_s = [&] {
        wait_phase(smem.full_q(), q_round & 1);
        wait_phase(smem.full_k(stage_of(0)), phase_of(0));
        my_turn();
        issue_qk(0);
        their_turn();
    };

    // One tile with work. It ends with finish(stores), stores being its stores of O from the
    // registers; finish returns whether the walk goes on (kCarryFirstS: it finds the next tile and
    // issues its first S before the stores, and overwrites w with the next tile's work: w is not
    // read after finish starts).
    auto run_tile = [&](const TileWork& w, auto finish) {
        const int batch = w.tile.batch, head = w.tile.head, m0 = w.m0;
        const int n_block_max = w.n_block_max;
        const int n_iters = w.n_iters();
        const sm80::OutputTile<Element> out =
            sm80::OutputTile<Element>::make(params, w.seq, batch, head, m0, kBlockM);
        if constexpr (!kCarryFirstS) {  // (kCarryFirstS: next_tile_with_work stored it)
            if (n_iters <= 0) {
                store_empty_tile(out);
                return true;
            }
        }

        [[maybe_unused]] const float alibi_slope =
            HasAlibi && params.alibi_slopes_ptr != nullptr
                ? reinterpret_cast<const float*>(params.alibi_slopes_ptr)
                      [batch * params.alibi_slopes_batch_stride + head]
                : 0.f;
        const KeyRange key_range = KeyRange::make(w.mask);
        [[maybe_unused]] const DropoutMask dropout =
            kDropout ? DropoutMask::make(params, static_cast<int64_t>(batch) * params.h + head)
                     : DropoutMask{};
        // Key blocks inside every tile row's visible range need no mask.
        const int unmasked_keys_end = w.mask.key_end(m0);
        const int unmasked_keys_begin = w.mask.key_begin(m0 + kBlockM - 1);

#pragma unroll
        for (int i = 0; i < Traits::kHeadDim / 2; ++i) acc_o[i] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc_l[i] = 0.f;
        OnlineSoftmax<1> softmax;
        softmax.init();

        // O += P V of iteration `it` (issued, committed, not waited for): V MN-major, k16 step
        // kk = 16 keys = two 1024-byte atoms of every slab; the slabs (64 columns each) are
        // kKVSlabBytes apart (the leading byte offset).
        auto issue_pv = [&](int it) {
            const uint32_t v_tile = smem.v + stage_of(it) * Traits::kKVTileBytes;
            ptx90::fence_operand(acc_o);
            if constexpr (kRowSumsOnTensorCores) ptx90::fence_operand(acc_l);
            ptx90::fence_operand(p_frag);
            ptx90::wgmma_fence();
            const uint64_t desc_v = ptx90::make_smem_desc_sw128(v_tile, Traits::kKVSlabBytes);
#pragma unroll
            for (int kk = 0; kk < kBlockN / 16; ++kk) {
                ptx90::wgmma_rs<Traits::kHeadDim, Element, true>(
                    acc_o, p_frag[0][kk], ptx90::smem_desc_advance(desc_v, 2048 * kk), true);
                if constexpr (kRowSumsOnTensorCores) {
                    ptx90::wgmma_rs<8, Element, false>(acc_l, p_frag[0][kk], desc_ones, true);
                }
            }
            ptx90::wgmma_commit();
        };
        // Softcap, ALiBi and the mask on the scores of iteration `it`.
        auto transform_scores = [&](int it) {
            const int n_block = n_block_max - 1 - it;
            if constexpr (HasSoftcap) apply_softcap(s_frag, softcap_pre_scale);
            const int frag_row0 = m0 + warp_row0 + lane / 4;
            const int frag_col0 = n_block * kBlockN + 2 * (lane % 4);
            if constexpr (HasAlibi) {
                apply_alibi(s_frag, score_scale, alibi_slope, frag_row0 + w.mask.diag, frag_col0);
            }
            // Blocks that cross the window's begin: both edges tested; blocks that cross only
            // the end (all causal blocks without a window): the end only, one compare per
            // element (mask.cuh apply_mask's kCheckBegin).
            if (n_block * kBlockN < unmasked_keys_begin) {
                apply_mask(s_frag, key_range, frag_row0, frag_col0);
            } else if ((n_block + 1) * kBlockN > unmasked_keys_end) {
                apply_mask</*kCheckBegin=*/false>(s_frag, key_range, frag_row0, frag_col0);
            }
        };

        // Overlap inside the warpgroup (DESIGN.md section 6): S of the next block and P V of this
        // one are issued back to back, and only S is waited for, so the next block's mask and
        // exponentials run while the tensor cores still accumulate P V. O is rescaled once that
        // P V has landed. P's A fragments stay untouched until then. (As compiled, ptxas places
        // the wait for that P V above the row max and the exponentials, so only the mask runs
        // under it: bench/NOTES.md session 29, s29order.)
        // The last block is peeled off (no next S), so the loop body is one straight-line
        // wgmma pipeline: ptxas serialises the wgmma (C7514) where a data-dependent branch
        // leaves it unsure which group a wait retires.
        // Q is released (empty_q) once the tile's last S has landed, so that the producer loads
        // the next tile's Q under this tile's last block and epilogue.
        // The first S: issued here, or (kCarryFirstS) at the end of the tile before.
        if constexpr (!kCarryFirstS) issue_first_s();
        release_o_buffers();  // the previous tile's O stores, under this S
        ptx90::wgmma_wait<0>();
        ptx90::fence_operand(acc_s);
        // The last K buffer: released here or below, or (o_in_kv) once O's stores have read it.
        if (!o_in_kv || n_iters > 1) ptx90::mbarrier_arrive(smem.empty_k(stage_of(0)));
        if (n_iters == 1) ptx90::mbarrier_arrive(smem.empty_q());
        auto step = [&](int it, auto has_next) {
            transform_scores(it);
            float o_scale[1][2];
            // P V of the previous block has landed (none pending at it = 0): O is final for
            // the rescale, p_frag free, the previous V buffer released.
            auto wait_pv = [&] {
                ptx90::wgmma_wait<0>();
                ptx90::fence_operand(acc_o);
                if constexpr (kRowSumsOnTensorCores) ptx90::fence_operand(acc_l);
                ptx90::fence_operand(p_frag);
                if (it > 0) ptx90::mbarrier_arrive(smem.empty_v(stage_of(it - 1)));
            };
            if constexpr (kPackPairs) {
                // After the wait (where ptxas put it anyway, above the row max), each pair of P
                // packed right behind its exponentials: the MUFUs interleave with the packs and
                // with the next S's wgmma issues, which no longer wait for every exponential
                // (the probabilities leave acc_s for temporaries).
                wait_pv();
                softmax.update_scores<kSumP>(
                    s_frag, log2_scale, o_scale, [&](int mt, int nt, int half, float p0, float p1) {
                        sm80::pack_p_pair<Element>(p_frag, mt, nt, half, p0, p1);
                    });
            } else {
                softmax.update_scores<kSumP>(s_frag, log2_scale, o_scale);
                wait_pv();
            }
            // Where O is rescaled. Without a next S, or pingpong (outside the turn): here. Else
            // under the next S, where ptxas places its FMULs among that S's wgmma issues by the
            // source position: d128 and causal d64 after the V wait (all of S issued first;
            // right after issue_qk, ptxas put them behind its first wgmma: causal d128 7-12%
            // slower), d256 and non-causal d64 right after issue_qk (d256: 2.4-3.8% faster than
            // after the V wait on causal calls; non-causal d64 s512-4k 0.6-3.3%). bench/NOTES.md
            // runs 183-186 and 190.
            constexpr bool rescale_under_s = decltype(has_next)::value && !Traits::kPingpong;
            constexpr bool rescale_after_v_wait =
                rescale_under_s && (Traits::kHeadDim == 128 || (Traits::kHeadDim == 64 && Causal));
            if constexpr (!rescale_under_s) OnlineSoftmax<1>::rescale(o_frag, o_scale);
            if constexpr (!kPackPairs) {
                sm80::convert_p_to_a_fragments<Element, PTile>(p_frag, s_frag);
            }
            if constexpr (kRowSumsOnTensorCores) {
                OnlineSoftmax<1>::rescale(l_frag, o_scale);
            } else if constexpr (!kFp32RowSums) {
                add_p_row_sums<Element>(softmax.row_sum, p_frag);
            } else if constexpr (!kSumP) {
                softmax.add_row_sums(s_frag);
            }
            my_turn();
            if constexpr (decltype(has_next)::value) {  // acc_s is free again (P is in p_frag)
                wait_phase(smem.full_k(stage_of(it + 1)), phase_of(it + 1));
                issue_qk(it + 1);
            }
            if constexpr (rescale_under_s && !rescale_after_v_wait) {
                OnlineSoftmax<1>::rescale(o_frag, o_scale);
            }
            if constexpr (kDropout) {  // under the next S; the row sums above are undropped
                // Several draws in flight: kDropoutChunk rounds (d64 / d128, the words
                // exchanged in shared memory), else kDropoutDrawUnroll (shuffles).
                const int dropout_row0 = ptx::opaque(m0 + warp_row0 + lane / 4);
                const int key_block0 = (n_block_max - 1 - it) * kBlockN;
                if constexpr (Traits::kDropoutViaSmem) {
                    constexpr int kChunk = Traits::kDropoutChunk;
                    apply_dropout_via_smem<kBlockN / 16, kChunk>(
                        p_frag, dropout, dropout_row0, key_block0, lane,
                        smem.scratch + (tid / 32 - 4) * kChunk * 512);
                } else {
                    apply_dropout_keep_bits<1, kBlockN / 16, Traits::kDropoutDrawUnroll>(
                        p_frag, dropout, dropout_row0, key_block0, lane);
                }
            }
            wait_phase(smem.full_v(stage_of(it)), phase_of(it));
            if constexpr (rescale_after_v_wait) OnlineSoftmax<1>::rescale(o_frag, o_scale);
            issue_pv(it);
            if constexpr (decltype(has_next)::value) {
                their_turn();
                ptx90::wgmma_wait<1>();  // S of the next block (the older group) is complete
                ptx90::fence_operand(acc_s);
                if (!o_in_kv || it + 2 < n_iters) {
                    ptx90::mbarrier_arrive(smem.empty_k(stage_of(it + 1)));
                }
                if (it + 2 == n_iters) ptx90::mbarrier_arrive(smem.empty_q());  // the last S
            } else {
                their_turn();
            }
        };
        for (int it = 0; it + 1 < n_iters; ++it) step(it, std::true_type{});
        step(n_iters - 1, std::false_type{});
        ptx90::wgmma_wait<0>();
        ptx90::fence_operand(acc_o);
        if constexpr (kRowSumsOnTensorCores) ptx90::fence_operand(acc_l);
        const int last_stage = stage_of(n_iters - 1);
        if constexpr (o_in_kv) {
            o_stage = last_stage;  // O goes there: released by release_o_buffers
        } else {
            ptx90::mbarrier_arrive(smem.empty_v(last_stage));
        }
        kv_base += n_iters;
        ++q_round;

        // ---- Epilogue: O / l and lse straight from the registers (l: row g in acc_l[0], row
        // g + 8 in acc_l[2], whole rows already; or the quad's partial sums).
        if constexpr (kRowSumsOnTensorCores) {
            softmax.row_sum[0][0] = acc_l[0];
            softmax.row_sum[0][1] = acc_l[2];
        } else {
            softmax.reduce_row_sums();
        }
        float lse[1][2];
        softmax.finalize(o_frag, lse, log2_scale);
        if constexpr (kDropout) {
#pragma unroll
            for (int i = 0; i < Traits::kHeadDim / 2; ++i) acc_o[i] *= params.rp_keep;
        }
        // Row g (half 0) / g + 8 (half 1) of O, columns 8 dt + 2 (lane % 4) + {0, 1}, packed
        // (kCarryFirstS: all of it before the next tile's first S is issued).
        [[maybe_unused]] uint32_t o_packed[2][kCarryFirstS ? Traits::kHeadDim / 8 : 1];
        auto o_pair = [&](int dt, int half) {
            return ptx::pack_float2<Element>(o_frag[0][dt][2 * half], o_frag[0][dt][2 * half + 1]);
        };
        if constexpr (kCarryFirstS) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
#pragma unroll
                for (int dt = 0; dt < Traits::kHeadDim / 8; ++dt) {
                    o_packed[half][dt] = o_pair(dt, half);
                }
            }
        } else {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = warp_row0 + 8 * half + lane / 4;  // in the tile
                if (lane % 4 == 0 && row < out.valid_rows) out.lse[row] = lse[0][half];
            }
        }
        if constexpr (o_by_tma) {
            // The warpgroup's 64 rows of O into its rows of the staged O's slabs (the layout the
            // TMA reads with the 128-byte swizzle: 16-byte chunk j of row r at j ^ (r % 8); a
            // warp's 8 rows x 16 bytes per store hit 32 distinct banks), then one thread stores
            // them with kSlabs TMA boxes of 64 x 64. First a buffer of its own must have been
            // read by the warpgroup's previous stores (its issuing thread waits; the named
            // barrier tells the rest); the last K and V buffers, by both warpgroups' last S and
            // P V (the barrier over the 256 consumers).
            if constexpr (o_in_kv) {
                ptx90::named_barrier_sync(kOStoreBarrier + 2, 256);
            } else {
                if (t == 0) ptx90::bulk_wait_group_read<0>();
                ptx90::named_barrier_sync(kOStoreBarrier + c, 128);
            }
            // This warpgroup's rows of the staged O: its first slab's at o_rows, slab `slab`'s
            // o_slab_offset(slab) further (o_in_kv: the K buffer's slabs, then the V buffer's,
            // kStages K / V tiles later).
            const uint32_t o_rows =
                (o_in_kv ? smem.k + last_stage * Traits::kKVTileBytes : smem.o) + 64 * c * 128;
            auto o_slab_offset = [](int slab) {
                constexpr int kPerBuffer = Traits::kOSlabsPerBuffer;
                constexpr bool kInKV = Traits::kOInKVBuffers;  // (o_in_kv; not captured)
                return kInKV ? (slab < kPerBuffer ? 0 : kStages * Traits::kKVTileBytes) +
                                   (slab % kPerBuffer) * Traits::kQSlabBytes
                             : slab * Traits::kQSlabBytes;
            };
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = 16 * (t / 32) + 8 * half + lane / 4;  // in the warpgroup's rows
                const uint32_t row_addr = o_rows + r * 128 + 4 * (lane % 4);
#pragma unroll
                for (int dt = 0; dt < Traits::kHeadDim / 8; ++dt) {
                    ptx::st_shared_4(row_addr + o_slab_offset(dt / 8) +
                                         (((dt % 8) ^ (lane / 4)) << 4),
                                     kCarryFirstS ? o_packed[half][dt] : o_pair(dt, half));
                }
            }
            ptx90::fence_proxy_async_shared();  // the stores above, seen by the TMA
            ptx90::named_barrier_sync(kOStoreBarrier + c, 128);
            if (t == 0 && m0 + 64 * c < params.seqlen_q) {  // rows past seqlen_q are clipped
                for (int slab = 0; slab < kSlabs; ++slab) {
                    ptx90::tma_store_4d(&o_map, o_rows + o_slab_offset(slab), 64 * slab,
                                        m0 + 64 * c, head, batch);
                }
                ptx90::bulk_commit_group();
            }
            if constexpr (!kCarryFirstS) return finish([] {});
        }
        // The stores of O (unless staged) and lse from the registers. kCarryFirstS: predicated,
        // no divergent branch (they run under the next tile's first S, and ptxas would wait for
        // the wgmma before a divergent branch: C7517 / C7518).
        auto store_from_registers = [&] {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = warp_row0 + 8 * half + lane / 4;  // in the tile
                if constexpr (kCarryFirstS) {
                    ptx::st_global_4_if(out.lse + row, __float_as_uint(lse[0][half]),
                                        lane % 4 == 0 && row < out.valid_rows);
                } else if (row >= out.valid_rows) {
                    continue;
                }
                if constexpr (!o_by_tma) {
                    Element* o_row =
                        out.o + static_cast<int64_t>(row) * params.o_row_stride + 2 * (lane % 4);
#pragma unroll
                    for (int dt = 0; dt < Traits::kHeadDim / 8; ++dt) {
                        // Only the call's d columns (a multiple of 8; the rest are zero padding).
                        if constexpr (kCarryFirstS) {
                            ptx::st_global_4_if(o_row + 8 * dt, o_packed[half][dt],
                                                row < out.valid_rows && 8 * dt < params.d);
                        } else if (8 * dt < params.d) {
                            *reinterpret_cast<uint32_t*>(o_row + 8 * dt) = o_pair(dt, half);
                        }
                    }
                }
            }
        };
        return finish(store_from_registers);
    };

    // The walk. kCarryFirstS: a tile's first S is in flight whenever run_tile starts one, so that
    // no path that reaches it has none (ptxas would otherwise wait for the wgmma at the merge).
    int round = 0;
    if constexpr (kCarryFirstS) {
        // Where every tile has work: each next tile is found under its first S. (Always so in the
        // causal kernels: with_fwd_sm90_traits runs them only then, and their walk has no search
        // for a tile with work.)
        auto every_tile_has_work = [&] {
            return !Traits::carries_first_s_on_every_call(Causal) ||
                   params.sm90_every_tile_has_work;
        };
        TileWork w;
        if (next_tile_with_work(round, w)) {
            issue_first_s();
            // Each path from the stores to the next run_tile issues a first S: at a merge of one
            // with and one without a wgmma in flight ptxas would wait for it.
            while (run_tile(w, [&](auto stores) {
                if (every_tile_has_work()) {
                    const int tile_index = take_tile(++round);
                    if (tile_index >= num_tiles) {
                        stores();
                        return false;
                    }
                    issue_first_s();
                    w = tile_work(tile_index);
                    stores();
                    return true;
                }
                if (!next_tile_with_work(++round, w)) {
                    stores();
                    return false;
                }
                issue_first_s();
                stores();
                return true;
            })) {
            }
        }
    } else {
        for (int tile_index = take_tile(0); tile_index < num_tiles;
             tile_index = take_tile(++round)) {
            const TileWork tile = tile_work(tile_index);
            if (!tile.has_rows()) continue;  // varlen: this sequence is shorter than the grid
            run_tile(tile, [](auto stores) {
                stores();
                return true;
            });
        }
    }
    // The shared memory must outlive the TMA stores' reads of it.
    release_o_buffers();
    if (o_by_tma && t == 0) ptx90::bulk_wait_group<0>();
    if constexpr (Traits::kPingpong) {
        if (c == 0) ptx90::named_barrier_sync(1, 256);  // warpgroup 1's last arrival
    }
#endif  // sm_90a
}

}  // namespace sm90
}  // namespace flash_cuda
