// Host launcher of the sm80 forward kernel (declared in kernels/launch.h). Included by the
// generated csrc/instantiations/fwd_hdim*_sm80.cu files, one (Element, HeadDim, Causal) each.
// Runtime features that change the inner loop (softcap, ALiBi, dropout) become template parameters
// here (launch_fwd); everything else (window, varlen, sequence ends, GQA) is read
// from the params at run time.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/bias_flags.h"
#include "kernels/decode.h"
#include "kernels/launch.h"
#include "kernels/params.h"
#include "kernels/sm80/fwd.cuh"
#include "kernels/sm80/traits.h"
#include "kernels/sm80/tune_configs.h"

namespace flash_cuda {

namespace sm80 {

// One instantiation of the kernel on the tile KernelTraits.
template <typename Element, typename KernelTraits, bool Causal, bool kHasAlibi, bool kHasSoftcap,
          bool kIsDropout>
void launch_fwd_kernel(FwdParams& params, cudaStream_t stream) {
    auto kernel = &sm80::mha_fwd_sm80_kernel<Element, KernelTraits, Causal, kHasAlibi,
                                             kHasSoftcap, kIsDropout>;
    constexpr int kSmemBytes = KernelTraits::kSmemBytes;
    reserve_dynamic_smem(kernel, kSmemBytes, "forward kernel");
    if ((!KernelTraits::kSplitKV && params.num_splits > 1) ||
        (!KernelTraits::kPagedKV && params.block_table != nullptr) ||
        (!KernelTraits::kPackGQA && params.gqa_pack > 1)) {
        throw std::runtime_error("flash_cuda: split-KV / paged KV need the decode tile");
    }
    if (KernelTraits::kHeadGroups != (params.head_group > 1)) {
        throw std::runtime_error("flash_cuda: head groups need the head-group tile and it them");
    }
    // The grid (fwd.cuh block_coords) and the divisors of the kernel's index math.
    const dim3 grid = prepare_fwd_grid<KernelTraits>(params);
    const int64_t m_split_blocks =
        static_cast<int64_t>(params.num_m_blocks_div.value()) * params.num_splits;
    if (KernelTraits::kSplitKV && m_split_blocks > 65535) {
        throw std::runtime_error("flash_cuda: decode tile supports at most 65535 query "
                                 "blocks x splits, got " + std::to_string(m_split_blocks));
    }
    // After a KV-cache append: programmatic dependent launch (the decode tile waits, fwd.cuh).
    launch_kernel<FwdParams>(kernel, grid, dim3(KernelTraits::kLaunchThreads), kSmemBytes, stream,
                             KernelTraits::kSplitKV && params.launch_pdl, params);
}

// Launches the kernel: tile configuration Traits, or BiasTraits for the ALiBi / softcap variants
// (they keep more values live in the score loop, so a head dim may give them a smaller tile),
// BothTraits with ALiBi and softcap together, DropoutTraits with dropout (with or without
// softcap / ALiBi: the dropout tile carries their flags too). Dropout (p_keep < 1) is a template
// flag (the kernels without it are unchanged).
template <typename Element, typename Traits, typename BiasTraits, typename BothTraits,
          typename DropoutTraits, bool Causal>
void launch_fwd(FwdParams& params, cudaStream_t stream) {
    if (params.seqlen_q <= 0 || params.b <= 0 || params.h <= 0) return;
    if (params.b > 65535 || params.h > 65535) {
        throw std::runtime_error("flash_cuda: forward kernel supports at most 65535 batch entries "
                                 "and 65535 heads, got b=" + std::to_string(params.b) +
                                 ", h=" + std::to_string(params.h));
    }
    if (params.num_splits < 1) params.num_splits = 1;
    const ScoreBias bias = fwd_score_bias(params);
    const bool has_softcap = bias.softcap, has_alibi = bias.alibi;
    const bool is_dropout = params.p_keep < 1.f;
    if (is_dropout) {
        with_bias_flags(has_softcap, has_alibi, [&](auto alibi, auto softcap) {
            launch_fwd_kernel<Element, DropoutTraits, Causal, decltype(alibi)::value,
                              decltype(softcap)::value, true>(params, stream);
        });
    } else if (has_softcap && has_alibi) {
        launch_fwd_kernel<Element, BothTraits, Causal, true, true, false>(params, stream);
    } else if (has_softcap) {
        launch_fwd_kernel<Element, BiasTraits, Causal, false, true, false>(params, stream);
    } else if (has_alibi) {
        launch_fwd_kernel<Element, BiasTraits, Causal, true, false, false>(params, stream);
    } else {
        launch_fwd_kernel<Element, Traits, Causal, false, false, false>(params, stream);
    }
}

// Tuning builds: the variant params.tile_variant of tune_configs.h, if it exists for HeadDim.
template <typename Element, int HeadDim, bool Causal, int Variant = 1>
bool launch_tile_variant(FwdParams& params, cudaStream_t stream) {
    if constexpr (Variant < kNumTileVariants) {
        if constexpr (FwdTuneConfig<HeadDim, Variant>::kExists) {
            if (params.tile_variant == Variant) {
                using Traits = typename FwdTuneConfig<HeadDim, Variant>::Traits;
                launch_fwd<Element, Traits, Traits, Traits, Traits, Causal>(params, stream);
                return true;
            }
        }
        return launch_tile_variant<Element, HeadDim, Causal, Variant + 1>(params, stream);
    }
    return false;
}

#ifdef FLASH_CUDA_FWD_TUNING
// Tuning builds: the decode tile variant params.tile_variant of tune_configs.h (4..6), if any.
template <typename Element, int HeadDim, bool Causal, int Variant = kFirstDecodeVariant>
bool launch_decode_variant(FwdParams& params, cudaStream_t stream) {
    if constexpr (Variant < kFirstDecodeVariant + kNumDecodeVariants) {
        if (params.tile_variant == Variant) {
            using Traits = typename FwdDecodeTuneConfig<HeadDim, Variant>::Traits;
            launch_fwd<Element, Traits, Traits, Traits, Traits, Causal>(params, stream);
            return true;
        }
        return launch_decode_variant<Element, HeadDim, Causal, Variant + 1>(params, stream);
    }
    return false;
}
#endif

}  // namespace sm80

template <typename Element, int HeadDim, bool Causal>
void run_mha_fwd_sm80(FwdParams& params, cudaStream_t stream) {
#ifdef FLASH_CUDA_FWD_TUNING
    if (params.tile_variant != 0 && params.num_splits <= 1 && params.block_table == nullptr &&
        params.gqa_pack <= 1 &&
        sm80::launch_tile_variant<Element, HeadDim, Causal>(params, stream)) {
        return;
    }
#endif
    // Decode and short queries (at most one 64-row tile per sequence) and paged KV: the decode
    // tile (traits.h: FwdDecodeConfig), also for the ALiBi / softcap variants.
    if (params.seqlen_q <= sm80::FwdDecodeConfig<HeadDim>::kBlockM || params.block_table != nullptr ||
        params.gqa_pack > 1) {
#ifdef FLASH_CUDA_FWD_TUNING
        if (sm80::launch_decode_variant<Element, HeadDim, Causal>(params, stream)) return;
#endif
        // Head groups (decode.h plan_packing): the head-group twin of the key-split tile,
        // whose plain variant is the only one compiled (the host plans no other; never causal).
        if (params.head_group > 1) {
            const ScoreBias bias = fwd_score_bias(params);
            const bool grouped = !Causal && !bias.softcap && !bias.alibi && !(params.p_keep < 1.f) &&
                sm80::with_head_group_traits<HeadDim>(
                    decode::decode_tile(params), [&](const char*, auto tile) {
                        using G = typename decltype(tile)::type;
                        if constexpr (!Causal) {
                            sm80::launch_fwd_kernel<Element, G, false, false, false, false>(
                                params, stream);
                        }
                    });
            if (!grouped) {
                throw std::runtime_error("flash_cuda: no head-group kernel for this call");
            }
            return;
        }
        using Decode = typename sm80::FwdDecodeConfig<HeadDim>::Traits;
        // Key-split tile (decode_keysplit.cuh; off with FLASH_CUDA_DECODE_KEYSPLIT=0) for tiles
        // of at most 16 rows (4 key slices) or 32 rows (2 x 2); dropout stays on the 64-row tile.
        // decode.h decode_tile says which (sm80::with_keysplit_traits: the tile's traits). Every
        // variant (ALiBi, softcap) runs on the paged-capable traits T, the plain one on their
        // twin P without the paged path where decode.h contiguous_keysplit says so, else on T;
        // dropout's on Decode.
        const bool contiguous = decode::contiguous_keysplit(params);
        const bool keysplit = sm80::with_keysplit_traits<HeadDim>(
            decode::decode_tile(params), [&](const char*, auto tile, auto plain) {
                using T = typename decltype(tile)::type;
                using P = typename decltype(plain)::type;
                if (contiguous) {
                    sm80::launch_fwd<Element, P, T, T, Decode, Causal>(params, stream);
                } else {
                    sm80::launch_fwd<Element, T, T, T, Decode, Causal>(params, stream);
                }
            });
        if (keysplit) return;
        sm80::launch_fwd<Element, Decode, Decode, Decode, Decode, Causal>(params, stream);
        return;
    }
    using Config = sm80::FwdConfig<HeadDim>;
    sm80::launch_fwd<Element, typename Config::Traits, sm80::bias_traits_t<Config>,
                     sm80::alibi_softcap_traits_t<Config>, sm80::dropout_traits_t<Config>,
                     Causal>(params, stream);
}

}  // namespace flash_cuda
