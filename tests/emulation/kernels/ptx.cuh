// Host emulation of csrc/kernels/ptx.cuh (same names and signatures). Found before the real
// header because tests/emulation comes first on the include path.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

namespace flash_cuda {
namespace ptx {

inline unsigned char* dynamic_smem() { return emu::block().smem.data(); }

inline uint32_t smem_addr(const void* ptr) {
    const auto* p = static_cast<const unsigned char*>(ptr);
    const long long off = p - emu::block().smem.data();
    if (off < 0 || off > static_cast<long long>(emu::block().smem.size())) {
        emu::fail("smem_addr of a non-shared pointer", off);
    }
    return static_cast<uint32_t>(off);
}

// cp.async reads global memory at issue and lands in shared memory later: at the thread's next
// cp.async.wait_group (any count: every earlier copy lands no later than the hardware's would),
// or, after a cp.async.mbarrier.arrive.noinc (sm90/ptx_sm90.cuh), when that barrier's phase
// completes. A thread that reads a tile before its wait sees the old bytes (NaN at first).
namespace detail {
struct PendingCopy {
    uint32_t dst;
    uint32_t bytes;
    unsigned char data[16];
};
inline thread_local std::vector<PendingCopy> pending_copies;

inline void stage_cp_async(uint32_t smem_dst, const void* gmem_src, bool in_bounds,
                           uint32_t bytes) {
    emu::smem_at(smem_dst, bytes, bytes);
    PendingCopy copy{smem_dst, bytes, {}};
    if (in_bounds) {
        if (reinterpret_cast<uintptr_t>(gmem_src) % bytes != 0) {
            emu::fail("misaligned cp.async source", reinterpret_cast<long long>(gmem_src));
        }
        emu::check_readable(gmem_src, bytes);
        std::memcpy(copy.data, gmem_src, bytes);
    }
    pending_copies.push_back(copy);
}
}  // namespace detail

inline void cp_async_16(uint32_t smem_dst, const void* gmem_src, bool in_bounds) {
    detail::stage_cp_async(smem_dst, gmem_src, in_bounds, 16);
}
inline void cp_async_4(uint32_t smem_dst, const void* gmem_src, bool in_bounds) {
    detail::stage_cp_async(smem_dst, gmem_src, in_bounds, 4);
}
inline void barrier_sync_unaligned() { __syncthreads(); }
inline void cp_async_commit() {}
template <int kPendingGroups>
inline void cp_async_wait() {
    for (const detail::PendingCopy& c : detail::pending_copies) {
        std::memcpy(emu::smem_at(c.dst, c.bytes, c.bytes), c.data, c.bytes);
    }
    detail::pending_copies.clear();
}

inline uint4 ld_shared_16(uint32_t addr) {
    uint4 v;
    std::memcpy(&v, emu::smem_at(addr, 16, 16), 16);
    return v;
}
inline uint32_t ld_shared_4(uint32_t addr) {
    uint32_t v;
    std::memcpy(&v, emu::smem_at(addr, 4, 4), 4);
    return v;
}
inline void st_shared_4(uint32_t addr, uint32_t value) {
    std::memcpy(emu::smem_at(addr, 4, 4), &value, 4);
}
inline void st_global_4_if(void* ptr, uint32_t value, bool pred) {
    if (pred) std::memcpy(ptr, &value, 4);
}
inline void st_shared_f32x2(uint32_t addr, float a, float b) {
    const float v[2] = {a, b};
    std::memcpy(emu::smem_at(addr, 8, 8), v, 8);
}

inline uint32_t opaque(uint32_t x) { return x; }
inline int opaque(int x) { return x; }
inline int warp_uniform(int x) {
    return static_cast<int>(__shfl_sync(0xffffffffu, static_cast<uint32_t>(x), 0));
}
inline uint64_t mad_wide_u32(uint32_t a, uint32_t b, uint64_t c) {
    return static_cast<uint64_t>(a) * b + c;
}
inline int thread_index_fresh() { return static_cast<int>(threadIdx.x); }

inline uint16_t load_b16(uint32_t addr) {
    uint16_t v;
    std::memcpy(&v, emu::smem_at(addr, 2, 2), 2);
    return v;
}

// Lane l gives the row address of matrix l / 8; register i of lane l gets row l / 4,
// elements 2 (l % 4), +1 of matrix i (transposed: column l / 4, rows 2 (l % 4), +1).
inline void ldmatrix_impl(uint32_t (&regs)[4], uint32_t row_addr, bool trans) {
    emu::smem_at(row_addr, 16, 16);  // checks
    emu::WarpContext& w = emu::warp();
    const int lane = emu::lane();
    w.words[lane][0] = row_addr;
    w.barrier.arrive_and_wait();
    for (int i = 0; i < 4; ++i) {
        uint32_t lo, hi;
        if (!trans) {
            const uint32_t row = w.words[8 * i + lane / 4][0];
            lo = load_b16(row + 4 * (lane % 4));
            hi = load_b16(row + 4 * (lane % 4) + 2);
        } else {
            lo = load_b16(w.words[8 * i + 2 * (lane % 4)][0] + 2 * (lane / 4));
            hi = load_b16(w.words[8 * i + 2 * (lane % 4) + 1][0] + 2 * (lane / 4));
        }
        regs[i] = lo | (hi << 16);
    }
    w.barrier.arrive_and_wait();
}
inline void ldmatrix_x4(uint32_t (&regs)[4], uint32_t addr) { ldmatrix_impl(regs, addr, false); }
inline void ldmatrix_x4_trans(uint32_t (&regs)[4], uint32_t addr) { ldmatrix_impl(regs, addr, true); }

template <typename Element>
inline float b16_to_float(uint16_t bits);
template <>
inline float b16_to_float<__half>(uint16_t bits) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
}
template <>
inline float b16_to_float<__nv_bfloat16>(uint16_t bits) {
    const uint32_t w = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &w, 4);
    return f;
}

