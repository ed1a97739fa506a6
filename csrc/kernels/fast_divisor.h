// Division of non-negative ints by a divisor fixed for a whole launch, as one multiply-high, an
// add and a shift. nvcc emits a run-time integer division as an I2F / MUFU.RCP / F2I / IMAD
// chain of about 25 instructions and some 100 cycles of latency; the decode prologue had eight
// of them ahead of its first copy (bench/NOTES.md session 25). The host makes the constants
// once per launch (sm80/fwd.cuh prepare_fwd_grid); host code and tests use the same arithmetic.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace flash_cuda {

// Round-up multiplier (Granlund and Montgomery, "Division by invariant integers using
// multiplication", 1994, theorem 4.2 with N = 32): for a divisor d >= 1 let s = ceil(log2 d)
// and m = floor(2^32 (2^s - d) / d) + 1, which is below 2^32 because 2^s - d < d. Then for every
// 0 <= n < 2^32, n / d = (umulhi(n, m) + n) >> s computed in 33 bits; for n < 2^31 the sum
// stays below 2^32, so 32-bit arithmetic is exact. d = 1 gives m = 1, s = 0: n itself.
struct FastDivisor {
    uint32_t divisor;
    uint32_t multiplier;
    uint32_t shift;

    // d < 1 is taken as 1 (a field that is 0 when its feature is off: gqa_pack, head groups).
    static FastDivisor make(int d) {
        const uint64_t dd = d < 1 ? 1u : static_cast<uint64_t>(d);
        uint32_t s = 0;
        while ((uint64_t{1} << s) < dd) ++s;
        FastDivisor f;
        f.divisor = static_cast<uint32_t>(dd);
        f.shift = s;
        f.multiplier =
            static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - dd)) / dd + 1);
        return f;
    }

    // n / divisor, for 0 <= n < 2^31.
    FLASH_HOST_DEVICE int div(int n) const {
        const uint32_t un = static_cast<uint32_t>(n);
        return static_cast<int>((mulhi_u32(un, multiplier) + un) >> shift);
    }

    FLASH_HOST_DEVICE int value() const { return static_cast<int>(divisor); }
};

}  // namespace flash_cuda
