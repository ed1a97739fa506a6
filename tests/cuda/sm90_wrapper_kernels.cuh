// The kernels and host-side references of the sm_90a wrapper checks, shared by the GPU program
// (tests/cuda/test_sm90_wrappers.cu) and the CPU emulator's (tests/emulation/
// sm90_wrappers_emulated.cpp), so both run the same device code against the same expectations.
// One warpgroup (128 threads), one CTA; shared memory only through ptx::dynamic_smem (the
// emulator has no static __shared__). Every mbarrier wait is bounded: a wrong parity or byte
// count sets *timed_out instead of hanging.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/ptx.cuh"
#include "kernels/sm90/ptx_sm90.cuh"

namespace sm90_check {

using namespace flash_cuda;

constexpr int kTile = 64;                      // 64 x 64 bf16 tiles
constexpr int kTileBytes = kTile * kTile * 2;  // 8 KB
constexpr int kBulkBytes = 16384;
constexpr int kThreads = 128;                 // one warpgroup
// Dynamic shared memory of every kernel: 1024 bytes of slack to align the tiles, two tiles (or
// the bulk buffer), then the mbarrier.
constexpr int kBarOffset = 2 * kTileBytes;
constexpr int kSmemBytes = 1024 + kBarOffset + 64;
static_assert(kBulkBytes <= kBarOffset, "bulk buffer before the barrier");

// Byte offset of element (r, k) of a 64-column bf16 tile in the 128-byte-swizzled layout.
__host__ __device__ inline int sw128_offset(int r, int k) {
    const int chunk = (k * 2) / 16;
    return r * 128 + ((chunk ^ (r % 8)) * 16) + (k * 2) % 16;
}

// The dynamic shared memory rounded up to 1024 bytes (the 128-byte swizzle's atom alignment).
__device__ inline uint8_t* smem_1024() {
    uint8_t* dyn = ptx::dynamic_smem();
    const uint32_t base = ptx::smem_addr(dyn);
    return dyn + (((base + 1023u) & ~1023u) - base);
}

// Bounded wait on an mbarrier phase; false after ~2^22 polls.
__device__ inline bool wait_bounded(uint32_t bar, uint32_t parity) {
    for (int i = 0; i < (1 << 22); ++i) {
        if (ptx90::mbarrier_try_wait_parity(bar, parity)) return true;
    }
    return false;
}

// ---- 1. bulk copy of 16 KB through an mbarrier, then the smem copied back out.
__global__ void bulk_copy_kernel(const uint4* src, uint4* dst, int* timed_out) {
    uint8_t* smem = smem_1024();
    const uint32_t buf = ptx::smem_addr(smem);
    const uint32_t bar = buf + kBarOffset;
    if (threadIdx.x == 0) {
        ptx90::mbarrier_init(bar, 1);
        ptx90::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        ptx90::mbarrier_arrive_expect_tx(bar, kBulkBytes);
        ptx90::bulk_copy_g2s(buf, src, kBulkBytes, bar);
    }
    if (!wait_bounded(bar, 0)) *timed_out = 1;
    __syncthreads();
    for (int i = threadIdx.x; i < kBulkBytes / 16; i += kThreads) {
        dst[i] = ptx::ld_shared_16(buf + 16 * i);
    }
}

// ---- 2. TMA 2D load of box (0, row0) of a (rows, 64) bf16 tensor; the raw smem image out.
__global__ void tma_kernel(const __grid_constant__ CUtensorMap map, int row0, uint8_t* image,
                           int* timed_out) {
    uint8_t* smem = smem_1024();
    const uint32_t bar = ptx::smem_addr(smem) + kBarOffset;
    if (threadIdx.x == 0) {
        ptx90::mbarrier_init(bar, 1);
        ptx90::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        ptx90::mbarrier_arrive_expect_tx(bar, kTileBytes);
        ptx90::tma_load_2d(ptx::smem_addr(smem), &map, 0, row0, bar);
    }
    if (!wait_bounded(bar, 0)) *timed_out = 1;
    __syncthreads();
    for (int i = threadIdx.x; i < kTileBytes; i += kThreads) image[i] = smem[i];
}

// Accumulator register i of warpgroup thread t: (row, column) of D (ptx_sm90.cuh header).
__host__ __device__ inline int acc_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2); }
__host__ __device__ inline int acc_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + (i % 2); }

// ---- 3. wgmma: D (64 x 64) = A (64 x 64) B^T, A and B^T (64 x 64, row = k-contiguous) as
// swizzled tiles; via_tma: loaded by the TMA (maps a_map / b_map), else written with st.shared
// at sw128_offset (the layout the TMA check pins down), then fence.proxy.async.
__global__ void wgmma_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b,
                             const __grid_constant__ CUtensorMap a_map,
                             const __grid_constant__ CUtensorMap b_map, bool via_tma, float* d,
                             int* timed_out) {
    uint8_t* smem = smem_1024();
    uint8_t* sa = smem;
    uint8_t* sb = smem + kTileBytes;
    const uint32_t bar = ptx::smem_addr(smem) + kBarOffset;
    const int t = threadIdx.x;
    if (via_tma) {
        if (t == 0) {
            ptx90::mbarrier_init(bar, 1);
            ptx90::fence_barrier_init();
        }
        __syncthreads();
        if (t == 0) {
            ptx90::mbarrier_arrive_expect_tx(bar, 2 * kTileBytes);
            ptx90::tma_load_2d(ptx::smem_addr(sa), &a_map, 0, 0, bar);
            ptx90::tma_load_2d(ptx::smem_addr(sb), &b_map, 0, 0, bar);
        }
        if (!wait_bounded(bar, 0)) *timed_out = 1;
    } else {
        for (int i = t; i < kTile * kTile; i += kThreads) {
            const int r = i / kTile, k = i % kTile;
            std::memcpy(sa + sw128_offset(r, k), &a[i], 2);
            std::memcpy(sb + sw128_offset(r, k), &b[i], 2);
        }
        ptx90::fence_proxy_async_shared();
    }
    __syncthreads();
    float acc[32];
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    ptx90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {  // k16 step ks: 32 B into each 128-byte row
        const uint64_t da = ptx90::make_smem_desc_sw128(ptx::smem_addr(sa) + 32 * ks);
        const uint64_t db = ptx90::make_smem_desc_sw128(ptx::smem_addr(sb) + 32 * ks);
        ptx90::wgmma_m64n64k16_bf16_ss(acc, da, db, ks > 0);
    }
    ptx90::wgmma_commit();
    ptx90::wgmma_wait<0>();
    for (int i = 0; i < 32; ++i) d[acc_row(t, i) * kTile + acc_col(t, i)] = acc[i];
}

