#include "rng.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <mutex>

namespace flash_cuda {

PhiloxSeed philox_seed_from_state(const at::Tensor& rng_state) {
    const at::Tensor host = rng_state.to(at::kCPU).contiguous();
    const int64_t* p = host.data_ptr<int64_t>();
    return PhiloxSeed{static_cast<uint64_t>(p[0]), static_cast<uint64_t>(p[1])};
}

PhiloxSeed philox_seed_for(const at::Tensor& q, const std::optional<at::Tensor>& rng_state,
                           double dropout_p, int64_t increment) {
    if (rng_state.has_value()) return philox_seed_from_state(*rng_state);
    if (dropout_p <= 0.0) return PhiloxSeed{};
    if (q.is_cuda()) {
        TORCH_CHECK_NOT_IMPLEMENTED(
            c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None,
            "flash_cuda: dropout inside CUDA graph capture is not supported yet");
        auto gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
            std::nullopt, at::cuda::detail::getDefaultCUDAGenerator(q.get_device()));
        std::lock_guard<std::mutex> lock(gen->mutex_);
        const at::PhiloxCudaState state = gen->philox_cuda_state(static_cast<uint64_t>(increment));
        return PhiloxSeed{state.seed_.val, state.offset_.val};
    }
    auto gen = at::get_generator_or_default<at::CPUGeneratorImpl>(
        std::nullopt, at::detail::getDefaultCPUGenerator());
    std::lock_guard<std::mutex> lock(gen->mutex_);
    return PhiloxSeed{gen->random64(), 0};
}

}  // namespace flash_cuda
