// Where the dropout RNG's (seed, offset) come from. Both backends use the Philox mask of
// kernels/philox.cuh; this file only decides the seed and offset of a call.
//   CUDA: torch's default CUDA generator (philox_cuda_state), so torch.manual_seed reproduces a run;
//         under CUDA graph capture its graph-safe state (device pointers, see PhiloxSeed), so
//         every replay of the graph draws with the offset the generator advanced to.
//   CPU : torch's default CPU generator draws the seed; offset 0.
//   A given rng_state (int64 (2)) overrides both: the backward and replays use the forward's.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace flash_cuda {

struct PhiloxSeed {
    uint64_t seed = 0;
    uint64_t offset = 0;
    // CUDA graph capture: the values exist only on the device when the graph runs (torch's
    // graph-safe PhiloxCudaState, or an rng_state tensor): seed = *seed_ptr, offset =
    // *offset_ptr + offset_intragraph, read by the kernels; seed / offset above are 0 then.
    // Only the kernels can use such a seed (the reference needs the values on the host).
    const int64_t* seed_ptr = nullptr;
    const int64_t* offset_ptr = nullptr;
    uint64_t offset_intragraph = 0;

    bool on_device() const { return seed_ptr != nullptr; }
};

// Seed and offset for a call that draws `increment` counter values (batch * heads, philox.cuh).
// Without dropout no generator state is consumed and (0, 0) is returned.
PhiloxSeed philox_seed_for(const at::Tensor& q, const std::optional<at::Tensor>& rng_state,
                           double dropout_p, int64_t increment);

// Reads a (seed, offset) pair saved by the forward (copies 16 bytes to the host), or, during
// CUDA graph capture, points at it on the device (no copy can be captured).
PhiloxSeed philox_seed_from_state(const at::Tensor& rng_state);

}  // namespace flash_cuda
