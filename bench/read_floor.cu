// The decode benchmark's speed-of-light probe (bench/read_floor.py, impl `read_floor`).
//
// One kernel that reads two buffers (a decode step's K and V caches) once, 16 bytes per load,
// and writes nothing. Any decode step reads at least these bytes in at least one launch, so the
// probe's time, taken the same way as the step's (same L2 flush, CUDA-graph replay), is a floor:
// what no attention kernel can beat on that cell. With both sizes 0 it is the floor of a launch.
//
// Built by read_floor.py with nvcc into a shared library (no torch headers) and called through
// ctypes on torch's current stream, so a CUDA graph captures it like any other kernel.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 512;  // 4 CTAs per SM: 2048 threads, the SM's maximum
constexpr int kUnroll = 8;     // 8 loads of 16 B in flight per thread: 256 KB per SM

// ld.global.nc with L1::no_allocate: a streaming read through L2 that keeps L1 out of it.
__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Reads data[0, n) (n 16-byte words) in grid-stride rounds of kUnroll loads per thread; returns
// the XOR of every word, which the caller only compares.
__device__ __forceinline__ unsigned read_all(const uint4* data, long long n) {
    unsigned acc = 0;
    const long long round = static_cast<long long>(gridDim.x) * kThreads * kUnroll;
    for (long long base = static_cast<long long>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
         base < n; base += round) {
        uint4 words[kUnroll];
        if (base + (kUnroll - 1) * kThreads < n) {  // a whole round: loads with no guard
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) words[u] = load_streaming(data + base + u * kThreads);
        } else {
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const long long i = base + static_cast<long long>(u) * kThreads;
                words[u] = i < n ? load_streaming(data + i) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) acc ^= words[u].x ^ words[u].y ^ words[u].z ^ words[u].w;
    }
    return acc;
}

// a: (na,) and b: (nb,) 16-byte words; sink: one word, written only if the XOR of everything a
// thread read equals a constant (which keeps the loads; random data practically never hits it).
__global__ void __launch_bounds__(kThreads) read_two_buffers_kernel(const uint4* a, long long na,
                                                                     const uint4* b, long long nb,
                                                                     unsigned* sink) {
    const unsigned acc = read_all(a, na) ^ read_all(b, nb);
    if (acc == 0x9e3779b9u) *sink = acc;
}

}  // namespace

// Launches the probe on `stream` (a cudaStream_t) with `ctas` CTAs of kThreads threads; byte
// counts must be multiples of 16 and the pointers 16-byte aligned (read_floor.py checks both).
// Returns the cudaError_t of the launch.
extern "C" int read_floor_launch(const void* a, long long a_bytes, const void* b,
                                 long long b_bytes, void* sink, int ctas, void* stream) {
    read_two_buffers_kernel<<<ctas, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint4*>(a), a_bytes / 16, static_cast<const uint4*>(b), b_bytes / 16,
        static_cast<unsigned*>(sink));
    return static_cast<int>(cudaGetLastError());
}

extern "C" int read_floor_threads() { return kThreads; }
