// Host launcher of the sm80 backward (declared in kernels/launch.h). Included by the generated
// csrc/instantiations/bwd_hdim*_sm80.cu files, one (Element, HeadDim, Causal) each; softcap and
// ALiBi become template flags here (launch_bwd_kernel), as in fwd_launch.cuh.
// The caller (flash_api.cpp) provides, fixed length: dq_accum_ptr zeroed fp32
// (splits, b, h, seqlen_q_rounded, HeadDim); unless dkv_direct (MHA), dk_accum_ptr /
// dv_accum_ptr fp32 (b, h, seqlen_k_rounded, HeadDim); dsoftmax_sum fp32 (b, h, seqlen_q_rounded);
// seqlen_*_rounded multiples of 128. Varlen (cu_seqlens_q / cu_seqlens_k, total_q, total_k,
// seqlen_q / seqlen_k = the max lengths): dq_accum zeroed (splits, h, total_q, HeadDim), dk / dv
// workspaces (h, total_k, HeadDim) unless dkv_direct (then dk / dv zeroed: packed rows of no
// sequence), dsoftmax_sum (h, total_q). dq / dk / dv contiguous, d a multiple of 8.
// splits = num_splits when deterministic (dq_accum_split_stride floats apart), else 1.
// Dropout (p_keep < 1) is a template flag of the main kernel (bwd.cuh), with or without softcap
// / ALiBi.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/bias_flags.h"
#include "kernels/launch.h"
#include "kernels/params.h"
#include "kernels/sm80/bwd.cuh"
#include "kernels/sm80/bwd_steps.cuh"
#include "kernels/sm80/bwd_v2.cuh"
#ifdef FLASH_CUDA_BWD_TUNING
#include <cstdlib>

#include "kernels/sm80/bwd_tune_configs.h"
#endif

// Which main kernel: head dims with a BwdV2Config (64, 96, 128, 192, 256) run
// mha_bwd_sm80_v2_kernel (bwd_v2.cuh, FA2-style warp grids; faster fwd+bwd than bwd.cuh: d128
// +5-10% (bench/NOTES run 19), d256 +30-50%, d96 +6-21%, d192 +4-6% (run 23)) except with
// dropout, and except where the device cannot reserve the v2 tile's shared
// memory (d256: 214 KB, more than A100's 163 KB); those and every other head dim run
// mha_bwd_sm80_kernel. Tuning builds (FLASH_CUDA_BWD_TUNING): FLASH_CUDA_BWD_TILE=<n> picks
// variant n of bwd_tune_configs.h instead of BwdV2Config where it exists.

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

// Shared memory of the default v2 tile of HeadDim (0 without one).
template <int HeadDim>
constexpr int bwd_v2_smem_bytes() {
    if constexpr (BwdV2Config<HeadDim>::kSupported) {
        return BwdV2Config<HeadDim>::Traits::kSmemBytes;
    } else {
        return 0;
    }
}

// v2 on the tile Traits, the softcap / ALiBi flags picked at run time.
template <typename Element, typename Traits, bool Causal>
void launch_bwd_v2(BwdParams& params, cudaStream_t stream, bool has_softcap, bool has_alibi) {
    with_bias_flags(has_softcap, has_alibi, [&](auto alibi, auto softcap) {
        launch_bwd_v2_kernel<Element, Traits, Causal, decltype(alibi)::value,
                             decltype(softcap)::value>(params, stream);
    });
}

// bwd.cuh's kernel without dropout: the bias tile (bias_traits_t) with softcap or ALiBi, else
// the config's tile.
template <typename Element, typename Config, bool Causal>
void launch_bwd_v1(BwdParams& params, cudaStream_t stream, bool has_softcap, bool has_alibi) {
    with_bias_flags(has_softcap, has_alibi, [&](auto alibi, auto softcap) {
        constexpr bool kAlibi = decltype(alibi)::value, kSoftcap = decltype(softcap)::value;
        using Traits = std::conditional_t<kAlibi || kSoftcap, bias_traits_t<Config>,
                                          typename Config::Traits>;
        launch_bwd_kernel<Element, Traits, Causal, kAlibi, kSoftcap, false>(params, stream);
    });
}

// Whether the current device can reserve `bytes` of dynamic shared memory per CTA (asked only
// for tiles above A100's 163 KB).
inline bool device_fits_smem(int bytes) {
    if (bytes <= 163 * 1024) return true;
    int device = 0, optin = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess) {
        return false;
    }
    return optin >= bytes;
}

