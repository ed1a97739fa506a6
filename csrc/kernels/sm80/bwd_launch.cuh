// Host launcher of the sm80 backward (declared in kernels/launch.h). Included by the generated
// csrc/instantiations/bwd_hdim*_sm80.cu files, one (Element, HeadDim, Causal) each; softcap and
// ALiBi become template flags here (launch_bwd_kernel), as in fwd_launch.cuh.
// The caller (flash_api.cpp) provides, fixed length: dq_accum_ptr zeroed fp32
// (splits, b, h, seqlen_q_rounded, HeadDim); unless dkv_direct (MHA), dk_accum_ptr /
// dv_accum_ptr fp32 (b, h, seqlen_k_rounded, HeadDim); dsoftmax_sum fp32 (b, h, seqlen_q_rounded);
// seqlen_*_rounded multiples of 128. Varlen (cu_seqlens_q / cu_seqlens_k, total_q, total_k,
// seqlen_q / seqlen_k = the max lengths): dq_accum zeroed (splits, h, total_q, HeadDim), dk / dv
// workspaces (h, total_k, HeadDim) unless dkv_direct (then dk / dv zeroed: packed rows of no
// sequence), dsoftmax_sum (h, total_q). dq / dk / dv contiguous, d a multiple of 8. splits = num_splits when
// deterministic (dq_accum_split_stride floats apart), else 1. Dropout (p_keep < 1) is a template
// flag of the main kernel, compiled without softcap / ALiBi only (the host routes dropout with
// those, varlen or deterministic to the reference), which keeps the build small.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/launch.h"
#include "kernels/params.h"
#include "kernels/sm80/bwd.cuh"
#include "kernels/sm80/bwd_v2.cuh"

// Which main kernel: head dims with a BwdV2Config (64, 128) run mha_bwd_sm80_v2_kernel
// (bwd_v2.cuh, FA2-style warp grids; 1.00-1.08x faster fwd+bwd at d128 than bwd.cuh, bench/NOTES
// run 19) except with dropout; dropout and every other head dim run mha_bwd_sm80_kernel.