// ---- 4. wgmma RS with an MN-major B: O (64 x 64) = P (64 x 64, registers) V (64 keys x 64
// columns, row-major = MN-major, swizzled by st.shared at sw128_offset), the P V step of
// attention. P's A fragments per k16 step ks (mma.m16n8k16 layout, warp w: rows 16 w ..).
__global__ void wgmma_rs_kernel(const __nv_bfloat16* p, const __nv_bfloat16* v, float* o) {
    uint8_t* sv = smem_1024();
    const int t = threadIdx.x;
    for (int i = t; i < kTile * kTile; i += kThreads) {
        std::memcpy(sv + sw128_offset(i / kTile, i % kTile), &v[i], 2);
    }
    ptx90::fence_proxy_async_shared();
    __syncthreads();
    const int w = t / 32, g = (t % 32) / 4, q = t % 4;
    auto pack = [&](int r, int k) {  // P[r][k], P[r][k + 1] as bf16x2 (low half first)
        uint16_t lo, hi;
        std::memcpy(&lo, &p[r * kTile + k], 2);
        std::memcpy(&hi, &p[r * kTile + k + 1], 2);
        return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    };
    float acc[32];
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    uint32_t a[kTile / 16][4];
    for (int ks = 0; ks < kTile / 16; ++ks) {
        const int r = 16 * w + g, k = 16 * ks + 2 * q;
        a[ks][0] = pack(r, k);
        a[ks][1] = pack(r + 8, k);
        a[ks][2] = pack(r, k + 8);
        a[ks][3] = pack(r + 8, k + 8);
    }
    ptx90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {  // k16 step: 16 K rows = 2 atoms = 2048 B
        const uint64_t db = ptx90::make_smem_desc_sw128(ptx::smem_addr(sv) + 2048 * ks);
        ptx90::wgmma_m64n64k16_bf16_rs<true>(acc, a[ks], db, ks > 0);
    }
    ptx90::wgmma_commit();
    ptx90::wgmma_wait<0>();
    for (int i = 0; i < 32; ++i) o[acc_row(t, i) * kTile + acc_col(t, i)] = acc[i];
}

// ---- host side: inputs and expectations

// Test matrices: A (128 x 64, two TMA boxes), B (64 x 64); small multiples of 1/8 and 1/4, exact
// in bf16, so every product sum is exact in fp32 too.
struct Inputs {
    std::vector<__nv_bfloat16> a, b;
    std::vector<float> a_f, b_f;
    Inputs() : a(2 * kTile * kTile), b(kTile * kTile), a_f(a.size()), b_f(b.size()) {
        for (size_t i = 0; i < a.size(); ++i) {
            a_f[i] = static_cast<float>((i * 7 + 3) % 17) / 8.f - 1.f;
            a[i] = __float2bfloat16(a_f[i]);
        }
        for (size_t i = 0; i < b.size(); ++i) {
            b_f[i] = static_cast<float>((i * 5 + 1) % 13) / 4.f - 1.5f;
            b[i] = __float2bfloat16(b_f[i]);
        }
    }
    // D = A[:64] B^T (B as N x K) and O = A[:64] B (B as K x N).
    std::vector<float> ref(bool b_transposed) const {
        std::vector<float> out(kTile * kTile);
        for (int m = 0; m < kTile; ++m) {
            for (int n = 0; n < kTile; ++n) {
                float s = 0.f;
                for (int k = 0; k < kTile; ++k) {
                    s += a_f[m * kTile + k] * (b_transposed ? b_f[n * kTile + k] : b_f[k * kTile + n]);
                }
                out[m * kTile + n] = s;
            }
        }
        return out;
    }
};

inline std::vector<uint32_t> bulk_pattern() {
    std::vector<uint32_t> host(kBulkBytes / 4);
    for (size_t i = 0; i < host.size(); ++i) host[i] = 0x9E3779B9u * static_cast<uint32_t>(i + 1);
    return host;
}

// The first element of the TMA image of A's box at row0 not at its swizzled offset, or -1.
inline int first_misplaced(const std::vector<uint8_t>& img, const Inputs& in, int row0) {
    for (int r = 0; r < kTile; ++r) {
        for (int k = 0; k < kTile; ++k) {
            if (std::memcmp(&img[sw128_offset(r, k)], &in.a[(row0 + r) * kTile + k], 2) != 0) {
                return r * kTile + k;
            }
        }
    }
    return -1;
}

// max |x - ref| (infinity if any x is NaN).
inline double max_error(const std::vector<float>& x, const std::vector<float>& ref) {
    double err = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
        if (std::isnan(x[i])) return INFINITY;
        err = std::fmax(err, std::fabs(static_cast<double>(x[i]) - ref[i]));
    }
    return err;
}

}  // namespace sm90_check
