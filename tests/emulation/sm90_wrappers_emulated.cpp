// CPU run of the sm_90a wrapper checks (tests/cuda/sm90_wrapper_kernels.cuh) on the emulated
// Hopper instructions (kernels/sm90/ptx_sm90.cuh here): the same kernels, expectations and check
// sequence as the GPU program tests/cuda/test_sm90_wrappers.cu. Passing here checks the kernels'
// protocol (barrier counts, parities, transaction bytes, descriptors) against the emulator's
// reading of the PTX ISA; the GPU program checks that reading against the hardware.
// Built and run by tests/test_sm90_wrappers.py; prints one line per check and "N failure(s)".
#include <deque>

#include "sm90_wrapper_kernels.cuh"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 gridDim;

// "Device" memory: host buffers (16-byte aligned, registered as readable for the copy checks).
struct Emulated {
    std::deque<std::vector<uint4>> buffers;
    int flag_value = 0;

    template <typename T>
    T* upload(const std::vector<T>& host) {
        buffers.emplace_back((host.size() * sizeof(T) + 15) / 16);
        T* p = reinterpret_cast<T*>(buffers.back().data());
        emu::readable_ranges().push_back({p, host.size() * sizeof(T)});
        upload_to(p, host);
        return p;
    }
    template <typename T>
    void upload_to(T* dev, const std::vector<T>& host) {
        std::memcpy(dev, host.data(), host.size() * sizeof(T));
    }
    template <typename T>
    std::vector<T> download(const T* dev, size_t n) {
        return std::vector<T>(dev, dev + n);
    }
    void release(void*) {}
    int* flag() { return &flag_value; }
    template <typename... Params, typename... Args>
    void launch(void (*kernel)(Params...), Args... args) {
        emu::launch(dim3(1, 1, 1), sm90_check::kThreads, sm90_check::kSmemBytes,
                    [&] { kernel(args...); });
    }
};

int main() {
    Emulated emulated;
    const int failures = sm90_check::run_checks(emulated);
    std::printf("%d failure(s)\n", failures);
    return failures == 0 ? 0 : 1;
}
