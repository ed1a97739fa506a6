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

    // make's, every word lane 0's: ptxas can then keep the key and the stream in uniform
    // registers and form the ten round keys with uniform adds, not per lane (the seed may come
    // from memory, so it cannot prove them uniform).
    __device__ __forceinline__ static DropoutMask make_warp_uniform(const FwdParams& params,
                                                                    int64_t bh) {
        DropoutMask m = make(params, bh);
        auto uniform64 = [](uint64_t x) {
            const uint32_t lo = static_cast<uint32_t>(ptx::warp_uniform(static_cast<int>(x)));
            const uint32_t hi = static_cast<uint32_t>(ptx::warp_uniform(static_cast<int>(x >> 32)));
            return (static_cast<uint64_t>(hi) << 32) | lo;
        };
        m.seed = uniform64(m.seed);
        m.stream = uniform64(m.stream);
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

// Zeroes the dropped halves of a packed pair of P (keys 2t, 2t + 1 of one S tile and row, the
// lower key in the low half) given its draw word (the lower key's draw in the low 16 bits):
// two compares and two predicated ANDs, no shift. The high draw is below the threshold <=>
// word <= (threshold << 16) - 1, which fits 32 bits up to threshold 65536 (dropout_p within
// 2^-17 of 0); threshold 0 (within 2^-17 of 1) keeps nothing (any_kept). No early exit for
// either end: those made ptxas spill the sm90 d128 forward.
struct PairDrop {
    uint32_t threshold;
    uint32_t word_bound_hi;
    bool any_kept;

    __device__ __forceinline__ explicit PairDrop(uint32_t keep_threshold)
        : threshold(keep_threshold),
          word_bound_hi((keep_threshold << 16) - 1u),
          any_kept(keep_threshold != 0u) {}

    __device__ __forceinline__ void operator()(uint32_t& pair, uint32_t word) const {
        if (!((word & 0xFFFFu) < threshold)) pair &= 0xFFFF0000u;
        if (!(word <= word_bound_hi && any_kept)) pair &= 0x0000FFFFu;
    }
};

// The 4 x 4 word transpose of a quad's draws by shuffles: lane t (= lane % 4 = 2c + b) holds
// the four words of its own draw r; on return mine[g] is word t of quad lane g's draw. Two
// butterfly stages, each trading two words with one partner (lane t ^ 1, then t ^ 2); the
// selects go by the lane's bits b and c, so every word ends in a register known at compile
// time (no runtime-indexed select, no keep bits to build): 4 shuffles and 16 selects per draw.
__device__ __forceinline__ void quad_transpose_words(uint32_t (&mine)[4], const Philox4& r,
                                                     int lane) {
    const bool b = (lane & 1) != 0, c = (lane & 2) != 0;
    // Stage 1, partner t ^ 1: keep the own words b and b + 2, give words b ^ 1 and (b ^ 1) + 2,
    // get the partner's words b and b + 2 (it gives those).
    const uint32_t keep_lo = b ? r.y : r.x, keep_hi = b ? r.w : r.z;
    const uint32_t give_lo = b ? r.x : r.y, give_hi = b ? r.z : r.w;
    const uint32_t got_lo = __shfl_xor_sync(0xffffffffu, give_lo, 1);
    const uint32_t got_hi = __shfl_xor_sync(0xffffffffu, give_hi, 1);
    // Held now: words b (lo) and b + 2 (hi) of groups 2c + b (keep) and 2c + (b ^ 1) (got).
    // Stage 2, partner t ^ 2: keep words b + 2c = t, give words t ^ 2 (the partner's t).
    const uint32_t near_same = c ? keep_hi : keep_lo;   // group 2c + b
    const uint32_t near_other = c ? got_hi : got_lo;    // group 2c + (b ^ 1)
    const uint32_t give_same = c ? keep_lo : keep_hi;
    const uint32_t give_other = c ? got_lo : got_hi;
    const uint32_t far_same = __shfl_xor_sync(0xffffffffu, give_same, 2);    // 2 (c ^ 1) + b
    const uint32_t far_other = __shfl_xor_sync(0xffffffffu, give_other, 2);  // 2 (c ^ 1) + (b ^ 1)
    // Group 2C + B is near if C == c, far else; "same" if B == b.
    const uint32_t near0 = b ? near_other : near_same, near1 = b ? near_same : near_other;
    const uint32_t far0 = b ? far_other : far_same, far1 = b ? far_same : far_other;
    mine[0] = c ? far0 : near0;
    mine[1] = c ? far1 : near1;
    mine[2] = c ? near0 : far0;
    mine[3] = c ? near1 : far1;
}

// Forward: zeroes the dropped elements of P, given as the 16-bit A fragments of P V
// (warp_gemm.cuh: p_frag[mt][kk] = {S tile 2kk rows g, S tile 2kk rows g + 8, S tile 2kk + 1
// rows g, S tile 2kk + 1 rows g + 8}, each a pair of keys 2t, 2t + 1 with the lower key in the
// low half). Working on the packed fragments (half the registers of fp32 P) leaves room for the
// Philox rounds beside the O accumulator. Kept elements stay unscaled (the caller scales O by
// 1 / p_keep at the end). row0 = query of S element (0, 0, 0); key_block0 = first key of the
// block (a multiple of 8).
// The four lanes of a quad hold the same rows: for each row and 4 key groups (S tiles 4j ..
// 4j + 3) lane t draws group 4j + t once and the quad transposes the words by shuffles
// (quad_transpose_words: lane t needs word t of each draw), so every draw is computed once, not
// four times; each word then masks its pair (PairDrop). The loops are unrolled whole (every
// pair's register is known at compile time), so a draw's chain of ten dependent multiply / xor
// rounds can overlap the previous draw's exchange where the registers allow. Used by the sm80
// forward (its d64 dropout tile is 128 x 64: on 128 x 128 this spilled); apply_dropout_keep_bits
// below is the version in fewer registers, apply_dropout_via_smem the one through shared memory.
// Before session 44 the sm80 forward used apply_dropout_keep_bits (one draw at a time): about
// 1.27x the instructions per key of the d64 kernel (local SASS) and 1.29-1.56x the time at
// d64 / d128 (run 205, bench/NOTES.md session 44).
template <int kMTiles, int kKSteps>
__device__ __forceinline__ void apply_dropout(uint32_t (&p_frag)[kMTiles][kKSteps][4],
                                              const DropoutMask& mask, int row0, int key_block0,
                                              int lane) {
    constexpr int kNTiles = 2 * kKSteps;  // 8-key S tiles
    static_assert(kNTiles % 4 == 0, "whole rounds of 4 S tiles (the sm80 tiles' 32+ keys)");
    const PairDrop drop(mask.threshold);
    const int t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t row = static_cast<uint32_t>(row0 + 16 * mt + 8 * half);
#pragma unroll
            for (int j = 0; j < kNTiles / 4; ++j) {
                const Philox4 r = mask.draws(row, static_cast<uint32_t>(key_block0 / 8 + 4 * j + t));
                uint32_t mine[4];  // S tiles 4j + g: keys 8 (4j + g) + 2t, + 1 of this row
                quad_transpose_words(mine, r, lane);
#pragma unroll
                for (int g = 0; g < 4; ++g) {
                    const int nt = 4 * j + g;
                    drop(p_frag[mt][nt / 2][2 * (nt % 2) + half], mine[g]);
                }
            }
        }
    }
}

