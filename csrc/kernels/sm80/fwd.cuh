// FlashAttention-2-style forward on tensor cores with mma.sync (sm80+: Ampere, Ada, Hopper).
//
// One CTA = kBlockM query rows of one (batch, head):
//   Q tile    -> shared memory once (cp.async), read by ldmatrix every key block
//   for key blocks n = last .. first (only those some row of the tile can see):
//     K_n, V_n  -> shared memory through cp.async (kStages buffers each, loads run ahead)
//     S = Q K_n^T                fp32 accumulators in registers (warp_gemm.cuh)
//     softcap / ALiBi / mask     on the fragments (mask.cuh); masking only on edge blocks
//     online softmax             row max/sum by quad shuffles, O rescaled (softmax.cuh)
//     O += P V_n, l += P 1       P converted in registers into the A operand; the row sums l
//                                of the 16-bit P come from the tensor cores (softmax.cuh)
//     dropout (IsDropout)        dropped elements of P zeroed after the row sums, before P V
//                                (dropout.cuh); O scaled by 1 / p_keep at the end
//   O / l -> shared memory (over the Q tile) -> global with 16-byte stores; lse per row.
// Key blocks run from the last to the first so the blocks that need masking on the causal
// diagonal / sequence end come first and the rest run without mask code.
// The warp-specialised key-split tile (sm_90; Traits::kProducerWarps > 0, kv_ring.cuh) runs the
// same loop on its compute warps, whose K / V tiles come from producer warps through a ring of
// mbarrier-tracked slots instead of their own cp.async groups. The key-split tile's head-group
// twin (Traits::kHeadGroups, kernels/decode.h plan_packing) runs it over key columns that are
// the (key, KV head) pairs of several KV heads: its copies address those rows (load_kv_tile)
// and every block masks the columns of other heads than a row's (mask.cuh).
//
// Tensors (elements; strides from FwdParams, 64-bit offsets):
//   q (b, seqlen_q, h, d)  or packed (total_q, h, d) with cu_seqlens_q
//   k, v (b, seqlen_k, h_k, d)  or packed (total_k, h_k, d) with cu_seqlens_k
//   o like q (written only for rows < seqlen_q and columns < d)
//   lse fp32 (b, h, seqlen_q), or (h, total_q) when params.unpadded_lse
// Grid (ceil(max seqlen_q / kBlockM), b, h), kNThreads threads, Traits::kSmemBytes dynamic
// shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/dropout.cuh"
#include "kernels/mask.cuh"
#include "kernels/params.h"
#include "kernels/ptx.cuh"
#include "kernels/softmax.cuh"
#include "kernels/sm80/decode_keysplit.cuh"
#include "kernels/sm80/kv_ring.cuh"
#include "kernels/sm80/traits.h"
#include "kernels/sm80/warp_gemm.cuh"

namespace flash_cuda {
namespace sm80 {

// The per-sequence integers, each a predicated load with no branch before it (0 where the
// pointer is null), issued from the kernel's first instructions: the Q tile (varlen), the key
// range and with it the first K/V copies wait on them. (Loaded inside SequenceInfo's branches
// and after the grid-coordinate divisions, cache_seqlens was issued 156 instructions into the
// d128 decode kernel, now 36.)
struct SequenceLoads {
    int q_start, q_end;  // cu_seqlens_q[batch], [batch + 1]
    int k_start, k_end;  // cu_seqlens_k[batch], [batch + 1]
    int cache_row;       // KV cache: batch entry i reads cache sequence cache_batch_idx[i]
    int seqused;         // seqused_k[batch] (cache_seqlens)
    int leftpad;         // leftpad_k[batch] (cache_leftpad)

    __device__ __forceinline__ static SequenceLoads issue(const FwdParams& params, int batch) {
        SequenceLoads l;
        const bool varlen_q = params.cu_seqlens_q != nullptr;
        const bool varlen_k = params.cu_seqlens_k != nullptr;
        l.q_start = varlen_q ? params.cu_seqlens_q[batch] : 0;
        l.q_end = varlen_q ? params.cu_seqlens_q[batch + 1] : 0;
        l.k_start = varlen_k ? params.cu_seqlens_k[batch] : 0;
        l.k_end = varlen_k ? params.cu_seqlens_k[batch + 1] : 0;
        l.cache_row = params.cache_batch_idx != nullptr ? params.cache_batch_idx[batch] : batch;
        l.seqused = params.seqused_k != nullptr ? params.seqused_k[batch] : 0;
        l.leftpad = params.leftpad_k != nullptr ? params.leftpad_k[batch] : 0;
        return l;
    }
};

// Where one batch entry's rows start and how many there are (fixed length or varlen; KV cache
// with cache_batch_idx / cache_leftpad; paged KV). Two halves, so that the kernel can issue its
// Q copy between them: set_query_rows consumes only cu_seqlens_q (nothing loaded with
// fixed-length q), set_keys the rest of the loads.
struct SequenceInfo {
    int64_t q_offset;   // element offset of row 0 of q (o uses the same rows)
    int64_t o_offset;
    int64_t k_offset;   // element offset of row 0 of k / v (head 0); 0 when paged
    int64_t v_offset;
    int q_start;        // varlen: first packed row of the sequence (lse index), else 0
    int seqlen_q;
    int seqlen_k;
    int k_pos0;         // paged: cache position of key 0 (cache_leftpad), else 0

    __device__ __forceinline__ static SequenceInfo make(const FwdParams& params, int batch) {
        const SequenceLoads loads = SequenceLoads::issue(params, batch);
        SequenceInfo info;
        info.set_query_rows(params, batch, loads);
        info.set_keys(params, loads);
        return info;
    }

    __device__ __forceinline__ void set_query_rows(const FwdParams& params, int batch,
                                                   const SequenceLoads& loads) {
        if (params.cu_seqlens_q != nullptr) {
            q_start = loads.q_start;
            seqlen_q = loads.q_end - loads.q_start;
            q_offset = static_cast<int64_t>(loads.q_start) * params.q_row_stride;
            o_offset = static_cast<int64_t>(loads.q_start) * params.o_row_stride;
        } else {
            q_start = 0;
            seqlen_q = params.seqlen_q;
            q_offset = static_cast<int64_t>(batch) * params.q_batch_stride;
            o_offset = static_cast<int64_t>(batch) * params.o_batch_stride;
        }
    }

