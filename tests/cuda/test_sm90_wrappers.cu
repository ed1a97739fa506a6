// Single-warpgroup GPU checks of the sm_90a PTX wrappers (csrc/kernels/sm90/ptx_sm90.cuh): mbarrier
// + bulk copy, a TMA 2D load with the 128-byte swizzle (the smem image against the swizzle the
// wgmma descriptors assume), wgmma m64n64k16 over a 64 x 64 x 64 product from swizzled tiles
// written by st.shared and by the TMA, and the register-A form with an MN-major B (P V). The
// kernels and expectations are in sm90_wrapper_kernels.cuh (the CPU emulator runs the same ones).
// Built and run by tests/test_sm90_wrappers.py:
//   nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Itests/cuda \
//       tests/cuda/test_sm90_wrappers.cu -o test_sm90_wrappers
// Prints one line per check and "N failure(s)"; exits 1 if any fails.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/sm90/tensor_map.h"
#include "sm90_wrapper_kernels.cuh"

using namespace sm90_check;

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

template <typename T>
static T* upload(const std::vector<T>& host) {
    T* dev;
    CUDA_OK(cudaMalloc(&dev, host.size() * sizeof(T)));
    CUDA_OK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return dev;
}
template <typename T>
static std::vector<T> download(const T* dev, size_t n) {
    std::vector<T> host(n);
    CUDA_OK(cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}

// A (rows, 64) row-major bf16 tensor, boxes of 64 x 64, 128-byte swizzle.
static CUtensorMap tile_map(const void* base, int rows) {
    flash_cuda::sm90::TensorMap2d m;
    m.base = base;
    m.cols = kTile;
    m.rows = rows;
    m.row_stride_bytes = kTile * 2;
    m.box_cols = kTile;
    m.box_rows = kTile;
    CUtensorMap map;
    const int r = flash_cuda::sm90::encode_tensor_map_2d(&map, m);
    if (r != 0) {
        std::printf("cuTensorMapEncodeTiled failed: %d\n", r);
        std::exit(2);
    }
    return map;
}

int main() {
    int* timed_out;
    CUDA_OK(cudaMallocManaged(&timed_out, sizeof(int)));
    for (auto kernel : {reinterpret_cast<const void*>(bulk_copy_kernel),
                        reinterpret_cast<const void*>(tma_kernel),
                        reinterpret_cast<const void*>(wgmma_kernel),
                        reinterpret_cast<const void*>(wgmma_rs_kernel)}) {
        CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kSmemBytes));
    }

    {  // 1. bulk copy
        const std::vector<uint32_t> host = bulk_pattern();
        uint32_t* src = upload(host);
        uint32_t* dst = upload(std::vector<uint32_t>(host.size(), 0));
        *timed_out = 0;
        bulk_copy_kernel<<<1, kThreads, kSmemBytes>>>(reinterpret_cast<const uint4*>(src),
                                                 reinterpret_cast<uint4*>(dst), timed_out);
        CUDA_OK(cudaDeviceSynchronize());
        report("mbarrier wait completes (bulk copy)", *timed_out == 0);
        report("cp.async.bulk 16 KB global -> shared", download(dst, host.size()) == host);
        CUDA_OK(cudaFree(src));
        CUDA_OK(cudaFree(dst));
    }

    const Inputs in;
    __nv_bfloat16* a_dev = upload(in.a);
    __nv_bfloat16* b_dev = upload(in.b);
    const CUtensorMap a_map = tile_map(a_dev, 2 * kTile), b_map = tile_map(b_dev, kTile);

    {  // 2. TMA load of the second 64-row box of A, smem image against sw128_offset
        uint8_t* image = upload(std::vector<uint8_t>(kTileBytes, 0));
        *timed_out = 0;
        tma_kernel<<<1, kThreads, kSmemBytes>>>(a_map, kTile, image, timed_out);
        CUDA_OK(cudaDeviceSynchronize());
        const int bad = first_misplaced(download(image, kTileBytes), in, kTile);
        if (bad >= 0) std::printf("  TMA image: element %d not at its swizzled offset\n", bad);
        report("mbarrier wait completes (TMA 2D)", *timed_out == 0);
        report("TMA 2D load, 128-byte swizzle = sw128_offset", bad < 0);
        CUDA_OK(cudaFree(image));
    }

    // 3. wgmma, operands by st.shared and by TMA
    const std::vector<float> ref = in.ref(true);
    float* d_dev = upload(std::vector<float>(kTile * kTile, NAN));
    for (int via_tma = 0; via_tma < 2; ++via_tma) {
        CUDA_OK(cudaMemset(d_dev, 0xFF, kTile * kTile * 4));  // NaN poison
        *timed_out = 0;
        wgmma_kernel<<<1, kThreads, kSmemBytes>>>(a_dev, b_dev, a_map, b_map, via_tma != 0, d_dev,
                                             timed_out);
        CUDA_OK(cudaDeviceSynchronize());
        const double err = max_error(download(d_dev, kTile * kTile), ref);
        std::printf("  wgmma (%s operands): max |D - ref| = %g\n", via_tma ? "TMA" : "st.shared",
                    err);
        report(via_tma ? "wgmma m64n64k16 x4, TMA-loaded operands"
                       : "wgmma m64n64k16 x4, st.shared operands",
               err <= 1e-3 && *timed_out == 0);
    }

    {  // 4. wgmma RS: O = P V, P = the first 64 rows of A, V = B read as keys x columns
        CUDA_OK(cudaMemset(d_dev, 0xFF, kTile * kTile * 4));
        wgmma_rs_kernel<<<1, kThreads, kSmemBytes>>>(a_dev, b_dev, d_dev);
        CUDA_OK(cudaDeviceSynchronize());
        const double err = max_error(download(d_dev, kTile * kTile), in.ref(false));
        std::printf("  wgmma RS (P V, MN-major V): max |O - ref| = %g\n", err);
        report("wgmma m64n64k16 RS x4, MN-major B (transposed descriptor)", err <= 1e-3);
    }

    std::printf("%d failure(s)\n", g_failures);
    return g_failures == 0 ? 0 : 1;
}
