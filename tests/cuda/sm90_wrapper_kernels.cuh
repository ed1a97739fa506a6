// The kernels, host-side references and check sequence (run_checks) of the sm_90a wrapper
// checks, shared by the GPU program
// (tests/cuda/test_sm90_wrappers.cu) and the CPU emulator's (tests/emulation/
// sm90_wrappers_emulated.cpp), so both run the same device code against the same expectations.
// One warpgroup (128 threads), one CTA; shared memory only through ptx::dynamic_smem (the
// emulator has no static __shared__). Every mbarrier wait is bounded: a wrong parity or byte
// count sets *timed_out instead of hanging.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/ptx.cuh"
#include "kernels/sm90/ptx_sm90.cuh"
#include "kernels/sm90/fwd_sm90_host.h"  // encode_rows_map (and tensor_map.h)

namespace sm90_check {

using namespace flash_cuda;

constexpr int kTile = 64;                      // 64 x 64 bf16 tiles
constexpr int kTileBytes = kTile * kTile * 2;  // 8 KB
constexpr int kBulkBytes = 16384;
constexpr int kThreads = 128;                 // one warpgroup
// Dynamic shared memory of every kernel: 1024 bytes of slack to align the tiles, three tiles (or
// the bulk buffer), then the mbarrier.
constexpr int kBarOffset = 3 * kTileBytes;
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

// One mbarrier phase of copies: thread 0 initialises the barrier, then (after a CTA barrier)
// announces `bytes` and runs issue(), the copies that complete them; every thread waits for the
// phase (bounded). False when the wait gave up.
template <typename Issue>
__device__ bool copy_one_phase(uint32_t bar, uint32_t bytes, Issue&& issue) {
    if (threadIdx.x == 0) {
        ptx90::mbarrier_init(bar, 1);
        ptx90::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        ptx90::mbarrier_arrive_expect_tx(bar, bytes);
        issue();
    }
    return wait_bounded(bar, 0);
}

// ---- 1. bulk copy of 16 KB through an mbarrier, then the smem copied back out.
__global__ void bulk_copy_kernel(const uint4* src, uint4* dst, int* timed_out) {
    const uint32_t buf = ptx::smem_addr(smem_1024());
    const uint32_t bar = buf + kBarOffset;
    const bool done =
        copy_one_phase(bar, kBulkBytes, [&] { ptx90::bulk_copy_g2s(buf, src, kBulkBytes, bar); });
    if (!done) *timed_out = 1;
    __syncthreads();
    for (int i = threadIdx.x; i < kBulkBytes / 16; i += kThreads) {
        dst[i] = ptx::ld_shared_16(buf + 16 * i);
    }
}

// ---- 2. TMA load of one 64 x 64 box; the raw smem image out. rank 2: box (0, c1) of a
// (rows, 64) tensor; rank 4 (the maps of the attention kernels: column, row, head, batch): box
// (0, c1, c2, c3) of a (b, s, h, 64) tensor, rows past s zero-filled and the transaction bytes
// the whole box's.
__global__ void tma_kernel(const __grid_constant__ CUtensorMap map, int rank, int c1, int c2,
                           int c3, uint8_t* image, int* timed_out) {
    uint8_t* smem = smem_1024();
    const uint32_t dst = ptx::smem_addr(smem);
    const bool done = copy_one_phase(dst + kBarOffset, kTileBytes, [&] {
        if (rank == 2) {
            ptx90::tma_load_2d(dst, &map, 0, c1, dst + kBarOffset);
        } else {
            ptx90::tma_load_4d(dst, &map, 0, c1, c2, c3, dst + kBarOffset);
        }
    });
    if (!done) *timed_out = 1;
    __syncthreads();
    for (int i = threadIdx.x; i < kTileBytes; i += kThreads) image[i] = smem[i];
}

// Accumulator register i of warpgroup thread t: (row, column) of D (ptx_sm90.cuh header).
__host__ __device__ inline int acc_row(int t, int i) {
    return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i / 2) % 2);
}
__host__ __device__ inline int acc_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + (i % 2); }

