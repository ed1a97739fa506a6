// Where the dropout RNG's (seed, offset) come from. Both backends use the Philox mask of
// kernels/philox.cuh; this file only decides the seed and offset of a call.
//   CUDA: torch's default CUDA generator (philox_cuda_state), so torch.manual_seed reproduces a run.
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
};

// Seed and offset for a call that draws `increment` counter values (batch * heads, philox.cuh).
// Without dropout no generator state is consumed and (0, 0) is returned.
PhiloxSeed philox_seed_for(const at::Tensor& q, const std::optional<at::Tensor>& rng_state,
                           double dropout_p, int64_t increment);

// Reads a (seed, offset) pair saved by the forward (copies 16 bytes to the host).
PhiloxSeed philox_seed_from_state(const at::Tensor& rng_state);

}  // namespace flash_cuda
