// KV-cache append step of flash_attn_with_kvcache, one launch before attention:
//   - the new keys (rotary applied at their absolute positions) and values of sequence i are
//     written into its cache rows cache_seqlens[i] + t, t < seqlen_new (contiguous cache row
//     cache_batch_idx[i], or the pages of block_table row i);
//   - with rotary, q is written rotated to q_rot (its positions: KvAppendParams).
// It matches the reference (csrc/reference/kvcache.cpp) bit for bit: the rotation is computed
// in fp32 as a*cos - b*sin and b*cos + a*sin, each product and the sum rounded to fp32 (IEEE,
// no fused multiply-add, no flush to zero), then rounded to the element type.
//
// Work: one warp per row (d elements); rows [0, b * seqlen_new * h_k) are new key/value rows,
// the rows after them query rows (b * seqlen_q * h, rotary only). Lanes stride the columns, so
// every access is coalesced whatever d is; any strides, any d.
//
// Reads only device memory it is given and never synchronizes with the host, so it can be
// captured in a CUDA graph. Inputs the host checks reject (positions past the cache, the block
// table or the rotary table, cache_batch_idx out of range) are skipped or clamped here, never
// read or written out of bounds, when the host value checks are off (graph capture).
//
// Device code only (no torch); also compiled as host C++ by the CPU emulator
// (tests/emulation/prelude.h), where the PTX wrappers fall back to plain float arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/convert.cuh"
#include "kernels/kvcache_append.h"
#include "kernels/ptx.cuh"

