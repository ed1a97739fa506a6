// Code that the CUDA kernels and the host (CPU references, launchers, the emulator, host tests)
// share: FLASH_HOST_DEVICE marks such a function, and the 32-bit multiply-high both sides need.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASH_HOST_DEVICE inline
#endif

namespace flash_cuda {

// The high 32 bits of the 64-bit product a * b (__umulhi on the GPU).
FLASH_HOST_DEVICE uint32_t mulhi_u32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

}  // namespace flash_cuda