__device__ __forceinline__ uint32_t draw_word(const Philox4& r, int word) {
    return word == 0 ? r.x : word == 1 ? r.y : word == 2 ? r.z : r.w;
}

// Forward, in fewer registers than apply_dropout (the sm90 d192 / d256 forward; at d256
// apply_dropout's transposed words spill 40 bytes): the same draws, but lane t takes word t of
// each partner's draw by a shuffle of a runtime-selected word (draw_word: branches) and collects
// keep bits (bit 2 nt + c), applied per pair after the draws; kDrawUnroll draws in flight (the
// d256 kernel: all three of a row's, its block's 10 S tiles leaving the last round's two groups
// unused; the d192 kernel: two of four, for 14 S tiles). About twice apply_dropout's
// instructions per draw beside the Philox rounds (local SASS of the sm80 d64 kernel,
// bench/NOTES.md session 43).
template <int kMTiles, int kKSteps, int kDrawUnroll = 1>
__device__ __forceinline__ void apply_dropout_keep_bits(uint32_t (&p_frag)[kMTiles][kKSteps][4],
                                                        const DropoutMask& mask, int row0,
                                                        int key_block0, int lane) {
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
// (4 stores and one 16-byte load per draw instead of 4 shuffles and 16 selects) beside the
// Philox rounds' own 20 IMAD.WIDE + 20 LOP3 (bench/NOTES.md session 42: the ALU pipe bounds the
// dropout forward).
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
    const PairDrop drop(mask.threshold);
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
                    drop(p_frag[0][nt / 2][2 * (nt % 2) + half], mine[g]);
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
// mask_of() gives the DropoutMask at each draw: the sm80 backward re-makes it from params
// there (nothing of it stays live in registers across its loop: its accumulators need them),
// the sm90 kernels pass one made warp-uniform per tile (uniform registers). kDrawUnroll draws
// (of 4) are in flight at a time where the kernel has the registers (a Philox draw is a chain
// of ten dependent multiply / xor rounds: one at a time leaves the warp waiting on its latency).
template <int kKeyTiles, int kQTiles8, int kDrawUnroll = 1, typename MaskOf>
__device__ __forceinline__ void dropout_keep_bits_transposed(
    uint32_t (&keep)[kKeyTiles][(kQTiles8 + 7) / 8], MaskOf&& mask_of, int key_slice0,
    int query0, int lane) {
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
                const DropoutMask mask = mask_of();
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

template <int kKeyTiles, int kQTiles8, int kDrawUnroll = 1>
__device__ __forceinline__ void dropout_keep_bits_transposed(
    uint32_t (&keep)[kKeyTiles][(kQTiles8 + 7) / 8], const FwdParams& params, int64_t bh,
    int key_slice0, int query0, int lane) {
    dropout_keep_bits_transposed<kKeyTiles, kQTiles8, kDrawUnroll>(
        keep, [&] { return DropoutMask::make(params, bh); }, key_slice0, query0, lane);
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

// Backward, on the 16-bit A fragments of P^T that convert_p_to_a_fragments made of such a
// fragment (p[mt][kk] = {S tile 2kk rows g, rows g + 8, S tile 2kk + 1 rows g, rows g + 8},
// elements 2t, 2t + 1 of each): the dropped elements zeroed, the kept left unscaled (the caller
// scales dV by 1 / p_keep once, at the end). One predicated AND per element instead of a
// multiply and a select on the fp32 values.
template <int kKeyTiles, int kKSteps>
__device__ __forceinline__ void drop_pairs_transposed(
    uint32_t (&p)[kKeyTiles][kKSteps][4],
    const uint32_t (&keep)[kKeyTiles][(2 * kKSteps + 7) / 8]) {
#pragma unroll
    for (int mt = 0; mt < kKeyTiles; ++mt) {
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int nt = 2 * kk + r / 2, e0 = 2 * (r % 2);
                if (!kept_transposed(keep[mt], nt, e0)) p[mt][kk][r] &= 0xFFFF0000u;
                if (!kept_transposed(keep[mt], nt, e0 + 1)) p[mt][kk][r] &= 0x0000FFFFu;
            }
        }
    }
}

// The other half of drop_pairs_transposed: dV accumulated (P o M)^T dO over the whole loop, so
// its 1 / p_keep (of P o M / p_keep) is applied once, to the accumulator, before dV is stored.
template <int kN>
__device__ __forceinline__ void scale_dv_for_dropped_pairs(float (&acc_dv)[kN], float rp_keep) {
#pragma unroll
    for (int i = 0; i < kN; ++i) acc_dv[i] *= rp_keep;
}

}  // namespace flash_cuda
