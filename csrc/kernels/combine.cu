// Split-KV combine: launcher of kernels/combine.cuh (the formula and layouts are described
// there). Launched on the given stream; never synchronizes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/combine.cuh"
#include "kernels/launch.h"

namespace flash_cuda {

template <typename Element>
void run_combine_splits(const FwdParams& params, cudaStream_t stream) {
    const int64_t rows = static_cast<int64_t>(params.b) * params.h * params.seqlen_q;
    const bool vec4 = combine::vec4_layout(params);
    // The few-splits kernel has the warp kernel's launch shape (a warp per row).
    const bool few = combine::few_splits_kernel(params, vec4);
    const combine::LaunchPlan plan =
        combine::launch_plan(rows, params.num_splits, !few && combine::row_kernel_enabled());
    if (plan.blocks == 0) return;
    void (*kernel)(FwdParams) = vec4 ? &combine::combine_splits_kernel<Element, true>
                                     : &combine::combine_splits_kernel<Element, false>;
    if (few) {
        kernel = &combine::combine_few_splits_kernel<Element>;
    } else if (plan.row_kernel) {
        combine::with_row_warps(plan.threads / 32, [&](auto warps) {
            kernel = vec4 ? &combine::combine_splits_row_kernel<Element, true, warps()>
                          : &combine::combine_splits_row_kernel<Element, false, warps()>;
        });
    }
    launch_kernel<FwdParams>(kernel, dim3(static_cast<unsigned>(plan.blocks)), dim3(plan.threads),
                             plan.smem_bytes, stream, params.combine_pdl, params);
}

template void run_combine_splits<__half>(const FwdParams&, cudaStream_t);
template void run_combine_splits<__nv_bfloat16>(const FwdParams&, cudaStream_t);

}  // namespace flash_cuda
