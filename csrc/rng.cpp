#include "rng.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <mutex>

namespace flash_cuda {

namespace {
bool capturing(const at::Tensor& t) {
    return t.is_cuda() &&
           c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}
}  // namespace

PhiloxSeed philox_seed_from_state(const at::Tensor& rng_state) {
    if (capturing(rng_state)) {
        PhiloxSeed s;
        s.seed_ptr = rng_state.data_ptr<int64_t>();
        s.offset_ptr = s.seed_ptr + 1;
        return s;
    }
    const at::Tensor host = rng_state.to(at::kCPU).contiguous();
    const int64_t* p = host.data_ptr<int64_t>();
    return PhiloxSeed{static_cast<uint64_t>(p[0]), static_cast<uint64_t>(p[1])};
}

PhiloxSeed philox_seed_for(const at::Tensor& q, const std::optional<at::Tensor>& rng_state,
                           double dropout_p, int64_t increment) {
    if (rng_state.has_value()) return philox_seed_from_state(*rng_state);
    if (dropout_p <= 0.0) return PhiloxSeed{};
    if (q.is_cuda()) {
        auto gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
            std::nullopt, at::cuda::detail::getDefaultCUDAGenerator(q.get_device()));
        std::lock_guard<std::mutex> lock(gen->mutex_);
        const at::PhiloxCudaState state = gen->philox_cuda_state(static_cast<uint64_t>(increment));
        if (state.captured_) {  // graph capture: the kernel reads seed and offset on the device
            PhiloxSeed s;
            s.seed_ptr = state.seed_.ptr;
            s.offset_ptr = state.offset_.ptr;
            s.offset_intragraph = state.offset_intragraph_;
            return s;
        }
        return PhiloxSeed{state.seed_.val, state.offset_.val};
    }
    auto gen = at::get_generator_or_default<at::CPUGeneratorImpl>(
        std::nullopt, at::detail::getDefaultCPUGenerator());
    std::lock_guard<std::mutex> lock(gen->mutex_);
    return PhiloxSeed{gen->random64(), 0};
}

}  // namespace flash_cuda
