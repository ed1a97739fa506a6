// Dropout on mma.m16n8k16 fragments of P, with the mask of philox.cuh (the one the CPU reference
// draws), so kernels and reference drop the same elements:
//   element (bh, query row i, key j) is kept  <=>  lane j % 8 of
//       philox(key = seed, counter = {j / 8, i, lo32(bh + offset), hi32(bh + offset)}) < threshold
// Rows and keys are relative to the sequence start. Kept probabilities are scaled by 1 / p_keep
// (the forward applies that factor to O once, in its epilogue).
//
// Forward (fwd.cuh, layout of mask.cuh: rows are queries): a thread's element (mt, nt, e) holds
// query row0 + 16 mt + 8 (e / 2) and key col0 + 8 nt + (e % 2), col0 = block key 0 + 2 (lane % 4):
// the two keys of a (row, nt) pair are lanes 2t, 2t + 1 of one draw, i.e. its 32-bit word t.
// Backward (bwd.cuh, P^T fragments: rows are keys): element (mt, nt, e) holds key
// key0 + 16 mt + 8 (e / 2) and query 8 nt + 2 (lane % 4) + (e % 2); each element is its own draw
// (lane key % 8 of the draw of (query, key / 8)).
#pragma once

#include <cstdint>

#include "kernels/params.h"
#include "kernels/philox.cuh"
#include "kernels/ptx.cuh"

namespace flash_cuda {

// The Philox key and stream of one (batch, head): counters {j / 8, i, lo32(stream), hi32(stream)}.
struct DropoutMask {
    uint64_t seed;
    uint64_t stream;     // bh + offset
    uint32_t threshold;  // keep when the 16-bit draw is below

    // Seed and offset of the call: from params, or (CUDA graph capture: torch's
    // PhiloxCudaState) read on the device, so a replayed graph uses the advanced offset.
    __device__ __forceinline__ static uint64_t seed_of(const FwdParams& params) {
        return params.philox_seed_ptr != nullptr
                   ? static_cast<uint64_t>(*params.philox_seed_ptr)
                   : params.philox_seed;
    }
    __device__ __forceinline__ static uint64_t offset_of(const FwdParams& params) {
        return params.philox_offset_ptr != nullptr
                   ? static_cast<uint64_t>(*params.philox_offset_ptr) +
                         params.philox_offset_intragraph
                   : params.philox_offset;
    }

    __device__ __forceinline__ static DropoutMask make(const FwdParams& params, int64_t bh) {
        DropoutMask m;
        m.seed = seed_of(params);
        m.stream = static_cast<uint64_t>(bh) + offset_of(params);
        m.threshold = params.p_keep_threshold;
        return m;
    }

    // The eight 16-bit draws of keys [8 group, 8 group + 8) of query `row`.
    __device__ __forceinline__ Philox4 draws(uint32_t row, uint32_t group) const {
        return philox4x32_10(Philox4{group, row, static_cast<uint32_t>(stream),
                                     static_cast<uint32_t>(stream >> 32)},
                             seed);
    }
};

// The forward writes the (seed, offset) it used to rng_state (int64 (2)), once per grid, so the
// backward replays the same mask (also inside a CUDA graph, where only the device knows them).
__device__ __forceinline__ void write_rng_state(const FwdParams& params, int tid) {
    if (params.rng_state != nullptr && tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 &&
        blockIdx.z == 0) {
        params.rng_state[0] = static_cast<int64_t>(DropoutMask::seed_of(params));
        params.rng_state[1] = static_cast<int64_t>(DropoutMask::offset_of(params));
    }
}

__device__ __forceinline__ uint32_t draw_word(const Philox4& r, int word) {
    return word == 0 ? r.x : word == 1 ? r.y : word == 2 ? r.z : r.w;
}

// Forward: zeroes the dropped elements of P, given as the 16-bit A fragments of P V
// (warp_gemm.cuh: p_frag[mt][kk] = {S tile 2kk rows g, S tile 2kk rows g + 8, S tile 2kk + 1
// rows g, S tile 2kk + 1 rows g + 8}, each a pair of keys 2t, 2t + 1 with the lower key in the
// low half). Working on the packed fragments (half the registers of fp32 P) leaves room for the
// Philox rounds beside the O accumulator. Kept elements stay unscaled (the caller scales O by
// 1 / p_keep at the end). row0 = query of S element (0, 0, 0); key_block0 = first key of the
// block (a multiple of 8).
// The four lanes of a quad hold the same rows: for each row and 4 key groups (S tiles 4j ..
// 4j + 3) lane t draws group 4j + t once and the quad exchanges words (lane t needs word t of
// each draw), so every draw is computed once, not four times. The keep bits are collected in a
// loop unrolled kDrawUnroll times, then applied: a Philox draw is a chain of ten dependent
// multiply / xor rounds, so one draw at a time (kDrawUnroll 1: few live registers, what the sm80
// kernels can afford) leaves a warp waiting on its latency, while an unrolled loop (the sm90
// kernels, 240 registers per consumer thread) keeps several chains in flight: 1.03-1.13x on the
// sm90 dropout forward (bench/NOTES.md run 200; the rounds' own issue cost stays). A block whose
// S tiles are not a multiple of 4 (the sm90 d256 kernel's 80 keys: 10) draws the groups past its
// end in the last round and leaves their bits unused.
template <int kMTiles, int kKSteps, int kDrawUnroll = 1>
__device__ __forceinline__ void apply_dropout(uint32_t (&p_frag)[kMTiles][kKSteps][4],
                                              const DropoutMask& mask, int row0, int key_block0,
                                              int lane) {
    constexpr int kNTiles = 2 * kKSteps;  // 8-key S tiles
    static_assert(kNTiles <= 16, "key block: at most 128 keys (2 keep bits per S tile)");
    const int t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t row = static_cast<uint32_t>(row0 + 16 * mt + 8 * half);
            uint32_t bits = 0;  // bit 2 nt + c: key 8 nt + 2t + c of this row is kept
#pragma unroll kDrawUnroll
            for (int j = 0; j < (kNTiles + 3) / 4; ++j) {
                const Philox4 r = mask.draws(row, static_cast<uint32_t>(key_block0 / 8 + 4 * j + t));
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    // Partner t ^ s drew group 4j + (t ^ s) and sends its word (t ^ s) ^ s = t.
                    uint32_t w = draw_word(r, t ^ s);
                    if (s != 0) w = __shfl_xor_sync(0xffffffffu, w, s);
                    const uint32_t kept = ((w & 0xFFFFu) < mask.threshold ? 1u : 0u) |
                                          ((w >> 16) < mask.threshold ? 2u : 0u);
                    bits |= kept << (8 * j + 2 * (t ^ s));
                }
            }
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
                const uint32_t pair = bits >> (2 * nt);
                const uint32_t and_mask = ((pair & 1u) ? 0x0000FFFFu : 0u) |
                                          ((pair & 2u) ? 0xFFFF0000u : 0u);
                p_frag[mt][nt / 2][2 * (nt % 2) + half] &= and_mask;
            }
        }
    }
}

