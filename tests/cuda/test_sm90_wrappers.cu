// Single-warpgroup checks of the sm_90a PTX wrappers (csrc/kernels/sm90/ptx_sm90.cuh): mbarrier
// + bulk copy, a TMA 2D load with the 128-byte swizzle (the smem image against the swizzle the
// wgmma descriptors assume), and wgmma m64n64k16 over a 64 x 64 x 64 product from swizzled
// tiles written by st.shared and by the TMA, and the register-A form with an MN-major B (P V).
// Built and run by tests/test_sm90_wrappers.py:
//   nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//       tests/cuda/test_sm90_wrappers.cu -o test_sm90_wrappers
// Every mbarrier wait is bounded: a wrong parity or byte count reports FAIL instead of hanging.
// Prints one line per check and "N failure(s)"; exits 1 if any fails.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/sm90/ptx_sm90.cuh"

using namespace flash_cuda;

#define CUDA_OK(expr)                                                                       \
    do {                                                                                    \
        cudaError_t e_ = (expr);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            std::exit(2);                                                                   \
        }                                                                                   \
    } while (0)

static int g_failures = 0;
static void report(const char* name, bool ok) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    if (!ok) ++g_failures;
}

constexpr int kTile = 64;                      // 64 x 64 bf16 tiles
constexpr int kTileBytes = kTile * kTile * 2;  // 8 KB

// Byte offset of element (r, k) of a 64-column bf16 tile in the 128-byte-swizzled layout.
__host__ __device__ inline int sw128_offset(int r, int k) {
    const int chunk = (k * 2) / 16;
    return r * 128 + ((chunk ^ (r % 8)) * 16) + (k * 2) % 16;
}

__device__ inline uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The dynamic shared memory rounded up to 1024 bytes (the 128-byte swizzle's atom alignment;
// launches reserve 1024 bytes extra).
__device__ inline uint8_t* smem_1024() {
    extern __shared__ __align__(1024) uint8_t dyn_smem[];
    const uint32_t base = smem_u32(dyn_smem);
    return dyn_smem + (((base + 1023u) & ~1023u) - base);
}

// Bounded wait on an mbarrier phase; false (and the caller reports) after ~2^24 polls.
__device__ inline bool wait_bounded(uint32_t bar, uint32_t parity) {
    for (int i = 0; i < (1 << 24); ++i) {
        if (ptx90::mbarrier_try_wait_parity(bar, parity)) return true;
    }
    return false;
}

// ---- 1. bulk copy of 16 KB through an mbarrier, then the smem copied back out.
__global__ void bulk_copy_kernel(const uint4* src, uint4* dst, int* timed_out) {
    __shared__ alignas(128) uint4 buf[1024];  // 16 KB
    __shared__ alignas(8) uint64_t bar;
    const uint32_t bar_addr = smem_u32(&bar);
    if (threadIdx.x == 0) {
        ptx90::mbarrier_init(bar_addr, 1);
        ptx90::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        ptx90::mbarrier_arrive_expect_tx(bar_addr, sizeof(buf));
        ptx90::bulk_copy_g2s(smem_u32(buf), src, sizeof(buf), bar_addr);
    }
    if (!wait_bounded(bar_addr, 0)) atomicExch(timed_out, 1);
    __syncthreads();
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) dst[i] = buf[i];
}

// ---- 2. TMA 2D load of box (0, row0) of a (rows, 64) bf16 tensor; the raw smem image out.
__global__ void tma_kernel(const __grid_constant__ CUtensorMap map, int row0, uint8_t* image,
                           int* timed_out) {
    uint8_t* smem = smem_1024();
    __shared__ alignas(8) uint64_t bar;
    const uint32_t bar_addr = smem_u32(&bar);
    if (threadIdx.x == 0) {
        ptx90::mbarrier_init(bar_addr, 1);
        ptx90::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        ptx90::mbarrier_arrive_expect_tx(bar_addr, kTileBytes);
        ptx90::tma_load_2d(smem_u32(smem), &map, 0, row0, bar_addr);
    }
    if (!wait_bounded(bar_addr, 0)) atomicExch(timed_out, 1);
    __syncthreads();
    for (int i = threadIdx.x; i < kTileBytes; i += blockDim.x) image[i] = smem[i];
}

