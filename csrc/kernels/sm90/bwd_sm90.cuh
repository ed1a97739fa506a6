// Backward main kernel on Hopper (sm_90a): TMA, mbarriers and wgmma (../shared/DESIGN.md sections
// 6 and 7). One query block at a time per consumer warpgroup (its GEMMs do not overlap its
// softmax work); the two warpgroups issue their GEMM batches in turn (pingpong), so one's
// softmax work runs under the other's GEMMs. dQ added to dq_accum by TMA reductions from
// shared memory.
//
// One CTA = kBlockN = 128 keys of one (batch, query head), 3 warpgroups (384 threads):
//   warpgroup 0, the producer (registers lowered to 24):
//     warp 0, one thread: K and V of the block once (TMA), then for each query block m that
//       sees some key of the block, Q_m and dO_m (TMA boxes of 64 rows) into one of kStages
//       buffers, behind that buffer's `empty` mbarrier;
//     warp 1: lse_m (in base-2 units; +inf past the sequence) and D_m = rowsum(dO * O) of the
//       same query block into shared memory; its 32 arrivals and the copies' bytes complete the
//       buffer's `full` mbarrier.
//   warpgroups 1 and 2, the consumers (registers raised to 240): keys 64 c .. 64 c + 63 of the
//     block (c = warpgroup - 1), dK and dV (64 x HeadDim, fp32) in registers for the whole loop.
//     Per query block (the transposed form: keys are the M dimension, so P^T and dS^T come out
//     of the accumulators already in the A-fragment layout the next GEMMs want):
//       S^T  = K Q^T, dP^T = V dO^T        wgmma SS (n64), both K-major
//       P^T  = exp2(S^T scale log2(e) - lse) (0 where the mask hides the key; ALiBi as the
//              forward), dS^T = P^T (dP^T - D)
//       dV  += P^T dO, dK += dS^T Q         wgmma RS, dO / Q MN-major (k = queries)
//       dS^T -> shared memory (rows = keys, 64 queries per 128-byte row: an MN-major A)
//       dQ   = dS K                         wgmma SS (n32 at d64, n64 at d128), A and B MN-major,
//              issued right behind dV and dK; staged in shared memory (fp32, 64 queries x
//              d / 2 per warpgroup) and added to dq_accum by one thread's
//              cp.reduce.async.bulk.tensor (.add; the red.global.add.v2.f32 from the registers
//              it replaced held 16-20% of the consumers' time in register and LSU-queue waits:
//              bench/NOTES.md run 171). Warpgroup c takes columns d / 2 c .. over all 128 keys
//              (both warpgroups' dS^T), one reduction per element.
//     Pingpong (the default kernels; bench/NOTES.md session 35: fwd+bwd 1.04-1.10x at d64,
//     1.02-1.07x at d128): the S^T / dP^T batch and the dV / dK / dQ batch of each warpgroup
//     are issued in turn with the other's (named barriers 5 and 6). The dQ of a query
//     block needs the other warpgroup's dS^T of it, written in its softmax step, which the turns
//     put under this warpgroup's GEMMs; so the dQ GEMM of block m is issued in the batch of
//     block m + 1 (dS^T in three buffers) and the last block's after the loop.
//     deterministic=True (OrderedTraits): no pingpong; dQ of block m right behind its dV / dK
//     (dS^T double-buffered, a named barrier between the warpgroups) in turns.
//   After the loop: dK (times the softmax scale) and dV to the outputs or, GQA, the fp32
//   per-query-head workspaces (sm80/bwd_dkv_store.cuh).
// Everything around it is the sm80 backward's (sm80/bwd_steps.cuh): the preprocess (D), the
// dq_accum -> dq conversion, the GQA dk / dv sums; workspaces and params as bwd_launch.cuh says.
// deterministic=True (d192 / d256 in bwd_sm90_wide.cuh too): the dQ additions of the CTAs take
// turns per query block (DqTurns below); the turn passes on once the block's TMA reductions are
// complete. Dropout (IsDropout, without ALiBi): the forward's keep bits of each warp's S^T
// fragment (dropout.cuh), drawn under its S^T / dP^T GEMMs (the wide kernel: at the top of the
// iteration, where it spills nothing); dV += (P o M / p_keep)^T dO, dS = P o (dP o M / p_keep -
// D). Not here (the launcher keeps these on sm80): softcap, dropout with ALiBi; head dims 192 and
// 256 are bwd_sm90_wide.cuh's (which shares this file's traits and pieces), the others run the
// next kernel up, zero-padded (bwd_sm90_host.h).
// Grid (key blocks, b, h).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/mask.cuh"
#include "kernels/params.h"
#include "kernels/ptx.cuh"
#include "kernels/sm80/bwd.cuh"  // BwdSequence, bwd_attention_mask, BwdQueryBlocks, scores
#include "kernels/sm80/bwd_dkv_store.cuh"
#include "kernels/sm80/warp_gemm.cuh"  // convert_p_to_a_fragments
#include "kernels/sm90/mbarrier_wait.cuh"
#include "kernels/sm90/ptx_sm90.cuh"

namespace flash_cuda {
namespace sm90 {

template <int HeadDim, bool Pingpong = false, int BlockM = 64,
          int BlockN = (HeadDim > 128 ? 64 : 128)>
struct BwdSm90Traits {
    static constexpr int kHeadDim = HeadDim;
    // Pingpong: the consumer warpgroups issue their GEMM batches in turn (mha_bwd_sm90_kernel's
    // my_turn / their_turn), so one's softmax step runs under the other's GEMMs.
    static constexpr bool kPingpong = Pingpong;
    static constexpr int kBlockM = BlockM;  // queries per iteration
    static constexpr int kBlockN = BlockN;  // keys per CTA
    static constexpr int kStages = 2;       // Q / dO / lse / D buffers
    static constexpr int kConsumerWarpgroups = 2;
    static constexpr int kNThreads = 128 * (1 + kConsumerWarpgroups);
    static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
    static constexpr int kSlabs = HeadDim / 64;  // 64-column slabs of Q, dO, K, V
    // Wide (d192 / d256, bwd_sm90_wide.cuh): the consumer warpgroups split the head dim of dK,
    // dV and dQ instead of the keys (64 x 256 fp32 of dK and dV would not fit one warpgroup), P^T
    // goes through shared memory like dS^T.
    static constexpr bool kWide = HeadDim > 128;

