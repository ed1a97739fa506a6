// Host emulation of the CUDA device environment, for running the sm80 kernels on a CPU.
// Force-included (-include prelude.h) before the kernel headers; see README.md here.
//
// Every CUDA thread of a block is a std::thread; __syncthreads is a block barrier, and the
// warp-collective instructions (ldmatrix, mma, shfl) exchange operands through per-warp
// buffers between two warp barriers. Blocks run one after another. Slow (seconds per small
// problem) but it executes the real kernel source, so index math, swizzles, fragment layouts,
// masking and the softmax are checked without a GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <bit>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __grid_constant__
#undef __align__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) alignas(n)

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 gridDim;

inline int min(int a, int b) { return a < b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline uint32_t min(uint32_t a, uint32_t b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline float __log2f(float x) { return std::log2(x); }
// Position (1-based) of the least significant set bit, 0 for 0.
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<uint32_t>(x)) + 1; }
inline float __uint_as_float(uint32_t x) {
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
inline uint32_t __float_as_uint(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    return x;
}

namespace emu {

[[noreturn]] inline void fail(const char* what, long long value) {
    std::fprintf(stderr, "emulation error: %s (%lld) in block (%u, %u, %u) thread %u\n", what,
                 value, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x);
    std::abort();
}

struct WarpContext {
    std::barrier<> barrier{32};
    uint32_t words[32][8];
};

// A warpgroup (4 consecutive warps) for the sm90 wgmma instructions: register operands are
// exchanged through `words` between two warpgroup barriers.
struct WarpgroupContext {
    std::barrier<> barrier{128};
    uint32_t words[128][4];
};

// An mbarrier object of the sm90 emulation (tests/emulation/kernels/sm90/ptx_sm90.cuh), keyed by
// its shared-memory address. The asynchronous copies that complete_tx on it are queued and
// carried out when the phase completes, so a kernel that reads a buffer before its wait sees the
// old contents (NaN at first), not the new.
struct MBarrier {
    int count = 0;        // arrivals per phase
    int pending = 0;      // arrivals the current phase still waits for
    long long tx = 0;     // transaction bytes expected minus completed, current phase
    unsigned phase = 0;   // completed phases
    std::vector<std::vector<unsigned char>> staged;  // copy payloads, applied at completion
    std::vector<uint32_t> staged_dst;
};

struct BlockContext {
    explicit BlockContext(int threads, size_t smem_bytes)
        : barrier(threads), smem(smem_bytes), warps(threads / 32), warpgroups(threads / 128) {}
    std::barrier<> barrier;
    std::vector<unsigned char> smem;
    std::deque<WarpContext> warps;
    std::deque<WarpgroupContext> warpgroups;
    std::mutex mbarrier_mutex;
    std::map<uint32_t, MBarrier> mbarriers;
    // Named barriers (bar.sync id, threads) of the sm90 emulation, made at first use.
    std::map<uint32_t, std::unique_ptr<std::barrier<>>> named_barriers;
};

// Global memory the kernel may read with cp.async (inputs), for bounds checks.
struct Range {
    const void* begin;
    size_t bytes;
};
inline std::vector<Range>& readable_ranges() {
    static std::vector<Range> ranges;
    return ranges;
}
inline void check_readable(const void* p, size_t bytes) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (const Range& r : readable_ranges()) {
        const auto* b = static_cast<const unsigned char*>(r.begin);
        if (c >= b && c + bytes <= b + r.bytes) return;
    }
    fail("global read outside every input tensor", reinterpret_cast<long long>(p));
}

inline thread_local BlockContext* tl_block = nullptr;

inline BlockContext& block() { return *tl_block; }
inline WarpContext& warp() { return tl_block->warps[threadIdx.x / 32]; }
inline int lane() { return static_cast<int>(threadIdx.x % 32); }

inline unsigned char* smem_at(uint32_t addr, size_t bytes, size_t align) {
    if (addr % align != 0) fail("misaligned shared-memory access", addr);
    if (addr + bytes > tl_block->smem.size()) fail("shared-memory access out of bounds", addr);
    return tl_block->smem.data() + addr;
}

// Runs kernel(args) on a grid, one block at a time, `threads` std::threads per block.
// Shared memory starts filled with 0xFF bytes (NaN in fp16, bf16 and fp32).
template <typename Kernel>
void launch(dim3 grid, int threads, size_t smem_bytes, Kernel&& kernel) {
    for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
            for (unsigned x = 0; x < grid.x; ++x) {
                BlockContext ctx(threads, smem_bytes);
                std::fill(ctx.smem.begin(), ctx.smem.end(), 0xFF);
                std::vector<std::thread> pool;
                pool.reserve(threads);
                for (int t = 0; t < threads; ++t) {
                    pool.emplace_back([&, t] {
                        tl_block = &ctx;
                        threadIdx = make_uint3(t, 0, 0);
                        blockIdx = make_uint3(x, y, z);
                        gridDim = grid;
                        kernel();
                    });
                }
                for (auto& th : pool) th.join();
            }
        }
    }
}

}  // namespace emu

inline void __syncthreads() { emu::block().barrier.arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
[[noreturn]] inline void __trap() { emu::fail("__trap", 0); }
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) { emu::warp().barrier.arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask) {
    emu::WarpContext& w = emu::warp();
    const int lane = emu::lane();
    std::memcpy(&w.words[lane][0], &value, 4);
    w.barrier.arrive_and_wait();
    float other;
    std::memcpy(&other, &w.words[lane ^ lane_mask][0], 4);
    w.barrier.arrive_and_wait();
    return other;
}

inline uint32_t __shfl_xor_sync(unsigned mask, uint32_t value, int lane_mask) {
    float f, r;
    std::memcpy(&f, &value, 4);
    r = __shfl_xor_sync(mask, f, lane_mask);
    uint32_t out;
    std::memcpy(&out, &r, 4);
    return out;
}

inline uint32_t __shfl_sync(unsigned /*mask*/, uint32_t value, int src_lane) {
    emu::WarpContext& w = emu::warp();
    const int lane = emu::lane();
    std::memcpy(&w.words[lane][0], &value, 4);
    w.barrier.arrive_and_wait();
    uint32_t other;
    std::memcpy(&other, &w.words[src_lane & 31][0], 4);
    w.barrier.arrive_and_wait();
    return other;
}
