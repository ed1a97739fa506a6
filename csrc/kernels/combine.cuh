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
//
// With many splits and few rows (decode at small batch: e.g. 32 rows x 16-128 splits) the warp
// per row leaves most of the GPU idle and walks its splits in several dependent rounds (8 float4
// loads in flight per lane). combine_splits_row_kernel then takes one CTA of W = row_warps(splits)
// warps per row (4, 8 or 16: at least one per kRowChunk splits): warp w merges splits w, w + W,
// ... with an online softmax over chunks of kRowChunk splits, loading each chunk's lse and
// partial rows together (one round trip per chunk: one in all up to 128 splits), and the warps'
// (max, sum, row) triples are merged through shared memory:
//   M = max_w m_w,  L = sum_w l_w exp(m_w - M),  o = sum_w o_w exp(m_w - M) / L,  lse = M + log L
// (o_w, l_w: warp w's sums of exp(lse_i - m_w) o_i and exp(lse_i - m_w)), the same formula
// as above in another order. launch_plan() picks the kernel (combine.cu and the emulator),
// unless the rows fit combine_few_splits_kernel (few_splits_kernel: at most 8 splits, the float4
// layout, at most 128 columns), which loads the lse and the partial rows in one round trip.
//
// Both kernels start with griddepcontrol.wait: after a split-KV attention kernel on sm_90 they
// are launched with programmatic dependent launch (FwdParams::combine_pdl), so their CTAs take
// SM slots while the attention kernel's last CTAs run and start reading the moment it completes,
// instead of after a kernel-launch gap.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "kernels/convert.cuh"
#include "kernels/params.h"
#include "kernels/ptx.cuh"