// ---- 3. wgmma: D (64 x 64) = A (64 x 64) B^T, A and B^T (64 x 64, row = k-contiguous) as
// swizzled tiles; via_tma: loaded by the TMA (maps a_map / b_map), else written with st.shared
// at sw128_offset (the layout the TMA check above pins down), then fence.proxy.async.
__global__ void wgmma_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b,
                             const __grid_constant__ CUtensorMap a_map,
                             const __grid_constant__ CUtensorMap b_map, bool via_tma, float* d,
                             int* timed_out) {
    uint8_t* smem = smem_1024();
    uint8_t* sa = smem;
    uint8_t* sb = smem + kTileBytes;
    __shared__ alignas(8) uint64_t bar;
    const uint32_t bar_addr = smem_u32(&bar);
    const int t = threadIdx.x;
    if (via_tma) {
        if (t == 0) {
            ptx90::mbarrier_init(bar_addr, 1);
            ptx90::fence_barrier_init();
        }
        __syncthreads();
        if (t == 0) {
            ptx90::mbarrier_arrive_expect_tx(bar_addr, 2 * kTileBytes);
            ptx90::tma_load_2d(smem_u32(sa), &a_map, 0, 0, bar_addr);
            ptx90::tma_load_2d(smem_u32(sb), &b_map, 0, 0, bar_addr);
        }
        if (!wait_bounded(bar_addr, 0)) atomicExch(timed_out, 1);
    } else {
        for (int i = t; i < kTile * kTile; i += blockDim.x) {
            const int r = i / kTile, k = i % kTile;
            *reinterpret_cast<__nv_bfloat16*>(sa + sw128_offset(r, k)) = a[i];
            *reinterpret_cast<__nv_bfloat16*>(sb + sw128_offset(r, k)) = b[i];
        }
        ptx90::fence_proxy_async_shared();
    }
    __syncthreads();
    float acc[32];
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    ptx90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {  // k16 step ks: 32 B into each 128-byte row
        const uint64_t da = ptx90::make_smem_desc_sw128(smem_u32(sa) + 32 * ks);
        const uint64_t db = ptx90::make_smem_desc_sw128(smem_u32(sb) + 32 * ks);
        ptx90::wgmma_m64n64k16_bf16_ss(acc, da, db, ks > 0);
    }
    ptx90::wgmma_commit();
    ptx90::wgmma_wait<0>();
    const int w = t / 32, g = (t % 32) / 4, q = t % 4;
    for (int i = 0; i < 32; ++i) {
        const int row = 16 * w + g + 8 * ((i / 2) % 2);
        const int col = 8 * (i / 4) + 2 * q + (i % 2);
        d[row * kTile + col] = acc[i];
    }
}

// ---- 4. wgmma RS with an MN-major B: O (64 x 64) = P (64 x 64, registers) V (64 keys x 64
// columns, row-major = MN-major, swizzled by st.shared at sw128_offset), the P V step of
// attention. P's A fragments per k16 step ks (mma.m16n8k16 layout, warp w: rows 16 w ..).
__global__ void wgmma_rs_kernel(const __nv_bfloat16* p, const __nv_bfloat16* v, float* o) {
    uint8_t* sv = smem_1024();
    const int t = threadIdx.x;
    for (int i = t; i < kTile * kTile; i += blockDim.x) {
        *reinterpret_cast<__nv_bfloat16*>(sv + sw128_offset(i / kTile, i % kTile)) = v[i];
    }
    ptx90::fence_proxy_async_shared();
    __syncthreads();
    const int w = t / 32, g = (t % 32) / 4, q = t % 4;
    auto pack = [&](int r, int k) {  // P[r][k], P[r][k + 1] as bf16x2 (low half first)
        uint16_t lo, hi;
        memcpy(&lo, &p[r * kTile + k], 2);
        memcpy(&hi, &p[r * kTile + k + 1], 2);
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
        const uint64_t db = ptx90::make_smem_desc_sw128(smem_u32(sv) + 2048 * ks);
        ptx90::wgmma_m64n64k16_bf16_rs<true>(acc, a[ks], db, ks > 0);
    }
    ptx90::wgmma_commit();
    ptx90::wgmma_wait<0>();
    for (int i = 0; i < 32; ++i) {
        const int row = 16 * w + g + 8 * ((i / 2) % 2);
        const int col = 8 * (i / 4) + 2 * q + (i % 2);
        o[row * kTile + col] = acc[i];
    }
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static EncodeTiled encode_tiled() {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status;
    CUDA_OK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || fn == nullptr) {
        std::printf("cuTensorMapEncodeTiled not found\n");
        std::exit(2);
    }
    return reinterpret_cast<EncodeTiled>(fn);
}