    static constexpr int kKVSlabBytes = BlockN * 128;
    static constexpr int kKVBytes = kSlabs * kKVSlabBytes;
    static constexpr int kQSlabBytes = BlockM * 128;
    static constexpr int kQBytes = kSlabs * kQSlabBytes;
    // dS^T (and, wide, P^T): BlockN key rows of BlockM = 64 queries (128 bytes).
    static constexpr int kDSBytes = BlockN * 128;
    // dQ split by columns: warpgroup c computes columns kDqCols c .. (below; wide: 128 c ..)
    // over all keys of the block, reading both warpgroups' dS^T rows (double-buffered, a named
    // barrier per query block), so each dq_accum element gets one reduction per CTA (each
    // warpgroup's own keys over all columns made two: d64 until session 39, bench/NOTES.md).
    // With pingpong: a warpgroup's dQ GEMM of query block m waits for the other's dS^T of m,
    // written in the other's softmax step, which runs under this one's GEMMs; so the dQ GEMM of
    // block m is issued with block m + 1's dV and dK, when the turns say the other's dS^T of m
    // is written. Three dS^T buffers: while one warpgroup writes block m + 1's, the other's dQ
    // GEMM of block m - 1 (in its batch of block m) may still read block m - 1's.
    static constexpr bool kDqDeferred = Pingpong;
    // d64 with pingpong: the dQ GEMM of a query block is one warpgroup's, all 64 columns (n64),
    // the warpgroups taking the blocks in turn; split by columns each read all of dS^T for an
    // n32 (3 KB per k16 step, 6 KB for both) where one n64 reads 4 KB.
    static constexpr bool kDqAlternate = Pingpong && HeadDim == 64;
    static constexpr int kDSBuffers = kDqDeferred ? 3 : 2;
    static constexpr int kPBuffers = kWide ? 2 : 0;

    // dQ by TMA reductions: each consumer warpgroup stages its 64 queries x kDqCols columns of
    // dQ in fp32 (boxes of 32 columns x 64 rows, 128-byte swizzle) and one of its threads adds
    // them to dq_accum with cp.reduce.async.bulk.tensor, instead of red.global per thread. One
    // buffer per warpgroup at d64 / d128 / d192 (the turns or the named barrier before each dQ
    // GEMM also say that the previous reductions have read it); d256 has no room for it and
    // stages in the consumed Q and dO tiles (bwd_sm90_wide.cuh).
    static constexpr int kDqBoxBytes = BlockM * 128;
    static constexpr bool kDqInQdoTiles = HeadDim == 256;
    static constexpr int kDqBuffers = kDqInQdoTiles ? 0 : 1;  // per warpgroup
    // Columns of dQ per consumer warpgroup (d64: 32, d128: 64, d192: 96, d256: 128) and the
    // staging boxes of 32 columns they make.
    static constexpr int kDqCols = kDqAlternate ? HeadDim : HeadDim / kConsumerWarpgroups;
    static constexpr int kDqBoxes = kDqCols / 32;
    static constexpr int kDqBufferBytes = kDqBoxes * kDqBoxBytes;
    // d64: each consumer warpgroup holds its 64 key rows of K and V as wgmma A fragments (16
    // registers each, loaded once), so S^T = K Q^T and dP^T = V dO^T read only Q / dO from
    // shared memory (2 KB per k16 step instead of 4: the shared-memory pipe was 69% busy in
    // run 263's ncu, tensor 48%). d128 has no 64 registers to spare.
    static constexpr bool kKVInRegisters = HeadDim == 64;

    static constexpr int kSmemKOffset = 0;
    static constexpr int kSmemVOffset = kKVBytes;
    static constexpr int kSmemQOffset = 2 * kKVBytes;  // stage s: Q, then dO
    static constexpr int kSmemDSOffset = kSmemQOffset + kStages * 2 * kQBytes;
    static constexpr int kSmemPOffset = kSmemDSOffset + kDSBuffers * kDSBytes;
    static constexpr int kSmemDqOffset = kSmemPOffset + kPBuffers * kDSBytes;  // [wg][buffer]
    static constexpr int kSmemLseOffset =
        kSmemDqOffset + kConsumerWarpgroups * kDqBuffers * kDqBufferBytes;  // [stage][BlockM]
    static constexpr int kSmemDOffset = kSmemLseOffset + kStages * BlockM * 4;
    static constexpr int kSmemBarOffset = kSmemDOffset + kStages * BlockM * 4;
    // mbarriers: full K/V, then per stage full Q, empty Q.
    static constexpr int kNumBarriers = 1 + 2 * kStages;
    static constexpr int kSmemBytes = 1024 + kSmemBarOffset + 8 * kNumBarriers;

    // Queries (columns of S^T) per consumer warpgroup: all 64, or wide half of them.
    static constexpr int kCols = kWide ? BlockM / kConsumerWarpgroups : BlockM;
    // The geometry of the sm80 P -> A-fragment helper: 16 key rows per warp, kCols queries
    // (the K dimension of dV += P^T dO).
    struct PTile {
        static constexpr int kMTiles = 1;
        static constexpr int kBlockN = kCols;
        static constexpr int kNTiles = kCols / 8;
    };

    static_assert(HeadDim == 64 || HeadDim == 128 || HeadDim == 192 || HeadDim == 256,
                  "sm90 backward: head dims 64, 128, 192 and 256");
    static_assert(BlockM == 64, "dS^T rows are one 128-byte swizzle row of queries");
    static_assert(kWide ? BlockN == 64 : BlockN == 64 * kConsumerWarpgroups,
                  "64 keys per consumer warpgroup; wide: 64 keys shared by both");
    static_assert(kSmemBytes <= 227 * 1024, "must fit a Hopper CTA's shared memory");
    static_assert(!Pingpong || !kWide, "the wide kernel has no pingpong");
};

// Traits: the default kernel (pingpong at d64 / d128); OrderedTraits: deterministic=True's (no
// pingpong: its turns order each query block's reductions).
template <int HeadDim>
struct BwdSm90Config {
    using Traits = BwdSm90Traits<HeadDim, HeadDim <= 128>;
    using OrderedTraits = BwdSm90Traits<HeadDim, false>;
};

// Shared-memory addresses of the CTA's tiles and barriers.
template <typename Traits>
struct BwdSm90Smem {
    uint32_t base;
    __device__ __forceinline__ static BwdSm90Smem make() {
        const uint32_t raw = ptx::smem_addr(ptx::dynamic_smem());
        return BwdSm90Smem{(raw + 1023u) & ~1023u};
    }
    __device__ __forceinline__ uint32_t k() const { return base + Traits::kSmemKOffset; }
    __device__ __forceinline__ uint32_t v() const { return base + Traits::kSmemVOffset; }
    __device__ __forceinline__ uint32_t q(int stage) const {
        return base + Traits::kSmemQOffset + stage * 2 * Traits::kQBytes;
    }
    __device__ __forceinline__ uint32_t d_o(int stage) const { return q(stage) + Traits::kQBytes; }
    __device__ __forceinline__ uint32_t ds(int buffer) const {
        return base + Traits::kSmemDSOffset + buffer * Traits::kDSBytes;
    }
    __device__ __forceinline__ uint32_t p(int buffer) const {
        return base + Traits::kSmemPOffset + buffer * Traits::kDSBytes;
    }
    // Consumer warpgroup c's staged dQ.
    __device__ __forceinline__ uint32_t dq(int c) const {
        return base + Traits::kSmemDqOffset + c * Traits::kDqBufferBytes;
    }
    __device__ __forceinline__ uint32_t lse(int stage) const {
        return base + Traits::kSmemLseOffset + stage * Traits::kBlockM * 4;
    }
    __device__ __forceinline__ uint32_t dsum(int stage) const {
        return base + Traits::kSmemDOffset + stage * Traits::kBlockM * 4;
    }
    __device__ __forceinline__ uint32_t bar() const { return base + Traits::kSmemBarOffset; }
    __device__ __forceinline__ uint32_t full_kv() const { return bar(); }
    __device__ __forceinline__ uint32_t full_q(int stage) const { return bar() + 8 * (1 + stage); }
    __device__ __forceinline__ uint32_t empty_q(int stage) const {
        return bar() + 8 * (1 + Traits::kStages + stage);
    }
};

__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
    return __uint_as_float(ptx::ld_shared_4(addr));
}

// ---- Pieces of the two backward kernels (this file's and bwd_sm90_wide.cuh's).

// The key block of this CTA, -1 past the sequence's (varlen). Deterministic: the CTAs take the
// key blocks from the last one down, while their dQ turns (DqTurns) go up with blockIdx.x, the
// dispatch order. A higher key block meets a given query block after fewer iterations when the
// mask is causal or windowed (its first query block is later), so in that order each CTA's
// turn comes about when it is ready; in the other, every CTA would wait for the one below.
template <int kBlockN>
__device__ __forceinline__ int bwd_sm90_key_block(const BwdParams& params,
                                                  const sm80::BwdSequence& seq) {
    const int n_blocks = (seq.seqlen_k + kBlockN - 1) / kBlockN;
    const int x = static_cast<int>(blockIdx.x);
    if (x >= n_blocks) return -1;
    return params.deterministic ? n_blocks - 1 - x : x;
}

// The CTA's work: its key block [n0, n0 + valid_keys) of the sequence (n0 < 0: none, varlen)
// and the query blocks [blocks.min, blocks.max) that see some key of it.
template <typename Traits, bool Causal>
struct BwdSm90Work {
    sm80::BwdSequence seq;
    AttentionMask mask;
    KeyRange range;
    sm80::BwdQueryBlocks blocks;
    int n0, valid_keys, n_iters;  // n_iters may be 0: dK = dV = 0