namespace flash_cuda {
namespace combine {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxSplits = 128;  // = decode::kMaxSplits
constexpr int kSplitsPerLane = kMaxSplits / 32;
constexpr int kSmemBytes = kWarpsPerBlock * kMaxSplits * static_cast<int>(sizeof(float));

// The row kernel: splits per warp and round trip, warps per row (CTA) and its shared memory
// (per warp: max, sum and one column pass of 128 floats).
constexpr int kRowChunk = 8;
constexpr int kRowMaxWarps = kMaxSplits / kRowChunk;  // 16: every split in one round trip
constexpr int kRowColsPerPass = 128;  // 32 lanes x 4 columns (float4), or 32 x 1 (scalar)

// Warps of the row kernel's CTA for `splits` splits, a compile-time count of the kernel: 4 up to
// 32 splits, 8 up to 64, else 16, so that each warp loads its (at most kRowChunk) splits in one
// round trip. with_row_warps(warps, f) calls f(std::integral_constant<int, warps>).
inline int row_warps(int splits) {
    return splits <= 4 * kRowChunk ? 4 : (splits <= 8 * kRowChunk ? 8 : kRowMaxWarps);
}
template <typename F>
void with_row_warps(int warps, F&& f) {
    if (warps == 16) {
        f(std::integral_constant<int, 16>{});
    } else if (warps == 8) {
        f(std::integral_constant<int, 8>{});
    } else {
        f(std::integral_constant<int, 4>{});
    }
}
inline int row_smem_bytes(int warps) {
    return warps * (2 + kRowColsPerPass) * static_cast<int>(sizeof(float));
}

// FLASH_CUDA_COMBINE_ROW=0 in the environment (read per call, host side; the CPU emulator reads
// it too) keeps every combine on the warp per row (A/B runs); by default launch_plan() may pick
// the row kernel (bench/NOTES.md session 7: +26-29% on MQA b1 kv32k / kv131k decode steps).
inline bool row_kernel_enabled() {
    const char* value = std::getenv("FLASH_CUDA_COMBINE_ROW");
    return !(value != nullptr && value[0] == '0' && value[1] == '\0');
}

// Which kernel merges `rows` rows of `splits` splits, and its launch shape. The row kernel (where
// `allow_row_kernel`) where the warp per row would walk its splits in more than one round
// (splits >= 8) and its CTAs would not fill the GPU many times over (rows <= 4096: a CTA per
// row), with row_warps(splits) warps.
struct LaunchPlan {
    bool row_kernel;
    int64_t blocks;
    int threads;
    int smem_bytes;
};
inline LaunchPlan launch_plan(int64_t rows, int splits, bool allow_row_kernel) {
    if (allow_row_kernel && splits >= 8 && rows <= 4096) {
        const int warps = row_warps(splits);
        return {true, rows, warps * 32, row_smem_bytes(warps)};
    }
    return {false, (rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kWarpsPerBlock * 32, kSmemBytes};
}

// Whether the layouts allow the kVec4 kernels: float4 partial rows and 8-byte output groups.
inline bool vec4_layout(const FwdParams& p) {
    return p.d % 4 == 0 && p.d_rounded % 4 == 0 &&
           reinterpret_cast<uintptr_t>(p.oaccum_ptr) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(p.o_ptr) % 8 == 0 && p.o_batch_stride % 4 == 0 &&
           p.o_row_stride % 4 == 0 && p.o_head_stride % 4 == 0;
}

// The few-splits kernel: at most kFewSplits splits, rows of at most kFewMaxCols columns on the
// float4 layout. One warp per row; every lane loads every split's lse and every split's float4
// of its 4 columns together, one round trip from L2 instead of the warp kernel's two (lse, then
// the partial rows weighted by them), and merges in registers. Its bits are the scalar warp
// kernel's (same reductions in the same order; the emulator checks that).
// FLASH_CUDA_COMBINE_FEW=0 in the environment (read per call, host side; the emulator too)
// keeps those rows on the other kernels (A/B runs).
constexpr int kFewSplits = 8;
constexpr int kFewMaxCols = 32 * 4;
inline bool few_splits_kernel(const FwdParams& p, bool vec4) {
    const char* value = std::getenv("FLASH_CUDA_COMBINE_FEW");
    const bool enabled = !(value != nullptr && value[0] == '0' && value[1] == '\0');
    return enabled && vec4 && p.num_splits <= kFewSplits && p.d <= kFewMaxCols;
}

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

// Output row (b, sq, h, d layout) of combine row `row` = (b, h, sq) flattened.
template <typename Element>
__device__ __forceinline__ Element* output_row(const FwdParams& params, int64_t row) {
    const int64_t sq = params.seqlen_q, h = params.h;
    const int64_t bi = row / (h * sq), hi = (row / sq) % h, qi = row % sq;
    return reinterpret_cast<Element*>(params.o_ptr) + bi * params.o_batch_stride +
           qi * params.o_row_stride + hi * params.o_head_stride;
}

// kVec4: d % 4 == 0, oaccum 16-byte aligned with d_rounded % 4 == 0, o 8-byte aligned with
// strides % 4 == 0 (vec4_layout, which the launcher checks).
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
    ptx::wait_for_prior_grid();  // the partials' writer (PDL launch; a no-op otherwise)

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
    Element* out = output_row<Element>(params, row);
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

// See few_splits_kernel. The float4 layout (vec4_layout), at most kFewSplits splits and
// kFewMaxCols columns; kWarpsPerBlock rows per CTA.
template <typename Element>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    combine_few_splits_kernel(const FwdParams params) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t rows = static_cast<int64_t>(params.b) * params.h * params.seqlen_q;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;  // (b, h, sq)
    if (row >= rows) return;
    const int splits = params.num_splits;
    const int c = 4 * lane;
    const bool col_ok = c < params.d;
    const int64_t row_stride = params.d_rounded;
    const float* o_acc = reinterpret_cast<const float*>(params.oaccum_ptr) + row * row_stride;
    const int64_t split_stride = rows * row_stride;
    ptx::wait_for_prior_grid();  // the partials' writer (PDL launch; a no-op otherwise)

    // One round trip: every lane loads every split's lse (the same addresses across the warp)
    // and its 4 columns of every split's partial row, all unconditionally (splits past the end
    // read split 0 and weigh 0; lanes past the columns read column 0 and store nothing) and
    // volatile (ptxas keeps them in program order, so all 16 go out before the first use);
    // nothing after them needs another lane: no shuffles.
    const float* lse_acc = params.softmax_lseaccum_ptr;
    const int c_load = col_ok ? c : 0;
    float l[kFewSplits];
    float4 o[kFewSplits];
#pragma unroll
    for (int s = 0; s < kFewSplits; ++s) {
        const int64_t s_load = s < splits ? s : 0;
        o[s] = ptx::ld_volatile_f32x4(o_acc + s_load * split_stride + c_load);
    }
#pragma unroll
    for (int s = 0; s < kFewSplits; ++s) {
        const int64_t s_load = s < splits ? s : 0;
        l[s] = ptx::ld_volatile_f32(lse_acc + s_load * rows + row);
    }
#pragma unroll
    for (int s = 0; s < kFewSplits; ++s) {
        if (s >= splits) l[s] = -INFINITY;
    }
    float m = l[0];
#pragma unroll
    for (int s = 1; s < kFewSplits; ++s) m = fmaxf(m, l[s]);
    float e[kFewSplits];
#pragma unroll
    for (int s = 0; s < kFewSplits; ++s) e[s] = l[s] == -INFINITY ? 0.f : expf(l[s] - m);
    // The sum in warp_sum's order over lanes 0..7 (the warp kernel's lane s holds split s), so
    // the result has the scalar warp kernel's bits.
    static_assert(kFewSplits == 8, "the sum tree below is warp_sum's for 8 lanes");
    const float sum = ((e[0] + e[4]) + (e[2] + e[6])) + ((e[1] + e[5]) + (e[3] + e[7]));
    const float lse = (m == -INFINITY || sum == 0.f) ? INFINITY : m + logf(sum);
    // Every split's row is used (weight 0 past the end: adding w * o = +-0 leaves acc's bits
    // as they are), so no load sinks into a branch of its own, one round trip after another.
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kFewSplits; ++s) {
        const float w = (lse == INFINITY || l[s] == -INFINITY) ? 0.f : expf(l[s] - lse);
        acc.x += w * o[s].x;
        acc.y += w * o[s].y;
        acc.z += w * o[s].z;
        acc.w += w * o[s].w;
    }
    if (col_ok) store4<Element>(output_row<Element>(params, row) + c, acc);
    if (lane == 0) params.softmax_lse_ptr[row] = lse;
}

// One CTA of kWarps = row_warps(num_splits) warps per row; see the top of the file. kVec4 as
// above: each lane owns 4 consecutive columns of a 128-column pass, else 1 of a 32-column pass.
template <typename Element, bool kVec4, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    combine_splits_row_kernel(const FwdParams params) {
    constexpr int kLaneCols = kVec4 ? 4 : 1;
    constexpr int kColsPerPass = 32 * kLaneCols;
    const int splits = params.num_splits, d = params.d;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* smem = reinterpret_cast<float*>(ptx::dynamic_smem());
    float* warp_max_s = smem;                // [kWarps]
    float* warp_sum_s = smem + kWarps;       // [kWarps]
    float* warp_acc_s = smem + 2 * kWarps;   // [kWarps][kColsPerPass]
    const int64_t rows = static_cast<int64_t>(params.b) * params.h * params.seqlen_q;
    const int64_t row = blockIdx.x;
    const float* lse_acc = params.softmax_lseaccum_ptr;
    const int64_t row_stride = params.d_rounded;
    const float* o_acc = reinterpret_cast<const float*>(params.oaccum_ptr) + row * row_stride;
    const int64_t split_stride = rows * row_stride;
    Element* out = output_row<Element>(params, row);
    ptx::wait_for_prior_grid();  // the partials' writer (PDL launch; a no-op otherwise)

    for (int c0 = 0; c0 < d; c0 += kColsPerPass) {
        const int c = c0 + kLaneCols * lane;
        const bool col_ok = c < d;  // (kVec4: d % 4 == 0, so then all 4 columns are < d)
        // 1. This warp's splits, kRowChunk per round trip, merged online.
        float m = -INFINITY, sum = 0.f, acc[kLaneCols];
#pragma unroll
        for (int k = 0; k < kLaneCols; ++k) acc[k] = 0.f;
        for (int s0 = warp; s0 < splits; s0 += kWarps * kRowChunk) {
            float l[kRowChunk], o[kRowChunk][kLaneCols];
#pragma unroll
            for (int j = 0; j < kRowChunk; ++j) {
                const int s = s0 + kWarps * j;
                const bool ok = s < splits;
                l[j] = ok ? lse_acc[s * rows + row] : -INFINITY;
                if constexpr (kVec4) {
                    const float4 v = ok && col_ok ? *reinterpret_cast<const float4*>(
                                                        o_acc + s * split_stride + c)
                                                  : make_float4(0.f, 0.f, 0.f, 0.f);
                    o[j][0] = v.x;
                    o[j][1] = v.y;
                    o[j][2] = v.z;
                    o[j][3] = v.w;
                } else {
                    o[j][0] = ok && col_ok ? o_acc[s * split_stride + c] : 0.f;
                }
            }
            float m_new = m;
#pragma unroll
            for (int j = 0; j < kRowChunk; ++j) m_new = fmaxf(m_new, l[j]);
            if (m_new != -INFINITY) {  // else every split so far saw no key
                const float rescale = m == -INFINITY ? 0.f : expf(m - m_new);
                sum *= rescale;
#pragma unroll
                for (int k = 0; k < kLaneCols; ++k) acc[k] *= rescale;
#pragma unroll
                for (int j = 0; j < kRowChunk; ++j) {
                    const float w = l[j] == -INFINITY ? 0.f : expf(l[j] - m_new);
                    sum += w;
#pragma unroll
                    for (int k = 0; k < kLaneCols; ++k) acc[k] += w * o[j][k];
                }
                m = m_new;
            }
        }
        // 2. The warps' partial results through shared memory; warp 0 merges and stores.
        if (lane == 0) {
            warp_max_s[warp] = m;
            warp_sum_s[warp] = sum;
        }
#pragma unroll
        for (int k = 0; k < kLaneCols; ++k) {
            warp_acc_s[warp * kColsPerPass + kLaneCols * lane + k] = acc[k];
        }
        __syncthreads();
        if (warp == 0) {
            float row_max = -INFINITY;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) row_max = fmaxf(row_max, warp_max_s[w]);
            float total = 0.f, merged[kLaneCols];
#pragma unroll
            for (int k = 0; k < kLaneCols; ++k) merged[k] = 0.f;
            if (row_max != -INFINITY) {
#pragma unroll
                for (int w = 0; w < kWarps; ++w) {
                    const float mw = warp_max_s[w];
                    const float f = mw == -INFINITY ? 0.f : expf(mw - row_max);
                    total += f * warp_sum_s[w];
#pragma unroll
                    for (int k = 0; k < kLaneCols; ++k) {
                        merged[k] += f * warp_acc_s[w * kColsPerPass + kLaneCols * lane + k];
                    }
                }
            }
            const bool empty = row_max == -INFINITY || total == 0.f;
            const float inv_total = empty ? 0.f : 1.f / total;
            if (col_ok) {
                if constexpr (kVec4) {
                    store4<Element>(out + c, make_float4(merged[0] * inv_total,
                                                         merged[1] * inv_total,
                                                         merged[2] * inv_total,
                                                         merged[3] * inv_total));
                } else {
                    out[c] = from_float<Element>(merged[0] * inv_total);
                }
            }
            if (lane == 0 && c0 == 0) {
                params.softmax_lse_ptr[row] = empty ? INFINITY : row_max + logf(total);
            }
        }
        __syncthreads();  // shared memory is reused by the next column pass
    }
}

}  // namespace combine
}  // namespace flash_cuda
