// Launcher of the KV-cache append step (kernels/kvcache_append.cuh).
#include <algorithm>

#include "kernels/kvcache_append.cuh"
#include "kernels/launch.h"

namespace flash_cuda {

template <typename Element>
bool run_kvcache_append(const KvAppendParams& params, cudaStream_t stream) {
    using namespace kvcache_append;
    const int64_t rows = kv_rows(params) + q_rows(params);
    const bool seqlens = params.seqlens_out != nullptr && params.b > 0;  // written by block 0
    if ((rows == 0 || params.d == 0) && !seqlens) return false;
    // One warp per row; beyond 2^16 blocks the warps loop (grid-stride).
    const int64_t blocks =
        std::clamp<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, 1 << 16);
    kvcache_append_kernel<Element><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(params);
    FLASH_CUDA_CHECK_LAUNCH();
    return true;
}

template bool run_kvcache_append<__half>(const KvAppendParams&, cudaStream_t);
template bool run_kvcache_append<__nv_bfloat16>(const KvAppendParams&, cudaStream_t);

}  // namespace flash_cuda