// Forward on Hopper (the sm90 forward at d64 / d128, where shared memory has room): as
// apply_dropout, but the quad's words change hands through shared memory instead of shuffles
// and runtime-indexed selects, and each word masks its pair of P with two compares and two
// predicated ANDs (the high draw against threshold << 16, no shift): about half of
// apply_dropout's ALU instructions per draw beside the Philox rounds' own 20 IMAD.WIDE + 20
// LOP3 (bench/NOTES.md session 42: the ALU pipe bounds the dropout forward).
// For each row and kChunk rounds of 4 key groups, lane t of a quad draws group 4j + t and writes
// word k of its draw to row k ^ f, column t of the quad's 4 x 4 word matrix of round j (scratch
// + 512 j + 64 quad; f = (quad / 2) % 4 spreads the 8 quads' stores over the 32 banks); lane t
// then reads row t ^ f, 16 bytes: word t of groups 4j .. 4j + 3, its two keys of S tiles 4j ..
// 4j + 3. scratch: the warp's kChunk x 512 bytes, 16-byte aligned.
template <int kKSteps, int kChunk>
__device__ __forceinline__ void apply_dropout_via_smem(uint32_t (&p_frag)[1][kKSteps][4],
                                                       const DropoutMask& mask, int row0,
                                                       int key_block0, int lane,
                                                       uint32_t scratch) {
    constexpr int kRounds = kKSteps / 2;  // 4 S tiles (8 keys each) per round
    static_assert(kKSteps % 2 == 0 && kRounds % kChunk == 0, "whole rounds of 4 S tiles");
    // The high draw is below the threshold <=> word <= (threshold << 16) - 1, which fits 32 bits
    // up to threshold 65536 (dropout_p within 2^-17 of 0); threshold 0 (within 2^-17 of 1) keeps
    // nothing (any_kept). No branch here: early exits made ptxas spill the d128 kernel.
    const uint32_t word_bound_hi = (mask.threshold << 16) - 1u;
    const bool any_kept = mask.threshold != 0u;
    const int t = lane % 4, quad = lane / 4, f = (quad / 2) % 4;
    const uint32_t quad_matrix = scratch + 64 * quad;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const uint32_t row = static_cast<uint32_t>(row0 + 8 * half);
#pragma unroll
        for (int j0 = 0; j0 < kRounds; j0 += kChunk) {
            Philox4 r[kChunk];
#pragma unroll
            for (int u = 0; u < kChunk; ++u) {
                r[u] = mask.draws(row, static_cast<uint32_t>(key_block0 / 8 + 4 * (j0 + u) + t));
            }
            __syncwarp();  // the lanes' reads of the previous chunk are done
#pragma unroll
            for (int u = 0; u < kChunk; ++u) {
                const uint32_t words[4] = {r[u].x, r[u].y, r[u].z, r[u].w};
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    ptx::st_shared_4(quad_matrix + 512 * u + 16 * (k ^ f) + 4 * t, words[k]);
                }
            }
            __syncwarp();
#pragma unroll
            for (int u = 0; u < kChunk; ++u) {
                const uint4 v = ptx::ld_shared_16(quad_matrix + 512 * u + 16 * (t ^ f));
                const uint32_t mine[4] = {v.x, v.y, v.z, v.w};  // S tiles 4 (j0 + u) + g
#pragma unroll
                for (int g = 0; g < 4; ++g) {
                    const int nt = 4 * (j0 + u) + g;
                    uint32_t& pair = p_frag[0][nt / 2][2 * (nt % 2) + half];
                    if (!((mine[g] & 0xFFFFu) < mask.threshold)) pair &= 0xFFFF0000u;
                    if (!(mine[g] <= word_bound_hi && any_kept)) pair &= 0x0000FFFFu;
                }
            }
        }
    }
}

