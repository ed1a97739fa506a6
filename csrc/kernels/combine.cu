// Split-KV combine: launcher of kernels/combine.cuh (the formula and layouts are described
// there). Launched on the given stream; never synchronizes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/combine.cuh"
#include "kernels/launch.h"

namespace flash_cuda {

namespace {

// FLASH_CUDA_DECODE_PDL=1 (read once; A/B switch) on a device of compute capability >= 9.0.
bool programmatic_launch_enabled() {
    static const bool requested = [] {
        const char* env = std::getenv("FLASH_CUDA_DECODE_PDL");
        return env != nullptr && std::strcmp(env, "1") == 0;
    }();
    if (!requested) return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
        return false;
    }
    return major >= 9;
}

}  // namespace

template <typename Element>
void run_combine_splits(const FwdParams& params, cudaStream_t stream) {
    const int64_t rows = static_cast<int64_t>(params.b) * params.h * params.seqlen_q;
    const int64_t blocks = (rows + combine::kWarpsPerBlock - 1) / combine::kWarpsPerBlock;
    if (blocks == 0) return;
    // float4 partial rows and 8-byte output groups where the layouts allow it.
    const bool vec4 = params.d % 4 == 0 && params.d_rounded % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(params.oaccum_ptr) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(params.o_ptr) % 8 == 0 &&
                      params.o_batch_stride % 4 == 0 && params.o_row_stride % 4 == 0 &&
                      params.o_head_stride % 4 == 0;
    const auto kernel = vec4 ? &combine::combine_splits_kernel<Element, true>
                             : &combine::combine_splits_kernel<Element, false>;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(combine::kWarpsPerBlock * 32);
    config.dynamicSmemBytes = combine::kSmemBytes;
    config.stream = stream;
    // Programmatic dependent launch (sm_90+): the combine starts while the split kernel's CTAs
    // finish and waits in-kernel (griddepcontrol.wait) for their partials.
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    if (programmatic_launch_enabled()) {
        config.attrs = &attribute;
        config.numAttrs = 1;
    }
    cudaLaunchKernelEx(&config, kernel, params);
    FLASH_CUDA_CHECK_LAUNCH();
}

template void run_combine_splits<__half>(const FwdParams&, cudaStream_t);
template void run_combine_splits<__nv_bfloat16>(const FwdParams&, cudaStream_t);

}  // namespace flash_cuda