    __device__ __forceinline__ void set_keys(const FwdParams& params, const SequenceLoads& loads) {
        if (params.cu_seqlens_k != nullptr) {
            seqlen_k = loads.k_end - loads.k_start;
            k_offset = static_cast<int64_t>(loads.k_start) * params.k_row_stride;
            v_offset = static_cast<int64_t>(loads.k_start) * params.v_row_stride;
        } else {
            // KV cache: the cache row, clamped into the cache (see the device-side bounds below).
            int row = loads.cache_row;
            if (params.cache_batch_idx != nullptr && params.kv_cache_rows > 0) {
                row = min(max(row, 0), params.kv_cache_rows - 1);
            }
            seqlen_k = params.seqlen_k;
            k_offset = static_cast<int64_t>(row) * params.k_batch_stride;
            v_offset = static_cast<int64_t>(row) * params.v_batch_stride;
        }
        if (params.seqused_k != nullptr) seqlen_k = loads.seqused;
        // Device-side bounds. The host's value checks reject a cache_batch_idx, cache_seqlens,
        // cache_leftpad or block table that would reach past the cache, but they do not run in
        // CUDA-graph capture or with FLASH_CUDA_CHECK_VALUES=0, and a stale kept host copy can
        // miss a bad value: clamped here, such a call reads inside its tensors (its results are
        // then those of the clamped values, not an error). A paged sequence is at most its
        // block-table row (block_table_cols pages), a contiguous KV-cache one at most the
        // capacity (seqlen_k); entries of the table are clamped where a row's address is formed
        // (PagedKVRows::clamp_page in load_kv_tile).
        if (params.block_table != nullptr && params.block_table_cols > 0) {
            seqlen_k = static_cast<int>(
                min(static_cast<int64_t>(seqlen_k),
                    static_cast<int64_t>(params.block_table_cols) * params.page_block_size));
        } else if (params.cu_seqlens_k == nullptr) {
            seqlen_k = min(seqlen_k, params.seqlen_k);
        }
        seqlen_k = max(seqlen_k, 0);
        // Paged: key positions go through the block table (k/v batch strides are the physical
        // block strides), so the sequence starts at block-table position 0.
        if (params.block_table != nullptr) k_offset = v_offset = 0;
        k_pos0 = 0;
        // KV cache with left padding: keys [leftpad, seqused_k) of the cache row.
        if (params.leftpad_k != nullptr) {
            const int pad = min(max(loads.leftpad, 0), seqlen_k);
            seqlen_k -= pad;
            if (params.block_table != nullptr) {
                k_pos0 = pad;
            } else {
                k_offset += static_cast<int64_t>(pad) * params.k_row_stride;
                v_offset += static_cast<int64_t>(pad) * params.v_row_stride;
            }
        }
    }
};

// Where this CTA's keys and values come from: key 0 of this sequence and KV head in k / v (paged:
// block-table position 0 of this KV head), and for a paged cache the cache position of key 0.
struct KVSource {
    const void* k_seq;
    const void* v_seq;
    int pos0;
};

// Values shared by the CTA and needed only now and then in the main loop (see the kernel).
struct CtaScalars {
    KVSource kv;
    int unmasked_keys_begin;  // key blocks inside [begin, end) for every row need no mask
    int unmasked_keys_end;
    int diag;                 // seqlen_k - seqlen_q
    KeyRange key_range;       // visible keys per query row
    float alibi_slope;        // this (batch, head)'s ALiBi slope (ALiBi kernels only)
    uint64_t dropout_seed;    // dropout (IsDropout): Philox key and stream of this (batch, head)
    uint64_t dropout_stream;
};

// Grid. 128-row tile: (m blocks, b, h). Decode tile (Traits::kSplitKV): (h, b, splits x m
// blocks), heads fastest, so the CTAs of the query heads that share a KV head (unpacked GQA:
// several query rows, ALiBi, left windows) run side by side and read each K/V tile from L2
// rather than from DRAM once per head. The last dimension is split-major:
// blockIdx.z = split * (m blocks) + m-block index.
// Split-KV (params.num_splits > 1): split s of a tile handles the s-th of num_splits equal
// contiguous ranges of the key blocks the tile can see, and writes fp32 partial results:
//   oaccum   (num_splits, b, h, seqlen_q, d_rounded)   O of the split, normalised by its own sum
//   lseaccum (num_splits, b, h, seqlen_q)             lse of the split; -inf: saw no key
// (combine.cu merges them). Fixed-length q only (lse layout (b, h, seqlen_q)).
struct BlockCoords {
    int m_index;  // m block, in launch order
    int num_m_blocks;
    int split;
    int head;
};
template <typename Traits>
__device__ __forceinline__ BlockCoords block_coords(const FwdParams& params) {
    BlockCoords c;
    if constexpr (Traits::kSplitKV) {
        c.head = blockIdx.x;
        c.num_m_blocks = params.num_m_blocks_div.value();  // gridDim.z / num_splits
        c.split = params.num_splits > 1 ? params.num_m_blocks_div.div(blockIdx.z) : 0;
        c.m_index = blockIdx.z - c.split * c.num_m_blocks;
    } else {
        c.head = blockIdx.z;
        c.num_m_blocks = gridDim.x;
        c.split = 0;
        c.m_index = blockIdx.x;
    }
    return c;
}

// Host: the kernel's grid on tile Traits (see block_coords) and the divisors its index math
// takes from the params (FwdParams::*_div). Every launch of the kernel goes through it.
template <typename Traits>
inline dim3 prepare_fwd_grid(FwdParams& params) {
    // In-kernel GQA packing (decode tile): one CTA column per KV head, gqa_pack rows per query.
    const bool packed = Traits::kPackGQA && params.gqa_pack > 1;
    const int64_t rows = static_cast<int64_t>(params.seqlen_q) * (packed ? params.gqa_pack : 1);
    const int num_m_blocks = static_cast<int>((rows + Traits::kBlockM - 1) / Traits::kBlockM);
    const int grid_heads = packed ? params.h / params.gqa_pack : params.h;
    params.num_m_blocks_div = FastDivisor::make(num_m_blocks);
    params.num_splits_div = FastDivisor::make(params.num_splits);
    params.gqa_pack_div = FastDivisor::make(packed ? params.gqa_pack : 1);
    params.h_h_k_ratio_div = FastDivisor::make(params.h_h_k_ratio);
    params.head_group_rows_div =
        FastDivisor::make(params.head_group > 1 ? params.head_group_rows : 1);
    // The decode tile: heads along x, splits x m blocks along z (split-major); the 128-row
    // tile: m blocks along x, heads along z.
    // (Over 65535 along z the launcher refuses the call; the product is formed in 64 bits.)
    const int64_t m_split_blocks = static_cast<int64_t>(num_m_blocks) * params.num_splits;
    return Traits::kSplitKV ? dim3(grid_heads, params.b, static_cast<unsigned>(m_split_blocks))
                            : dim3(num_m_blocks, params.b, params.h);
}

__device__ __forceinline__ int64_t partial_row(const FwdParams& params, int split, int batch,
                                               int head, int row) {
    return ((static_cast<int64_t>(split) * params.b + batch) * params.h + head) *
               params.seqlen_q + row;
}

// GQA packing in the kernel (params.gqa_pack = G > 1, decode tile only): tile row r (m0 + r in
// the CTA's packed rows) is query position (m0 + r) / G of head kv_head * G + (m0 + r) % G.
// group: params.gqa_pack_div.
struct PackedRow {
    int pos;
    int head;
    __device__ __forceinline__ static PackedRow make(int packed_row, const FastDivisor& group,
                                                     int kv_head) {
        PackedRow p;
        p.pos = group.div(packed_row);
        p.head = kv_head * group.value() + (packed_row - p.pos * group.value());
        return p;
    }
};

// Empty split (or a tile that sees no key): zero partial O, lse -inf for tile rows [0, rows).
// packed: rows are PackedRow pairs of KV head `head`.
template <typename Traits>
__device__ __forceinline__ void store_empty_partial(const FwdParams& params, int split, int batch,
                                                    int head, int m0, int rows, bool packed,
                                                    int tid) {
    for (int row = tid; row < rows; row += Traits::kNThreads) {
        int64_t index;
        if (packed) {
            const PackedRow pr = PackedRow::make(m0 + row, params.gqa_pack_div, head);
            index = partial_row(params, split, batch, pr.head, pr.pos);
        } else {
            index = partial_row(params, split, batch, head, m0 + row);
        }
        params.softmax_lseaccum_ptr[index] = -INFINITY;
        float* o = reinterpret_cast<float*>(params.oaccum_ptr) + index * params.d_rounded;
        for (int c = 0; c < params.d_rounded; ++c) o[c] = 0.f;
    }
}

// Packed tile that sees no key (not split): out = 0, lse = +inf for tile rows [0, rows).
template <typename Element, typename Traits>
__device__ __forceinline__ void store_empty_packed(const FwdParams& params, int batch, int kv_head,
                                                   int m0, int rows, int tid) {
    for (int row = tid; row < rows; row += Traits::kNThreads) {
        const PackedRow pr = PackedRow::make(m0 + row, params.gqa_pack_div, kv_head);
        Element* o = reinterpret_cast<Element*>(params.o_ptr) + batch * params.o_batch_stride +
                     pr.pos * params.o_row_stride + pr.head * params.o_head_stride;
        for (int c = 0; c < params.d; c += 8) {
            *reinterpret_cast<uint4*>(o + c) = make_uint4(0u, 0u, 0u, 0u);
        }
        params.softmax_lse_ptr[(static_cast<int64_t>(batch) * params.h + pr.head) *
                                   params.seqlen_q + pr.pos] = INFINITY;
    }
}

// Where a paged cache keeps this thread's rows of one key block (its KVCopy row steps): the
// block-table lookups of a tile, done once per key block (its K and V tiles share them) and
// one copy ahead of their use, so a cp.async issue never waits on a dependent global load.
// Held in registers: the kernel passes it by reference with a separate `paged` flag (a pointer
// that may be null made ptxas keep it in a 32-byte stack frame, LDL / STL per row).
// Instructions count here: at one CTA per SM a decode step takes (instructions per warp) x
// (cycles per instruction), and the page arithmetic had made paged copies execute 55% more
// instructions than contiguous ones (bench/NOTES.md run 53).
template <typename Traits>
struct PagedKVRows {
    using KVCopy = typename Traits::KVCopy;
    static constexpr int kSteps = KVCopy::kRowSteps;
    // block_table entry of the row's page (past the valid rows: any), as read: unclamped.
    int page[kSteps];
    int row_in_page[kSteps];  // the row's position inside its page