    __device__ __forceinline__ static BwdSm90Work make(const BwdParams& params, int batch,
                                                       int head) {
        constexpr int kBlockN = Traits::kBlockN;
        BwdSm90Work w;
        w.seq = sm80::BwdSequence::make(params, batch, head);
        w.n0 = bwd_sm90_key_block<kBlockN>(params, w.seq) * kBlockN;
        if (w.n0 < 0) return w;
        w.valid_keys = min(kBlockN, w.seq.seqlen_k - w.n0);
        w.mask = sm80::bwd_attention_mask<Causal>(params, w.seq);
        w.range = KeyRange::make(w.mask);
        w.blocks = sm80::BwdQueryBlocks::make<Traits::kBlockM>(w.range, w.n0, w.valid_keys,
                                                                w.seq.seqlen_q);
        w.n_iters = w.blocks.max - w.blocks.min;
        return w;
    }
};

// Thread 0 initialises the mbarriers (full K/V: the TMA thread; full Q: the TMA thread and the
// lse/D warp; empty Q: every consumer thread), then the CTA's only __syncthreads.
template <typename Traits>
__device__ __forceinline__ void bwd_sm90_init_barriers(const BwdSm90Smem<Traits>& smem) {
    if (threadIdx.x == 0) {
        ptx90::mbarrier_init(smem.full_kv(), 1);
        for (int s = 0; s < Traits::kStages; ++s) {
            ptx90::mbarrier_init(smem.full_q(s), 1 + 32);
            ptx90::mbarrier_init(smem.empty_q(s), Traits::kConsumerThreads);
        }
        ptx90::fence_barrier_init();
    }
    __syncthreads();
}

// The producer warpgroup (see the header): warp 0, one thread, the TMA copies of K / V and of
// each query block's Q / dO; warp 1 the block's lse (base 2) and D.
template <typename Traits, bool Causal>
__device__ __forceinline__ void bwd_sm90_produce(const BwdParams& params,
                                                 const BwdSm90Work<Traits, Causal>& work,
                                                 const BwdSm90Smem<Traits>& smem, int batch,
                                                 int head, const CUtensorMap* q_map,
                                                 const CUtensorMap* k_map,
                                                 const CUtensorMap* v_map,
                                                 const CUtensorMap* do_map) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kStages = Traits::kStages;
    constexpr int kSlabs = Traits::kSlabs;
    const sm80::BwdSequence& seq = work.seq;
    const sm80::BwdQueryBlocks& blocks = work.blocks;
    const int n0 = work.n0;
    const int n_iters = blocks.max - blocks.min;  // (= work.n_iters; kept so the SASS is as run)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bool varlen = params.cu_seqlens_q != nullptr;
    if (warp == 0 && lane == 0) {
        const int q_row0 = varlen ? params.cu_seqlens_q[batch] : 0;
        const int k_row0 = varlen ? params.cu_seqlens_k[batch] : 0;
        const int map_batch = varlen ? 0 : batch;
        const int kv_head = head / params.h_h_k_ratio;
        ptx90::mbarrier_arrive_expect_tx(smem.full_kv(), 2 * Traits::kKVBytes);
        for (int slab = 0; slab < kSlabs; ++slab) {
            ptx90::tma_load_4d(smem.k() + slab * Traits::kKVSlabBytes, k_map, 64 * slab,
                               k_row0 + n0, kv_head, map_batch, smem.full_kv());
            ptx90::tma_load_4d(smem.v() + slab * Traits::kKVSlabBytes, v_map, 64 * slab,
                               k_row0 + n0, kv_head, map_batch, smem.full_kv());
        }
        for (int it = 0; it < n_iters; ++it) {
            const int stage = it % kStages;
            const uint32_t phase = (it / kStages) & 1;
            const int m0 = (blocks.min + it) * kBlockM;
            // The consumers released this buffer (first round: passes at once).
            wait_phase(smem.empty_q(stage), phase ^ 1);
            ptx90::mbarrier_arrive_expect_tx(smem.full_q(stage), 2 * Traits::kQBytes);
            for (int slab = 0; slab < kSlabs; ++slab) {
                ptx90::tma_load_4d(smem.q(stage) + slab * Traits::kQSlabBytes, q_map,
                                   64 * slab, q_row0 + m0, head, map_batch, smem.full_q(stage));
                ptx90::tma_load_4d(smem.d_o(stage) + slab * Traits::kQSlabBytes, do_map,
                                   64 * slab, q_row0 + m0, head, map_batch, smem.full_q(stage));
            }
        }
    } else if (warp == 1) {
        const float* lse = params.softmax_lse_ptr + seq.lse_row0;
        const float* dsum = reinterpret_cast<const float*>(params.dsoftmax_sum) + seq.acc_row0;
        for (int it = 0; it < n_iters; ++it) {
            const int stage = it % kStages;
            const uint32_t phase = (it / kStages) & 1;
            const int m0 = (blocks.min + it) * kBlockM;
            wait_phase(smem.empty_q(stage), phase ^ 1);
#pragma unroll
            for (int j = lane; j < kBlockM; j += 32) {
                const int query = m0 + j;
                const bool in = query < seq.seqlen_q;
                // Past the sequence: p = 2^(x - inf) = 0, so those rows add nothing.
                ptx::st_shared_4(smem.lse(stage) + 4 * j,
                                 __float_as_uint(in ? lse[query] * static_cast<float>(M_LOG2E)
                                                    : INFINITY));
                ptx::st_shared_4(smem.dsum(stage) + 4 * j,
                                 __float_as_uint(in ? dsum[query] : 0.f));
            }
            ptx90::mbarrier_arrive(smem.full_q(stage));  // releases the stores above
        }
    }
}