namespace flash_cuda {

namespace sm80 {

// One instantiation of the main kernel on the tile Traits (the bias tile when softcap or ALiBi
// is on). Grid: key blocks (deterministic: num_splits CTAs, each walking key blocks in order).
template <typename Element, typename Traits, bool Causal, bool kHasAlibi, bool kHasSoftcap,
          bool kIsDropout>
void launch_bwd_kernel(BwdParams& params, cudaStream_t stream) {
    auto kernel = &mha_bwd_sm80_kernel<Element, Traits, Causal, kHasAlibi, kHasSoftcap, kIsDropout>;
    constexpr int kSmemBytes = Traits::kSmemBytes;
    reserve_dynamic_smem(kernel, kSmemBytes, "backward kernel");
    const int n_blocks = (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
    const dim3 grid(params.deterministic ? params.num_splits : n_blocks, params.b, params.h);
    kernel<<<grid, Traits::kNThreads, kSmemBytes, stream>>>(params);
    FLASH_CUDA_CHECK_LAUNCH();
}

template <typename Element, typename Traits, bool Causal, bool kHasAlibi, bool kHasSoftcap>
void launch_bwd_v2_kernel(BwdParams& params, cudaStream_t stream) {
    auto kernel = &mha_bwd_sm80_v2_kernel<Element, Traits, Causal, kHasAlibi, kHasSoftcap>;
    constexpr int kSmemBytes = Traits::kSmemBytes;
    reserve_dynamic_smem(kernel, kSmemBytes, "backward kernel v2");
    const int n_blocks = (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
    const dim3 grid(params.deterministic ? params.num_splits : n_blocks, params.b, params.h);
    kernel<<<grid, Traits::kNThreads, kSmemBytes, stream>>>(params);
    FLASH_CUDA_CHECK_LAUNCH();
}

}  // namespace sm80

template <typename Element, int HeadDim, bool Causal>
void run_mha_bwd_sm80(BwdParams& params, cudaStream_t stream) {
    using Config = sm80::BwdConfig<HeadDim>;
    const bool varlen = params.cu_seqlens_q != nullptr;
    if (params.b <= 0 || params.h <= 0 || params.seqlen_q <= 0) return;
    if (params.b > 65535 || params.h > 65535) {
        throw std::runtime_error("flash_cuda: backward kernel supports at most 65535 batch "
                                 "entries and 65535 heads");
    }
    auto blocks_for = [](int64_t threads) {
        return static_cast<unsigned>(std::min<int64_t>((threads + 255) / 256, 65535 * 16));
    };
    {
        const int64_t rows = varlen ? static_cast<int64_t>(params.h) * params.total_q
                                    : static_cast<int64_t>(params.b) * params.h * params.seqlen_q;
        if (rows > 0) {
            sm80::mha_bwd_preprocess_kernel<Element>
                <<<static_cast<unsigned>((rows * 32 + 255) / 256), 256, 0, stream>>>(params);
            FLASH_CUDA_CHECK_LAUNCH();
        }
    }
    if (params.seqlen_k > 0) {
        const bool has_softcap = params.softcap > 0.f;
        const bool has_alibi = params.alibi_slopes_ptr != nullptr;
        using BiasTraits = sm80::bias_traits_t<Config>;
        using Traits = typename Config::Traits;
        if (params.p_keep < 1.f) {
            if (has_softcap || has_alibi || varlen || params.deterministic) {
                throw std::runtime_error("flash_cuda: the backward kernel's dropout covers fixed "
                                         "length without softcap / ALiBi, non-deterministic");
            }
            sm80::launch_bwd_kernel<Element, sm80::bwd_dropout_traits_t<HeadDim>, Causal, false,
                                    false, true>(params, stream);
        } else if constexpr (sm80::BwdV2Config<HeadDim>::kSupported) {
            using V2 = typename sm80::BwdV2Config<HeadDim>::Traits;
            if (has_softcap && has_alibi) {
                sm80::launch_bwd_v2_kernel<Element, V2, Causal, true, true>(params, stream);
            } else if (has_softcap) {
                sm80::launch_bwd_v2_kernel<Element, V2, Causal, false, true>(params, stream);
            } else if (has_alibi) {
                sm80::launch_bwd_v2_kernel<Element, V2, Causal, true, false>(params, stream);
            } else {
                sm80::launch_bwd_v2_kernel<Element, V2, Causal, false, false>(params, stream);
            }
        } else if (has_softcap && has_alibi) {
            sm80::launch_bwd_kernel<Element, BiasTraits, Causal, true, true, false>(params, stream);
        } else if (has_softcap) {
            sm80::launch_bwd_kernel<Element, BiasTraits, Causal, false, true, false>(params, stream);
        } else if (has_alibi) {
            sm80::launch_bwd_kernel<Element, BiasTraits, Causal, true, false, false>(params, stream);
        } else {
            sm80::launch_bwd_kernel<Element, Traits, Causal, false, false, false>(params, stream);
        }
    }
    // Postprocess: one thread per 8 head-dim columns of a (row, head); grid (row chunks, heads).
    constexpr int kChunks = HeadDim / 8;
    {
        const int64_t rows = varlen ? params.total_q : static_cast<int64_t>(params.b) * params.seqlen_q;
        if (rows > 0) {
            const dim3 grid(blocks_for(rows * kChunks), params.h);
            sm80::mha_bwd_convert_dq_kernel<Element, HeadDim><<<grid, 256, 0, stream>>>(params);
            FLASH_CUDA_CHECK_LAUNCH();
        }
    }
    if (!params.dkv_direct) {  // GQA: sum the per-query-head dk / dv workspaces
        const int64_t rows = varlen ? params.total_k : static_cast<int64_t>(params.b) * params.seqlen_k;
        if (rows > 0) {
            const dim3 grid(blocks_for(rows * kChunks), params.h_k);
            sm80::mha_bwd_convert_dkv_kernel<Element, HeadDim><<<grid, 256, 0, stream>>>(params);
            FLASH_CUDA_CHECK_LAUNCH();
        }
    }
}

}  // namespace flash_cuda