    // A block-table entry clamped into [0, num_pages) (one unsigned min: a negative entry is
    // a large unsigned one; num_pages = 0 leaves it as it is). See SequenceInfo. Applied where
    // the row address is formed (load_kv_tile), not in lookup: a min right after the table
    // load would make the warp wait for that load there, a copy before the entry is needed
    // (paged page-16 steps ran 1-8% slower that way, bench/NOTES.md session 19).
    __device__ __forceinline__ static int clamp_page(const FwdParams& params, int entry) {
        return static_cast<int>(min(static_cast<uint32_t>(entry),
                                    static_cast<uint32_t>(params.num_pages - 1)));
    }

    // This sequence's block-table row (batch = blockIdx.y); the kernel computes it once.
    __device__ __forceinline__ static const int* table_row(const FwdParams& params) {
        return params.block_table +
               static_cast<int64_t>(blockIdx.y) * params.block_table_batch_stride;
    }

    // Key block n_block (keys [n_block kBlockN, ...) of the sequence, valid_rows of them real)
    // of the sequence whose key 0 sits at cache position pos0 (pos0 >= 0: every position and
    // block-table index here is non-negative, so 32-bit unsigned index math is exact).
    __device__ __forceinline__ void lookup(const FwdParams& params, const int* table, int pos0,
                                           int n_block, int valid_rows, int tid) {
        const int row0 = KVCopy::thread_row(tid);
        const int page_size = params.page_block_size;
        const int pos_first = pos0 + n_block * Traits::kBlockN + row0;
        // A row past the valid ones reads the sequence's first entry (always there) instead of
        // one past its block-table row; its copies read nothing.
        if ((page_size & (page_size - 1)) == 0) {
            // Power-of-two pages (every size in practice): a shift and a mask per row step.
            const int shift = __ffs(page_size) - 1;
#pragma unroll
            for (int r = 0; r < kSteps; ++r) {
                const int pos = pos_first + r * KVCopy::kRowsPerStep;
                const bool valid = row0 + r * KVCopy::kRowsPerStep < valid_rows;
                row_in_page[r] = pos & (page_size - 1);
                page[r] = table[valid ? static_cast<uint32_t>(pos) >> shift : 0u];
            }
            return;
        }
        // Other page sizes: one division per block; the thread's rows are kRowsPerStep apart,
        // so with pages of at least kRowsPerStep rows each step crosses at most one boundary.
        int p = pos_first / page_size;
        int in_page = pos_first - p * page_size;
        const bool step_by_wrap = page_size >= KVCopy::kRowsPerStep;
#pragma unroll
        for (int r = 0; r < kSteps; ++r) {
            if (r > 0) {
                if (step_by_wrap) {
                    in_page += KVCopy::kRowsPerStep;
                    if (in_page >= page_size) {
                        in_page -= page_size;
                        ++p;
                    }
                } else {
                    const int pos = pos_first + r * KVCopy::kRowsPerStep;
                    p = pos / page_size;
                    in_page = pos - p * page_size;
                }
            }
            const bool valid = row0 + r * KVCopy::kRowsPerStep < valid_rows;
            row_in_page[r] = in_page;
            page[r] = table[valid ? static_cast<uint32_t>(p) : 0u];
        }
    }
};

// K / V tile of key block n_block (keys [n_block kBlockN, ...) of the sequence, valid_rows of
// them real) into shared memory: contiguous rows, or (paged) the rows a PagedKVRows lookup of
// this block found. Paged: page_stride and row_stride fit in 32 bits (checks.cpp
// check_paged_cache_strides), so a row's address is two 32 x 32 -> 64-bit multiply-adds.
// Head groups (Traits::kHeadGroups): tile row j is key j / G of the group's KV head j % G
// (G = params.head_group), at (j / G) row_stride + (j % G) group_head_stride from the block's
// first key; G divides the copy's kRowsPerStep, so each thread's rows are one head's, evenly
// spaced: its row steps lie (kRowsPerStep / G) row_stride apart.
template <typename Element, typename Traits>
__device__ __forceinline__ void load_kv_tile(const FwdParams& params, uint32_t smem_tile,
                                             const Element* seq, int64_t page_stride,
                                             int64_t row_stride, int64_t group_head_stride,
                                             int n_block, int valid_rows, bool paged,
                                             const PagedKVRows<Traits>& paged_rows, int tid) {
    using KVCopy = typename Traits::KVCopy;
    // Paged caches only in the decode tile's kernels (Traits::kPagedKV; the host sends every
    // paged call there): next to the 128-row tile's main loop at d = 128 the gather path costs
    // a few spilled registers.
    // A whole tile (every block but a sequence's last, at head dim = tile width) needs no
    // bounds per chunk: decode kernels only (Traits::kSplitKV), where a copy's instructions
    // count at one CTA per SM (bench/NOTES.md run 53).
    const bool whole_tile = Traits::kSplitKV && valid_rows >= Traits::kBlockN &&
                            params.d == Traits::kHeadDim;
    if constexpr (Traits::kHeadGroups) {
        const int shift = __ffs(params.head_group) - 1;  // G is a power of two
        const int row = KVCopy::thread_row(tid);
        const Element* thread_src =
            seq + static_cast<int64_t>((n_block * Traits::kBlockN + row) >> shift) * row_stride +
            (row & (params.head_group - 1)) * group_head_stride + KVCopy::thread_col(tid);
        const int64_t step_stride = (KVCopy::kRowsPerStep >> shift) * row_stride;
        if (whole_tile) {
            KVCopy::load_async_full_steps(smem_tile, thread_src, step_stride, tid);
        } else {
            KVCopy::load_async_steps(smem_tile, thread_src, step_stride, valid_rows, params.d,
                                     tid);
        }
    } else if (!Traits::kPagedKV || !paged) {
        const Element* tile = seq + static_cast<int64_t>(n_block) * Traits::kBlockN * row_stride;
        if (whole_tile) {
            KVCopy::load_async_full(smem_tile, tile, row_stride, tid);
        } else {
            KVCopy::load_async(smem_tile, tile, row_stride, valid_rows, params.d, tid);
        }
    } else {
        // Byte strides: below 2^32 (the element strides are below 2^31), and page ids and rows
        // are non-negative, so a row address is two 32 x 32 -> 64-bit unsigned multiply-adds.
        const uint32_t page_bytes = static_cast<uint32_t>(page_stride * sizeof(Element));
        const uint32_t row_bytes = static_cast<uint32_t>(row_stride * sizeof(Element));
        const uint64_t thread_base =
            reinterpret_cast<uint64_t>(seq + KVCopy::thread_col(tid));  // its first chunk
        auto chunk = [&](auto r) {
            const uint64_t row_start = ptx::mad_wide_u32(
                static_cast<uint32_t>(paged_rows.row_in_page[r]), row_bytes, thread_base);
            const int page = PagedKVRows<Traits>::clamp_page(params, paged_rows.page[r]);
            return reinterpret_cast<const Element*>(
                ptx::mad_wide_u32(static_cast<uint32_t>(page), page_bytes, row_start));
        };
        if (whole_tile) {
            KVCopy::template load_async_gather_steps<true>(smem_tile, chunk, valid_rows,
                                                           params.d, tid);
        } else {
            KVCopy::load_async_gather_steps(smem_tile, chunk, valid_rows, params.d, tid);
        }
    }
}

// Where this CTA writes: its O tile (row m0 of the sequence, this head) and lse entries.
template <typename Element>
struct OutputTile {
    Element* o;   // element (0, 0) of the tile; rows params.o_row_stride apart
    float* lse;   // lse of tile row 0; rows are consecutive
    int valid_rows;

