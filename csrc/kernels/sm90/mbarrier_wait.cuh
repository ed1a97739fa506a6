// Waiting on an mbarrier phase in the sm90 kernels: try_wait in a loop. Unbounded on purpose: a
// bounded loop that traps on timeout made ptxas spill 0.1-1 KB and serialise the wgmma of
// every sm90 kernel (the trap path breaks its register allocation around setmaxnreg). A wrong
// parity or byte count therefore hangs on the GPU: the CPU emulator (which fails such a wait
// after EMU_WAIT_SECONDS) and the tests' timeouts are the guard. Plain C++ over ptx_sm90.cuh's
// wrappers: the emulator runs it as it is.
#pragma once

#include <cstdint>

#include "kernels/sm90/ptx_sm90.cuh"

namespace flash_cuda {
namespace sm90 {

__device__ __forceinline__ void wait_phase(uint32_t bar, uint32_t parity) {
    while (!ptx90::mbarrier_try_wait_parity(bar, parity)) {
    }
}

}  // namespace sm90
}  // namespace flash_cuda