// D = A B + C for m16n8k16 with the PTX fragment layouts (ptx.cuh header comment).
template <typename Element>
inline void mma_16816(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu::WarpContext& w = emu::warp();
    const int lane = emu::lane();
    for (int i = 0; i < 4; ++i) w.words[lane][i] = a[i];
    w.words[lane][4] = b0;
    w.words[lane][5] = b1;
    w.barrier.arrive_and_wait();
    auto half_of = [](uint32_t word, int k) -> uint16_t {
        return static_cast<uint16_t>(k % 2 ? word >> 16 : word & 0xFFFF);
    };
    auto A = [&](int r, int k) {
        const int src = (r % 8) * 4 + (k % 8) / 2;
        const int reg = (r < 8 ? 0 : 1) + (k < 8 ? 0 : 2);
        return b16_to_float<Element>(half_of(w.words[src][reg], k));
    };
    auto B = [&](int k, int n) {
        const int src = n * 4 + (k % 8) / 2;
        return b16_to_float<Element>(half_of(w.words[src][k < 8 ? 4 : 5], k));
    };
    const int g = lane / 4, t = lane % 4;
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int r = g + (i / 2) * 8, n = 2 * t + i % 2;
        float sum = acc[i];
        for (int k = 0; k < 16; ++k) sum += A(r, k) * B(k, n);
        out[i] = sum;
    }
    w.barrier.arrive_and_wait();
    for (int i = 0; i < 4; ++i) acc[i] = out[i];
}

// red.global.add.v2.f32 / two atomicAdd: two fp32 atomic adds (block threads run concurrently).
// The vector form needs an 8-byte aligned address.
inline void red_add_f32x2(float* addr, float a, float b) {
    if (reinterpret_cast<uintptr_t>(addr) % 8 != 0) {
        emu::fail("misaligned red.global.add.v2.f32 address", reinterpret_cast<long long>(addr));
    }
    std::atomic_ref<float>(addr[0]).fetch_add(a);
    std::atomic_ref<float>(addr[1]).fetch_add(b);
}
// atomicAdd on a global int, returning the old value.
inline int atomic_add_global(int* addr, int value) {
    return std::atomic_ref<int>(*addr).fetch_add(value);
}
// Programmatic dependent launch: the emulator runs one kernel after the other, so a dependent
// kernel never starts early and both halves of the edge are no-ops.
inline void launch_dependents() {}
inline void wait_for_prior_grid() {}
// Volatile loads (program order on the GPU): plain loads here, one thread after another.
inline float ld_volatile_f32(const float* ptr) { return *ptr; }
inline float4 ld_volatile_f32x4(const float* ptr) {
    return *reinterpret_cast<const float4*>(ptr);
}
inline float exp2_approx(float x) { return std::exp2(x); }
inline float tanh_approx(float x) { return std::tanh(x); }

template <typename Element>
inline uint32_t pack_float2(float lo, float hi);
template <>
inline uint32_t pack_float2<__half>(float lo, float hi) {
    const __half_raw l = __half_raw(__float2half_rn(lo)), h = __half_raw(__float2half_rn(hi));
    return static_cast<uint32_t>(l.x) | (static_cast<uint32_t>(h.x) << 16);
}
template <>
inline uint32_t pack_float2<__nv_bfloat16>(float lo, float hi) {
    const __nv_bfloat16_raw l = __nv_bfloat16_raw(__float2bfloat16_rn(lo));
    const __nv_bfloat16_raw h = __nv_bfloat16_raw(__float2bfloat16_rn(hi));
    return static_cast<uint32_t>(l.x) | (static_cast<uint32_t>(h.x) << 16);
}

template <typename Element>
inline float2 unpack_float2(uint32_t packed);
template <>
inline float2 unpack_float2<__half>(uint32_t packed) {
    __half_raw l, h;
    l.x = static_cast<unsigned short>(packed & 0xffffu);
    h.x = static_cast<unsigned short>(packed >> 16);
    return make_float2(__half2float(__half(l)), __half2float(__half(h)));
}
template <>
inline float2 unpack_float2<__nv_bfloat16>(uint32_t packed) {
    return make_float2(std::bit_cast<float>(packed << 16),
                       std::bit_cast<float>(packed & 0xffff0000u));
}

}  // namespace ptx
}  // namespace flash_cuda