    __device__ __forceinline__ static OutputTile make(const FwdParams& params,
                                                      const SequenceInfo& seq, int batch,
                                                      int head, int m0, int block_m) {
        OutputTile out;
        out.o = reinterpret_cast<Element*>(params.o_ptr) + seq.o_offset +
                head * params.o_head_stride + m0 * params.o_row_stride;
        out.lse = params.softmax_lse_ptr +
                  (params.unpadded_lse
                       ? static_cast<int64_t>(head) * params.total_q + seq.q_start + m0
                       : (static_cast<int64_t>(batch) * params.h + head) * params.seqlen_q + m0);
        out.valid_rows = min(block_m, seq.seqlen_q - m0);
        return out;
    }
};

// O fragments (rows g and g + 8 of each 16-row slice, columns 2t, 2t + 1 of each 8-column
// tile) -> Element rows of the tile in shared memory (over the Q tile), the layout that
// QCopy::store / store_scatter read back. The caller synchronises before the read.
template <typename Element, typename Traits>
__device__ __forceinline__ void stage_output_tile(
    const float (&acc_o)[Traits::kMTiles][Traits::kDTiles][4], uint32_t smem_q, int warp_row0,
    int lane) {
    // Thread's first element: row warp_row0 + lane / 4, column 2 (lane % 4) (inside chunk 0).
    const uint32_t o_thread =
        smem_q + Traits::QTile::byte_offset(warp_row0 + lane / 4, 2 * (lane % 4));
    static_for_each<Traits::kMTiles>([&](auto mt) {
        static_for_each<2>([&](auto half) {
            static_for_each<Traits::kDTiles>([&](auto dt) {
                ptx::st_shared_4(
                    Traits::QTile::template stepped<16 * mt + 8 * half, 8 * dt>(o_thread),
                    ptx::pack_float2<Element>(acc_o[mt][dt][2 * half], acc_o[mt][dt][2 * half + 1]));
            });
        });
    });
}

// Split-KV: the thread's part of one fp32 partial-O row (oaccum row `index`), straight from the
// accumulators (a quad writes 32 contiguous bytes per 8 columns).
template <typename Traits>
__device__ __forceinline__ void store_partial_row(
    const FwdParams& params, int64_t index,
    const float (&acc_o)[Traits::kMTiles][Traits::kDTiles][4], int mt, int half, int lane) {
    float* o_row =
        reinterpret_cast<float*>(params.oaccum_ptr) + index * params.d_rounded + 2 * (lane % 4);
#pragma unroll
    for (int dt = 0; dt < Traits::kDTiles; ++dt) {
        *reinterpret_cast<float2*>(o_row + 8 * dt) =
            make_float2(acc_o[mt][dt][2 * half], acc_o[mt][dt][2 * half + 1]);
    }
}

// End of the key loop: O / l -> Element in shared memory (over the Q tile: every warp finished
// its last Q K^T before the loop's last barrier) -> global with 16-byte stores; lse per row.
// Output pointers and lane-derived values are recomputed here (a fresh %tid.x and the
// sequence info) rather than kept in registers through the main loop.
template <typename Element, typename Traits>
__device__ __forceinline__ void store_output(const FwdParams& params, int batch, int head, int m0,
                                             float (&acc_o)[Traits::kMTiles][Traits::kDTiles][4],
                                             OnlineSoftmax<Traits::kMTiles>& softmax,
                                             float log2_scale, uint32_t smem_q) {
    constexpr int kMTiles = Traits::kMTiles;
    const OutputTile<Element> out = OutputTile<Element>::make(
        params, SequenceInfo::make(params, batch), batch, head, m0, Traits::kBlockM);
    const int tid = ptx::thread_index_fresh();
    const int lane = tid % 32;
    // Key-split tile (decode_keysplit.cuh): the first warp of each row slice holds the merged
    // rows; the others only join the barrier and the 16-byte stores.
    const int warp_row0 = (tid / 32 / Traits::kKeySlices) * Traits::kWarpRows;
    const bool owns_rows = (tid / 32) % Traits::kKeySlices == 0;

    float lse[kMTiles][2];
    if constexpr (kRowSumsOfFp32P<Element>) softmax.reduce_row_sums();
    softmax.finalize(acc_o, lse, log2_scale);
    if (Traits::kPackGQA && params.gqa_pack > 1) {
        // GQA-packed tile (head = the KV head): each row to its own (position, head).
        const FastDivisor& group = params.gqa_pack_div;
        const int valid_rows = min(Traits::kBlockM, params.seqlen_q * group.value() - m0);
        const bool split_kv = params.num_splits > 1;
        const int split = block_coords<Traits>(params).split;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = warp_row0 + 16 * mt + 8 * half + lane / 4;  // in the tile
                if (owns_rows && row < valid_rows) {
                    const PackedRow pr = PackedRow::make(m0 + row, group, head);
                    const float l = lse[mt][half];
                    if (split_kv) {
                        const int64_t index = partial_row(params, split, batch, pr.head, pr.pos);
                        if (lane % 4 == 0) {
                            params.softmax_lseaccum_ptr[index] = l == INFINITY ? -INFINITY : l;
                        }
                        store_partial_row<Traits>(params, index, acc_o, mt, half, lane);
                    } else if (lane % 4 == 0) {
                        params.softmax_lse_ptr[(static_cast<int64_t>(batch) * params.h + pr.head) *
                                                   params.seqlen_q + pr.pos] = l;
                    }
                }
            }
        }
        if (split_kv) return;
        if (owns_rows) stage_output_tile<Element, Traits>(acc_o, smem_q, warp_row0, lane);
        compute_warps_sync<Traits>();
        Element* o_batch = reinterpret_cast<Element*>(params.o_ptr) + batch * params.o_batch_stride;
        Traits::QCopy::template store_scatter<Element>(
            [&](int r) {
                const PackedRow pr = PackedRow::make(m0 + r, group, head);
                return o_batch + pr.pos * params.o_row_stride + pr.head * params.o_head_stride;
            },
            smem_q, valid_rows, params.d, tid);
        return;
    }
    // (Only the decode tile's kernels carry this code: in the 128-row tile at d = 128 it costs
    // the main loop a few spilled registers.)
    if (Traits::kSplitKV && params.num_splits > 1) {
        // Split-KV partial result: fp32 O straight from the accumulators (each quad writes
        // 32 contiguous bytes per 8 columns), lse -inf where this split saw no key.
        const int split = block_coords<Traits>(params).split;
        const int64_t first = partial_row(params, split, batch, head, m0);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = warp_row0 + 16 * mt + 8 * half + lane / 4;  // in the tile
                if (owns_rows && row < out.valid_rows) {
                    const float l = lse[mt][half];
                    if (lane % 4 == 0) {
                        params.softmax_lseaccum_ptr[first + row] = l == INFINITY ? -INFINITY : l;
                    }
                    store_partial_row<Traits>(params, first + row, acc_o, mt, half, lane);
                }
            }
        }
        return;
    }
    if (owns_rows && lane % 4 == 0) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = warp_row0 + 16 * mt + 8 * half + lane / 4;  // in the tile
                if (row < out.valid_rows) out.lse[row] = lse[mt][half];
            }
        }
    }
    if (owns_rows) stage_output_tile<Element, Traits>(acc_o, smem_q, warp_row0, lane);
    compute_warps_sync<Traits>();
    Traits::QCopy::store(out.o, params.o_row_stride, smem_q, out.valid_rows, params.d, tid);
}

