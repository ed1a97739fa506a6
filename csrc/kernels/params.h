// Plain parameter structs handed from flash_api.cpp (the only file that sees at::Tensor) to the
// kernels. No torch headers here or below: kernel translation units must compile fast and be
// usable from plain CUDA C++.
//
// Layouts (all strides in elements, 64-bit so tensors over 2^31 elements work):
//   fixed length : q (b, seqlen_q, h, d), k/v (b, seqlen_k, h_k, d), o like q
//   varlen       : q (total_q, h, d), k/v (total_k, h_k, d); batch strides unused, the start
//                  row of sequence i is cu_seqlens_q[i] / cu_seqlens_k[i]
//   paged KV     : k/v (num_blocks, page_block_size, h_k, d), logical key j of batch i lives in
//                  block block_table[i * block_table_batch_stride + j / page_block_size],
//                  row j % page_block_size
//   lse          : fp32 (b, h, seqlen_q) fixed length, (h, total_q) varlen (unpadded_lse)
// The last dimension (head dim) is always contiguous.
#pragma once

#include <cstdint>

#include "kernels/fast_divisor.h"

namespace flash_cuda {

// Inputs shared by forward and backward: Q, K, V pointers, strides and head counts.
struct QKVParams {
    void* __restrict__ q_ptr;
    void* __restrict__ k_ptr;
    void* __restrict__ v_ptr;

    int64_t q_batch_stride, k_batch_stride, v_batch_stride;
    int64_t q_row_stride, k_row_stride, v_row_stride;
    int64_t q_head_stride, k_head_stride, v_head_stride;

    int h;          // query heads
    int h_k;        // key/value heads (h % h_k == 0: MQA/GQA)
    int h_h_k_ratio;  // h / h_k: query head i reads KV head i / h_h_k_ratio
};

struct FwdParams : public QKVParams {
    // Output (b, seqlen_q, h, d) in the input dtype.
    void* __restrict__ o_ptr;
    int64_t o_batch_stride, o_row_stride, o_head_stride;

    // Split-KV partial results, fp32: oaccum (num_splits, b, h, seqlen_q, d_rounded),
    // lseaccum (num_splits, b, h, seqlen_q). Only used when num_splits > 1.
    void* __restrict__ oaccum_ptr;
    float* __restrict__ softmax_lseaccum_ptr;

    // Log-sum-exp of the scaled (softcapped, biased) scores per query row, natural log, fp32.
    float* __restrict__ softmax_lse_ptr;

    // S_dmask (b, h, seqlen_q_rounded, seqlen_k_rounded) in the input dtype, only when
    // return_softmax is set (dropout debugging). nullptr otherwise.
    void* __restrict__ p_ptr;

    int b, seqlen_q, seqlen_k, d;
    int seqlen_q_rounded, seqlen_k_rounded, d_rounded;  // rounded up to 128, 128, kernel head dim
    int total_q;  // varlen: rows of packed q
    int total_k;  // varlen: rows of packed k / v

    // Softmax scale and its base-2 form (scale * log2(e)), folded into one FFMA before exp2.
    float scale_softmax;
    float scale_softmax_log2;
    // softcap > 0: scores become softcap * tanh(scale * s / softcap) before masking.
    float softcap;
    // Derived by set_score_scales(): scale_softmax / softcap and softcap * log2(e), so the
    // kernels read them from the constant bank instead of keeping them in registers.
    float softcap_pre_scale;
    float softcap_log2;

    // varlen: cumulative sequence starts, int32 (b + 1). nullptr for fixed length.
    int* __restrict__ cu_seqlens_q;
    int* __restrict__ cu_seqlens_k;
    // Optional per-batch number of keys actually used, int32 (b): overrides cu_seqlens_k /
    // seqlen_k (KV cache: cache_seqlens).
    int* __restrict__ seqused_k;
    // Optional per-batch first key row of the cache, int32 (b) (KV cache: cache_leftpad).
    int* __restrict__ leftpad_k;
    // true when cu_seqlens_k holds cumulative starts; false when it holds per-batch lengths.
    bool is_seqlens_k_cumulative;

    // KV cache append: new keys/values (b, seqlen_knew, h_k, d) written into k/v at seqused_k.
    void* __restrict__ knew_ptr;
    void* __restrict__ vnew_ptr;
    int64_t knew_batch_stride, vnew_batch_stride;
    int64_t knew_row_stride, vnew_row_stride;
    int64_t knew_head_stride, vnew_head_stride;
    int seqlen_knew;

    // Rotary embedding: cos/sin (seqlen_ro, rotary_dim / 2) in the input dtype.
    void* __restrict__ rotary_cos_ptr;
    void* __restrict__ rotary_sin_ptr;
    int rotary_dim;
    bool is_rotary_interleaved;

    // KV cache: batch i reads cache row cache_batch_idx[i], int32 (b). nullptr: identity.
    int* __restrict__ cache_batch_idx;
    // Rows of the contiguous cache (k.size(0)): cache_batch_idx is clamped into [0, rows) on the
    // device (0: no clamp). See sm80/fwd.cuh SequenceInfo on the device-side bounds.
    int kv_cache_rows;