// ---- 3. wgmma SS: D (64 x N) = A (64 x 64) B^T, A = rows 0..63 of the input A, B^T (N x 64,
// row = k-contiguous) = rows 0..N-1 of the input B (N = 64) or of A (N = 128), as swizzled tiles
// (N rows: N / 8 atoms of 1024 B); via_tma: loaded by the TMA (maps a_map / b_map, 64-row boxes),
// else written with st.shared at sw128_offset (the layout the TMA check pins down), then
// fence.proxy.async.
template <int N>
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
        const bool done = copy_one_phase(bar, (1 + N / kTile) * kTileBytes, [&] {
            ptx90::tma_load_2d(ptx::smem_addr(sa), &a_map, 0, 0, bar);
            for (int box = 0; box < N / kTile; ++box) {
                ptx90::tma_load_2d(ptx::smem_addr(sb) + box * kTileBytes, &b_map, 0, box * kTile,
                                   bar);
            }
        });
        if (!done) *timed_out = 1;
    } else {
        for (int i = t; i < N * kTile; i += kThreads) {
            const int r = i / kTile, k = i % kTile;
            if (r < kTile) std::memcpy(sa + sw128_offset(r, k), &a[i], 2);
            std::memcpy(sb + sw128_offset(r, k), &b[i], 2);  // sw128_offset continues past 64 rows
        }
        ptx90::fence_proxy_async_shared();
    }
    __syncthreads();
    float acc[N / 2];
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
    ptx90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {  // k16 step ks: 32 B into each 128-byte row
        const uint64_t da = ptx90::make_smem_desc_sw128(ptx::smem_addr(sa) + 32 * ks);
        const uint64_t db = ptx90::make_smem_desc_sw128(ptx::smem_addr(sb) + 32 * ks);
        ptx90::wgmma_ss<N, __nv_bfloat16>(acc, da, db, ks > 0);
    }
    ptx90::wgmma_commit();
    ptx90::wgmma_wait<0>();
    for (int i = 0; i < N / 2; ++i) d[acc_row(t, i) * N + acc_col(t, i)] = acc[i];
}

// ---- 4. wgmma RS with an MN-major B: O (64 x N) = P (64 x 64, registers) V (64 keys x N
// columns), the P V step of attention. V row-major (MN-major: keys are K), N = 64: the input B;
// N = 128: A^T (V[k][n] = A[n][k]). Stored as N / 64 slabs of 64 columns (each 64 keys x 128 B,
// swizzled by st.shared at sw128_offset, kTileBytes apart: the descriptor's leading byte offset).
// P = rows 0..63 of A as A fragments per k16 step ks (mma.m16n8k16 layout, warp w: rows 16 w ..).
template <int N>
__global__ void wgmma_rs_kernel(const __nv_bfloat16* p, const __nv_bfloat16* v_src, float* o) {
    uint8_t* sv = smem_1024();
    const int t = threadIdx.x;
    for (int i = t; i < kTile * N; i += kThreads) {
        const int key = i / N, col = i % N;
        const __nv_bfloat16* src =
            N == kTile ? &v_src[key * kTile + col] : &v_src[col * kTile + key];
        std::memcpy(sv + (col / kTile) * kTileBytes + sw128_offset(key, col % kTile), src, 2);
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
    float acc[N / 2];
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
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
        const uint64_t db =
            ptx90::make_smem_desc_sw128(ptx::smem_addr(sv) + 2048 * ks, kTileBytes);
        ptx90::wgmma_rs<N, __nv_bfloat16, true>(acc, a[ks], db, ks > 0);
    }
    ptx90::wgmma_commit();
    ptx90::wgmma_wait<0>();
    for (int i = 0; i < N / 2; ++i) o[acc_row(t, i) * N + acc_col(t, i)] = acc[i];
}

