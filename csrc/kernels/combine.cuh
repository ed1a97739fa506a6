// Split-KV combine kernel (device code; launched by combine.cu, run on the CPU by the emulator
// harness tests/emulation/fwd_emulated.cpp). Merges the fp32 partial results of `num_splits`
// key ranges into the final output. For one query row with partial (o_i, lse_i),
// i < num_splits:
//   m   = max_i lse_i
//   lse = m + log(sum_i exp(lse_i - m))          (+inf when every split saw no key)
//   o   = sum_i exp(lse_i - lse) * o_i            (0 for such rows)
// Partial lse of a split that saw no key is -inf (its weight is 0).
//
// Layouts: oaccum fp32 (num_splits, b, h, seqlen_q, d_rounded) contiguous (rows d_rounded
// floats apart, the first d used; the forward kernel writes d_rounded = its head dim); lseaccum
// fp32 (num_splits, b, h, seqlen_q); o (b, seqlen_q, h, d) with o_*_stride; lse (b, h, seqlen_q).
//
// One warp per query row, latency first (a decode step waits for this kernel; its inputs were
// just written and sit in L2): every lane reads its splits' lse once (splits lane, lane + 32,
// ...; all loads in flight together), the warp reduces max and sum by shuffles, the weights go
// to shared memory; then, with kVec4, each lane owns 4 consecutive columns (float4 loads, 8-byte
// stores), so a 128-column row takes one pass over the splits with the loads of several splits
// in flight; else one column per lane and pass (any d, any strides).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/convert.cuh"
#include "kernels/params.h"
#include "kernels/ptx.cuh"

namespace flash_cuda {
namespace combine {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxSplits = 128;  // = decode::kMaxSplits
constexpr int kSplitsPerLane = kMaxSplits / 32;
constexpr int kSmemBytes = kWarpsPerBlock * kMaxSplits * static_cast<int>(sizeof(float));

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    }
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Four Element values (8 bytes) to an 8-byte aligned address.
template <typename Element>
__device__ __forceinline__ void store4(Element* out, float4 v) {
    uint2 packed;
    packed.x = ptx::pack_float2<Element>(v.x, v.y);
    packed.y = ptx::pack_float2<Element>(v.z, v.w);
    *reinterpret_cast<uint2*>(out) = packed;
}

// kVec4: d % 4 == 0, oaccum 16-byte aligned with d_rounded % 4 == 0, o 8-byte aligned with
// strides % 4 == 0 (the launcher checks).
template <typename Element, bool kVec4>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    combine_splits_kernel(const FwdParams params) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* weights = reinterpret_cast<float*>(ptx::dynamic_smem()) + warp * kMaxSplits;
    const int64_t rows = static_cast<int64_t>(params.b) * params.h * params.seqlen_q;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;  // (b, h, sq)
    if (row >= rows) return;
    const int splits = params.num_splits, d = params.d;
    const float* lse_acc = params.softmax_lseaccum_ptr;

    // 1. lse over the splits: one read per split, kept in registers.
    float l[kSplitsPerLane];
#pragma unroll
    for (int i = 0; i < kSplitsPerLane; ++i) {
        const int s = lane + 32 * i;
        l[i] = s < splits ? lse_acc[s * rows + row] : -INFINITY;
    }
    float m = l[0];
#pragma unroll
    for (int i = 1; i < kSplitsPerLane; ++i) m = fmaxf(m, l[i]);
    m = warp_max(m);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kSplitsPerLane; ++i) sum += (l[i] == -INFINITY) ? 0.f : expf(l[i] - m);
    sum = warp_sum(sum);
    const float lse = (m == -INFINITY || sum == 0.f) ? INFINITY : m + logf(sum);
#pragma unroll
    for (int i = 0; i < kSplitsPerLane; ++i) {
        const int s = lane + 32 * i;
        if (s < splits) {
            weights[s] = (lse == INFINITY || l[i] == -INFINITY) ? 0.f : expf(l[i] - lse);
        }
    }
    __syncwarp();

    // 2. Weighted sum of the partial outputs.
    const int64_t sq = params.seqlen_q, h = params.h;
    const int64_t bi = row / (h * sq), hi = (row / sq) % h, qi = row % sq;
    Element* out = reinterpret_cast<Element*>(params.o_ptr) + bi * params.o_batch_stride +
                   qi * params.o_row_stride + hi * params.o_head_stride;
    const int64_t row_stride = params.d_rounded;
    const float* o_acc = reinterpret_cast<const float*>(params.oaccum_ptr) + row * row_stride;
    const int64_t split_stride = rows * row_stride;
    if constexpr (kVec4) {
        for (int c = 4 * lane; c < d; c += 4 * 32) {
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
            for (int s = 0; s < splits; ++s) {
                const float w = weights[s];
                const float4 o = *reinterpret_cast<const float4*>(o_acc + s * split_stride + c);
                acc.x += w * o.x;
                acc.y += w * o.y;
                acc.z += w * o.z;
                acc.w += w * o.w;
            }
            store4<Element>(out + c, acc);
        }
    } else {
        for (int c = lane; c < d; c += 32) {
            float acc = 0.f;
#pragma unroll 8
            for (int s = 0; s < splits; ++s) acc += weights[s] * o_acc[s * split_stride + c];
            out[c] = from_float<Element>(acc);
        }
    }
    if (lane == 0) params.softmax_lse_ptr[row] = lse;
}

}  // namespace combine
}  // namespace flash_cuda
