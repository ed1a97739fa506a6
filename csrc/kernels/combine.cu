// Split-KV combine: merges the fp32 partial results of `num_splits` key ranges into the final
// output. For one query row with partial (o_i, lse_i), i < num_splits:
//   m   = max_i lse_i
//   lse = m + log(sum_i exp(lse_i - m))          (+inf when every split saw no key)
//   o   = sum_i exp(lse_i - lse) * o_i            (0 for such rows)
// Partial lse of a split that saw no key is -inf (its weight is 0).
//
// Layouts: oaccum fp32 (num_splits, b, h, seqlen_q, d_rounded) contiguous (rows d_rounded
// floats apart, the first d used; the forward kernel writes d_rounded = its head dim); lseaccum fp32
// (num_splits, b, h, seqlen_q); o (b, seqlen_q, h, d) with o_*_stride; lse (b, h, seqlen_q).
// One warp per query row: lanes first reduce the split weights, then each lane writes
// d / 32 output columns. Launched on the given stream; never synchronizes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/convert.cuh"
#include "kernels/launch.h"

namespace flash_cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxSplits = 128;

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

template <typename Element>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    combine_splits_kernel(const FwdParams params) {
    __shared__ float weights[kWarpsPerBlock][kMaxSplits];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t rows = static_cast<int64_t>(params.b) * params.h * params.seqlen_q;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;  // (b, h, sq)
    if (row >= rows) return;
    const int splits = params.num_splits, d = params.d;
    const float* lse_acc = params.softmax_lseaccum_ptr;

    // 1. lse over the splits.
    float m = -INFINITY;
    for (int s = lane; s < splits; s += 32) m = fmaxf(m, lse_acc[s * rows + row]);
    m = warp_max(m);
    float sum = 0.f;
    for (int s = lane; s < splits; s += 32) {
        const float l = lse_acc[s * rows + row];
        sum += (l == -INFINITY) ? 0.f : expf(l - m);
    }
    sum = warp_sum(sum);
    const float lse = (m == -INFINITY || sum == 0.f) ? INFINITY : m + logf(sum);
    for (int s = lane; s < splits; s += 32) {
        const float l = lse_acc[s * rows + row];
        weights[warp][s] = (lse == INFINITY || l == -INFINITY) ? 0.f : expf(l - lse);
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
    for (int c = lane; c < d; c += 32) {
        float acc = 0.f;
        for (int s = 0; s < splits; ++s) acc += weights[warp][s] * o_acc[s * split_stride + c];
        out[c] = from_float<Element>(acc);
    }
    if (lane == 0) params.softmax_lse_ptr[row] = lse;
}

}  // namespace

template <typename Element>
void run_combine_splits(const FwdParams& params, cudaStream_t stream) {
    const int64_t rows = static_cast<int64_t>(params.b) * params.h * params.seqlen_q;
    const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (blocks == 0) return;
    combine_splits_kernel<Element><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(params);
    FLASH_CUDA_CHECK_LAUNCH();
}

template void run_combine_splits<__half>(const FwdParams&, cudaStream_t);
template void run_combine_splits<__nv_bfloat16>(const FwdParams&, cudaStream_t);

}  // namespace flash_cuda
