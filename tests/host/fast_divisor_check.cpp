// CPU check of kernels/fast_divisor.h (tests/test_fast_divisor.py builds and runs it): the
// multiply-shift quotient against the plain division, for every divisor the kernels see
// (1..4096: m blocks, splits, GQA ratios, head-group rows) and random large ones, at every
// dividend below 2^16, around each multiple of the divisor, and at random and extreme dividends
// up to 2^31 - 1. Prints "fast_divisor: N checks, 0 failure(s)".
#include <cstdint>
#include <cstdio>
#include <random>

#include "kernels/fast_divisor.h"

int main() {
    using flash_cuda::FastDivisor;
    std::mt19937_64 rng(20261202);
    long checks = 0, failures = 0;
    auto check = [&](const FastDivisor& f, int d, int64_t n) {
        if (n < 0 || n > INT32_MAX) return;
        ++checks;
        const int got = f.div(static_cast<int>(n));
        const int want = static_cast<int>(n / d);
        if (got != want || f.value() != d) {
            if (++failures <= 10) {
                std::printf("FAIL d=%d n=%lld: got %d, want %d\n", d, static_cast<long long>(n),
                            got, want);
            }
        }
    };
    auto check_divisor = [&](int d) {
        const FastDivisor f = FastDivisor::make(d);
        for (int64_t n = 0; n < (int64_t{1} << 16); ++n) check(f, d, n);
        for (int k = 0; k < 64; ++k) {  // around multiples of d, spread over the range
            const int64_t q = static_cast<int64_t>(rng() % (INT32_MAX / d + 1));
            for (int64_t e = -2; e <= 2; ++e) check(f, d, q * d + e);
        }
        const int64_t top = INT32_MAX;
        for (int64_t e = 0; e < 4; ++e) check(f, d, top - e);
        check(f, d, top / d * d);
        check(f, d, top / d * d - 1);
        for (int k = 0; k < 256; ++k) check(f, d, static_cast<int64_t>(rng() % (top + 1)));
    };
    for (int d = 1; d <= 4096; ++d) check_divisor(d);
    for (int s = 12; s <= 30; ++s) {  // powers of two and their neighbours
        for (int e = -1; e <= 1; ++e) check_divisor((1 << s) + e);
    }
    check_divisor(INT32_MAX);
    for (int k = 0; k < 200; ++k) check_divisor(1 + static_cast<int>(rng() % INT32_MAX));
    // d < 1 is taken as 1.
    const FastDivisor zero = FastDivisor::make(0);
    for (int64_t n : {0, 1, 7, 1 << 20, INT32_MAX}) check(zero, 1, n);
    std::printf("fast_divisor: %ld checks, %ld failure(s)\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