// ---- 5. wgmma SS with both operands MN-major (the dQ = dS K step of the backward): D (64 x 64)
// = A (64 x 64) B (64 x 64), A stored transposed (row = k, 64 m per 128-byte row), B row-major
// (row = k, 64 n), both swizzled by st.shared; k16 step = 16 rows = 2048 bytes.
__global__ void wgmma_tt_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d) {
    uint8_t* sa = smem_1024();
    uint8_t* sb = sa + kTileBytes;
    const int t = threadIdx.x;
    for (int i = t; i < kTile * kTile; i += kThreads) {
        const int r = i / kTile, c = i % kTile;
        std::memcpy(sa + sw128_offset(c, r), &a[i], 2);  // A[m = r][k = c] at row k, column m
        std::memcpy(sb + sw128_offset(r, c), &b[i], 2);  // B[k = r][n = c]
    }
    ptx90::fence_proxy_async_shared();
    __syncthreads();
    float acc[32];
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    ptx90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {
        ptx90::wgmma_ss<64, __nv_bfloat16, true, true>(
            acc, ptx90::make_smem_desc_sw128(ptx::smem_addr(sa) + 2048 * ks),
            ptx90::make_smem_desc_sw128(ptx::smem_addr(sb) + 2048 * ks), ks > 0);
    }
    ptx90::wgmma_commit();
    ptx90::wgmma_wait<0>();
    for (int i = 0; i < 32; ++i) d[acc_row(t, i) * kTile + acc_col(t, i)] = acc[i];
}

// ---- 6. stmatrix.x4: lane l holds, for matrix i, the elements (row l / 4, columns 2 (l % 4)
// and + 1) of stmatrix_value; lane 8 i + j gives slot 31 - (8 i + j) of 32 slots of 32 bytes as
// the address of row j of matrix i (slots reversed, the second 16 bytes of each left alone).
__host__ __device__ inline uint16_t stmatrix_value(int matrix, int row, int column) {
    return static_cast<uint16_t>((matrix << 12) | (row << 8) | (column << 4) | 5);
}

