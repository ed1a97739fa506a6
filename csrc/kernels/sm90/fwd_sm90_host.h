// Host side of the sm90 forward (kernels/sm90/fwd_sm90.cuh), shared by its launcher
// (fwd_sm90_launch.cuh), flash_api.cpp and the CPU emulator: which calls the kernel covers, and
// the tensor maps of q, k and v. Plain C++ on FwdParams; no torch.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "kernels/env_switch.h"
#include "kernels/params.h"
#include "kernels/sm90/tensor_map.h"

namespace flash_cuda {
namespace sm90 {

// The sm90 forward kernel that runs head dim d (a multiple of 8, at most 256): the smallest of
// 64 / 128 / 192 / 256 (the kernels: whole 64-column slabs, for the TMA boxes and the 128-byte
// swizzle) that holds it. Below the kernel's head dim the tensor maps' column extent is d, so
// the TMA zero-fills Q, K and V past it (S and O exact: the padded columns add zeros) and the
// epilogue stores only d columns of O. Forward against the sm80 kernels those calls ran before
// (bench/NOTES.md runs 212, 215; an H100): d48 1.14-1.46x, d80-d112 0.92-1.97x (below 1.0 only
// at causal s512, d96 / d112), d160 / d224 1.07-2.47x; d32 0.88-0.99x, so d <= 32 keeps the sm80
// kernel of head dim 32 (0 here). 0 also when none holds d.
constexpr int fwd_kernel_head_dim(int d) {
    return d <= 32 ? 0 : d <= 64 ? 64 : d <= 128 ? 128 : d <= 192 ? 192 : d <= 256 ? 256 : 0;
}

// Query tiles of a forward call: 128-row blocks of the (max) query length x batch x heads.
inline int64_t fwd_sm90_tiles(const FwdParams& p) {
    constexpr int kBlockM = 128;  // FwdSm90Traits::kBlockM
    return (static_cast<int64_t>(p.seqlen_q) + kBlockM - 1) / kBlockM * p.b * p.h;
}

// Whether the sm90 forward kernel handles the call: a head dim of at most 256 (a multiple of 8:
// the callers pad to that; the kernel is fwd_kernel_head_dim's), dropout only without softcap /
// ALiBi, no KV-cache features (paged, cache_batch_idx, leftpad, seqused_k, appended keys), no
// split-KV or GQA packing, more query rows than a decode step (seqlen_q > 64: shorter calls stay
// on the sm80 decode tile), at least one key row in k / v (a tensor map needs extents >= 1),
// fewer than 2^30 tiles (a CTA's last tile index, below tiles + gridDim.x with gridDim.x <=
// tiles, stays an int). Pointers and strides 16-byte aligned: the caller's (flash_api.cpp pads /
// copies to that).
inline bool fwd_supports(const FwdParams& p) {
    const bool has_keys = p.cu_seqlens_q != nullptr ? p.total_k > 0 : p.seqlen_k > 0;
    const bool kv_cache = p.block_table != nullptr || p.cache_batch_idx != nullptr ||
                          p.leftpad_k != nullptr || p.seqused_k != nullptr || p.knew_ptr != nullptr;
    const bool dropout_ok =
        p.p_keep >= 1.f || (!(p.softcap > 0.f) && p.alibi_slopes_ptr == nullptr);
    return fwd_kernel_head_dim(p.d) > 0 && p.d % 8 == 0 && dropout_ok && has_keys &&
           !kv_cache && p.num_splits <= 1 && p.gqa_pack <= 1 && p.seqlen_q > 64 &&
           fwd_sm90_tiles(p) < (int64_t{1} << 30) && p.is_seqlens_k_cumulative;
}

// Whether the kernel runs persistent, one CTA per SM walking the tiles (fwd_sm90.cuh FwdTile):
// fixed length without a window, not causal (every tile has the same key blocks: the grid order)
// or causal. Causal calls without dropout take their tiles dynamically (fwd_sm90_dynamic_tiles),
// which balances the CTAs as the hardware's hand-out of a grid does and keeps the K / V of the
// few (batch, head) pairs in flight in the L2; against one CTA per tile (an H100, bench/NOTES.md
// run 230) d256 s512-2k 1.04-1.08x, d192 s2k 1.10x, s16k 0.98-1.03x, and the cells the fixed
// walk ran persistent before gained (d128 s512 / s4k 1.15 / 1.14x over it).
// With the fixed walk (dropout, or FLASH_CUDA_SM90_DYNAMIC=0; the tiles' lengths fall with the
// level order, whose snake keeps the CTAs' work even), the rule before session 48: causal up to
// 8192 query rows, at head dims 192 / 256 from 4096, and d192 up to 1024. Measured on the H200
// against one CTA per tile (run 156): causal d64 / d128 persistent 1.02-1.38x at s512-8k but
// 0.96-0.99x at s16k; d256 1.05-1.06x at s4k-8k but 0.81x at s512-1k (the level order puts up to
// 132 heads' K / V in flight); d192 as d256 (run 211). With the level order in chunks
// (fwd_sm90_tile_chunk; an H100, run 227): d192 s512 / s1k 1.17 / 1.13x, s2k 0.92x; d256
// s512-2k 0.93-0.96x. By the kernel's head dim (fwd_kernel_head_dim). Windows and varlen keep one
// CTA per tile.
// FLASH_CUDA_SM90_PERSIST in the environment (A/B runs, read per call): "0" one CTA per tile
// always, another value persistent always; unset, this rule.
inline bool fwd_sm90_persistent(const FwdParams& p) {
    const EnvChoice env = env_choice("FLASH_CUDA_SM90_PERSIST");
    if (env != EnvChoice::kRule) return env == EnvChoice::kAll;
    if (p.cu_seqlens_q != nullptr || p.window_size_left >= 0) return false;
    if (!p.is_causal) return p.window_size_right < 0;
    if (p.p_keep >= 1.f && env_choice("FLASH_CUDA_SM90_DYNAMIC") != EnvChoice::kOff) {
        return true;  // dynamic tiles (fwd_sm90_dynamic_tiles)
    }
    const int head_dim = fwd_kernel_head_dim(p.d);
    return p.seqlen_q <= 8192 &&
           (head_dim < 192 || p.seqlen_q >= 4096 || (head_dim == 192 && p.seqlen_q <= 1024));
}

// Whether the CTAs of a call take their tiles dynamically (params.sm90_tile_counter, which the
// caller allocates and zeroes; fwd_sm90.cuh TileRing): each CTA starts on tile blockIdx.x and,
// whenever its producer has issued a tile's last K / V load, takes the next from the counter, so
// a CTA whose tiles were short takes more of them, as the hardware hands out the CTAs of a grid.
// The tiles then go in the grid's order (fwd_sm90_tile_chunk: chunks of one pair; the pairs one
// after another, each one's query blocks longest first), which keeps the K / V of the few pairs
// in flight in the L2. Causal persistent calls; the fixed walk's level order keeps the CTAs even
// by its snake but reads the K / V of many pairs at each level (an H100, d128 causal s4k:
// 1.13-1.24 GB from memory for 201 MB of Q / K / V, dynamic 201 MB; 533 against 464 us;
// bench/NOTES.md runs 229-230).
// Only the causal kernels without dropout are built with it (fwd_sm90.cuh kDynamicTiles), and
// only calls with more tiles than the GPU has SMs (num_sms) use it: with no second tile for any
// CTA the counter and its memset (a launch of its own, microseconds against a small call's tens)
// would buy nothing. The caller decides once, by setting params.sm90_tile_counter, which the
// launcher (fwd_sm90_tile_chunk) and the kernel then follow.
// FLASH_CUDA_SM90_DYNAMIC in the environment (A/B runs, tests; read per call): "0" never (the
// fixed walk), another value for every such call (windows and varlen too: one CTA per tile there
// then takes no second tile); unset, this rule.
inline bool fwd_sm90_dynamic_tiles(const FwdParams& p, int num_sms) {
    if (!p.is_causal || p.p_keep < 1.f) return false;
    const EnvChoice env = env_choice("FLASH_CUDA_SM90_DYNAMIC");
    if (env != EnvChoice::kRule) return env == EnvChoice::kAll;
    return fwd_sm90_persistent(p) && fwd_sm90_tiles(p) > num_sms;
}

// The divisors of the kernel's tile index math (fwd_sm90.cuh FwdTile's grid order, the K / V
// head): 128-row query blocks, heads, query heads per KV head; a multiply-high and a shift each
// instead of a run-time division's ~25 instructions (kernels/fast_divisor.h). The launcher and
// the CPU emulator call this.
inline void prepare_fwd_sm90_divisors(FwdParams& p) {
    p.num_m_blocks_div = FastDivisor::make((p.seqlen_q + 127) / 128);  // FwdSm90Traits::kBlockM
    p.sm90_heads_div = FastDivisor::make(p.h);
    p.h_h_k_ratio_div = FastDivisor::make(p.h_h_k_ratio);
}

// Whether a call of the d64 kernel takes key blocks of 192 (FwdSm90Config<64>::WideTraits)
// instead of 128: fixed length, not causal, no window, at least 4096 keys, not pingpong. Measured
// on the H200 (bench/NOTES.md run 161, d64 non-causal, 192 keys and 3 stages against 128 keys):
// s4096 1.06x, s8192 1.11-1.14x, s16384 1.18-1.19x; s512-2048 0.79-0.97x (the last block's
// padding: 2.67 blocks of 192 keys at s512) and causal 0.87-1.00x. FLASH_CUDA_SM90_KEYS192 in
// the environment (tests, A/B runs; read per call): "0" never, another value for every d64
// non-causal call (windows and varlen included); unset, this rule.
inline bool fwd_sm90_wide_key_blocks(const FwdParams& p) {
    if (fwd_kernel_head_dim(p.d) != 64 || p.is_causal || p.sm90_pingpong) return false;
    const EnvChoice env = env_choice("FLASH_CUDA_SM90_KEYS192");
    if (env != EnvChoice::kRule) return env == EnvChoice::kAll;
    return p.cu_seqlens_q == nullptr && p.window_size_left < 0 && p.window_size_right < 0 &&
           p.seqlen_k >= 4096;
}

// The kernel's CTAs: persistent, one per SM (a CTA needs all of an SM's shared memory) and at
// most one per tile; else one per tile.
inline int fwd_sm90_ctas(const FwdParams& p, int num_sms) {
    const int64_t tiles = fwd_sm90_tiles(p);
    return static_cast<int>(
        std::max<int64_t>(1, fwd_sm90_persistent(p) ? std::min<int64_t>(tiles, num_sms) : tiles));
}

// The rank-4 map (column, row, head, batch) of a (b, rows, heads, d) tensor or, varlen, of a
// packed (rows, heads, d) one (batch extent 1), with boxes of 64 columns x box_rows rows and the
// 128-byte swizzle. Fixed length: rows = the sequence length, so the TMA zero-fills past a
// sequence's end; varlen: rows = the packed total (row coordinate = the sequence's start + the
// row). Strides in elements. Returns 0, or the CUresult of the encoding.
inline int encode_rows_map(CUtensorMap* out, const void* base, int d, int64_t rows, int heads,
                           int batch, bool varlen, int64_t row_stride, int64_t head_stride,
                           int64_t batch_stride, uint32_t box_rows) {
    TensorMapDesc m;
    m.base = base;
    m.rank = 4;
    m.dims[0] = static_cast<uint64_t>(d);
    m.dims[1] = static_cast<uint64_t>(rows);
    m.dims[2] = static_cast<uint64_t>(heads);
    m.dims[3] = varlen ? 1 : static_cast<uint64_t>(batch);
    const int64_t strides[4] = {1, row_stride, head_stride, batch_stride};
    for (int i = 1; i < 4; ++i) {
        // A dimension of extent 1 may have any stride in torch (and varlen has no batch
        // stride); the TMA wants multiples of 16 bytes: use the dense one there.
        const uint64_t dense = m.dims[i - 1] * (i == 1 ? 2 : m.strides_bytes[i - 1]);
        m.strides_bytes[i] =
            m.dims[i] == 1 ? (dense + 15) / 16 * 16 : static_cast<uint64_t>(strides[i]) * 2;
    }
    m.box[0] = 64;
    m.box[1] = box_rows;
    m.box[2] = 1;
    m.box[3] = 1;
    m.swizzle_bytes = 128;
    return encode_tensor_map(out, m);
}

struct FwdTensorMaps {
    CUtensorMap q, k, v;
};

// q, k, v maps of a forward call: boxes of q_box_rows query rows and kv_box_rows key rows.
inline int make_fwd_tensor_maps(const FwdParams& p, uint32_t q_box_rows, uint32_t kv_box_rows,
                                FwdTensorMaps* maps) {
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int64_t q_rows = varlen ? p.total_q : p.seqlen_q;
    const int64_t k_rows = varlen ? p.total_k : p.seqlen_k;
    int r = encode_rows_map(&maps->q, p.q_ptr, p.d, q_rows, p.h, p.b, varlen, p.q_row_stride,
                            p.q_head_stride, p.q_batch_stride, q_box_rows);
    if (r == 0) {
        r = encode_rows_map(&maps->k, p.k_ptr, p.d, k_rows, p.h_k, p.b, varlen, p.k_row_stride,
                            p.k_head_stride, p.k_batch_stride, kv_box_rows);
    }
    if (r == 0) {
        r = encode_rows_map(&maps->v, p.v_ptr, p.d, k_rows, p.h_k, p.b, varlen, p.v_row_stride,
                            p.v_head_stride, p.v_batch_stride, kv_box_rows);
    }
    return r;
}

// Whether a call takes the kernel whose O leaves through shared memory and TMA stores
// (FwdSm90Config<HeadDim>::StagedOTraits) rather than 4-byte stores from the registers: fixed
// length (the TMA store clips at seqlen_q; a varlen tile's rows past its sequence belong to the
// next one), not pingpong, the d128, d192 or d256 kernel (head dims padded to them included).
// Measured on the H200 against the register stores: d128 (a 32 KB buffer of its own;
// bench/NOTES.md runs 165, 167) causal s512 / s1k / s2k 1.18 / 1.12-1.14 / 1.06-1.08x, s4k 1.02x
// (GQA 32/8 0.97x), s8k 0.98x; non-causal s512 / s1k 1.09-1.12 / 1.02-1.06x, s2k-8k
// 0.96-0.99x: its short tiles only. d256 (O in the last K and V
// buffers; run 169) 1.01-1.21x on every cell of the grid: every call. d64: never (0.82-1.01x
// with a buffer of its own, run 165; 0.85-0.90x in the last V buffer, run 169). d192 (in the last
// K and V buffers as d256): every call (bench/NOTES.md run 211: registers 0.90-0.99x).
// FLASH_CUDA_SM90_OSTORE in the environment (tests, A/B runs; read per call): "0" never,
// another value for every fixed-length d128 / d192 / d256 call (not pingpong); unset, this rule.
inline bool fwd_sm90_store_o_by_tma(const FwdParams& p) {
    const int head_dim = fwd_kernel_head_dim(p.d);  // the kernel's
    if (head_dim == 64 || p.cu_seqlens_q != nullptr || p.sm90_pingpong) return false;
    const EnvChoice env = env_choice("FLASH_CUDA_SM90_OSTORE");
    if (env != EnvChoice::kRule) return env == EnvChoice::kAll;
    if (head_dim >= 192) return true;
    return p.is_causal ? p.seqlen_q <= 2048 : p.seqlen_k <= 1024;
}

// The bytes of K and V that one (batch, head) pair of a call reads (seqlen_k rows of d 2-byte
// columns each; a GQA group's heads share theirs, so a pair counts its share): the unit of the
// L2 caps of fwd_sm90_tile_chunk and fwd_sm90_tail_pairs.
inline int64_t fwd_sm90_pair_kv_bytes(const FwdParams& p) {
    return std::max<int64_t>(
        1, 2 * static_cast<int64_t>(p.seqlen_k) * p.d * 2 / std::max(1, p.h_h_k_ratio));
}

// The (batch, head) pairs per chunk of a causal persistent call's level order (fwd_sm90.cuh
// FwdTile; FwdParams::sm90_tile_chunk), or 0 for one chunk of all: as many as the L2 (l2_bytes)
// holds twice the K and V of (fwd_sm90_pair_kv_bytes), if that is at least a sixth of the CTAs
// (num_ctas, fwd_sm90_ctas), else 0. Without chunks every level
// re-reads every head's K / V, from memory once they no longer fit the L2. Measured on an H100
// (bench/NOTES.md run 224, causal, against one chunk): d128 s512 / s1k / s2k 1.28 / 1.38 /
// 1.40x, d64 s512-4k 1.08-1.15x (chunks of 25+ pairs); with chunks of 12 or fewer (d128 s4k,
// d64 s8k, d192 / d256 from s4k) 0.67-0.94x: a round of the CTAs then spans more than 6 levels,
// whose tiles' lengths differ too much for the snake to even out, and those calls gain little
// from the L2. FLASH_CUDA_SM90_CHUNK in the environment (tests, A/B runs; read per call): "0" one
// chunk (the walk before session 47), a number N > 0 chunks of N pairs; unset, this rule.
// With dynamic tiles (p.sm90_tile_counter set: fwd_sm90_dynamic_tiles): chunks of 1 pair, i.e.
// the grid's order (each pair's query blocks longest first, pair after pair). The level order in
// the L2's chunks with dynamic tiles (no round to balance then) lost 0.92-0.97x to it at causal
// s512 on every head dim, and was 0.93-1.06x on the longer calls (an H100, bench/NOTES.md run
// 232).
inline int fwd_sm90_tile_chunk(const FwdParams& p, int64_t l2_bytes, int num_ctas) {
    const int64_t pairs = static_cast<int64_t>(p.b) * p.h;
    long n = 0;
    if (env_number("FLASH_CUDA_SM90_CHUNK", &n)) {
        return n > 0 ? static_cast<int>(std::min<int64_t>(n, pairs)) : 0;
    }
    if (p.sm90_tile_counter != nullptr) return 1;
    const int64_t chunk = std::min<int64_t>(l2_bytes / 2 / fwd_sm90_pair_kv_bytes(p), pairs);
    return 6 * chunk >= num_ctas ? static_cast<int>(chunk) : 0;
}

// The (batch, head) pairs at the end of a walk with dynamic tiles (p.sm90_tile_counter set) that
// form a chunk of their own in the level order (fwd_sm90.cuh FwdTile; FwdParams::
// sm90_tail_pairs), or 0. In the grid's order the last pair's longest query block (num_m_blocks
// key blocks) is handed out when the CTAs have about one pair's work left between them, and the
// CTA that takes it may run alone at the end. With the last pairs in the level order their
// longest tiles go first and the call ends on short ones. The tail takes the pairs of twice the
// CTAs' count of tiles (a list-scheduling model of the tiles put 2x within 1% of 4x and 8x), at
// most a quarter of the CTAs' count of pairs (s512 / s1k: 33 at 132 SMs, the tail measured
// there; the model put 66 within 1% of 33 at s512) and as many as the L2 holds twice the K and V
// of, from 4 query blocks per pair (512 rows). Measured against no tail (an H100, bench/NOTES.md
// runs 233-235, causal): s512 1.01-1.04x, s1k-4k d64 1.00-1.03x, d128 1.00-1.05x, d192 / d256
// 1.02-1.08x; s8k 0.95-1.08x and s16k within that machine's noise. FLASH_CUDA_SM90_TAIL in the
// environment (tests, A/B runs; read per call): a number N >= 0, a tail of N pairs (0: none);
// unset, this rule.
inline int fwd_sm90_tail_pairs(const FwdParams& p, int64_t l2_bytes, int num_ctas) {
    if (p.sm90_tile_counter == nullptr) return 0;
    const int64_t pairs = static_cast<int64_t>(p.b) * p.h;
    long n = 0;
    if (env_number("FLASH_CUDA_SM90_TAIL", &n)) {
        return static_cast<int>(std::clamp<int64_t>(n, 0, pairs));
    }
    const int64_t num_m_blocks = (p.seqlen_q + 127) / 128;  // FwdSm90Traits::kBlockM
    if (num_m_blocks < 4) return 0;
    const int64_t tail =
        std::min({(2 * num_ctas + num_m_blocks - 1) / num_m_blocks, int64_t{num_ctas + 3} / 4,
                  l2_bytes / 2 / fwd_sm90_pair_kv_bytes(p), pairs});
    return tail >= 2 ? static_cast<int>(tail) : 0;
}

// The level order's divisors (fwd_sm90.cuh FwdTile::make; FwdParams::sm90_chunk_tiles_div ...)
// from the call's chunk and tail (sm90_tile_chunk, sm90_tail_pairs: set those first): its index
// math then takes a multiply-high and a shift per division instead of three run-time divisions,
// some 75 instructions and 300 cycles in series ahead of every tile's first load wait (the
// causal calls' consumers, bench/NOTES.md session 52). The pairs before the tail (the body) go in
// chunks of sm90_tile_chunk pairs (0, or not fewer than the body: one chunk of all of them), the
// last one shorter where the chunks do not divide the body.
inline void prepare_fwd_sm90_level_order(FwdParams& p) {
    const int pairs = p.b * p.h;
    const int body = pairs - p.sm90_tail_pairs;
    const int chunk =
        p.sm90_tile_chunk > 0 && p.sm90_tile_chunk < body ? p.sm90_tile_chunk : std::max(body, 1);
    const int last_chunk = body > 0 ? body - (body - 1) / chunk * chunk : 1;
    p.sm90_chunk_tiles_div = FastDivisor::make(chunk * p.num_m_blocks_div.value());
    p.sm90_chunk_pairs_div = FastDivisor::make(chunk);
    p.sm90_last_chunk_pairs_div = FastDivisor::make(last_chunk);
    p.sm90_tail_pairs_div = FastDivisor::make(p.sm90_tail_pairs);
}

// Whether every tile of a call has rows and a visible key for one of them (FwdParams::
// sm90_every_tile_has_work): fixed length (a varlen tile may lie past its sequence's end) with at
// least as many keys as queries (row i then sees key i + seqlen_k - seqlen_q, whatever the causal
// mask or window; with fewer keys the first rows of a causal call see none).
inline bool fwd_sm90_every_tile_has_work(const FwdParams& p) {
    return p.cu_seqlens_q == nullptr && p.seqlen_k >= p.seqlen_q && p.seqlen_k > 0;
}

// Whether a causal call of a kernel built to issue a tile's first S at the end of the tile before
// (FwdSm90Traits::carries_first_s: d64's) runs it (with_fwd_sm90_traits; after
// sm90_every_tile_has_work is set). Only where every tile has work; there, by the rule, where a
// row sees 512 keys or more on average (causal: seqlen_k - seqlen_q / 2, at most the window):
// measured on an H100 (bench/NOTES.md run 252) at s1k-16k 1.02-1.05x, at s512 (256 keys a row)
// 0.93-0.97x. FLASH_CUDA_SM90_CARRY=0 never, another value wherever every tile has work (tests,
// A/B runs; read per call). Otherwise the call runs the same traits without it
// (FwdSm90Config::UncarriedTraits). (d64's non-causal kernels carry it on every call and have no
// such twin.)
inline bool fwd_sm90_carry_first_s(const FwdParams& p) {
    if (!p.sm90_every_tile_has_work) return false;
    const EnvChoice choice = env_choice("FLASH_CUDA_SM90_CARRY");
    if (choice != EnvChoice::kRule) return choice == EnvChoice::kAll;
    long keys_per_row = long(p.seqlen_k) - p.seqlen_q / 2;
    if (p.window_size_left >= 0) keys_per_row = std::min(keys_per_row, p.window_size_left + 1L);
    return keys_per_row >= 512;
}

// The map of the output o (fixed length: (column, row, head, batch), rows = seqlen_q, boxes of 64
// columns x 64 rows), for the kernel's TMA stores of O (store_o_by_tma: the kernel's
// kStoreOByTma); else zeroed, unused. Returns 0 or the CUresult.
inline int make_fwd_out_map(const FwdParams& p, bool store_o_by_tma, CUtensorMap* map) {
    *map = CUtensorMap{};
    if (!store_o_by_tma) return 0;
    return encode_rows_map(map, p.o_ptr, p.d, p.seqlen_q, p.h, p.b, false, p.o_row_stride,
                           p.o_head_stride, p.o_batch_stride, 64);
}

}  // namespace sm90
}  // namespace flash_cuda
