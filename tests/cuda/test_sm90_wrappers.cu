// GPU run of the sm_90a wrapper checks (csrc/kernels/sm90/ptx_sm90.cuh, wgmma.cuh):
// - mbarrier + bulk copy;
// - TMA 2D and 4D loads with the 128-byte swizzle (4D: the attention kernels' (column, row,
//   head, batch) maps, zero fill past the rows);
// - wgmma m64n{64,128}k16 from swizzled tiles written by st.shared and by the TMA; the
//   register-A form with an MN-major B (P V) in one and two 64-column slabs; SS with both
//   operands MN-major (the backward's dQ step).
// Kernels, expectations and the check sequence: sm90_wrapper_kernels.cuh (the CPU emulator runs
// the same, tests/emulation/sm90_wrappers_emulated.cpp).
// Built and run by tests/test_sm90_wrappers.py:
//   nvcc -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Itests/cuda \
//       tests/cuda/test_sm90_wrappers.cu -o test_sm90_wrappers
// Prints one line per check and "N failure(s)"; exits 1 if any fails.
#include <cuda_runtime.h>

#include "cuda_ok.h"
#include "sm90_wrapper_kernels.cuh"

struct Gpu {
    template <typename T>
    T* upload(const std::vector<T>& host) {
        T* dev;
        CUDA_OK(cudaMalloc(&dev, host.size() * sizeof(T)));
        upload_to(dev, host);
        return dev;
    }
    template <typename T>
    void upload_to(T* dev, const std::vector<T>& host) {
        CUDA_OK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    template <typename T>
    std::vector<T> download(const T* dev, size_t n) {
        std::vector<T> host(n);
        CUDA_OK(cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }
    void release(void* p) { CUDA_OK(cudaFree(p)); }
    int* flag() {
        int* f;
        CUDA_OK(cudaMallocManaged(&f, sizeof(int)));
        return f;
    }
    template <typename... Params, typename... Args>
    void launch(void (*kernel)(Params...), Args... args) {
        CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     sm90_check::kSmemBytes));
        kernel<<<1, sm90_check::kThreads, sm90_check::kSmemBytes>>>(args...);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
    }
};

int main() {
    Gpu gpu;
    const int failures = sm90_check::run_checks(gpu);
    std::printf("%d failure(s)\n", failures);
    return failures == 0 ? 0 : 1;
}
