// Philox4x32-10 counter-based RNG and the dropout mask it defines. Host and device: the CPU
// reference and the CUDA kernels draw the *same* mask for the same (seed, offset), so a GPU run
// can be checked element by element against the CPU oracle.
//
// The mask, independent of any thread layout:
//   element (bh = batch * h + head, row i, col j) of an attention call with (seed, offset):
//     r = philox(key = seed, counter = {j / 8, i, lo32(bh + offset), hi32(bh + offset)})
//     u = 16-bit lane (j % 8) of r (lane 2k is the low half of word k, 2k+1 the high half)
//     kept  <=>  u < p_keep_in_uint16  (= round(p_keep * 65536))
//   row i and col j are relative to the sequence start (varlen too).
// Each call consumes b * h counter values of the offset (dropout_offset_increment).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace flash_cuda {

struct Philox4 {
    uint32_t x, y, z, w;
};

FLASH_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
    lo = a * b;
    hi = mulhi_u32(a, b);
}

// Ten rounds of Philox4x32 on `counter` with the 64-bit `seed` as key.
FLASH_HOST_DEVICE Philox4 philox4x32_10(Philox4 counter, uint64_t seed) {
    constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
    constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    Philox4 c = counter;
#if defined(__CUDACC__)  // host compilers (the CPU reference) warn on the unknown pragma
#pragma unroll
#endif
    for (int round = 0; round < 10; ++round) {
        uint32_t hi0, lo0, hi1, lo1;
        philox_mulhilo(kMul0, c.x, hi0, lo0);
        philox_mulhilo(kMul1, c.z, hi1, lo1);
        c = Philox4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
        k0 += kWeyl0;
        k1 += kWeyl1;
    }
    return c;
}

// The eight 16-bit draws for columns [8 * col_group, 8 * col_group + 8) of one row.
FLASH_HOST_DEVICE Philox4 dropout_draws(uint64_t seed, uint64_t offset, uint64_t bh, uint32_t row,
                                        uint32_t col_group) {
    const uint64_t stream = bh + offset;
    return philox4x32_10(Philox4{col_group, row, static_cast<uint32_t>(stream),
                                 static_cast<uint32_t>(stream >> 32)},
                         seed);
}

// 16-bit lane `lane` (0..7) of a draw.
FLASH_HOST_DEVICE uint32_t dropout_lane(const Philox4& r, int lane) {
    const uint32_t word = lane < 2 ? r.x : lane < 4 ? r.y : lane < 6 ? r.z : r.w;
    return (lane & 1) ? (word >> 16) : (word & 0xFFFFu);
}

// Threshold for `u < threshold` to keep an element with probability p_keep.
FLASH_HOST_DEVICE uint32_t dropout_keep_threshold(float p_keep) {
    const float t = p_keep * 65536.0f + 0.5f;
    return t >= 65536.0f ? 65536u : static_cast<uint32_t>(t);
}

}  // namespace flash_cuda