// Backward: keep bits of the P^T fragments s[kKeyTiles][kQTiles8][4] of bwd.cuh (rows are keys):
// element (mt, nt, 2 half + c), key key_slice0 + 16 mt + 8 half + lane / 4 and query
// query0 + 8 nt + 2 (lane % 4) + c, is kept iff bit 4 (nt % 8) + 2 half + c of keep[mt][nt / 8].
// key_slice0 = first key of the warp's slice (a multiple of 16), query0 = first query of the
// block. The 8 keys of a group (one draw) lie in the 8 lanes of a column (lane / 4), so a draw
// is shared by 8 lanes: lane (g, t) draws the queries 8 g + 2t + c (c = 0, 1) of both 8-key
// halves of a 16-key tile once, turns them into a 32-bit keep mask (bit 16 half + 8 c + key % 8)
// and every lane reads the masks of its queries with one shuffle per 8-query tile.
// The mask is re-made from params inside the draw loop (nothing of it stays live in registers
// across the loop: the backward's accumulators need them); kDrawUnroll draws (of 4) are in
// flight at a time where the kernel has the registers (see apply_dropout).
template <int kKeyTiles, int kQTiles8, int kDrawUnroll = 1>
__device__ __forceinline__ void dropout_keep_bits_transposed(
    uint32_t (&keep)[kKeyTiles][(kQTiles8 + 7) / 8], const FwdParams& params, int64_t bh,
    int key_slice0, int query0, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
        for (int u = 0; u < (kQTiles8 + 7) / 8; ++u) {
            uint32_t drawn = 0;  // bit 16 half + 8 c + k: key group half, query 8 (8u + g) + 2t + c
#pragma unroll kDrawUnroll
            for (int hc = 0; hc < 4; ++hc) {
                const int half = hc / 2, c = hc % 2;
                const uint32_t query = static_cast<uint32_t>(query0 + 8 * (8 * u + g) + 2 * t + c);
                const uint32_t group = static_cast<uint32_t>((key_slice0 + 16 * mt + 8 * half) / 8);
                const DropoutMask mask = DropoutMask::make(params, bh);
                const Philox4 r = mask.draws(query, group);
                const uint32_t words[4] = {r.x, r.y, r.z, r.w};
                uint32_t m = 0;
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    const uint32_t lane16 = (k & 1) ? (words[k / 2] >> 16) : (words[k / 2] & 0xFFFFu);
                    m |= (lane16 < mask.threshold ? 1u : 0u) << k;
                }
                drawn |= m << (8 * hc);
            }
            uint32_t bits = 0;
#pragma unroll
            for (int n8 = 0; n8 < 8 && 8 * u + n8 < kQTiles8; ++n8) {
                const uint32_t v = __shfl_sync(0xffffffffu, drawn, 4 * n8 + t);
#pragma unroll
                for (int hc = 0; hc < 4; ++hc) bits |= ((v >> (8 * hc + g)) & 1u) << (4 * n8 + hc);
            }
            keep[mt][u] = bits;
        }
    }
}

// Whether element (mt, nt, e) of a P^T fragment is kept, from keep[mt] of
// dropout_keep_bits_transposed (bit 4 (nt % 8) + e of word nt / 8).
template <int kWords>
__device__ __forceinline__ bool kept_transposed(const uint32_t (&keep_row)[kWords], int nt, int e) {
    return (keep_row[nt / 8] >> (4 * (nt % 8) + e)) & 1u;
}

// Backward, on fp32 fragments of that P^T layout (the sm90 backward's S^T / dP^T accumulators):
// x = x * scale where kept, 0 where dropped.
template <int kKeyTiles, int kQTiles8>
__device__ __forceinline__ void drop_transposed(
    float (&x)[kKeyTiles][kQTiles8][4], const uint32_t (&keep)[kKeyTiles][(kQTiles8 + 7) / 8],
    float scale) {
#pragma unroll
    for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kQTiles8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                x[mt][nt][e] = kept_transposed(keep[mt], nt, e) ? x[mt][nt][e] * scale : 0.f;
            }
        }
    }
}

}  // namespace flash_cuda