__global__ void stmatrix_kernel(uint16_t* out) {
    uint8_t* smem = smem_1024();
    for (int i = threadIdx.x; i < 256; i += kThreads) {
        reinterpret_cast<uint32_t*>(smem)[i] = 0xFFFFFFFFu;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        uint32_t r[4];
        for (int i = 0; i < 4; ++i) {
            r[i] = stmatrix_value(i, lane / 4, 2 * (lane % 4)) |
                   (static_cast<uint32_t>(stmatrix_value(i, lane / 4, 2 * (lane % 4) + 1)) << 16);
        }
        ptx90::stmatrix_x4(ptx::smem_addr(smem) + (31 - lane) * 32, r[0], r[1], r[2], r[3]);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 512; i += kThreads) {
        out[i] = reinterpret_cast<const uint16_t*>(smem)[i];
    }
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
    // 64 x 64: D = A[:64] B^T (B as N x K) or O = A[:64] B (B as K x N); 64 x 128: A[:64] A^T.
    std::vector<float> ref(int n_cols, bool b_transposed) const {
        std::vector<float> out(kTile * n_cols);
        for (int m = 0; m < kTile; ++m) {
            for (int n = 0; n < n_cols; ++n) {
                float s = 0.f;
                for (int k = 0; k < kTile; ++k) {
                    const float bv = n_cols > kTile ? a_f[n * kTile + k]
                                     : b_transposed ? b_f[n * kTile + k]
                                                    : b_f[k * kTile + n];
                    s += a_f[m * kTile + k] * bv;
                }
                out[m * n_cols + n] = s;
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

namespace sm90_check {

// The checks, one line each ("PASS name" / "FAIL name"), against a Device that provides
//   T* upload(const std::vector<T>&), std::vector<T> download(const T*, size_t n),
//   void release(void*), int* flag() (a host-visible int), and
//   launch(kernel, args...) (one CTA of kThreads threads, kSmemBytes dynamic shared memory).
// Returns the number of failures.
template <typename Device>
int run_checks(Device& dev) {
    int failures = 0;
    auto report = [&](const char* name, bool ok) {
        std::printf("%s %s\n", ok ? "PASS" : "FAIL", name);
        if (!ok) ++failures;
    };
    int* timed_out = dev.flag();

    {  // 1. bulk copy
        const std::vector<uint32_t> host = bulk_pattern();
        uint32_t* src = dev.upload(host);
        uint32_t* dst = dev.upload(std::vector<uint32_t>(host.size(), 0));
        *timed_out = 0;
        dev.launch(bulk_copy_kernel, reinterpret_cast<const uint4*>(src),
                   reinterpret_cast<uint4*>(dst), timed_out);
        report("mbarrier wait completes (bulk copy)", *timed_out == 0);
        report("cp.async.bulk 16 KB global -> shared", dev.download(dst, host.size()) == host);
        dev.release(src);
        dev.release(dst);
    }

    const Inputs in;
    __nv_bfloat16* a_dev = dev.upload(in.a);
    __nv_bfloat16* b_dev = dev.upload(in.b);
    auto tile_map = [&](const void* base, int rows) {  // (rows, 64), 64 x 64 boxes
        CUtensorMap map;
        const int r = flash_cuda::sm90::encode_tensor_map(
            &map, flash_cuda::sm90::matrix_map(base, rows, kTile, kTile * 2, kTile, kTile));
        if (r != 0) {
            std::printf("tensor map rejected: %d\n", r);
            std::exit(2);
        }
        return map;
    };
    const CUtensorMap a_map = tile_map(a_dev, 2 * kTile), b_map = tile_map(b_dev, kTile);

    {  // 2. TMA load of the second 64-row box of A, smem image against sw128_offset
        uint8_t* image = dev.upload(std::vector<uint8_t>(kTileBytes, 0));
        *timed_out = 0;
        dev.launch(tma_kernel, a_map, 2, kTile, 0, 0, image, timed_out);
        const int bad = first_misplaced(dev.download(image, kTileBytes), in, kTile);
        if (bad >= 0) std::printf("  TMA image: element %d not at its swizzled offset\n", bad);
        report("mbarrier wait completes (TMA 2D)", *timed_out == 0);
        report("TMA 2D load, 128-byte swizzle = sw128_offset", bad < 0);
        dev.release(image);
    }

    {  // 2b. TMA 4D through encode_rows_map: box (0, 64, 2, 1) of a (2, 100, 3, 64) tensor:
       // rows 64..99, then zeros
        constexpr int kB = 2, kS = 100, kH = 3;
        std::vector<__nv_bfloat16> x(kB * kS * kH * kTile);
        for (size_t i = 0; i < x.size(); ++i) {
            x[i] = __float2bfloat16(static_cast<float>(static_cast<int>(i % 251) - 125));
        }
        __nv_bfloat16* x_dev = dev.upload(x);
        CUtensorMap map;  // the kernels' map builder (fwd_sm90_host.h), strides in elements
        if (flash_cuda::sm90::encode_rows_map(&map, x_dev, kTile, kS, kH, kB, false, kH * kTile,
                                              kTile, kS * kH * kTile, kTile) != 0) {
            std::printf("tensor map (4D) rejected\n");
            std::exit(2);
        }
        uint8_t* image = dev.upload(std::vector<uint8_t>(kTileBytes, 0xAB));
        *timed_out = 0;
        dev.launch(tma_kernel, map, 4, kTile, 2, 1, image, timed_out);
        const std::vector<uint8_t> img = dev.download(image, kTileBytes);
        bool ok = true;
        for (int r = 0; r < kTile && ok; ++r) {
            for (int k = 0; k < kTile && ok; ++k) {
                const int s = kTile + r;
                uint16_t want = 0;
                if (s < kS) std::memcpy(&want, &x[((1 * kS + s) * kH + 2) * kTile + k], 2);
                uint16_t got;
                std::memcpy(&got, &img[sw128_offset(r, k)], 2);
                if (got != want) {
                    std::printf("  TMA 4D image: row %d column %d is %04x, want %04x\n", r, k,
                                got, want);
                    ok = false;
                }
            }
        }
        report("mbarrier wait completes (TMA 4D)", *timed_out == 0);
        report("TMA 4D load: coordinates (column, row, head, batch), rows past s zero", ok);
        dev.release(image);
        dev.release(x_dev);
    }

    // 3. wgmma SS, operands by st.shared and by TMA; N = 64 (B) and N = 128 (B^T = A, 16 atoms)
    float* d_dev = dev.upload(std::vector<float>(kTile * 2 * kTile, NAN));
    for (int n : {64, 128}) {
        for (int via_tma = 0; via_tma < 2; ++via_tma) {
            dev.upload_to(d_dev, std::vector<float>(kTile * n, NAN));
            *timed_out = 0;
            if (n == 64) {
                dev.launch(wgmma_kernel<64>, a_dev, b_dev, a_map, b_map, via_tma != 0, d_dev,
                           timed_out);
            } else {
                dev.launch(wgmma_kernel<128>, a_dev, a_dev, a_map, a_map, via_tma != 0, d_dev,
                           timed_out);
            }
            const double err = max_error(dev.download(d_dev, kTile * n), in.ref(n, true));
            std::printf("  wgmma m64n%dk16 (%s operands): max |D - ref| = %g\n", n,
                        via_tma ? "TMA" : "st.shared", err);
            char name[96];
            std::snprintf(name, sizeof(name), "wgmma m64n%dk16 SS x4, %s operands", n,
                          via_tma ? "TMA-loaded" : "st.shared");
            report(name, err <= 1e-3 && *timed_out == 0);
        }
    }

    // 4. wgmma RS: O = P V, P = the first 64 rows of A; V = B (N = 64) or A^T (N = 128: two
    // 64-column slabs, the descriptor's leading byte offset apart)
    for (int n : {64, 128}) {
        dev.upload_to(d_dev, std::vector<float>(kTile * n, NAN));
        if (n == 64) {
            dev.launch(wgmma_rs_kernel<64>, a_dev, b_dev, d_dev);
        } else {
            dev.launch(wgmma_rs_kernel<128>, a_dev, a_dev, d_dev);
        }
        const double err = max_error(dev.download(d_dev, kTile * n), in.ref(n, false));
        std::printf("  wgmma m64n%dk16 RS (P V, MN-major V): max |O - ref| = %g\n", n, err);
        char name[96];
        std::snprintf(name, sizeof(name), "wgmma m64n%dk16 RS x4, MN-major B (%s)", n,
                      n == 64 ? "one slab" : "two slabs, leading byte offset");
        report(name, err <= 1e-3);
    }
    {  // 5. wgmma SS, A and B MN-major: D = A[:64] B (B as K x N)
        dev.upload_to(d_dev, std::vector<float>(kTile * kTile, NAN));
        dev.launch(wgmma_tt_kernel, a_dev, b_dev, d_dev);
        const double err = max_error(dev.download(d_dev, kTile * kTile), in.ref(kTile, false));
        std::printf("  wgmma SS (MN-major A and B): max |D - ref| = %g\n", err);
        report("wgmma m64n64k16 SS x4, MN-major A and B (transposed descriptors)", err <= 1e-3);
    }
    {  // 6. stmatrix.x4: every row at the address its lane gave, nothing else written
        uint16_t* out = dev.upload(std::vector<uint16_t>(512, 0));
        dev.launch(stmatrix_kernel, out);
        const std::vector<uint16_t> img = dev.download(out, 512);
        bool ok = true;
        for (int slot = 0; slot < 32 && ok; ++slot) {
            const int lane = 31 - slot;
            for (int c = 0; c < 16 && ok; ++c) {
                const uint16_t want = c < 8 ? stmatrix_value(lane / 8, lane % 8, c) : 0xFFFF;
                if (img[slot * 16 + c] != want) {
                    std::printf("  stmatrix: slot %d element %d is %04x, want %04x\n", slot, c,
                                img[slot * 16 + c], want);
                    ok = false;
                }
            }
        }
        report("stmatrix.x4: matrix i's row j at lane 8 i + j's address, mma fragment layout", ok);
        dev.release(out);
    }
    dev.release(d_dev);
    dev.release(a_dev);
    dev.release(b_dev);
    return failures;
}

}  // namespace sm90_check
