// Parameters of the KV-cache append step (kernels/kvcache_append.cuh): the work
// flash_attn_with_kvcache does before attention. Plain struct, no torch headers.
//
// Layouts (strides in elements, 64-bit; the head dim is contiguous everywhere):
//   new tokens : knew / vnew (b, seqlen_new, h_k, d)
//   caches     : contiguous (batch_cache, capacity, h_k, d), batch i of q uses cache row
//                cache_batch_idx[i] (identity when nullptr); or paged (num_blocks, page_size,
//                h_k, d), logical position p of batch i in block
//                block_table[i * block_table_batch_stride + p / page_size], row p % page_size
//   q / q_rot  : (b, seqlen_q, h, d)
//   rotary     : cos / sin (seqlen_ro, rotary_dim / 2), contiguous, the input dtype
#pragma once

#include <cstdint>

namespace flash_cuda {

struct KvAppendParams {
    int b;           // batch of q / the new tokens
    int seqlen_new;  // new tokens per sequence (0: nothing appended)
    int h_k;         // key/value heads
    int d;           // head dim (<= 256), any value

    // New keys and values; unused when seqlen_new == 0.
    const void* __restrict__ knew_ptr;
    const void* __restrict__ vnew_ptr;
    int64_t knew_batch_stride, knew_row_stride, knew_head_stride;
    int64_t vnew_batch_stride, vnew_row_stride, vnew_head_stride;

    // Caches, written in place. Paged: the batch stride is the block stride.
    void* __restrict__ kcache_ptr;
    void* __restrict__ vcache_ptr;
    int64_t kcache_batch_stride, kcache_row_stride, kcache_head_stride;
    int64_t vcache_batch_stride, vcache_row_stride, vcache_head_stride;
    int cache_batch;  // k_cache.size(0): cache sequences (contiguous) or blocks (paged)
    int64_t capacity;  // keys one sequence holds: k_cache.size(1), or max_blocks * page_size

    // int32 (b): where sequence i's new tokens start. nullptr: at `capacity` (no cache_seqlens;
    // only possible without new tokens).
    const int* __restrict__ cache_seqlens;
    // int32 (b), written (nullptr: not): the attention's key counts cache_seqlens[i] +
    // seqlen_new (the kernel's block 0 writes them, so the step needs no separate add kernel).
    int* __restrict__ seqlens_out;
    // int32 (b): cache row of batch i (contiguous caches). nullptr: identity.
    const int* __restrict__ cache_batch_idx;
    // int32 (b, max_blocks) paged caches; nullptr: contiguous.
    const int* __restrict__ block_table;
    int64_t block_table_batch_stride;
    int max_blocks;
    int page_size;

    // Rotary embedding (rotary_dim > 0): applied to the new keys before they are stored, and to
    // q (written to q_rot). Pairs (x[2m], x[2m+1]) when interleaved, else (x[m], x[m + r/2]);
    // columns >= rotary_dim are copied. Key t of sequence i sits at position
    // cache_seqlens[i] + t; query row t at cache_seqlens[i] + t when q_positions_per_row
    // (causal or local mask), else at cache_seqlens[i].
    int rotary_dim;  // 0: no rotary (q_rot is not written)
    int seqlen_ro;
    bool rotary_interleaved;
    bool q_positions_per_row;
    const void* __restrict__ rotary_cos_ptr;
    const void* __restrict__ rotary_sin_ptr;
    const void* __restrict__ q_ptr;
    void* __restrict__ qrot_ptr;
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t qrot_batch_stride, qrot_row_stride, qrot_head_stride;
    int seqlen_q;
    int h;
};

}  // namespace flash_cuda