    // Paged KV cache. block_table_cols and num_pages (k.size(0)) bound the sequence length and
    // the block-table entries on the device (0: no bound).
    int* __restrict__ block_table;
    int64_t block_table_batch_stride;
    int page_block_size;
    int block_table_cols;
    int num_pages;

    // Dropout: p_keep = 1 - dropout_p; an element is kept when its 16-bit Philox draw (see
    // philox.cuh) is < p_keep_threshold; kept values are scaled by rp_keep = 1 / p_keep.
    float p_keep;
    uint32_t p_keep_threshold;
    float rp_keep;
    // Philox seed and offset, and where the forward writes them (int64 (2) on the device) so the
    // backward replays the same mask.
    uint64_t philox_seed;
    uint64_t philox_offset;
    int64_t* __restrict__ rng_state;
    // CUDA graph capture (torch's PhiloxCudaState): when set, the kernels read the seed and
    // offset on the device, seed = *philox_seed_ptr, offset = *philox_offset_ptr +
    // philox_offset_intragraph, instead of philox_seed / philox_offset.
    const int64_t* philox_seed_ptr;
    const int64_t* philox_offset_ptr;
    uint64_t philox_offset_intragraph;

    // Local (sliding window) attention, bottom-right aligned; -1 = unbounded.
    int window_size_left, window_size_right;

    // ALiBi: fp32 slopes (h) or (b, h); bias = -slope * |i + seqlen_k - seqlen_q - j|.
    void* __restrict__ alibi_slopes_ptr;
    int64_t alibi_slopes_batch_stride;

    bool is_bf16;
    bool is_causal;
    bool unpadded_lse;  // lse laid out (h, total_q) (varlen)

    int num_splits;  // split-KV count (1 = no split)
    // GQA packing in the kernel (decode tile, fixed-length q; kernels/decode.h): > 1 = the
    // gqa_pack = h / h_k query heads of a KV head share one CTA, tile row r being query position
    // r / gqa_pack of head kv_head * gqa_pack + r % gqa_pack. 0 or 1: off.
    int gqa_pack;
    // The kvcache op's d128 key-split calls that take 128-key blocks through one K/V stage
    // (kernels/decode.h plan_key_blocks; sm80/decode_keysplit.cuh FwdDecodeKeySplitConfig::
    // TraitsWide for 16 rows, TraitsWide32 for 32).
    bool wide_key_blocks;
    // The kvcache op's key-split calls on sm_90 that run the warp-specialised tiles (producer
    // warps fill a ring of 64-key K/V slots; kernels/decode.h plan_decode_tile,
    // sm80/kv_ring.cuh). wide_key_blocks is false with it.
    bool kv_ring;
    // Paged calls on the 16-row 128-key tile (kernels/decode.h plan_kv_overlap): the launcher
    // runs its twin that issues each block's V copy once every warp has read the previous V
    // tile, with the block's K copy, instead of once its K has landed (sm80/fwd.cuh).
    bool kv_overlap;
    // Head groups (kernels/decode.h plan_packing; the kvcache op's one-token steps on
    // contiguous caches): > 1 = the query rows of head_group KV heads share one key-split tile
    // (head_group_rows = h / h_k rows per KV head), whose key columns are the (key, KV head)
    // pairs of those heads: column j is key j / head_group of the tile's KV head j % head_group.
    // k/v_head_stride are then the strides between tiles (head_group heads), and
    // k/v_group_head_stride those between the heads of one tile. 0 or 1: off.
    int head_group;
    int head_group_rows;
    int64_t k_group_head_stride, v_group_head_stride;

    // The divisors of the sm80 forward kernel's index math (kernels/fast_divisor.h: a
    // multiply-high and a shift each instead of an emulated division), made from the fields
    // above by sm80/fwd.cuh prepare_fwd_grid, through which every launch of that kernel goes.
    FastDivisor num_m_blocks_div;     // the grid's query blocks (decode tile: per split)
    FastDivisor num_splits_div;
    FastDivisor gqa_pack_div;         // 1 when gqa_pack is off
    FastDivisor h_h_k_ratio_div;
    FastDivisor head_group_rows_div;  // 1 when head groups are off
    // The sm90 forward's (sm90/fwd_sm90_host.h prepare_fwd_sm90_divisors, with num_m_blocks_div
    // of 128-row blocks and h_h_k_ratio_div): the heads, for its tile index math.
    FastDivisor sm90_heads_div;