#ifdef FLASH_CUDA_BWD_TUNING
// FLASH_CUDA_BWD_TILE (tuning builds), read once per process; 0 = BwdV2Config.
inline int bwd_tile_variant() {
    static const int variant = [] {
        const char* env = std::getenv("FLASH_CUDA_BWD_TILE");
        return env == nullptr ? 0 : std::atoi(env);
    }();
    return variant;
}

// Tuning builds: the v2 variant `variant` of bwd_tune_configs.h, if it exists for HeadDim.
template <typename Element, int HeadDim, bool Causal, int Variant = 1>
bool launch_bwd_tile_variant(BwdParams& params, cudaStream_t stream, int variant,
                             bool has_softcap, bool has_alibi) {
    if constexpr (Variant < kNumBwdTileVariants) {
        if constexpr (BwdV2TuneConfig<HeadDim, Variant>::kExists) {
            if (variant == Variant) {
                using Traits = typename BwdV2TuneConfig<HeadDim, Variant>::Traits;
                launch_bwd_v2<Element, Traits, Causal>(params, stream, has_softcap, has_alibi);
                return true;
            }
        }
        return launch_bwd_tile_variant<Element, HeadDim, Causal, Variant + 1>(
            params, stream, variant, has_softcap, has_alibi);
    }
    return false;
}
#endif

}  // namespace sm80

template <typename Element, int HeadDim, bool Causal>
void run_mha_bwd_sm80(BwdParams& params, cudaStream_t stream) {
    using Config = sm80::BwdConfig<HeadDim>;
    if (params.b <= 0 || params.h <= 0 || params.seqlen_q <= 0) return;
    if (params.b > 65535 || params.h > 65535) {
        throw std::runtime_error("flash_cuda: backward kernel supports at most 65535 batch "
                                 "entries and 65535 heads");
    }
    sm80::launch_bwd_preprocess<Element, HeadDim>(params, stream);
    if (params.seqlen_k > 0) {
        const bool has_softcap = params.softcap > 0.f;
        const bool has_alibi = params.alibi_slopes_ptr != nullptr;
        // bwd.cuh's non-dropout kernels are compiled only where v2 does not cover the head dim
        // or may not fit the device (v2 tile above A100's 163 KB): the d64 / d128 build does
        // not contain them.
        constexpr bool kV2 = sm80::BwdV2Config<HeadDim>::kSupported;
        // Tuning builds keep them everywhere: FLASH_CUDA_BWD_TILE=9 runs bwd.cuh (A/B).
#ifdef FLASH_CUDA_BWD_TUNING
        constexpr bool kV1Fallback = true;
#else
        constexpr bool kV1Fallback = !kV2 || sm80::bwd_v2_smem_bytes<HeadDim>() > 163 * 1024;
#endif
        if (params.p_keep < 1.f) {
            // The dropout tile; with softcap / ALiBi the bias tile (the same at d >= 128).
            with_bias_flags(has_softcap, has_alibi, [&](auto alibi, auto softcap) {
                constexpr bool kAlibi = decltype(alibi)::value, kSoftcap = decltype(softcap)::value;
                using T = std::conditional_t<kAlibi || kSoftcap, sm80::bias_traits_t<Config>,
                                             sm80::bwd_dropout_traits_t<HeadDim>>;
                sm80::launch_bwd_kernel<Element, T, Causal, kAlibi, kSoftcap, true>(params, stream);
            });
        } else {
            [[maybe_unused]] bool ran_v2 = false;  // the main kernel ran on bwd_v2.cuh
            if constexpr (kV2) {
                using V2 = typename sm80::BwdV2Config<HeadDim>::Traits;
#ifdef FLASH_CUDA_BWD_TUNING
                const int variant = sm80::bwd_tile_variant();
                ran_v2 = variant != 0 && sm80::launch_bwd_tile_variant<Element, HeadDim, Causal>(
                                             params, stream, variant, has_softcap, has_alibi);
                const bool force_v1 = variant == sm80::kBwdTileV1;
#else
                constexpr bool force_v1 = false;
#endif
                if (!ran_v2 && !force_v1 &&
                    (!kV1Fallback || sm80::device_fits_smem(V2::kSmemBytes))) {
                    sm80::launch_bwd_v2<Element, V2, Causal>(params, stream, has_softcap,
                                                             has_alibi);
                    ran_v2 = true;
                }
            }
            if constexpr (kV1Fallback) {
                if (!ran_v2) {
                    sm80::launch_bwd_v1<Element, Config, Causal>(params, stream, has_softcap,
                                                                 has_alibi);
                }
            }
        }
    }
    sm80::launch_bwd_postprocess<Element, HeadDim>(params, stream);
}

}  // namespace flash_cuda