// The prefill tile's softcap kernels' lane % 4 (the score fragment's column pair) in the key
// loop (traits.h FwdTraits, every head dim): the sm_80 pass (what an A100 runs) derives it from
// lane where it is used, because kept in a register through the loop ptxas spilled it in the
// d128 128-row kernels (8-12 B at 255 registers; since 34f9c7f).
// The sm_90a pass keeps the register: there it does not spill, and deriving it measured 1-3%
// slower on those kernels at 4k-16k keys (bench/NOTES.md run 148).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kRederiveLanePair = true;
#else
constexpr bool kRederiveLanePair = false;
#endif

// Template parameters: Causal (window right side fixed to 0), HasAlibi (scores converted to
// natural-log units with the ALiBi bias; also used, with slope 0, when softmax_scale <= 0 so
// the exponent factor stays positive), HasSoftcap (tanh capping), IsDropout (dropout of P: l
// and lse stay those of the undropped softmax, O is scaled by 1 / p_keep at the end).
// Traits::kProducerWarps > 0 (the warp-specialised key-split tile, kv_ring.cuh): the CTA is
// kNThreads compute threads (warps 0 .. kNWarps - 1, which run everything below but the K/V
// copies) and kProducerThreads producer threads after them (the copies only).
template <typename Element, typename Traits, bool Causal, bool HasAlibi, bool HasSoftcap,
          bool IsDropout = false>