// Whether every key of [key_first, key_first + kKeys) is visible to every query of
// [query_first, query_first + kQueries): then scores_to_probs tests no mask (warp-uniform: the
// arguments are). Queries past seqlen_q need no test either way (their lse is +inf).
template <int kKeys, int kQueries>
__device__ __forceinline__ bool block_fully_visible(const KeyRange& range, int key_first,
                                                    int query_first) {
    const int key_last = key_first + kKeys - 1;
    const int query_last = query_first + kQueries - 1;
    return key_last < range.seqlen_k && key_first >= query_last + range.begin_shift &&
           key_last < query_first + range.end_shift;
}

// P^T = exp2(S^T scale log2(e) - lse) in place of S^T: 0 where the mask hides the key, ALiBi as
// the forward. s: one warp's 16 key rows (key `key0` of the sequence + lane / 4 + 8 (e / 2)) by
// kCols query columns; column 8 nt + 2 (lane % 4) + j is query col_base + 8 nt + j, whose lse
// (base 2) is at lse_thread + 4 (8 nt + j). The mask per key row is a range of visible
// columns [lo, hi] relative to col_base, so each element compares a constant (keys past the
// sequence: an empty range): key >= query + begin_shift and key < min(seqlen_k, query +
// end_shift). kMasked = false (block_fully_visible): no comparison, no select.
template <int kCols, bool HasAlibi, bool kMasked>
__device__ __forceinline__ void scores_to_probs_impl(float (&s)[1][kCols / 8][4], int key0,
                                                     int col_base, const KeyRange& range,
                                                     const AttentionMask& mask,
                                                     uint32_t lse_thread, float score_log2,
                                                     float alibi_slope_log2) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int key = ptx::opaque(key0 + 8 * half);
        const int lo = key - range.end_shift + 1 - col_base;
        const int hi = key < range.seqlen_k ? key - range.begin_shift - col_base : -1;
        const int alibi_base = col_base + mask.diag - key;  // query + diag - key at offset 0
#pragma unroll
        for (int nt = 0; nt < kCols / 8; ++nt) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int offset = 8 * nt + j;
                const float lse_log2 = ld_shared_f32(lse_thread + 4 * offset);
                float dscore = 1.f;
                const float x = sm80::bwd_score_log2_p<false, HasAlibi>(
                    s[0][nt][2 * half + j], dscore, score_log2, 0.f, alibi_slope_log2,
                    HasAlibi ? abs(alibi_base + offset) : 0, lse_log2);
                if constexpr (kMasked) {
                    const bool visible = offset >= lo && offset <= hi;
                    s[0][nt][2 * half + j] = visible ? ptx::exp2_approx(x) : 0.f;
                } else {
                    s[0][nt][2 * half + j] = ptx::exp2_approx(x);
                }
            }
        }
    }
}

template <int kCols, bool HasAlibi>
__device__ __forceinline__ void scores_to_probs(float (&s)[1][kCols / 8][4], int key0,
                                                int col_base, const KeyRange& range,
                                                const AttentionMask& mask, uint32_t lse_thread,
                                                float score_log2, float alibi_slope_log2,
                                                bool fully_visible) {
    if (fully_visible) {
        scores_to_probs_impl<kCols, HasAlibi, false>(s, key0, col_base, range, mask, lse_thread,
                                                     score_log2, alibi_slope_log2);
    } else {
        scores_to_probs_impl<kCols, HasAlibi, true>(s, key0, col_base, range, mask, lse_thread,
                                                    score_log2, alibi_slope_log2);
    }
}

// dS^T = P^T (dP^T - D) in place of dP^T; D of column 8 nt + j at dsum_thread + 4 (8 nt + j).
template <int kCols>
__device__ __forceinline__ void probs_to_dscores(float (&dp)[1][kCols / 8][4],
                                                 const float (&p)[1][kCols / 8][4],
                                                 uint32_t dsum_thread) {
#pragma unroll
    for (int nt = 0; nt < kCols / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float d = ld_shared_f32(dsum_thread + 4 * (8 * nt + (e % 2)));
            dp[0][nt][e] = p[0][nt][e] * (dp[0][nt][e] - d);
        }
    }
}

// One warp's A fragments of 16 key rows (rows warp_row0 + g, + 8; warp_row0 a multiple of 8) by
// 16 kKTiles queries -> shared memory rows of 128 bytes (64 queries, 128-byte swizzle) at `rows`
// (128-byte aligned), the queries from 16-byte chunk chunk0 (even) on: a K-major A (P^T for dV)
// or, read MN-major, the A of dQ (dS). frag[kk] words: (row g, queries 16 kk + 2 q), (g + 8, ..),
// (g, 16 kk + 8 + 2 q), (g + 8, ..) -- four 8x8 matrices in the mma layout, so one stmatrix.x4
// per kk: lane 8 i + j addresses row j of matrix i, key row warp_row0 + j + 8 (i % 2), chunk
// chunk0 + 2 kk + i / 2, at ((chunk0 + 2 kk + i / 2) ^ j) << 4 in the row = (((i / 2) ^ j) << 4)
// ^ ((chunk0 / 2 + kk) << 5): one XOR per kk on a base address (its bits 4-6 are the chunk's).
template <int kKTiles>
__device__ __forceinline__ void store_key_rows(uint32_t rows, const uint32_t (&frag)[kKTiles][4],
                                               int warp_row0, int lane, int chunk0) {
    const int matrix = lane / 8, j = lane % 8;  // row % 8 = j
    const uint32_t base =
        rows + (warp_row0 + j + 8 * (matrix % 2)) * 128 + (((matrix / 2) ^ j) << 4);
#pragma unroll
    for (int kk = 0; kk < kKTiles; ++kk) {
        ptx90::stmatrix_x4(base ^ ((chunk0 / 2 + kk) << 5), frag[kk][0], frag[kk][1],
                           frag[kk][2], frag[kk][3]);
    }
}