    // Tuning builds only (sm80/tune_configs.h): which tile configuration to launch; 0 = default.
    int tile_variant;
    // sm90 forward (kernels/sm90/fwd_sm90.cuh): the pingpong variant, the two consumer
    // warpgroups taking turns at the tensor cores (FLASH_CUDA_SM90=pingpong; A/B runs).
    bool sm90_pingpong;
    // sm90 forward, causal persistent calls (the level order, fwd_sm90.cuh FwdTile, which reads
    // the divisors below): the (batch, head) pairs per chunk of the walk (fwd_sm90_host.h
    // fwd_sm90_tile_chunk); 0: one chunk.
    int sm90_tile_chunk;
    // sm90 forward with dynamic tiles: the (batch, head) pairs at the end of the walk taken in
    // the level order, as one chunk of their own (fwd_sm90_host.h fwd_sm90_tail_pairs); 0: none.
    int sm90_tail_pairs;
    // The level order's divisors (fwd_sm90_host.h prepare_fwd_sm90_level_order, from the two
    // fields above): tiles of a whole chunk (its pairs x the query blocks), pairs of a whole
    // chunk, of the last chunk before the tail (fewer where the chunks do not divide the pairs),
    // and of the tail.
    FastDivisor sm90_chunk_tiles_div;
    FastDivisor sm90_chunk_pairs_div;
    FastDivisor sm90_last_chunk_pairs_div;
    FastDivisor sm90_tail_pairs_div;
    // sm90 forward: every tile has rows and a visible key (fwd_sm90_host.h
    // fwd_sm90_every_tile_has_work), so a tile's first S can be issued before its work is known.
    bool sm90_every_tile_has_work;
    // sm90 forward, persistent calls with dynamic tiles (fwd_sm90_host.h fwd_sm90_dynamic_tiles):
    // one int, zeroed before the launch, from which each CTA takes its next tile (atomicAdd);
    // nullptr: each CTA walks its tiles in a fixed order.
    int* sm90_tile_counter;
    // Split-KV decode (flash_api.cpp, sm_90 devices): the combine kernel is launched with
    // programmatic dependent launch, so its CTAs are scheduled while the attention kernel's last
    // CTAs run and wait in griddepcontrol.wait (FLASH_CUDA_PDL=0: a plain launch; A/B runs).
    bool combine_pdl;
    // KV-cache step that appended (flash_api.cpp, sm_90 devices): the split-KV attention kernel
    // is launched with programmatic dependent launch after the append kernel, so its launch
    // overlaps the append's last CTAs (kvcache_append.cuh triggers at its end) and its CTAs wait
    // in griddepcontrol.wait before their first global access (sm80/fwd.cuh). Ignored by the
    // kernels without kSplitKV, which do not wait.
    bool launch_pdl;
};

struct BwdParams : public FwdParams {
    // Gradient of the output, same layout as o.
    void* __restrict__ do_ptr;
    int64_t do_batch_stride, do_row_stride, do_head_stride;

    // Gradients of q, k, v in the input dtype, laid out like q, k, v. For GQA dk/dv are first
    // accumulated per query head (dk_expanded) and summed over each group afterwards.
    void* __restrict__ dq_ptr;
    void* __restrict__ dk_ptr;
    void* __restrict__ dv_ptr;
    int64_t dq_batch_stride, dk_batch_stride, dv_batch_stride;
    int64_t dq_row_stride, dk_row_stride, dv_row_stride;
    int64_t dq_head_stride, dk_head_stride, dv_head_stride;

    // fp32 workspaces: dq_accum (b, seqlen_q_rounded, h, d_rounded); dk/dv_accum for GQA.
    void* __restrict__ dq_accum_ptr;
    // float4s of dq_accum (from its start) that the preprocess kernel zeroes before the main
    // kernel adds to them (one launch fewer than a memset); 0: the caller zeroed it.
    int64_t dq_accum_zero_vec4;
    void* __restrict__ dk_accum_ptr;
    void* __restrict__ dv_accum_ptr;
    // MHA (h == h_k): the main kernel writes dk / dv directly (dk_accum / dv_accum unused; the
    // outputs contiguous with d a multiple of 8).
    bool dkv_direct;

    // D = rowsum(dO * O), fp32 (b, h, seqlen_q_rounded).
    void* __restrict__ dsoftmax_sum;

    // Deterministic mode. sm80 backward: num_splits dq_accum slices, dq_accum_split_stride
    // floats apart, each accumulated by one CTA in a fixed order (bwd.cuh). sm90 backward: one
    // slice, and dq_semaphore (b, h, seqlen_q_rounded / 64) ints, zeroed, order the CTAs'
    // additions per 64-query block (bwd_sm90.cuh DqTurns).
    int* __restrict__ dq_semaphore;
    bool deterministic;
    int64_t dq_accum_split_stride;
};

// Sets the softmax scale, the softcap and the factors derived from them (host side).
inline void set_score_scales(FwdParams& params, float softmax_scale, float softcap) {
    constexpr float kLog2e = 1.4426950408889634f;
    params.scale_softmax = softmax_scale;
    params.scale_softmax_log2 = softmax_scale * kLog2e;
    params.softcap = softcap;
    params.softcap_pre_scale = softcap > 0.f ? softmax_scale / softcap : 0.f;
    params.softcap_log2 = softcap * kLog2e;
}

}  // namespace flash_cuda