// A (rows, 64) row-major bf16 tensor, boxes of 64 x 64, 128-byte swizzle.
static CUtensorMap tile_map(void* base, int rows) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kTile), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {kTile * 2};  // bytes between rows
    const cuuint32_t box[2] = {kTile, kTile};
    const cuuint32_t elem_strides[2] = {1, 1};
    const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims,
                                      strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                      CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        std::printf("cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r));
        std::exit(2);
    }
    return map;
}

int main() {
    int* timed_out;
    CUDA_OK(cudaMallocManaged(&timed_out, sizeof(int)));

    {  // 1. bulk copy
        std::vector<uint32_t> host(4096);
        for (int i = 0; i < 4096; ++i) host[i] = 0x9E3779B9u * (i + 1);
        uint4 *src, *dst;
        CUDA_OK(cudaMalloc(&src, 16384));
        CUDA_OK(cudaMalloc(&dst, 16384));
        CUDA_OK(cudaMemcpy(src, host.data(), 16384, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(dst, 0, 16384));
        *timed_out = 0;
        bulk_copy_kernel<<<1, 128>>>(src, dst, timed_out);
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<uint32_t> back(4096);
        CUDA_OK(cudaMemcpy(back.data(), dst, 16384, cudaMemcpyDeviceToHost));
        report("mbarrier wait completes (bulk copy)", *timed_out == 0);
        report("cp.async.bulk 16 KB global -> shared", back == host);
        CUDA_OK(cudaFree(src));
        CUDA_OK(cudaFree(dst));
    }

    // bf16 test matrices: values k / 8 - 4 style small integers / 8 (exact in bf16 and fp32).
    const int rows = 2 * kTile;
    std::vector<__nv_bfloat16> a_host(rows * kTile), b_host(kTile * kTile);
    std::vector<float> a_f(rows * kTile), b_f(kTile * kTile);
    for (int i = 0; i < rows * kTile; ++i) {
        a_f[i] = static_cast<float>((i * 7 + 3) % 17 - 8) / 8.f;
        a_host[i] = __float2bfloat16(a_f[i]);
    }
    for (int i = 0; i < kTile * kTile; ++i) {
        b_f[i] = static_cast<float>((i * 5 + 1) % 13 - 6) / 4.f;
        b_host[i] = __float2bfloat16(b_f[i]);
    }
    __nv_bfloat16 *a_dev, *b_dev;
    CUDA_OK(cudaMalloc(&a_dev, a_host.size() * 2));
    CUDA_OK(cudaMalloc(&b_dev, b_host.size() * 2));
    CUDA_OK(cudaMemcpy(a_dev, a_host.data(), a_host.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(b_dev, b_host.data(), b_host.size() * 2, cudaMemcpyHostToDevice));
    const CUtensorMap a_map = tile_map(a_dev, rows), b_map = tile_map(b_dev, kTile);

    {  // 2. TMA load of the second 64-row box of A, smem image against sw128_offset
        uint8_t* image;
        CUDA_OK(cudaMalloc(&image, kTileBytes));
        CUDA_OK(cudaMemset(image, 0, kTileBytes));
        CUDA_OK(cudaFuncSetAttribute(tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kTileBytes + 1024));
        *timed_out = 0;
        tma_kernel<<<1, 128, kTileBytes + 1024>>>(a_map, kTile, image, timed_out);
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<uint8_t> img(kTileBytes);
        CUDA_OK(cudaMemcpy(img.data(), image, kTileBytes, cudaMemcpyDeviceToHost));
        bool ok = true;
        for (int r = 0; r < kTile && ok; ++r) {
            for (int k = 0; k < kTile; ++k) {
                if (std::memcmp(&img[sw128_offset(r, k)], &a_host[(kTile + r) * kTile + k], 2)) {
                    std::printf("  TMA image: element (%d, %d) not at its swizzled offset\n", r,
                                k);
                    ok = false;
                    break;
                }
            }
        }
        report("mbarrier wait completes (TMA 2D)", *timed_out == 0);
        report("TMA 2D load, 128-byte swizzle = sw128_offset", ok);
        CUDA_OK(cudaFree(image));
    }

    // 3. wgmma, operands by st.shared and by TMA
    std::vector<float> ref(kTile * kTile);
    for (int m = 0; m < kTile; ++m) {
        for (int n = 0; n < kTile; ++n) {
            float s = 0.f;
            for (int k = 0; k < kTile; ++k) s += a_f[m * kTile + k] * b_f[n * kTile + k];
            ref[m * kTile + n] = s;
        }
    }
    float* d_dev;
    CUDA_OK(cudaMalloc(&d_dev, kTile * kTile * 4));
    CUDA_OK(cudaFuncSetAttribute(wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 2 * kTileBytes + 1024));
    for (int via_tma = 0; via_tma < 2; ++via_tma) {
        CUDA_OK(cudaMemset(d_dev, 0xFF, kTile * kTile * 4));  // NaN poison
        *timed_out = 0;
        wgmma_kernel<<<1, 128, 2 * kTileBytes + 1024>>>(a_dev, b_dev, a_map, b_map, via_tma != 0,
                                                        d_dev, timed_out);
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> d(kTile * kTile);
        CUDA_OK(cudaMemcpy(d.data(), d_dev, d.size() * 4, cudaMemcpyDeviceToHost));
        double max_err = 0.0;
        for (int i = 0; i < kTile * kTile; ++i) {
            max_err = std::fmax(max_err, std::fabs(static_cast<double>(d[i]) - ref[i]));
            if (std::isnan(d[i])) max_err = INFINITY;
        }
        std::printf("  wgmma (%s operands): max |D - ref| = %g\n", via_tma ? "TMA" : "st.shared",
                    max_err);
        report(via_tma ? "wgmma m64n64k16 x4, TMA-loaded operands"
                       : "wgmma m64n64k16 x4, st.shared operands",
               max_err <= 1e-3 && *timed_out == 0);
    }

    {  // 4. wgmma RS: O = P V, P = the first 64 rows of A, V = B read as keys x columns
        std::vector<float> ref_o(kTile * kTile);
        for (int m = 0; m < kTile; ++m) {
            for (int n = 0; n < kTile; ++n) {
                float s = 0.f;
                for (int k = 0; k < kTile; ++k) s += a_f[m * kTile + k] * b_f[k * kTile + n];
                ref_o[m * kTile + n] = s;
            }
        }
        CUDA_OK(cudaFuncSetAttribute(wgmma_rs_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kTileBytes + 1024));
        CUDA_OK(cudaMemset(d_dev, 0xFF, kTile * kTile * 4));
        wgmma_rs_kernel<<<1, 128, kTileBytes + 1024>>>(a_dev, b_dev, d_dev);
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> o(kTile * kTile);
        CUDA_OK(cudaMemcpy(o.data(), d_dev, o.size() * 4, cudaMemcpyDeviceToHost));
        double max_err = 0.0;
        for (int i = 0; i < kTile * kTile; ++i) {
            max_err = std::fmax(max_err, std::fabs(static_cast<double>(o[i]) - ref_o[i]));
            if (std::isnan(o[i])) max_err = INFINITY;
        }
        std::printf("  wgmma RS (P V, MN-major V): max |O - ref| = %g\n", max_err);
        report("wgmma m64n64k16 RS x4, MN-major B (transposed descriptor)", max_err <= 1e-3);
    }

    std::printf("%d failure(s)\n", g_failures);
    return g_failures == 0 ? 0 : 1;
}