__global__ void __launch_bounds__(Traits::kLaunchThreads, 1)
    mha_fwd_sm80_kernel(const __grid_constant__ FwdParams params) {
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kStages = Traits::kStages;
    constexpr int kMTiles = Traits::kMTiles;
    constexpr int kNTiles = Traits::kNTiles;
    constexpr int kDTiles = Traits::kDTiles;
    // cp.async groups are committed in the order K0 V0 K1 V1 ...; when waiting for K_j (or V_j)
    // the 2 (kStages - 1) groups issued after it may stay in flight.
    constexpr int kGroupsInFlight = 2 * (kStages - 1);
    // One K and one V buffer (the 128-key key-split tiles): the plain order issues V_j once K_j
    // has landed and K_j+1 once V_j has (one tile in flight per CTA). The twin with
    // Traits::kOverlapKV (paged calls, kernels/decode.h plan_kv_overlap) issues V_j+1 once every
    // warp has read V_j (a third barrier per block), right after K_j+1, so a block's K and V
    // travel together: at the top of iteration j the groups in flight are K_j, V_j. (The
    // contiguous twins lost 0.5-1.7% with it, run 139.)
    constexpr bool overlap_kv = Traits::kOverlapKV;  // (decode_keysplit.cuh asserts one stage)
    using QCopy = typename Traits::QCopy;
    using KVCopy = typename Traits::KVCopy;
    // The warp GEMMs' geometry: the tile's, or for the key-split tile (decode_keysplit.cuh) all
    // 16 rows x the warp's kWarpKeys keys of each block.
    using WarpGemm = typename Traits::WarpGemm;
    static_assert(!(Traits::kKeySplit && IsDropout), "the key-split tile has no dropout");
    // The warp-specialised tile needs sm_90's mbarrier waits: in a pass for an older GPU its
    // kernels only trap (the host never launches them there).
    constexpr bool kWarpSpecialized = Traits::kProducerWarps > 0 && kKVRingCompiled;
    if constexpr (Traits::kProducerWarps > 0 && !kKVRingCompiled) {
        __trap();
        return;
    }

    // Split-KV decode: the combine kernel (launched with programmatic dependent launch on sm_90)
    // may be scheduled as soon as every CTA of this grid has started; it waits for this grid to
    // complete before reading the partials (combine.cuh). After a KV-cache append this grid may
    // itself be PDL-launched (FwdParams::launch_pdl): it waits here, before its first global
    // access, for the append kernel's cache rows, rotated q and key counts (a no-op otherwise).
    if constexpr (Traits::kSplitKV) {
        ptx::launch_dependents();
        ptx::wait_for_prior_grid();
    }

    unsigned char* smem = ptx::dynamic_smem();
    const uint32_t smem_q = ptx::smem_addr(smem);
    const uint32_t smem_k = smem_q + Traits::kSmemKOffset;
    const uint32_t smem_v = smem_q + Traits::kSmemVOffset;

    const int tid = threadIdx.x;
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int batch = blockIdx.y;
    // The per-sequence loads first (they head the prologue's critical path); the grid
    // coordinates and, with fixed-length q, the Q copy run while they are in flight.
    const SequenceLoads seq_loads = SequenceLoads::issue(params, batch);
    SequenceInfo seq;
    seq.set_query_rows(params, batch, seq_loads);
    // Grid coordinates (block_coords: the decode tile orders heads first and has the splits).
    const BlockCoords coords = block_coords<Traits>(params);
    const int split = coords.split;
    // Causal: the last query blocks have the most keys; start them first.
    const int m_block = Causal ? coords.num_m_blocks - 1 - coords.m_index : coords.m_index;
    const int head = coords.head;
    const int m0 = m_block * kBlockM;  // first query row of this CTA
    if constexpr (IsDropout) write_rng_state(params, tid);

    int n_block_min, n_block_max;      // key blocks some row of the tile can see
    // CTA-wide scalars read only now and then in the main loop. They live in shared memory
    // rather than in registers: they derive from global loads (cu_seqlens), so they would take
    // per-thread registers through the whole loop, where the accumulators need every register.
    // Written by thread 0, visible to all after the first barrier of the main loop.
    static_assert(sizeof(CtaScalars) <= Traits::kSmemScalarsBytes, "scalars area too small");
    CtaScalars& cta = *reinterpret_cast<CtaScalars*>(smem + Traits::kSmemScalarsOffset);
    KVSource kv;                       // prologue copy of cta.kv
    int seqlen_k;
    bool warp_computes = true;         // false: an idle warp of the decode tile (see the loop)
    {
        // GQA packed in the kernel (decode tile): G rows per query position (PackedRow).
        const bool packed = Traits::kPackGQA && params.gqa_pack > 1;
        const FastDivisor& group = params.gqa_pack_div;  // 1 when not packed
        const int tile_rows = seq.seqlen_q * group.value();  // rows of this (batch, head) problem
        if (m0 >= tile_rows) return;  // varlen: this sequence is shorter than the grid
        const int valid_q_rows = min(kBlockM, tile_rows - m0);
        if constexpr (Traits::kSkipIdleWarps) {
            warp_computes = warp * Traits::kWarpRows < valid_q_rows;
        }
        // ---- Q tile load (64-bit element offsets; the compute threads). Issued before the
        // key range: with fixed-length q its rows depend on no loaded value, so its copy
        // overlaps the round trip of the per-sequence key counts (cache_seqlens) that the key
        // range and the first K/V copies wait for. It is committed with the first K copy (the
        // warp-specialised tile: in a group of its own).
        const Element* q_seq = reinterpret_cast<const Element*>(params.q_ptr) + seq.q_offset;
        if (kWarpSpecialized && tid >= Traits::kNThreads) {
            // a producer thread: no part in the Q tile
        } else if (packed) {  // head = the KV head; rows gathered per (position, head)
            QCopy::load_async_gather(
                smem_q,
                [&](int r) {
                    const PackedRow pr = PackedRow::make(m0 + r, group, head);
                    return q_seq + static_cast<int64_t>(pr.pos) * params.q_row_stride +
                           static_cast<int64_t>(pr.head) * params.q_head_stride;
                },
                valid_q_rows, params.d, tid);
        } else {
            const Element* q_tile = q_seq + head * params.q_head_stride + m0 * params.q_row_stride;
            QCopy::load_async(smem_q, q_tile, params.q_row_stride, valid_q_rows, params.d, tid);
        }

        // The key count and offsets (from here on the loads are waited for).
        seq.set_keys(params, seq_loads);
        // Keys, or with head groups (key, KV head) columns: the key loop's unit.
        seqlen_k = Traits::kHeadGroups ? seq.seqlen_k * params.head_group : seq.seqlen_k;
        // Query position of tile row m0 + r (r may be past the valid rows).
        auto position = [&](int packed_row) { return packed ? group.div(packed_row) : packed_row; };

        // ---- Mask geometry. The host normalised the window once, with seqlen_k (varlen: the
        // max, KV cache: the capacity); each sequence applies it as is with its own lengths
        // (flash_attn's rule: no renormalisation per sequence). Head groups have neither
        // window nor causal mask (decode.h pack_head_groups): only the sequence end, in
        // columns, and the head mask of the key loop.
        AttentionMask mask;
        mask.seqlen_k = seqlen_k;
        mask.diag = seqlen_k - seq.seqlen_q;
        mask.window_left = params.window_size_left;
        mask.window_right = Causal ? 0 : params.window_size_right;
        // Keys some row of the tile can see: [key_begin(first row), key_end(last row)).
        const int keys_begin = max(0, mask.key_begin(position(m0)));
        const int keys_end = mask.key_end(position(m0 + valid_q_rows - 1));
        n_block_min = keys_begin / kBlockN;
        n_block_max = keys_end > keys_begin ? (keys_end + kBlockN - 1) / kBlockN : 0;
        // Split-KV: this split's share of those blocks (possibly none).
        if (Traits::kSplitKV && params.num_splits > 1 && n_block_max > n_block_min) {
            const int per_split = params.num_splits_div.div(n_block_max - n_block_min +
                                                            params.num_splits - 1);
            n_block_min += split * per_split;
            n_block_max = min(n_block_max, n_block_min + per_split);
        }
        // Blocks inside every tile row's visible range need no mask: keys [n kBlockN,
        // (n+1) kBlockN) with (n+1) kBlockN <= key_end(first row), n kBlockN >= key_begin(last).
        if (tid == 0) {
            cta.unmasked_keys_end = mask.key_end(position(m0));
            cta.unmasked_keys_begin = mask.key_begin(position(m0 + kBlockM - 1));
            cta.key_range = KeyRange::make(mask);
            cta.diag = mask.diag;
            if constexpr (IsDropout) {
                const DropoutMask dropout =
                    DropoutMask::make(params, static_cast<int64_t>(batch) * params.h + head);
                cta.dropout_seed = dropout.seed;
                cta.dropout_stream = dropout.stream;
            }
        }

        // ---- No visible key for any row of the tile (seqlen_k = 0, causal with seqlen_q >
        // seqlen_k, windows past the end) or an empty split: out = 0, lse = +inf (split: the
        // partial O = 0, lse = -inf, which the combine weighs 0).
        if (n_block_max <= n_block_min) {
            if (kWarpSpecialized && tid >= Traits::kNThreads) return;  // a producer: no copies
            ptx::cp_async_wait<0>();  // the Q copy lands before the CTA leaves
            if (Traits::kSplitKV && params.num_splits > 1) {
                store_empty_partial<Traits>(params, split, batch, head, m0, valid_q_rows, packed,
                                            tid);
                return;
            }
            if (packed) {
                store_empty_packed<Element, Traits>(params, batch, head, m0, valid_q_rows, tid);
                return;
            }
            const OutputTile<Element> out =
                OutputTile<Element>::make(params, seq, batch, head, m0, kBlockM);
            QCopy::store_zeros(out.o, params.o_row_stride, out.valid_rows, params.d, tid);
            for (int row = tid; row < out.valid_rows; row += Traits::kNThreads) {
                out.lse[row] = INFINITY;
            }
            return;
        }

        // ---- K/V sources.
        const int kv_head = packed ? head : params.h_h_k_ratio_div.div(head);
        kv.k_seq = reinterpret_cast<const Element*>(params.k_ptr) + seq.k_offset +
                   kv_head * params.k_head_stride;
        kv.v_seq = reinterpret_cast<const Element*>(params.v_ptr) + seq.v_offset +
                   kv_head * params.v_head_stride;
        kv.pos0 = seq.k_pos0;
        if (tid == 0) cta.kv = kv;
    }

    // ---- Score units: final score = s * score_scale (+ ALiBi); softmax exponent factor.
    // (Straight from the params' constant bank: no registers held through the loop.)
    const float softcap_pre_scale = HasSoftcap ? params.softcap_pre_scale : 0.f;
    const float score_scale = HasSoftcap ? params.softcap : params.scale_softmax;
    const float log2_scale =
        HasAlibi ? static_cast<float>(M_LOG2E)
                 : (HasSoftcap ? params.softcap_log2 : params.scale_softmax_log2);
    if (HasAlibi && tid == 0) {
        cta.alibi_slope = params.alibi_slopes_ptr == nullptr
                              ? 0.f
                              : reinterpret_cast<const float*>(params.alibi_slopes_ptr)
                                    [batch * params.alibi_slopes_batch_stride + head];
    }

    const int n_iters = n_block_max - n_block_min;
    // K / V tiles of iteration `it` (key block n_block_max - 1 - it) into buffer it % kStages.
    // src: the K/V source (`kv` in the prologue and in the producer warps, its shared copy
    // `cta.kv` in the compute warps' loop). copy_tid: the thread's index among the copying
    // threads (the compute threads, or with producer warps the producer threads).
    // Paged cache: `paged_rows` holds the rows of the block whose K was issued last; the V copy
    // of that block reuses them, and the next block's lookup follows it (one copy step ahead
    // of the K copy that needs it).
    const int copy_tid = kWarpSpecialized ? tid - Traits::kNThreads : tid;
    const bool paged = Traits::kPagedKV && params.block_table != nullptr;
    PagedKVRows<Traits> paged_rows;
    const int* block_table_row = paged ? PagedKVRows<Traits>::table_row(params) : nullptr;
    auto block_of = [&](int it) { return n_block_max - 1 - it; };
    auto lookup_pages = [&](int it, const KVSource& src) {
        if (paged) {
            paged_rows.lookup(params, block_table_row, src.pos0, block_of(it),
                              seqlen_k - block_of(it) * kBlockN, copy_tid);
        }
    };
    auto load_k = [&](int it, const KVSource& src) {
        load_kv_tile<Element, Traits>(params, smem_k + (it % kStages) * Traits::kSmemKVTileBytes,
                                      static_cast<const Element*>(src.k_seq),
                                      params.k_batch_stride, params.k_row_stride,
                                      params.k_group_head_stride, block_of(it),
                                      seqlen_k - block_of(it) * kBlockN, paged, paged_rows,
                                      copy_tid);
    };
    auto load_v = [&](int it, const KVSource& src) {
        load_kv_tile<Element, Traits>(params, smem_v + (it % kStages) * Traits::kSmemKVTileBytes,
                                      static_cast<const Element*>(src.v_seq),
                                      params.v_batch_stride, params.v_row_stride,
                                      params.v_group_head_stride, block_of(it),
                                      seqlen_k - block_of(it) * kBlockN, paged, paged_rows,
                                      copy_tid);
    };

    // ---- Warp-specialised tile (kv_ring.cuh): the producer warps fill the ring and leave; the
    // compute warps wait for Q (their own copies) and run the key loop on the ring below.
    [[maybe_unused]] const KVRing<Traits> ring = kv_ring_at<Traits>(smem_q);
    if constexpr (kWarpSpecialized) {
        ptx::cp_async_commit();  // Q (issued by the compute threads above)
        if (tid == 0) ring.init();
        // A producer's first page lookup (registers only) before the barrier: its block-table
        // loads' round trip overlaps the barrier and the ring's setup.
        if (tid >= Traits::kNThreads) lookup_pages(0, kv);
        __syncthreads();  // the ring's barriers and the CTA scalars, for every warp
        if (tid >= Traits::kNThreads) {
            for (int it = 0; it < n_iters; ++it) {
                ring.acquire(it);
                if (it > 0) lookup_pages(it, kv);
                load_k(it, kv);
                ring.k_issued(it);
                load_v(it, kv);
                ring.v_issued(it);
            }
            return;  // its copies land on their own; the full barriers track them
        }
        ptx::cp_async_wait<0>();
        compute_warps_sync<Traits>();  // Q landed (every compute thread's share)
    } else {
        // ---- Prologue: Q (issued above) with K of the first block, then (kStages buffers)
        // V0 K1 .. V(kStages-2) K(kStages-1), one group each (empty past the last block).
        lookup_pages(0, kv);
        load_k(0, kv);
        ptx::cp_async_commit();
        if constexpr (kStages >= 2 || overlap_kv) {
            load_v(0, kv);  // overlap_kv (one stage): the V buffer is free, K0 and V0 together
            ptx::cp_async_commit();
        }
        if constexpr (kStages >= 2) {
            if (n_iters > 1) {
                lookup_pages(1, kv);
                load_k(1, kv);
            }
            ptx::cp_async_commit();
        }
        if constexpr (kStages == 3) {
            if (n_iters > 1) load_v(1, kv);
            ptx::cp_async_commit();
            if (n_iters > 2) {
                lookup_pages(2, kv);
                load_k(2, kv);
            }
            ptx::cp_async_commit();
        }
        // Here paged_rows holds block kStages - 1's rows (or an earlier block's when n_iters is
        // smaller: their V copies are then never issued).
    }

    float acc_o[kMTiles][kDTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
        }
    }
    OnlineSoftmax<kMTiles> softmax;
    softmax.init();
    // In the tile. The key-split tile's kKeySlices warps of a 16-row slice compute its rows, each
    // on its own keys [warp_key0, warp_key0 + kWarpKeys) of every block (K/V tile rows).
    const int warp_row0 = (warp / Traits::kKeySlices) * Traits::kWarpRows;
    const int warp_key0 = (warp % Traits::kKeySlices) * Traits::kWarpKeys;
    [[maybe_unused]] KeySplitQFragments<Traits> q_regs;  // key-split tile, d <= 128
    // Head groups: the KV head in the group of this thread's rows (tile rows warp_row0 +
    // lane / 4 and 8 more; one m block: m0 = 0), for the head mask of every block.
    [[maybe_unused]] int row_head[kMTiles][2];
    if constexpr (Traits::kHeadGroups) {
        row_head[0][0] = params.head_group_rows_div.div(warp_row0 + lane / 4);
        row_head[0][1] = params.head_group_rows_div.div(warp_row0 + lane / 4 + 8);
    }

    // Decode tile (Traits::kSkipIdleWarps): a warp whose rows all lie past the tile's valid rows
    // (1..g real rows of 64 in a decode step) only issues its share of the K/V copies and joins
    // the main loop's two barriers per key block, in the same order; no math. Its rows are
    // never stored (the epilogue writes valid rows only). Its barriers are other instructions
    // than the computing warps', so the main loop's barriers are the unaligned form there.
    auto block_barrier = [] {
        if constexpr (Traits::kSkipIdleWarps) {
            ptx::barrier_sync_unaligned();
        } else {
            __syncthreads();
        }
    };
    int compute_iters = n_iters;
    if (Traits::kSkipIdleWarps && !warp_computes) {
        for (int it = 0; it < n_iters; ++it) {
            ptx::cp_async_wait<kGroupsInFlight>();
            block_barrier();
            if (it + kStages - 1 < n_iters) load_v(it + kStages - 1, cta.kv);
            ptx::cp_async_commit();
            if (it + kStages < n_iters) lookup_pages(it + kStages, cta.kv);
            ptx::cp_async_wait<kGroupsInFlight>();
            block_barrier();
            if (it + kStages < n_iters) load_k(it + kStages, cta.kv);
            ptx::cp_async_commit();
        }
        compute_iters = 0;
    }
    // Warp-specialised tile: the compute warps take each block's K and V from the ring
    // (KVRing::wait_k / wait_v) and hand the slot back after P V; the copies are the producers'.
    for (int it = 0; it < compute_iters; ++it) {
        const int n_block = n_block_max - 1 - it;
        const int slot = it % kStages;

        if constexpr (kWarpSpecialized) {
            ring.wait_k(it);
        } else if constexpr (overlap_kv) {
            // K of this block has landed (its V may still be in flight). The paged lookup of
            // the next block: this block's V was issued with its rows already.
            ptx::cp_async_wait<1>();
            block_barrier();
            if (it + 1 < n_iters) lookup_pages(it + 1, cta.kv);
        } else {
            // K of this block has landed (and every warp is done with the buffers refilled
            // next).
            ptx::cp_async_wait<kGroupsInFlight>();
            block_barrier();
            if (it + kStages - 1 < n_iters) {
                load_v(it + kStages - 1, cta.kv);
            }
            ptx::cp_async_commit();
            // Paged: the next K block's rows, looked up while this block's scores are computed.
            if (it + kStages < n_iters) lookup_pages(it + kStages, cta.kv);
        }

        float acc_s[kMTiles][kNTiles][4];  // the key-split tile: the warp's keys
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
            }
        }
        const uint32_t k_tile =
            smem_k + slot * Traits::kSmemKVTileBytes + Traits::kv_row_byte_offset(warp_key0);
        if constexpr (Traits::kKeySplit && Traits::kQInRegisters) {
            if (it == 0) q_regs.load(smem_q, warp_row0, lane);  // Q landed with K of block 0
            keysplit_gemm_qk<Element, Traits>(acc_s, q_regs, k_tile, lane);
        } else {
            warp_gemm_qk<Element, WarpGemm>(acc_s, smem_q, k_tile, warp_row0, lane);
        }

        if constexpr (HasSoftcap) apply_softcap(acc_s, softcap_pre_scale);
        if constexpr (Traits::kHeadGroups) {
            // The column inside the block: blocks start at multiples of G (kBlockN % G == 0).
            apply_head_group_mask(acc_s, row_head, warp_key0 + 2 * (lane % 4),
                                  params.head_group - 1);
        }
        // Query row and key of s[0][0][0]. (Opaque: per-row values derived from it are computed
        // here, not hoisted out of the loop into registers.)
        const int frag_row0 = ptx::opaque(m0 + warp_row0 + lane / 4);
        const int lane_pair = kRederiveLanePair && HasSoftcap && !Traits::kSplitKV
                                  ? ptx::opaque(lane) % 4
                                  : lane % 4;
        const int frag_col0 = n_block * kBlockN + warp_key0 + 2 * lane_pair;
        if constexpr (HasAlibi) {
            apply_alibi(acc_s, score_scale, cta.alibi_slope, frag_row0 + cta.diag, frag_col0);
        }
        const bool block_needs_mask = (n_block + 1) * kBlockN > cta.unmasked_keys_end ||
                                      n_block * kBlockN < cta.unmasked_keys_begin;
        if (block_needs_mask) {
            if (Traits::kPackGQA && params.gqa_pack > 1) {
                // Packed rows: the mask follows each row's query position.
                int pos[kMTiles][2];
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        pos[mt][half] = params.gqa_pack_div.div(frag_row0 + 16 * mt + 8 * half);
                    }
                }
                apply_mask_positions(acc_s, cta.key_range, pos, frag_col0);
            } else {
                apply_mask(acc_s, cta.key_range, frag_row0, frag_col0);
            }
        }

        softmax.update(acc_s, acc_o, log2_scale);
        if constexpr (kRowSumsOfFp32P<Element>) softmax.add_row_sums(acc_s);
        uint32_t p_frag[kMTiles][WarpGemm::kBlockN / 16][4];
        convert_p_to_a_fragments<Element, WarpGemm>(p_frag, acc_s);

        if constexpr (kWarpSpecialized) {
            ring.wait_v(it);
        } else {
            // V of this block has landed; every warp is done reading this block's K buffer.
            ptx::cp_async_wait<kGroupsInFlight>();  // with overlap_kv: K_j+1 not issued yet
            block_barrier();
            if (it + kStages < n_iters) load_k(it + kStages, cta.kv);
            ptx::cp_async_commit();
        }

        if constexpr (!kRowSumsOfFp32P<Element>) {
            warp_gemm_p_rowsum<WarpGemm>(softmax.row_sum, p_frag);
        }
        if constexpr (IsDropout) {  // on the packed fragments, after the row sums (undropped l)
            apply_dropout(p_frag,
                          DropoutMask{cta.dropout_seed, cta.dropout_stream, params.p_keep_threshold},
                          ptx::opaque(m0 + warp_row0 + lane / 4), n_block * kBlockN, lane);
        }
        warp_gemm_pv<Element, WarpGemm>(acc_o, p_frag,
                                        smem_v + slot * Traits::kSmemKVTileBytes +
                                            Traits::kv_row_byte_offset(warp_key0),
                                        lane);
        if constexpr (kWarpSpecialized) ring.release(it, lane);
        if constexpr (overlap_kv) {
            // Every warp is done reading this block's V: the next block's V follows its K.
            if (it + 1 < n_iters) {
                block_barrier();
                load_v(it + 1, cta.kv);
            }
            ptx::cp_async_commit();
        }
    }
    ptx::cp_async_wait<0>();  // only empty groups can be left; drain them anyway
    if constexpr (Traits::kKeySplit) {
        keysplit_merge_warps<Traits>(acc_o, softmax, log2_scale, smem + Traits::kSmemKOffset, warp,
                                     lane);
    }

    // ---- Epilogue.
    if constexpr (IsDropout) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] *= params.rp_keep;
            }
        }
    }
    store_output<Element, Traits>(params, batch, head, m0, acc_o, softmax, log2_scale, smem_q);
}

}  // namespace sm80
}  // namespace flash_cuda
