// The end of a backward main kernel (bwd.cuh, bwd_v2.cuh): one warp's dK and dV accumulators
// for its key block leave the registers.
//
// Fragments are m16n8 accumulators (fp32, dK unscaled): acc[mt][nt][2 half + j] holds key row
// key_row0 + 16 mt + 8 half + lane / 4 of the block and head-dim column col0 + 8 nt + 2 (lane % 4)
// + j. Rows at or past valid_keys are not stored. kv_row0: the workspace row of the sequence's
// key 0 for this query head (BwdSequence::kv_row0).
//   params.dkv_direct (MHA: one query head per KV head): dk = scale * dK and dv = dV in Element,
//     straight into the outputs (no workspace, no convert pass); columns >= params.d skipped.
//   otherwise (GQA): fp32 rows of the per-query-head workspaces dk_accum / dv_accum;
//     mha_bwd_convert_dkv_kernel sums each group in a fixed order.
// kDoDk / kDoDv: which of the two this kernel (pass) accumulated.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/params.h"
#include "kernels/ptx.cuh"

namespace flash_cuda {
namespace sm80 {

template <typename Element, int kHeadDim, bool kDoDk, bool kDoDv, int kMTiles, int kNTiles>
__device__ __forceinline__ void store_dk_dv(const BwdParams& params, int batch, int head,
                                            int64_t kv_row0, int n0, int key_row0, int col0,
                                            int lane, int valid_keys,
                                            const float (&acc_dk)[kMTiles][kNTiles][4],
                                            const float (&acc_dv)[kMTiles][kNTiles][4]) {
    const int key_row = key_row0 + lane / 4;  // in the block
    const int col = col0 + 2 * (lane % 4);
    if (params.dkv_direct) {
        const int64_t key0 =
            (params.cu_seqlens_k != nullptr ? params.cu_seqlens_k[batch] : 0) + n0 + key_row;
        const int64_t batch_k = params.cu_seqlens_k != nullptr ? 0 : batch;
        Element* dk = reinterpret_cast<Element*>(params.dk_ptr) + batch_k * params.dk_batch_stride +
                      key0 * params.dk_row_stride + head * params.dk_head_stride + col;
        Element* dv = reinterpret_cast<Element*>(params.dv_ptr) + batch_k * params.dv_batch_stride +
                      key0 * params.dv_row_stride + head * params.dv_head_stride + col;
        const float scale = params.scale_softmax;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = 16 * mt + 8 * half;
                if (key_row + r >= valid_keys) continue;
#pragma unroll
                for (int nt = 0; nt < kNTiles; ++nt) {
                    if (col + 8 * nt >= params.d) continue;
                    if constexpr (kDoDk) {
                        *reinterpret_cast<uint32_t*>(dk + r * params.dk_row_stride + 8 * nt) =
                            ptx::pack_float2<Element>(scale * acc_dk[mt][nt][2 * half],
                                                      scale * acc_dk[mt][nt][2 * half + 1]);
                    }
                    if constexpr (kDoDv) {
                        *reinterpret_cast<uint32_t*>(dv + r * params.dv_row_stride + 8 * nt) =
                            ptx::pack_float2<Element>(acc_dv[mt][nt][2 * half],
                                                      acc_dv[mt][nt][2 * half + 1]);
                    }
                }
            }
        }
        return;
    }
    const int64_t ws_offset = (kv_row0 + n0 + key_row) * kHeadDim + col;
    float* dk_ws = reinterpret_cast<float*>(params.dk_accum_ptr) + ws_offset;
    float* dv_ws = reinterpret_cast<float*>(params.dv_accum_ptr) + ws_offset;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (key_row + 16 * mt + 8 * half >= valid_keys) continue;
            const int64_t row_off = (16 * mt + 8 * half) * kHeadDim;
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
                if constexpr (kDoDk) {
                    *reinterpret_cast<float2*>(dk_ws + row_off + 8 * nt) =
                        make_float2(acc_dk[mt][nt][2 * half], acc_dk[mt][nt][2 * half + 1]);
                }
                if constexpr (kDoDv) {
                    *reinterpret_cast<float2*>(dv_ws + row_off + 8 * nt) =
                        make_float2(acc_dv[mt][nt][2 * half], acc_dv[mt][nt][2 * half + 1]);
                }
            }
        }
    }
}

}  // namespace sm80
}  // namespace flash_cuda