// store_key_rows' inverse: one warp's A fragments of 16 key rows (warp_row0 + g, + 8) by 16
// kKTiles columns of `rows` (128-byte swizzled rows of 64 columns per slab, the slabs
// kSlabBytes apart, 1024-byte aligned), one ldmatrix.x4 per kk (lane 8 i + j: row warp_row0 + j +
// 8 (i % 2), chunk 2 (kk % 4) + i / 2 of slab kk / 4).
template <int kKTiles, int kSlabBytes>
__device__ __forceinline__ void load_key_rows(uint32_t (&frag)[kKTiles][4], uint32_t rows,
                                              int warp_row0, int lane) {
    const int matrix = lane / 8, j = lane % 8;
    const uint32_t base =
        rows + (warp_row0 + j + 8 * (matrix % 2)) * 128 + (((matrix / 2) ^ j) << 4);
#pragma unroll
    for (int kk = 0; kk < kKTiles; ++kk) {
        ptx::ldmatrix_x4(frag[kk], (base + (kk / 4) * kSlabBytes) ^ ((kk % 4) << 5));
    }
}

// dQ = dS K over 16 kKSteps keys, kN columns (kN / 2 accumulators): A = dS^T rows at a_rows
// (MN-major: k = keys, 16 of them = 2048 bytes per step), B = the K slab's rows at b_rows
// (MN-major; d64's n32 starts 64 bytes into the slab's 128-byte rows, the swizzle applying to
// the absolute address). Issued and committed, not waited for: this file's kernel issues it
// right behind dV and dK (the tensor cores go on from one to the other); the wide kernel
// stages its first slab while the second runs.
template <typename Element, int kKSteps, int kN = 64>
__device__ __forceinline__ void issue_dq_slab(float (&acc_dq)[kN / 2], uint32_t a_rows,
                                              uint32_t b_rows) {
    ptx90::fence_operand(acc_dq);
    ptx90::wgmma_fence();
    const uint64_t desc_a = ptx90::make_smem_desc_sw128(a_rows);
    const uint64_t desc_b = ptx90::make_smem_desc_sw128(b_rows);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
        ptx90::wgmma_ss<kN, Element, true, true>(acc_dq,
                                                 ptx90::smem_desc_advance(desc_a, 2048 * kk),
                                                 ptx90::smem_desc_advance(desc_b, 2048 * kk),
                                                 kk > 0);
    }
    ptx90::wgmma_commit();
}

// acc_dq (issue_dq_slab's, landed) into a staged-dQ buffer: 64 rows x kN fp32 columns as kN / 32
// boxes of 32 columns (kDqBoxBytes apart), each row 128 bytes with the 128-byte swizzle (16-byte
// chunk j of row r at j ^ (r % 8), the layout the TMA reads for an fp32 box of 32 columns). Row
// 16 w + g (+ 8), columns 8 nt + 2 q (+ 1): a warp's 8-byte stores of one (nt, half) cover 256
// distinct bytes (two wavefronts).
template <int kDqBoxBytes, int kN = 64>
__device__ __forceinline__ void stage_dq_slab(const float (&acc_dq)[kN / 2], uint32_t buffer,
                                              int t) {
    const int lane = t % 32, g = lane / 4, q = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = 16 * (t / 32) + g + 8 * half;
        const uint32_t row_addr = buffer + row * 128 + 8 * (q % 2);
#pragma unroll
        for (int nt = 0; nt < kN / 8; ++nt) {
            const int chunk = 2 * (nt % 4) + q / 2;
            ptx::st_shared_f32x2(row_addr + (nt / 4) * kDqBoxBytes + ((chunk ^ g) << 4),
                                 acc_dq[4 * nt + 2 * half], acc_dq[4 * nt + 2 * half + 1]);
        }
    }
}

// Thread 0 of a consumer warpgroup, after stage_dq_slab, the async-proxy fence and
// consumer_warpgroup_sync: the TMA reductions of the kN / 32 staged boxes at `buffer` into
// dq_accum from (row, column). Not committed (commit_dq_reductions).
template <int kDqBoxBytes, int kN = 64>
__device__ __forceinline__ void issue_dq_reductions(const CUtensorMap* dq_map, uint32_t buffer,
                                                    int column, int row) {
#pragma unroll
    for (int box = 0; box < kN / 32; ++box) {
        ptx90::tma_reduce_add_2d(dq_map, buffer + box * kDqBoxBytes, column + 32 * box, row);
    }
}

// The same thread: commits the reductions issued; `complete` (deterministic): they are complete
// and visible (ordered before the turn's release) on return.
__device__ __forceinline__ void commit_dq_reductions(bool complete) {
    ptx90::bulk_commit_group();
    if (complete) {
        ptx90::bulk_wait_group<0>();
        ptx90::fence_proxy_async_global();
    }
}

// Consumer warpgroup c's own barrier (3 or 4), its id a constant (a register id costs a
// register).
__device__ __forceinline__ void consumer_warpgroup_sync(int c) {
    if (c == 0) {
        ptx90::named_barrier_sync(3, 128);
    } else {
        ptx90::named_barrier_sync(4, 128);
    }
}

// Deterministic dQ (params.deterministic; dQ is split by columns, so one thread per CTA adds to
// each dq_accum element). The CTAs of one (batch, head) add to the rows of each
// 64-query block in a fixed order, their blockIdx.x (key blocks from the last one down,
// bwd_sm90_key_block): semaphore m of the (batch, head) holds how many of its CTAs are done
// with query block m. CTA n waits until it reads n, adds, and writes n + 1; a query block it
// has no keys for it passes on the same way without adding. CTA n waits only for lower
// blockIdx.x of its (batch, head), dispatched before it: no deadlock. One elected thread waits
// and writes; named barrier 2 (all consumer threads) spreads the turn and collects the
// additions.
struct DqTurns {
    int* sem;      // the (batch, head)'s semaphores; nullptr when not deterministic
    int n;         // this CTA's turn: blockIdx.x
    // 64-query blocks with a semaphore: the sequence's, but at most the (batch, head)'s share of
    // seqlen_q_rounded / 64. A varlen max_seqlen_q below a sequence's length (not caught when the
    // value checks are off) must not reach the next head's semaphores, where the turns of two
    // heads would mix and hang; the blocks past the share are added unordered.
    int n_blocks;

    __device__ __forceinline__ static DqTurns make(const BwdParams& params, int batch, int head,
                                                   int seqlen_q) {
        if (!params.deterministic) return DqTurns{nullptr, 0, 0};
        const int64_t bh = static_cast<int64_t>(batch) * params.h + head;
        const int share = params.seqlen_q_rounded / 64;
        return DqTurns{params.dq_semaphore + bh * share, static_cast<int>(blockIdx.x),
                       min((seqlen_q + 63) / 64, share)};
    }
    // The elected thread: passes on query blocks [lo, hi) without adding.
    __device__ __forceinline__ void pass_range(int lo, int hi) const {
        hi = min(hi, n_blocks);
        for (int m = lo; m < hi; ++m) {
            ptx90::wait_global_equal(sem + m, n);
            ptx90::store_release_global(sem + m, n + 1);
        }
    }
    // All consumer threads, before adding to query block m (the it-th of the CTA's blocks
    // [first, ..)): the elected thread first passes on the blocks before `first`, then waits.
    __device__ __forceinline__ void acquire(int m, int it, int first, bool elected,
                                            int consumer_threads) const {
        if (elected) {
            if (it == 0) pass_range(0, first);
            if (m < n_blocks) ptx90::wait_global_equal(sem + m, n);
        }
        ptx90::named_barrier_sync(2, consumer_threads);
    }
    // All consumer threads, after their additions to query block m.
    __device__ __forceinline__ void release(int m, bool elected, int consumer_threads) const {
        __threadfence();
        ptx90::named_barrier_sync(2, consumer_threads);
        if (elected && m < n_blocks) ptx90::store_release_global(sem + m, n + 1);
    }
};

