// Host launcher of the sm90 backward (kernels/sm90/bwd_sm90.cuh; declared in kernels/launch.h).
// Included by the generated csrc/instantiations/bwd_hdim*_sm90.cu files. The steps around the
// main kernel are the sm80 backward's (sm80/bwd_steps.cuh), with its workspaces.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/launch.h"
#include "kernels/params.h"
#include "kernels/sm80/bwd_steps.cuh"
#include "kernels/sm90/bwd_sm90_wide.cuh"  // and bwd_sm90.cuh
#include "kernels/sm90/bwd_sm90_host.h"

namespace flash_cuda {

namespace sm90 {

template <typename Element, typename Traits, bool Causal, bool HasAlibi, bool IsDropout = false>
void launch_bwd_sm90_kernel(BwdParams& params, const BwdTensorMaps& maps, cudaStream_t stream) {
    auto kernel = bwd_sm90_kernel<Element, Traits, Causal, HasAlibi, IsDropout>();
    reserve_dynamic_smem(kernel, Traits::kSmemBytes, "sm90 backward kernel");
    const dim3 grid((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, params.b, params.h);
    kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params, maps.q, maps.k, maps.v,
                                                                     maps.d_o, maps.dq_accum);
    FLASH_CUDA_CHECK_LAUNCH();
}

}  // namespace sm90

template <typename Element, int HeadDim, bool Causal>
void run_mha_bwd_sm90(BwdParams& params, cudaStream_t stream) {
    using Traits = typename sm90::BwdSm90Config<HeadDim>::Traits;
    if (params.b <= 0 || params.h <= 0 || params.seqlen_q <= 0) return;
    // Any d up to the kernel's runs on it (zero-padded); the workspaces are sized for HeadDim.
    if (params.d > HeadDim || params.d_rounded != HeadDim || !sm90::bwd_supports(params)) {
        throw std::runtime_error("flash_cuda: the sm90 backward kernel does not cover this call");
    }
    sm90::BwdTensorMaps maps;
    const int r = sm90::make_bwd_tensor_maps(params, Traits::kBlockM, Traits::kBlockN, &maps);
    if (r != 0) {
        throw std::runtime_error("flash_cuda: cuTensorMapEncodeTiled failed for the sm90 backward "
                                 "(CUresult " + std::to_string(r) + ")");
    }
    sm80::launch_bwd_preprocess<Element, HeadDim>(params, stream);
    // The kernel without pingpong (the same tiles) where bwd_sm90_ordered_kernel says.
    using OrderedTraits = typename sm90::BwdSm90Config<HeadDim>::OrderedTraits;
    auto launch = [&](auto traits) {
        using T = typename decltype(traits)::type;
        if (params.p_keep < 1.f) {  // dropout, without ALiBi (bwd_supports)
            sm90::launch_bwd_sm90_kernel<Element, T, Causal, false, true>(params, maps, stream);
        } else if (params.alibi_slopes_ptr != nullptr) {
            sm90::launch_bwd_sm90_kernel<Element, T, Causal, true>(params, maps, stream);
        } else {
            sm90::launch_bwd_sm90_kernel<Element, T, Causal, false>(params, maps, stream);
        }
    };
    if (sm90::bwd_sm90_ordered_kernel(params) && !std::is_same_v<Traits, OrderedTraits>) {
        launch(std::type_identity<OrderedTraits>{});
    } else {
        launch(std::type_identity<Traits>{});
    }
    sm80::launch_bwd_postprocess<Element, HeadDim>(params, stream);
}

}  // namespace flash_cuda
