// Host launcher of the sm80 backward (declared in kernels/launch.h). Included by the generated
// csrc/instantiations/bwd_hdim*_sm80.cu files, one (Element, HeadDim, Causal) each.
// The caller (flash_api.cpp) provides: dq_accum_ptr zeroed fp32 (b, h, seqlen_q_rounded,
// HeadDim); dk_accum_ptr / dv_accum_ptr fp32 (b, h, seqlen_k_rounded, HeadDim) (fully written
// here); dsoftmax_sum fp32 (b, h, seqlen_q_rounded); seqlen_*_rounded multiples of 128.
// Fixed length, no softcap / ALiBi (the host routes those to the reference); dropout
// (p_keep < 1) is a template flag of the main kernel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/launch.h"
#include "kernels/params.h"
#include "kernels/sm80/bwd.cuh"
#include "kernels/static_switch.h"

namespace flash_cuda {

template <typename Element, int HeadDim, bool Causal>
void run_mha_bwd_sm80(BwdParams& params, cudaStream_t stream) {
    using Traits = typename sm80::BwdConfig<HeadDim>::Traits;
    if (params.b <= 0 || params.h <= 0 || params.seqlen_q <= 0) return;
    if (params.b > 65535 || params.h > 65535) {
        throw std::runtime_error("flash_cuda: backward kernel supports at most 65535 batch "
                                 "entries and 65535 heads");
    }
    auto blocks_for = [](int64_t threads) {
        return static_cast<unsigned>(std::min<int64_t>((threads + 255) / 256, 65535 * 16));
    };
    {
        const int64_t rows = static_cast<int64_t>(params.b) * params.h * params.seqlen_q;
        sm80::mha_bwd_preprocess_kernel<Element>
            <<<static_cast<unsigned>((rows * 32 + 255) / 256), 256, 0, stream>>>(params);
        FLASH_CUDA_CHECK_LAUNCH();
    }
    if (params.seqlen_k > 0) {
        BOOL_SWITCH(params.p_keep < 1.f, kIsDropout, [&] {
            auto kernel = &sm80::mha_bwd_sm80_kernel<Element, Traits, Causal, kIsDropout>;
            constexpr int kSmemBytes = Traits::kSmemBytes;
            reserve_dynamic_smem(kernel, kSmemBytes, "backward kernel");
            const dim3 grid((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, params.b,
                            params.h);
            kernel<<<grid, Traits::kNThreads, kSmemBytes, stream>>>(params);
            FLASH_CUDA_CHECK_LAUNCH();
        });
    }
    {
        const int64_t n = static_cast<int64_t>(params.b) * params.seqlen_q * params.h * params.d;
        sm80::mha_bwd_convert_dq_kernel<Element, HeadDim><<<blocks_for(n), 256, 0, stream>>>(params);
        FLASH_CUDA_CHECK_LAUNCH();
    }
    if (params.seqlen_k > 0) {
        const int64_t n = static_cast<int64_t>(params.b) * params.seqlen_k * params.h_k * params.d;
        sm80::mha_bwd_convert_dkv_kernel<Element, HeadDim>
            <<<blocks_for(n), 256, 0, stream>>>(params);
        FLASH_CUDA_CHECK_LAUNCH();
    }
}

}  // namespace flash_cuda