template <typename Element, typename Traits, bool Causal, bool HasAlibi, bool IsDropout = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    mha_bwd_sm90_kernel(const __grid_constant__ BwdParams params,
                        const __grid_constant__ CUtensorMap q_map,
                        const __grid_constant__ CUtensorMap k_map,
                        const __grid_constant__ CUtensorMap v_map,
                        const __grid_constant__ CUtensorMap do_map,
                        const __grid_constant__ CUtensorMap dq_map) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap();  // no body outside sm_90a (see fwd_sm90.cuh)
#else
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kStages = Traits::kStages;
    using PTile = typename Traits::PTile;
    static_assert(!Traits::kWide, "d192 / d256: mha_bwd_sm90_wide_kernel");

    const BwdSm90Smem<Traits> smem = BwdSm90Smem<Traits>::make();
    const int tid = threadIdx.x;
    const int batch = blockIdx.y;
    const int head = blockIdx.z;
    const auto work = BwdSm90Work<Traits, Causal>::make(params, batch, head);
    if (work.n0 < 0) return;  // varlen: this sequence has fewer key blocks
    const auto& [seq, mask, range, blocks, n0, valid_keys, n_iters] = work;
    bwd_sm90_init_barriers(smem);

    const int warpgroup = tid / 128;
    if (warpgroup == 0) {  // ---- Producer.
        ptx90::setmaxnreg_dec<24>();
        bwd_sm90_produce(params, work, smem, batch, head, &q_map, &k_map, &v_map, &do_map);
        return;
    }

    // ---- Consumers: warpgroup 1 + c owns keys 64 c .. 64 c + 63 of the block.
    ptx90::setmaxnreg_inc<240>();
    const int c = ptx::warp_uniform(warpgroup - 1);
    const int t = tid % 128;
    const int lane = t % 32;
    const int key_row0 = 64 * c + 16 * (t / 32);  // the warp's first key in the block
    const float score_log2 = params.scale_softmax_log2;
    const float alibi_slope_log2 = HasAlibi ? sm80::bwd_alibi_slope_log2(params, batch, head) : 0.f;
    const DqTurns turns = DqTurns::make(params, batch, head, seq.seqlen_q);  // deterministic
    const bool elected = c == 0 && t == 0;
    // dq_accum's row of query 0 (the TMA's row coordinate: bwd_sm90_host.h make_dq_accum_map
    // refuses 2^31 rows or more).
    const int dq_row0 = static_cast<int>(seq.acc_row0);
    const bool ordered = turns.sem != nullptr;  // deterministic

    float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];  // wgmma layout, rows = the warp's keys
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;
    float acc_s[kBlockM / 2], acc_dp[kBlockM / 2];  // S^T, dP^T (64 keys x 64 queries)
    uint32_t p_frag[1][kBlockM / 16][4], ds_frag[1][kBlockM / 16][4];
    auto& s_frag = *reinterpret_cast<float(*)[1][kBlockM / 8][4]>(&acc_s);
    auto& dp_frag = *reinterpret_cast<float(*)[1][kBlockM / 8][4]>(&acc_dp);

    // Pingpong: each warpgroup issues its two GEMM batches of a query block (S^T and dP^T; dV,
    // dK and a dQ) between bar.sync on its barrier (5 + c) and bar.arrive on the other's, so the
    // batches go in turn, warpgroup 0 first (warpgroup 1's arrival before the loop). A
    // warpgroup's arrivals on a barrier alternate with its syncs on the other one, so no warp
    // arrives twice in one phase; warpgroup 0's one more sync after the loop takes warpgroup 1's
    // last arrival. The ids are constants (a register id costs a register).
    auto my_turn = [&] {
        if constexpr (Traits::kPingpong) {
            if (c == 0) {
                ptx90::named_barrier_sync(5, Traits::kConsumerThreads);
            } else {
                ptx90::named_barrier_sync(6, Traits::kConsumerThreads);
            }
        }
    };
    auto their_turn = [&] {
        if constexpr (Traits::kPingpong) {
            if (c == 0) {
                ptx90::named_barrier_arrive(6, Traits::kConsumerThreads);
            } else {
                ptx90::named_barrier_arrive(5, Traits::kConsumerThreads);
            }
        }
    };
    if constexpr (Traits::kPingpong) {
        if (c == 1) ptx90::named_barrier_arrive(5, Traits::kConsumerThreads);
    }
    // dS^T buffer of the it-th query block.
    auto ds_buffer = [&](int it) {
        return smem.ds(it % Traits::kDSBuffers);
    };
    // dQ split by columns: columns kDqCols c .. of the it-th query block over all kBlockN keys.
    // kDqAlternate (not with dropout: its keep bits beside a 64-column dQ spilled 52 bytes): all
    // columns, from 0; the staging buffer is sized for them (Traits::kDqCols).
    constexpr bool kDqAlternate = Traits::kDqAlternate && !IsDropout;
    constexpr int kDqCols = kDqAlternate ? kHeadDim : kHeadDim / Traits::kConsumerWarpgroups;
    // The dQ accumulator type, named: g++ 12 (the emulator's compiler) fails with an internal
    // error on `float acc_dq[kDqCols / 2]` declared inside the generic lambda `iteration`.
    using DqAccumulator = float[kDqCols / 2];
    const int dq_col0 = kDqAlternate ? 0 : kDqCols * c;
    auto issue_dq_split = [&](float (&acc_dq)[kDqCols / 2], int it) {
        // Column dq_col0 of K: slab c (d128), 64 bytes into the one slab (d64 split by
        // columns, c = 1) or its start (kDqAlternate).
        const uint32_t k_columns = (dq_col0 / 64) * Traits::kKVSlabBytes + 2 * (dq_col0 % 64);
        issue_dq_slab<Element, kBlockN / 16, kDqCols>(acc_dq, ds_buffer(it),
                                                      smem.k() + k_columns);
    };
    // acc_dq (landed) of the query block at m0 -> `buffer` (the caller has seen the previous
    // reductions read it), then one thread of the warpgroup issues the boxes' reductions.
    // `complete` (deterministic): this block's reductions are complete (and ordered before the
    // turn's release) on return.
    auto reduce_dq = [&](const float (&acc_dq)[kDqCols / 2], uint32_t buffer, int m0,
                         bool complete) {
        stage_dq_slab<Traits::kDqBoxBytes, kDqCols>(acc_dq, buffer, t);
        ptx90::fence_proxy_async_shared();  // the stores above, seen by the TMA
        consumer_warpgroup_sync(c);
        if (t == 0) {
            issue_dq_reductions<Traits::kDqBoxBytes, kDqCols>(&dq_map, buffer, dq_col0,
                                                             dq_row0 + m0);
            commit_dq_reductions(complete);
        }
    };

    // Dropout: the tile's Philox key and stream, warp-uniform (uniform registers); d128 re-makes
    // them at each draw (hoisted, they spill 32-44 bytes there).
    constexpr bool kUniformMask = IsDropout && kHeadDim != 128;
    // P^T dropped on its 16-bit A fragments (dV scaled by 1 / p_keep at the end), but in fp32 in
    // the d128 kernel without pingpong, where that serialises its wgmma (registers).
    constexpr bool kDropPacked = !(kHeadDim == 128 && !Traits::kPingpong);
    [[maybe_unused]] const DropoutMask dropout_mask =
        kUniformMask ? DropoutMask::make_warp_uniform(
                           params, static_cast<int64_t>(batch) * params.h + head)
                     : DropoutMask{};
    wait_phase(smem.full_kv(), 0);
    // kKVInRegisters: this warp's 16 key rows of K and V (this warpgroup's rows of the slab).
    constexpr int kKVFragTiles = Traits::kKVInRegisters ? kHeadDim / 16 : 1;
    [[maybe_unused]] uint32_t k_frag[kKVFragTiles][4], v_frag[kKVFragTiles][4];
    if constexpr (Traits::kKVInRegisters) {
        const uint32_t rows_offset = static_cast<uint32_t>(64 * c * 128);
        load_key_rows<kKVFragTiles, Traits::kKVSlabBytes>(k_frag, smem.k() + rows_offset,
                                                          16 * (t / 32), lane);
        load_key_rows<kKVFragTiles, Traits::kKVSlabBytes>(v_frag, smem.v() + rows_offset,
                                                          16 * (t / 32), lane);
    }
    // One query block; has_dq (kDqAlternate): this warpgroup issues the dQ GEMM of block it - 1.
    auto iteration = [&](int it_lane, auto has_dq) {
        // Warp-uniform, as c: the shared addresses and wgmma descriptors below (the stage's,
        // the dS^T buffer's) are then built in uniform registers, one uniform add per wgmma.
        // Built per lane, each took about six instructions and an R2UR, 28 bytes spilled at
        // d128 (bench/NOTES.md session 36).
        const int it = ptx::warp_uniform(it_lane);
        const int stage = it % kStages;
        const int m0 = (blocks.min + it) * kBlockM;
        // This warpgroup's 64 key rows in each K / V slab and in dS^T.
        const uint32_t rows_offset = static_cast<uint32_t>(64 * c * 128);
        const uint32_t k_rows = smem.k() + rows_offset;
        const uint32_t v_rows = smem.v() + rows_offset;
        const uint32_t ds_rows = ds_buffer(it) + rows_offset;
        wait_phase(smem.full_q(stage), (it / kStages) & 1);

        // S^T = K Q^T and dP^T = V dO^T: k16 step ks reads 32 bytes into the rows of slab ks / 4.
        ptx90::fence_operand(acc_s);
        ptx90::fence_operand(acc_dp);
        ptx90::wgmma_fence();
        // acc = A rows (this warpgroup's 64 keys of K or V: shared memory, or kKVInRegisters
        // a_frag) * B tile^T (Q or dO), one group.
        auto key_gemm = [&](float (&acc)[kBlockM / 2], uint32_t a_rows,
                           const uint32_t (&a_frag)[kKVFragTiles][4], uint32_t b_tile) {
            const uint64_t desc_a = ptx90::make_smem_desc_sw128(a_rows);
            const uint64_t desc_b = ptx90::make_smem_desc_sw128(b_tile);
#pragma unroll
            for (int ks = 0; ks < kHeadDim / 16; ++ks) {
                const uint32_t b_offset = (ks / 4) * Traits::kQSlabBytes + 32 * (ks % 4);
                if constexpr (Traits::kKVInRegisters) {
                    ptx90::wgmma_rs<kBlockM, Element, false>(
                        acc, a_frag[ks], ptx90::smem_desc_advance(desc_b, b_offset), ks > 0);
                } else {
                    const uint32_t a_offset = (ks / 4) * Traits::kKVSlabBytes + 32 * (ks % 4);
                    ptx90::wgmma_ss<kBlockM, Element>(
                        acc, ptx90::smem_desc_advance(desc_a, a_offset),
                        ptx90::smem_desc_advance(desc_b, b_offset), ks > 0);
                }
            }
            ptx90::wgmma_commit();
        };
        my_turn();
        key_gemm(acc_s, k_rows, k_frag, smem.q(stage));
        key_gemm(acc_dp, v_rows, v_frag, smem.d_o(stage));
        their_turn();
        // Dropout: the forward's keep bits of the warp's 16 keys x 64 queries (dropout.cuh),
        // drawn while S^T and dP^T accumulate.
        [[maybe_unused]] uint32_t keep[1][1];
        if constexpr (IsDropout) {
            // All four draws in flight, but two at d128 (more adds spill loads there).
            if constexpr (!kUniformMask) {
                dropout_keep_bits_transposed<1, kBlockM / 8, 2>(
                    keep, params, static_cast<int64_t>(batch) * params.h + head, n0 + key_row0,
                    m0, lane);
            } else {
                dropout_keep_bits_transposed<1, kBlockM / 8, 4>(
                    keep, [&] { return dropout_mask; }, n0 + key_row0, m0, lane);
            }
        }

        // P^T while dP^T accumulates, then dS^T.
        ptx90::wgmma_wait<1>();
        ptx90::fence_operand(acc_s);
        const bool fully_visible = block_fully_visible<64, kBlockM>(range, n0 + 64 * c, m0);
        scores_to_probs<kBlockM, HasAlibi>(s_frag, n0 + key_row0 + lane / 4,
                                           ptx::opaque(m0 + 2 * (lane % 4)), range, mask,
                                           smem.lse(stage) + 8 * (lane % 4), score_log2,
                                           alibi_slope_log2, fully_visible);
        ptx90::wgmma_wait<0>();
        ptx90::fence_operand(acc_dp);
        // Dropout: dS = P o (dP o M / p_keep - D), dV += (P o M)^T dO (1 / p_keep at the end).
        if constexpr (IsDropout) drop_transposed(dp_frag, keep, params.rp_keep);
        probs_to_dscores<kBlockM>(dp_frag, s_frag, smem.dsum(stage) + 8 * (lane % 4));
        if constexpr (IsDropout && !kDropPacked) drop_transposed(s_frag, keep, params.rp_keep);
        sm80::convert_p_to_a_fragments<Element, PTile>(p_frag, s_frag);
        if constexpr (IsDropout && kDropPacked) drop_pairs_transposed(p_frag, keep);
        sm80::convert_p_to_a_fragments<Element, PTile>(ds_frag, dp_frag);

        // dS^T -> shared memory, rows = keys, 128-byte rows of the 64 queries (swizzled): the
        // MN-major A operand of dQ.
        store_key_rows(ds_rows, ds_frag[0], 16 * (t / 32), lane, 0);
        ptx90::fence_proxy_async_shared();  // the st.shared above, read by the dQ wgmma below

        // dV += P^T dO, dK += dS^T Q: B MN-major (rows = queries), k16 step = 16 query rows =
        // 2048 bytes, the 64-column slabs kQSlabBytes apart. One group.
        auto issue_dv_dk = [&] {
            ptx90::fence_operand(acc_dv);
            ptx90::fence_operand(acc_dk);
            ptx90::fence_operand(p_frag);
            ptx90::fence_operand(ds_frag);
            ptx90::wgmma_fence();
            // acc += frag (16 keys x 64 queries, A fragments) * the stage's tile `rows`.
            auto rs_gemm = [&](float (&acc)[kHeadDim / 2],
                               const uint32_t (&frag)[kBlockM / 16][4], uint32_t rows) {
                const uint64_t desc = ptx90::make_smem_desc_sw128(rows, Traits::kQSlabBytes);
#pragma unroll
                for (int kk = 0; kk < kBlockM / 16; ++kk) {
                    ptx90::wgmma_rs<kHeadDim, Element, true>(
                        acc, frag[kk], ptx90::smem_desc_advance(desc, 2048 * kk), true);
                }
            };
            rs_gemm(acc_dv, p_frag[0], smem.d_o(stage));
            rs_gemm(acc_dk, ds_frag[0], smem.q(stage));
            ptx90::wgmma_commit();
        };
        auto dv_dk_landed = [&] {
            ptx90::fence_operand(acc_dv);
            ptx90::fence_operand(acc_dk);
            ptx90::fence_operand(p_frag);
            ptx90::fence_operand(ds_frag);
            ptx90::mbarrier_arrive(smem.empty_q(stage));  // Q, dO, lse, D of this stage consumed
        };

        // dQ = dS K, this warpgroup's kDqCols columns (kDqCols / 2 accumulators beside dK and
        // dV) over all kBlockN keys: both warpgroups' dS^T rows (written and fenced for the
        // async proxy).
        DqAccumulator acc_dq;
        const uint32_t dq_buffer = smem.dq(c);
        if constexpr (Traits::kDqDeferred) {
            // The dQ GEMM of block it - 1 (both warpgroups' dS^T rows of it are written: see
            // kDqDeferred), then dV and dK. At it = 0 it reads whatever the last dS^T buffer
            // holds and its result is dropped (issued anyway: the wgmma under a branch made
            // ptxas serialise the kernel's wgmma). The staged-dQ buffer's last reductions have
            // read it once this turn is passed.
            if constexpr (decltype(has_dq)::value) {
                if (t == 0) ptx90::bulk_wait_group_read<0>();
                my_turn();
                issue_dq_split(acc_dq, it + Traits::kDSBuffers - 1);  // (it - 1) mod kDSBuffers
                issue_dv_dk();
                their_turn();
                ptx90::wgmma_wait<1>();
                ptx90::fence_operand(acc_dq);
                if (it > 0) reduce_dq(acc_dq, dq_buffer, m0 - kBlockM, false);  // under dV, dK
            } else {
                my_turn();
                issue_dv_dk();
                their_turn();
            }
            ptx90::wgmma_wait<0>();
            dv_dk_landed();
        } else {
            my_turn();
            issue_dv_dk();
            // Both warpgroups' dS^T rows of this block are written past this barrier; the one
            // staged-dQ buffer's previous reductions have read it.
            if (t == 0) ptx90::bulk_wait_group_read<0>();
            ptx90::named_barrier_sync(1, Traits::kConsumerThreads);
            issue_dq_split(acc_dq, it);
            their_turn();
            ptx90::wgmma_wait<1>();  // dV and dK have landed
            dv_dk_landed();
            if (ordered) {
                turns.acquire(m0 / kBlockM, it, blocks.min, elected, Traits::kConsumerThreads);
            }
            ptx90::wgmma_wait<0>();
            ptx90::fence_operand(acc_dq);
            reduce_dq(acc_dq, dq_buffer, m0, ordered);
            if (ordered) turns.release(m0 / kBlockM, elected, Traits::kConsumerThreads);
        }
    };
    if constexpr (kDqAlternate) {
        // Warpgroup c issues the dQ GEMMs of the query blocks of parity c, each in the iteration
        // after the block's own (block it - 1 in iteration it). Both warpgroups run one loop
        // unrolled by two, so one copy of it is in the instruction cache (a wgmma under a branch
        // inside the loop would serialise the kernel's wgmma); warpgroup 1 first takes block 0
        // alone (no dQ: block -1 has none).
        if (c == 1 && n_iters > 0) iteration(0, std::false_type{});
        for (int it = c; it < n_iters; it += 2) {
            iteration(it, std::false_type{});
            if (it + 1 == n_iters) break;
            iteration(it + 1, std::true_type{});  // the dQ of block it
        }
    } else {
        for (int it = 0; it < n_iters; ++it) iteration(it, std::true_type{});
    }
    if constexpr (Traits::kPingpong) {
        if (c == 0) my_turn();  // warpgroup 1's last arrival
    }
    if constexpr (Traits::kDqDeferred) {  // the last block's dQ (its dS^T written: the turns)
        // kDqAlternate: the warpgroup of the last block's parity.
        if (n_iters > 0 && (!kDqAlternate || (n_iters - 1) % 2 == c)) {
            float acc_dq[kDqCols / 2];
            issue_dq_split(acc_dq, n_iters - 1);
            if (t == 0) ptx90::bulk_wait_group_read<0>();
            consumer_warpgroup_sync(c);  // the staged-dQ buffer has been read
            ptx90::wgmma_wait<0>();
            ptx90::fence_operand(acc_dq);
            reduce_dq(acc_dq, smem.dq(c), (blocks.min + n_iters - 1) * kBlockM, false);
        }
    }
    // The staged dQ must outlive its reductions' reads.
    if (t == 0) ptx90::bulk_wait_group<0>();

    if (turns.sem != nullptr && elected) {  // deterministic: the query blocks after this CTA's
        turns.pass_range(n_iters > 0 ? blocks.max : 0, turns.n_blocks);
    }

    // ---- dK, dV of this warp's 16 keys.
    if constexpr (IsDropout && kDropPacked) scale_dv_for_dropped_pairs(acc_dv, params.rp_keep);
    const auto& dk_frag = *reinterpret_cast<const float(*)[1][kHeadDim / 8][4]>(&acc_dk);
    const auto& dv_frag = *reinterpret_cast<const float(*)[1][kHeadDim / 8][4]>(&acc_dv);
    sm80::store_dk_dv<Element, kHeadDim, true, true>(params, batch, head, seq.kv_row0, n0, key_row0,
                                                      0, lane, valid_keys, dk_frag, dv_frag);
#endif  // sm_90a
}

}  // namespace sm90
}  // namespace flash_cuda
