// Host launcher of the sm90 forward kernel (kernels/sm90/fwd_sm90.cuh; declared in
// kernels/launch.h). Included by the generated csrc/instantiations/fwd_hdim*_sm90.cu files, one
// (Element, HeadDim, Causal) each (compiled for every architecture of the build; the kernels
// have a body in the sm_90a pass only). Softcap and ALiBi become template parameters here, as in
// the sm80 launcher; the rest is read from the params at run time.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/bias_flags.h"
#include "kernels/launch.h"
#include "kernels/params.h"
#include "kernels/sm90/fwd_sm90.cuh"
#include "kernels/sm90/fwd_sm90_host.h"

namespace flash_cuda {

namespace sm90 {

template <typename Element, typename Traits, bool Causal, bool HasAlibi, bool HasSoftcap>
void launch_fwd_sm90_kernel(const FwdParams& params, const FwdTensorMaps& maps,
                            const CUtensorMap& o_map, int ctas, cudaStream_t stream) {
    auto kernel = &mha_fwd_sm90_kernel<Element, Traits, Causal, HasAlibi, HasSoftcap>;
    reserve_dynamic_smem(kernel, Traits::kSmemBytes, "sm90 forward kernel");
    static_assert(Traits::kBlockM == 128, "fwd_sm90_tiles counts 128-row tiles");
    kernel<<<dim3(ctas), Traits::kNThreads, Traits::kSmemBytes, stream>>>(params, maps.q, maps.k,
                                                                          maps.v, o_map);
    FLASH_CUDA_CHECK_LAUNCH();
}

// ctas: the grid (fwd_sm90_ctas).
template <typename Element, typename Traits, bool Causal>
void launch_fwd_sm90(const FwdParams& params, int ctas, cudaStream_t stream) {
    FwdTensorMaps maps;
    CUtensorMap o_map;
    int r = make_fwd_tensor_maps(params, Traits::kBlockM, Traits::kBlockN, &maps);
    if (r == 0) r = make_fwd_out_map(params, Traits::kStoreOByTma, &o_map);
    if (r != 0) {
        throw std::runtime_error("flash_cuda: cuTensorMapEncodeTiled failed for the sm90 forward "
                                 "(CUresult " + std::to_string(r) + ")");
    }
    if constexpr (Traits::kDropout) {  // without softcap / ALiBi (fwd_supports)
        launch_fwd_sm90_kernel<Element, Traits, Causal, false, false>(params, maps, o_map, ctas,
                                                                      stream);
    } else {
        const ScoreBias bias = fwd_score_bias(params);  // the sm80 launcher's variant choice
        with_bias_flags(bias.softcap, bias.alibi, [&](auto alibi, auto softcap) {
            launch_fwd_sm90_kernel<Element, Traits, Causal, decltype(alibi)::value,
                                   decltype(softcap)::value>(params, maps, o_map, ctas,
                                                             stream);
        });
    }
}

}  // namespace sm90

template <typename Element, int HeadDim, bool Causal>
void run_mha_fwd_sm90(FwdParams& params, cudaStream_t stream) {
    if (params.seqlen_q <= 0 || params.b <= 0 || params.h <= 0) return;
    if (sm90::fwd_kernel_head_dim(params.d) != HeadDim || !sm90::fwd_supports(params)) {
        throw std::runtime_error("flash_cuda: the sm90 forward kernel does not cover this call");
    }
    int device = 0, l2_bytes = 0, num_sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        throw std::runtime_error("flash_cuda: cannot read the GPU's L2 size / SM count (sm90 "
                                 "forward)");
    }
    sm90::prepare_fwd_sm90_divisors(params);
    const int ctas = sm90::fwd_sm90_ctas(params, num_sms);
    params.sm90_tile_chunk = sm90::fwd_sm90_tile_chunk(params, l2_bytes, ctas);
    params.sm90_tail_pairs = sm90::fwd_sm90_tail_pairs(params, l2_bytes, ctas);
    sm90::prepare_fwd_sm90_level_order(params);
    params.sm90_every_tile_has_work = sm90::fwd_sm90_every_tile_has_work(params);
    sm90::with_fwd_sm90_traits<HeadDim, Causal>(params, [&](auto traits) {
        sm90::launch_fwd_sm90<Element, decltype(traits), Causal>(params, ctas, stream);
    });
}

}  // namespace flash_cuda
