// The backward's steps around its main kernel, shared by the sm80 launcher (bwd_launch.cuh) and
// the sm90 one (sm90/bwd_sm90_launch.cuh): the preprocess (D = rowsum(dO * O), bwd.cuh) before,
// and after it the dq_accum -> dq conversion and, for GQA (not dkv_direct), the sum of the
// per-query-head dk / dv workspaces. Host code; the caller's params and workspaces as
// bwd_launch.cuh describes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/launch.h"
#include "kernels/params.h"
#include "kernels/sm80/bwd.cuh"

namespace flash_cuda {
namespace sm80 {

// Blocks of 256 threads for `threads` threads of work, capped (the kernels loop over the rest).
inline unsigned bwd_blocks_for(int64_t threads) {
    return static_cast<unsigned>(std::min<int64_t>((threads + 255) / 256, 65535 * 16));
}

// D = rowsum(dO * O), bwd_preprocess_lanes(HeadDim) lanes per (query row, head); and dq_accum
// zeroed (dq_accum_zero_vec4). The grid covers the larger of the two (the rows, or four float4s
// of zeros per thread); both loops are grid-stride beyond it.
template <typename Element, int HeadDim>
void launch_bwd_preprocess(const BwdParams& params, cudaStream_t stream) {
    constexpr int kLanes = bwd_preprocess_lanes(HeadDim);
    const bool varlen = params.cu_seqlens_q != nullptr;
    const int64_t pairs = varlen ? static_cast<int64_t>(params.h) * params.total_q
                                 : static_cast<int64_t>(params.b) * params.h * params.seqlen_q;
    if (pairs > 0 || params.dq_accum_zero_vec4 > 0) {
        const int64_t threads = std::max(pairs * kLanes, (params.dq_accum_zero_vec4 + 3) / 4);
        mha_bwd_preprocess_kernel<Element, kLanes>
            <<<bwd_blocks_for(threads), 256, 0, stream>>>(params);
        FLASH_CUDA_CHECK_LAUNCH();
    }
}

// dq_accum -> dq, and the GQA dk / dv sums: one thread per 8 head-dim columns of a (row, head);
// grid (row chunks, heads).
template <typename Element, int HeadDim>
void launch_bwd_postprocess(const BwdParams& params, cudaStream_t stream) {
    const bool varlen = params.cu_seqlens_q != nullptr;
    auto launch = [&](auto kernel, int64_t rows, int heads) {
        if (rows <= 0) return;
        const dim3 grid(bwd_blocks_for(rows * (HeadDim / 8)), heads);
        kernel<<<grid, 256, 0, stream>>>(params);
        FLASH_CUDA_CHECK_LAUNCH();
    };
    launch(&mha_bwd_convert_dq_kernel<Element, HeadDim>,
           varlen ? params.total_q : static_cast<int64_t>(params.b) * params.seqlen_q, params.h);
    if (!params.dkv_direct) {  // GQA: sum the per-query-head dk / dv workspaces
        launch(&mha_bwd_convert_dkv_kernel<Element, HeadDim>,
               varlen ? params.total_k : static_cast<int64_t>(params.b) * params.seqlen_k,
               params.h_k);
    }
}

}  // namespace sm80
}  // namespace flash_cuda