namespace flash_cuda {
namespace kvcache_append {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = kWarpsPerBlock * 32;

// mul.rn.f32 / add.rn.f32 / sub.rn.f32: one IEEE fp32 operation, never fused into an FMA and,
// unlike plain float arithmetic in the --use_fast_math build, without flushing subnormals
// (bf16 inputs can produce fp32 subnormal products; the reference keeps them).
__device__ __forceinline__ float mul_rn_f32(float a, float b) {
#ifdef __CUDA_ARCH__
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return a * b;
#endif
}
__device__ __forceinline__ float add_rn_f32(float a, float b) {
#ifdef __CUDA_ARCH__
    float r;
    asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return a + b;
#endif
}
__device__ __forceinline__ float sub_rn_f32(float a, float b) {
#ifdef __CUDA_ARCH__
    float r;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return a - b;
#endif
}

// Column c (< rotary_dim) of row x rotated to position `pos`: with the pair (a, b) that holds
// column c and m its index in the cos/sin row, a' = a*cos[m] - b*sin[m], b' = b*cos[m] + a*sin[m].
template <typename Element>
__device__ __forceinline__ Element rotate(const Element* x, int c, const KvAppendParams& p,
                                          int64_t pos) {
    const int half = p.rotary_dim / 2;
    int m, ia, ib;
    bool first;
    if (p.rotary_interleaved) {  // pairs (x[2m], x[2m + 1])
        m = c / 2;
        ia = 2 * m;
        ib = ia + 1;
        first = (c % 2) == 0;
    } else {  // pairs (x[m], x[m + half])
        first = c < half;
        m = first ? c : c - half;
        ia = m;
        ib = m + half;
    }
    const float a = to_float(x[ia]), b = to_float(x[ib]);
    const int64_t t = pos * half + m;
    const float co = to_float(static_cast<const Element*>(p.rotary_cos_ptr)[t]);
    const float si = to_float(static_cast<const Element*>(p.rotary_sin_ptr)[t]);
    const float r = first ? sub_rn_f32(mul_rn_f32(a, co), mul_rn_f32(b, si))
                          : add_rn_f32(mul_rn_f32(b, co), mul_rn_f32(a, si));
    return from_float<Element>(r);
}

// A rotary position inside the table (out-of-range positions only reach here unchecked).
__device__ __forceinline__ int64_t clamp_position(int64_t pos, const KvAppendParams& p) {
    return pos < 0 ? 0 : (pos >= p.seqlen_ro ? p.seqlen_ro - 1 : pos);
}

// Sequence i's cache offset (elements, before the head offset) of logical position pos, or -1
// when the position has no valid cache row (only with inputs the host checks reject).
__device__ __forceinline__ int64_t cache_row_offset(const KvAppendParams& p, int i, int64_t pos,
                                                    int64_t batch_stride, int64_t row_stride) {
    if (pos < 0 || pos >= p.capacity) return -1;
    if (p.block_table != nullptr) {
        const int64_t page = pos / p.page_size;
        const int block = p.block_table[i * p.block_table_batch_stride + page];
        if (block < 0 || block >= p.cache_batch) return -1;
        return block * batch_stride + (pos - page * p.page_size) * row_stride;
    }
    const int row = p.cache_batch_idx != nullptr ? p.cache_batch_idx[i] : i;
    if (row < 0 || row >= p.cache_batch) return -1;
    return row * batch_stride + pos * row_stride;
}

template <typename Element>
__device__ __forceinline__ void append_kv_row(const KvAppendParams& p, int64_t row, int lane) {
    const int hk = static_cast<int>(row % p.h_k);
    const int64_t bt = row / p.h_k;
    const int t = static_cast<int>(bt % p.seqlen_new);
    const int i = static_cast<int>(bt / p.seqlen_new);
    const int64_t start = p.cache_seqlens != nullptr ? p.cache_seqlens[i] : p.capacity;
    const int64_t pos = start + t;
    const int64_t k_off = cache_row_offset(p, i, pos, p.kcache_batch_stride, p.kcache_row_stride);
    const int64_t v_off = cache_row_offset(p, i, pos, p.vcache_batch_stride, p.vcache_row_stride);
    if (k_off < 0 || v_off < 0) return;
    const Element* knew = static_cast<const Element*>(p.knew_ptr) + i * p.knew_batch_stride +
                          t * p.knew_row_stride + hk * p.knew_head_stride;
    const Element* vnew = static_cast<const Element*>(p.vnew_ptr) + i * p.vnew_batch_stride +
                          t * p.vnew_row_stride + hk * p.vnew_head_stride;
    Element* kc = static_cast<Element*>(p.kcache_ptr) + k_off + hk * p.kcache_head_stride;
    Element* vc = static_cast<Element*>(p.vcache_ptr) + v_off + hk * p.vcache_head_stride;
    const int64_t ro_pos = clamp_position(pos, p);
    for (int c = lane; c < p.d; c += 32) {
        kc[c] = c < p.rotary_dim ? rotate(knew, c, p, ro_pos) : knew[c];
        vc[c] = vnew[c];
    }
}

template <typename Element>
__device__ __forceinline__ void rotate_q_row(const KvAppendParams& p, int64_t row, int lane) {
    const int hh = static_cast<int>(row % p.h);
    const int64_t bq = row / p.h;
    const int t = static_cast<int>(bq % p.seqlen_q);
    const int i = static_cast<int>(bq / p.seqlen_q);
    const int64_t start = p.cache_seqlens != nullptr ? p.cache_seqlens[i] : p.capacity;
    const int64_t pos = clamp_position(start + (p.q_positions_per_row ? t : 0), p);
    const Element* q = static_cast<const Element*>(p.q_ptr) + i * p.q_batch_stride +
                       t * p.q_row_stride + hh * p.q_head_stride;
    Element* out = static_cast<Element*>(p.qrot_ptr) + i * p.qrot_batch_stride +
                   t * p.qrot_row_stride + hh * p.qrot_head_stride;
    for (int c = lane; c < p.d; c += 32) {
        out[c] = c < p.rotary_dim ? rotate(q, c, p, pos) : q[c];
    }
}

// Rows of the launch: new key/value rows, then (rotary only) query rows.
__host__ __device__ __forceinline__ int64_t kv_rows(const KvAppendParams& p) {
    return static_cast<int64_t>(p.b) * p.seqlen_new * p.h_k;
}
__host__ __device__ __forceinline__ int64_t q_rows(const KvAppendParams& p) {
    return p.rotary_dim > 0 ? static_cast<int64_t>(p.b) * p.seqlen_q * p.h : 0;
}

template <typename Element>
__global__ void __launch_bounds__(kThreads) kvcache_append_kernel(const KvAppendParams p) {
    if (p.seqlens_out != nullptr && blockIdx.x == 0) {
        for (int i = threadIdx.x; i < p.b; i += kThreads) {
            p.seqlens_out[i] = p.cache_seqlens[i] + p.seqlen_new;
        }
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t n_kv = kv_rows(p), n_rows = n_kv + q_rows(p);
    for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < n_rows;
         row += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
        if (row < n_kv) {
            append_kv_row<Element>(p, row, lane);
        } else {
            rotate_q_row<Element>(p, row - n_kv, lane);
        }
    }
    // The attention kernel after it may be PDL-launched (FwdParams::launch_pdl): its CTAs may be
    // scheduled once every CTA of this grid has executed this (they then wait for this grid to
    // complete). At the end, not the start: with the trigger first, MQA b128 steps (128
    // attention CTAs planned one per SM, 16 append CTAs; 132 SMs) ran 1.20-1.29x slower (run 109),
    // likely from attention CTAs placed two to an SM while the append CTAs held SMs.
    ptx::launch_dependents();
}

}  // namespace kvcache_append
}  // namespace flash_cuda
