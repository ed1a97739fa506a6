// Host-side declarations of every kernel launcher. Included by flash_api.cpp (compiled by the host
// compiler) and by the .cu files that define them; no torch headers, no device code.
// Each launcher takes a params struct and the stream to launch on, checks the launch, and never
// synchronizes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/kvcache_append.h"
#include "kernels/params.h"

// After every kernel launch: turn a launch error into an exception (a Python RuntimeError).
#define FLASH_CUDA_CHECK_LAUNCH()                                                             \
    do {                                                                                      \
        const cudaError_t flash_cuda_err = cudaGetLastError();                                \
        if (flash_cuda_err != cudaSuccess) {                                                  \
            throw std::runtime_error(std::string("flash_cuda: kernel launch failed: ") +      \
                                     cudaGetErrorString(flash_cuda_err) + " (" __FILE__ ":" + \
                                     std::to_string(__LINE__) + ")");                         \
        }                                                                                     \
    } while (0)

namespace flash_cuda {

// Lets `kernel` launch with `bytes` of dynamic shared memory (an opt-in above 48 KB); throws,
// naming `what`, when the GPU cannot give that much to one CTA. The attribute is set once per
// (kernel, device) for the largest size asked so far: cudaFuncSetAttribute costs microseconds of
// host time, which short calls notice (bench/NOTES.md session 38).
template <typename Kernel>
inline void reserve_dynamic_smem(Kernel kernel, int bytes, const char* what) {
    if (bytes <= 48 * 1024) return;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) device = -1;
    static std::mutex mutex;
    static std::map<std::pair<const void*, int>, int> reserved;  // (kernel, device) -> bytes
    const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), device);
    {
        const std::lock_guard<std::mutex> lock(mutex);
        const auto it = reserved.find(key);
        if (it != reserved.end() && it->second >= bytes) return;
    }
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) {
        throw std::runtime_error(std::string("flash_cuda: cannot reserve ") +
                                 std::to_string(bytes) + " bytes of shared memory for the " +
                                 what + ": " + cudaGetErrorString(err));
    }
    if (device >= 0) {
        const std::lock_guard<std::mutex> lock(mutex);
        int& held = reserved[key];
        held = std::max(held, bytes);
    }
}

// kernel<<<grid, block, smem_bytes, stream>>>(params), with programmatic dependent launch when
// `pdl` (sm_90+: the kernel may start before the previous one in the stream completes, so it must
// execute griddepcontrol.wait, kernels/ptx.cuh wait_for_prior_grid, before reading what that one
// wrote). Launch errors become exceptions.
template <typename Params>
inline void launch_kernel(void (*kernel)(Params), dim3 grid, dim3 block, int smem_bytes,
                          cudaStream_t stream, bool pdl, const Params& params) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = pdl ? 1 : 0;
    (void)cudaLaunchKernelEx(&config, kernel, params);  // an error is also the runtime's last one
    FLASH_CUDA_CHECK_LAUNCH();
}

// Portable tensor-core forward (mma.sync, sm80+). Element: __half or __nv_bfloat16.
// HeadDim: the kernel's head dim (params.d <= HeadDim; inputs are padded to a multiple of 8).
// Instantiated per (Element, HeadDim, Causal) in csrc/instantiations/ (generate_kernels.py).
template <typename Element, int HeadDim, bool Causal>
void run_mha_fwd_sm80(FwdParams& params, cudaStream_t stream);

// Hopper forward (TMA, wgmma; kernels/sm90/fwd_sm90.cuh), head dims 64, 128 and 256, for the calls
// sm90::fwd_supports (kernels/sm90/fwd_sm90_host.h) accepts. Compiled with a body only for sm_90a:
// call it only when the build has sm_90a (FLASH_CUDA_HAS_SM90) and the device is sm_90.
template <typename Element, int HeadDim, bool Causal>
void run_mha_fwd_sm90(FwdParams& params, cudaStream_t stream);

// Hopper backward main kernel (TMA, wgmma; kernels/sm90/bwd_sm90.cuh, bwd_sm90_wide.cuh) between
// the sm80 backward's preprocess and convert steps, head dims 64, 128 and 256, for the calls
// sm90::bwd_supports (kernels/sm90/bwd_sm90_host.h) accepts; workspaces as run_mha_bwd_sm80's.
// Compiled with a body only for sm_90a (as run_mha_fwd_sm90).
template <typename Element, int HeadDim, bool Causal>
void run_mha_bwd_sm90(BwdParams& params, cudaStream_t stream);

// Portable tensor-core backward (mma.sync, sm80+), fixed length or varlen, softcap / ALiBi,
// deterministic dq, dropout (kernels/sm80/bwd_launch.cuh lists the workspaces the caller
// provides).
template <typename Element, int HeadDim, bool Causal>
void run_mha_bwd_sm80(BwdParams& params, cudaStream_t stream);

// Split-KV combine: merges params.num_splits fp32 partial outputs (oaccum_ptr) and lses
// (softmax_lseaccum_ptr) into o_ptr (Element) and softmax_lse_ptr. csrc/kernels/combine.cu.
template <typename Element>
void run_combine_splits(const FwdParams& params, cudaStream_t stream);

// KV-cache append step before attention: new k (rotary applied) and v into the cache (paged or
// not), and q rotated into params.qrot_ptr when rotary is on. csrc/kernels/kvcache_append.cu.
// Returns whether it launched the kernel (not when there is nothing to write).
template <typename Element>
bool run_kvcache_append(const KvAppendParams& params, cudaStream_t stream);

}  // namespace flash_cuda
