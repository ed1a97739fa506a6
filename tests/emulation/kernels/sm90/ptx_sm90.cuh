// Host emulation of csrc/kernels/sm90/ptx_sm90.cuh (same names and signatures), found before the
// real header because tests/emulation comes first on the include path. See ../../README.md.
//
// - mbarriers live in a table of the block (prelude.h MBarrier), keyed by their shared-memory
//   address: arrivals, transaction bytes and the phase count follow the PTX rules (a phase
//   completes when its pending arrivals and its transaction bytes both reach zero; try_wait with
//   parity P succeeds once the current phase's parity differs from P).
// - Bulk and TMA copies are staged (the global bytes read at issue) and written to shared memory
//   when the barrier's phase completes, which the emulator does lazily (at the next wait on the
//   barrier or before its next arrival): a buffer read without its wait still holds old bytes.
//   A wait that never completes fails the run after EMU_WAIT_SECONDS (default 20) instead of
//   hanging.
// - TMA stores (shared to global) are kept per thread and carried out when a bulk wait_group
//   retires their group: shared memory overwritten before that wait, or a store never waited
//   for, gives wrong or missing output.
// - wgmma computes at issue from the shared-memory operands the descriptors describe (start
//   address, leading / stride byte offsets, 128-byte swizzle on address bits 4-6 ^ 7-9); the
//   register-A form exchanges the A fragments through the warpgroup (prelude.h WarpgroupContext).
//   fence / commit / wait and setmaxnreg do nothing here.
#pragma once

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/ptx.cuh"  // the host versions: ptx::load_b16, b16_to_float
#include "kernels/sm90/tensor_map.h"

namespace flash_cuda {
namespace ptx90 {

namespace detail {

inline emu::MBarrier& barrier_locked(uint32_t bar) {
    auto it = emu::block().mbarriers.find(bar);
    if (it == emu::block().mbarriers.end()) emu::fail("mbarrier used before mbarrier.init", bar);
    return it->second;
}

// Completes the phase when no arrival and no transaction byte is outstanding: the staged copies
// land in shared memory, the phase count advances, the arrival count re-arms. Called lazily --
// by a wait on the barrier, or before the next arrival / copy changes it -- so the copies of a
// buffer land only once somebody waits for them: a kernel that reads a buffer without waiting
// on its barrier sees the old contents (and fails its check).
inline void complete_if_ready_locked(emu::MBarrier& b) {
    if (b.pending > 0 || b.tx != 0) return;
    for (size_t i = 0; i < b.staged.size(); ++i) {
        const size_t align = b.staged[i].size() < 16 ? b.staged[i].size() : 16;  // cp.async 4 B
        std::memcpy(emu::smem_at(b.staged_dst[i], b.staged[i].size(), align), b.staged[i].data(),
                    b.staged[i].size());
    }
    b.staged.clear();
    b.staged_dst.clear();
    b.phase += 1;
    b.pending = b.count;
}

inline void stage_copy(uint32_t bar, uint32_t smem_dst, std::vector<unsigned char> bytes) {
    std::lock_guard<std::mutex> lock(emu::block().mbarrier_mutex);
    emu::MBarrier& b = barrier_locked(bar);
    complete_if_ready_locked(b);
    b.tx -= static_cast<long long>(bytes.size());
    b.staged_dst.push_back(smem_dst);
    b.staged.push_back(std::move(bytes));
}

inline double wait_limit_seconds() {
    const char* v = std::getenv("EMU_WAIT_SECONDS");
    return v != nullptr ? std::atof(v) : 20.0;
}

// Shared-memory byte address of element (mn, k) of a wgmma operand described by `desc`
// (128-byte swizzle only). K-major: rows of the MN dimension, 128 bytes of K each, 8-row groups
// `stride byte offset` apart. MN-major: rows of the K dimension, 64 MN elements (128 B) each,
// 8-row groups `stride byte offset` apart, 64-element MN blocks `leading byte offset` apart.
inline uint32_t operand_addr(uint64_t desc, int mn, int k, bool mn_major) {
    const uint32_t start = static_cast<uint32_t>(desc & 0x3FFFu) << 4;
    const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3FFFu) << 4;
    const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFFu) << 4;
    const uint32_t base_offset = static_cast<uint32_t>((desc >> 49) & 0x7u);
    const uint32_t swizzle = static_cast<uint32_t>(desc >> 62);
    if (swizzle != 1) emu::fail("wgmma descriptor: only the 128-byte swizzle is emulated", swizzle);
    if (base_offset != 0) emu::fail("wgmma descriptor: base offset not emulated", base_offset);
    uint32_t addr;
    if (!mn_major) {
        if (2 * k >= 128) emu::fail("K-major operand: k past the 128-byte row", k);
        addr = start + (mn / 8) * sbo + (mn % 8) * 128 + 2 * k;
    } else {
        addr = start + (mn / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + 2 * (mn % 64);
    }
    return addr ^ (((addr >> 7) & 7u) << 4);
}

template <typename Element>
inline float operand(uint64_t desc, int mn, int k, bool mn_major) {
    return ptx::b16_to_float<Element>(ptx::load_b16(operand_addr(desc, mn, k, mn_major)));
}

// Thread t of the warpgroup: (row, column) of its accumulator register i (ptx_sm90.cuh header).
inline void acc_coord(int t, int i, int& row, int& col) {
    const int w = t / 32, g = (t % 32) / 4, q = t % 4;
    row = 16 * w + g + 8 * ((i / 2) % 2);
    col = 8 * (i / 4) + 2 * q + (i % 2);
}

inline emu::WarpgroupContext& warpgroup() {
    const size_t g = threadIdx.x / 128;
    if (g >= emu::block().warpgroups.size()) emu::fail("wgmma outside a whole warpgroup", g);
    return emu::block().warpgroups[g];
}

// d (64 x N) = (accumulate ? d : 0) + A (64 x 16) B (16 x N); A from `desc_a` (K-major, or
// MN-major with trans_a) or from the warpgroup's register fragments `a`, B from `desc_b`
// (K-major: stored N x K; or MN-major with trans_b).
template <int N, typename Element>
inline void wgmma_impl(float (&d)[N / 2], const uint64_t* desc_a, const uint32_t* a,
                       uint64_t desc_b, bool trans_a, bool trans_b, bool accumulate) {
    const int t = static_cast<int>(threadIdx.x % 128);
    emu::WarpgroupContext& wg = warpgroup();
    if (a != nullptr) {
        for (int i = 0; i < 4; ++i) wg.words[t][i] = a[i];
    }
    wg.barrier.arrive_and_wait();
    // A (row, k) from the register fragments: warp row / 16 holds rows 16 w.. in the
    // mma.m16n8k16 A layout (ptx.cuh).
    auto a_reg = [&](int row, int k) {
        const int w = row / 16, r = row % 16;
        const int src = 32 * w + (r % 8) * 4 + (k % 8) / 2;
        const int reg = (r < 8 ? 0 : 1) + (k < 8 ? 0 : 2);
        const uint32_t word = wg.words[src][reg];
        const uint16_t bits = static_cast<uint16_t>(k % 2 ? word >> 16 : word & 0xFFFF);
        return ptx::b16_to_float<Element>(bits);
    };
    float out[N / 2];
    for (int i = 0; i < N / 2; ++i) {
        int row, col;
        acc_coord(t, i, row, col);
        float sum = accumulate ? d[i] : 0.f;
        for (int k = 0; k < 16; ++k) {
            const float av =
                a != nullptr ? a_reg(row, k) : operand<Element>(*desc_a, row, k, trans_a);
            const float bv = operand<Element>(desc_b, col, k, trans_b);
            sum += av * bv;
        }
        out[i] = sum;
    }
    wg.barrier.arrive_and_wait();
    for (int i = 0; i < N / 2; ++i) d[i] = out[i];
}

}  // namespace detail

// ---- mbarrier ----

inline void mbarrier_init(uint32_t bar, uint32_t count) {
    emu::smem_at(bar, 8, 8);
    std::lock_guard<std::mutex> lock(emu::block().mbarrier_mutex);
    emu::MBarrier b;
    b.count = static_cast<int>(count);
    b.pending = static_cast<int>(count);
    emu::block().mbarriers[bar] = std::move(b);
}
inline void fence_barrier_init() {}

inline void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    std::lock_guard<std::mutex> lock(emu::block().mbarrier_mutex);
    emu::MBarrier& b = detail::barrier_locked(bar);
    detail::complete_if_ready_locked(b);
    b.tx += bytes;
    b.pending -= 1;
}
inline void mbarrier_arrive_count(uint32_t bar, uint32_t count) {
    std::lock_guard<std::mutex> lock(emu::block().mbarrier_mutex);
    emu::MBarrier& b = detail::barrier_locked(bar);
    detail::complete_if_ready_locked(b);
    if (static_cast<int>(count) > b.pending) emu::fail("mbarrier arrivals past the count", count);
    b.pending -= static_cast<int>(count);
}
inline void mbarrier_arrive(uint32_t bar) { mbarrier_arrive_count(bar, 1); }

// The thread's cp.async copies not yet landed (kernels/ptx.cuh here) land when this barrier's
// phase completes; then one arrival.
inline void cp_async_mbarrier_arrive_noinc(uint32_t bar) {
    std::lock_guard<std::mutex> lock(emu::block().mbarrier_mutex);
    emu::MBarrier& b = detail::barrier_locked(bar);
    detail::complete_if_ready_locked(b);
    for (const ptx::detail::PendingCopy& c : ptx::detail::pending_copies) {
        b.staged_dst.push_back(c.dst);
        b.staged.emplace_back(c.data, c.data + c.bytes);
    }
    ptx::detail::pending_copies.clear();
    b.pending -= 1;
}

inline bool mbarrier_try_wait_parity(uint32_t bar, uint32_t parity) {
    thread_local auto first_miss = std::chrono::steady_clock::time_point{};
    thread_local bool missing = false;
    {
        std::lock_guard<std::mutex> lock(emu::block().mbarrier_mutex);
        emu::MBarrier& b = detail::barrier_locked(bar);
        detail::complete_if_ready_locked(b);
        if ((b.phase % 2) != (parity & 1u)) {
            missing = false;
            return true;
        }
        const auto now = std::chrono::steady_clock::now();
        if (!missing) {
            missing = true;
            first_miss = now;
        } else if (std::chrono::duration<double>(now - first_miss).count() >
                   detail::wait_limit_seconds()) {
            std::fprintf(stderr,
                         "mbarrier at %u: waiting for parity %u; phase %u, %d arrivals and %lld "
                         "transaction bytes outstanding\n",
                         bar, parity, b.phase, b.pending, b.tx);
            emu::fail("mbarrier wait never completed (a hang on the GPU)", bar);
        }
    }
    std::this_thread::yield();
    return false;
}

// ---- global flags ----

// The spin of the deterministic backward's semaphores. The emulator runs CTAs one after the
// other in grid order, so a value that is not there at once arrives only if a CTA of this one's
// own block writes it: a flag past `value` (the order broke) fails at once, one that stays below
// fails after EMU_WAIT_SECONDS (a hang on the GPU).
inline void wait_global_equal(const int* addr, int value) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
        const int v = std::atomic_ref<const int>(*addr).load(std::memory_order_acquire);
        if (v == value) return;
        if (v > value) {
            std::fprintf(stderr, "semaphore: waiting for %d, found %d\n", value, v);
            emu::fail("semaphore already past the awaited value", value);
        }
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
            detail::wait_limit_seconds()) {
            std::fprintf(stderr, "semaphore: waiting for %d, found %d\n", value, v);
            emu::fail("semaphore wait never completed (a hang on the GPU)", value);
        }
        std::this_thread::yield();
    }
}
inline void store_release_global(int* addr, int value) {
    std::atomic_ref<int>(*addr).store(value, std::memory_order_release);
}

// ---- shared-memory stores ----

// stmatrix.m8n8.x4.b16: the lanes' row addresses and fragments meet in the warp's buffer; each
// lane then writes the rows it gave the address of (matrix lane / 8, row lane % 8).
inline void stmatrix_x4(uint32_t row_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    emu::smem_at(row_addr, 16, 16);  // checks
    emu::WarpContext& w = emu::warp();
    const int lane = emu::lane();
    const uint32_t r[4] = {r0, r1, r2, r3};
    for (int i = 0; i < 4; ++i) w.words[lane][i] = r[i];
    w.barrier.arrive_and_wait();
    const int matrix = lane / 8, row = lane % 8;
    uint32_t words[4];  // the row's 8 elements: held by lanes 4 row .. 4 row + 3
    for (int q = 0; q < 4; ++q) words[q] = w.words[4 * row + q][matrix];
    std::memcpy(emu::smem_at(row_addr, 16, 16), words, 16);
    w.barrier.arrive_and_wait();
}

// ---- async proxy ----

inline void fence_proxy_async_shared() {}
inline void fence_proxy_async_global() {}

inline void bulk_copy_g2s(uint32_t smem_dst, const void* gmem_src, uint32_t bytes, uint32_t bar) {
    if (bytes % 16 != 0) emu::fail("cp.async.bulk size not a multiple of 16", bytes);
    if (reinterpret_cast<uintptr_t>(gmem_src) % 16 != 0) {
        emu::fail("misaligned cp.async.bulk source", reinterpret_cast<long long>(gmem_src));
    }
    emu::smem_at(smem_dst, bytes, 16);
    emu::check_readable(gmem_src, bytes);
    const auto* src = static_cast<const unsigned char*>(gmem_src);
    detail::stage_copy(bar, smem_dst, std::vector<unsigned char>(src, src + bytes));
}

namespace detail {
// Rows of a TMA box (box[1] x box[2] x box[3]; box[0] elements each) and their bytes.
inline uint32_t box_rows(const sm90::TensorMapDesc& m) { return m.box[1] * m.box[2] * m.box[3]; }
inline uint32_t box_row_bytes(const sm90::TensorMapDesc& m) { return m.box[0] * m.elem_bytes; }

// Box row r of the map at coordinates c: coordinates (c1 + i1, c2 + i2, c3 + i3), i1 fastest.
// Whether it lies inside the tensor; row_off: its byte offset from the map's base.
inline bool box_row(const sm90::TensorMapDesc& m, const int (&c)[4], uint32_t r,
                    long long& row_off) {
    const long long i1 = r % m.box[1], i2 = (r / m.box[1]) % m.box[2];
    const long long i3 = r / (m.box[1] * m.box[2]);
    const long long y[3] = {c[1] + i1, c[2] + i2, c[3] + i3};
    bool row_in = true;
    row_off = 0;
    for (int d = 1; d < 4; ++d) {
        if (d >= m.rank) {
            if (y[d - 1] != 0) row_in = false;
            continue;
        }
        if (y[d - 1] < 0 || y[d - 1] >= static_cast<long long>(m.dims[d])) row_in = false;
        row_off += y[d - 1] * static_cast<long long>(m.strides_bytes[d]);
    }
    return row_in;
}

// Shared-memory byte offset of element e of box row r (the 128-byte swizzle on the offsets).
inline uint32_t box_smem_offset(const sm90::TensorMapDesc& m, uint32_t r, uint32_t e) {
    uint32_t off = r * box_row_bytes(m) + e * m.elem_bytes;
    if (m.swizzle_bytes == 128) off ^= ((off >> 7) & 7u) << 4;
    return off;
}

// The box of the map at coordinates c[0..rank) into shared memory (zero outside the tensor),
// staged on the barrier.
inline void tma_load(uint32_t smem_dst, const void* tensor_map, const int (&c)[4], uint32_t bar) {
    const sm90::TensorMapDesc& m = sm90::tensor_map_fields(tensor_map);
    const uint32_t bytes = box_row_bytes(m) * box_rows(m);
    emu::smem_at(smem_dst, bytes, m.swizzle_bytes == 128 ? 1024 : 128);
    std::vector<unsigned char> image(bytes, 0);
    for (uint32_t r = 0; r < box_rows(m); ++r) {
        long long row_off;
        if (!box_row(m, c, r, row_off)) continue;  // zero fill
        for (uint32_t e = 0; e < m.box[0]; ++e) {
            const long long x = static_cast<long long>(c[0]) + e;
            if (x < 0 || x >= static_cast<long long>(m.dims[0])) continue;  // zero fill
            const uint32_t off = box_smem_offset(m, r, e);
            const auto* src =
                static_cast<const unsigned char*>(m.base) + row_off + x * m.elem_bytes;
            emu::check_readable(src, m.elem_bytes);
            std::memcpy(&image[off], src, m.elem_bytes);
        }
    }
    stage_copy(bar, smem_dst, std::move(image));
}

// A TMA store issued by this thread: read from shared memory and written to global memory only
// when a bulk_wait_group(_read) retires its group -- the latest moment the hardware may read the
// shared memory -- so a kernel that overwrites the buffer before its wait, or exits without
// waiting, writes wrong or no output here.
struct PendingStore {
    const void* tensor_map;
    uint32_t smem_src;
    int c[4];
    bool add = false;  // a reduction (fp32 add) into global memory instead of a copy
};
struct BulkGroups {
    std::vector<PendingStore> open;                 // issued since the last commit
    std::vector<std::vector<PendingStore>> groups;  // committed, oldest first
};
inline thread_local BulkGroups tl_bulk_groups;

inline void tma_store_now(const PendingStore& st) {
    const sm90::TensorMapDesc& m = sm90::tensor_map_fields(st.tensor_map);
    const unsigned char* image = emu::smem_at(st.smem_src, box_row_bytes(m) * box_rows(m),
                                              m.swizzle_bytes == 128 ? 1024 : 128);
    for (uint32_t r = 0; r < box_rows(m); ++r) {
        long long row_off;
        if (!box_row(m, st.c, r, row_off)) continue;  // past the tensor: not written
        for (uint32_t e = 0; e < m.box[0]; ++e) {
            const long long x = static_cast<long long>(st.c[0]) + e;
            if (x < 0 || x >= static_cast<long long>(m.dims[0])) continue;
            const uint32_t off = box_smem_offset(m, r, e);
            auto* dst = static_cast<unsigned char*>(const_cast<void*>(m.base)) + row_off +
                        x * m.elem_bytes;
            if (st.add) {
                if (m.elem_bytes != 4) emu::fail("TMA reduction add on a map that is not fp32", 0);
                float value;
                std::memcpy(&value, image + off, 4);
                std::atomic_ref<float>(*reinterpret_cast<float*>(dst)).fetch_add(value);
            } else {
                std::memcpy(dst, image + off, m.elem_bytes);
            }
        }
    }
}

inline void retire_bulk_groups(size_t keep) {
    BulkGroups& g = tl_bulk_groups;
    while (g.groups.size() > keep) {
        for (const PendingStore& st : g.groups.front()) tma_store_now(st);
        g.groups.erase(g.groups.begin());
    }
}
}  // namespace detail

inline void tma_store_4d(const void* tensor_map, uint32_t smem_src, int c0, int c1, int c2,
                         int c3) {
    sm90::tensor_map_fields(tensor_map);  // fails on a map that was not encoded
    detail::tl_bulk_groups.open.push_back({tensor_map, smem_src, {c0, c1, c2, c3}});
}
// cp.reduce.async.bulk.tensor.2d ... .add: the box at (c0, c1) added to global memory (fp32).
inline void tma_reduce_add_2d(const void* tensor_map, uint32_t smem_src, int c0, int c1) {
    sm90::tensor_map_fields(tensor_map);
    detail::tl_bulk_groups.open.push_back({tensor_map, smem_src, {c0, c1, 0, 0}, true});
}
inline void bulk_commit_group() {
    detail::BulkGroups& g = detail::tl_bulk_groups;
    g.groups.push_back(std::move(g.open));
    g.open.clear();
}
template <int kPending>
inline void bulk_wait_group_read() {
    detail::retire_bulk_groups(kPending);
}
template <int kPending>
inline void bulk_wait_group() {
    detail::retire_bulk_groups(kPending);
}

inline void tma_load_2d(uint32_t smem_dst, const void* tensor_map, int c0, int c1, uint32_t bar) {
    detail::tma_load(smem_dst, tensor_map, {c0, c1, 0, 0}, bar);
}
inline void tma_load_4d(uint32_t smem_dst, const void* tensor_map, int c0, int c1, int c2, int c3,
                        uint32_t bar) {
    detail::tma_load(smem_dst, tensor_map, {c0, c1, c2, c3}, bar);
}

// ---- wgmma ----

inline uint64_t make_smem_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes = 16) {
    uint64_t desc = (smem_addr & 0x3FFFFu) >> 4;
    desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
    desc |= static_cast<uint64_t>(1024 >> 4) << 32;
    desc |= static_cast<uint64_t>(1) << 62;
    return desc;
}
// The descriptor `byte_offset` bytes further: the start address field advanced, which must
// neither carry out of its 14 bits nor drop a partial 16-byte unit.
inline uint64_t smem_desc_advance(uint64_t desc, uint32_t byte_offset) {
    if (byte_offset % 16 != 0) {
        emu::fail("smem_desc_advance: offset not a multiple of 16", byte_offset);
    }
    if ((desc & 0x3FFFu) + (byte_offset >> 4) > 0x3FFFu) {
        emu::fail("smem_desc_advance: start address past 2^18", byte_offset);
    }
    const uint32_t lo = static_cast<uint32_t>(desc) + (byte_offset >> 4);
    return (desc & 0xFFFFFFFF00000000ull) | lo;
}

template <typename T, int N>
inline void fence_operand(T (&)[N]) {}
inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int kPending>
inline void wgmma_wait() {}

template <int N, typename Element, bool kTransA = false, bool kTransB = false>
inline void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    detail::wgmma_impl<N, Element>(d, &desc_a, nullptr, desc_b, kTransA, kTransB, accumulate);
}
template <int N, typename Element, bool kTransB>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                     bool accumulate) {
    detail::wgmma_impl<N, Element>(d, nullptr, a, desc_b, false, kTransB, accumulate);
}

// ---- named barriers ----

// Named barrier `id` of `threads` threads, made at its first use (`what`: the instruction, for
// the error message).
inline std::barrier<>* named_barrier(uint32_t id, uint32_t threads, const char* what) {
    if (id == 0 || id > 15 || threads % 32 != 0) emu::fail(what, id);
    std::lock_guard<std::mutex> lock(emu::block().mbarrier_mutex);
    auto& slot = emu::block().named_barriers[id];
    if (!slot) slot = std::make_unique<std::barrier<>>(static_cast<std::ptrdiff_t>(threads));
    return slot.get();
}

inline void named_barrier_sync(uint32_t id, uint32_t threads) {
    named_barrier(id, threads, "bar.sync: bad id or thread count")->arrive_and_wait();
}

inline void named_barrier_arrive(uint32_t id, uint32_t threads) {
    auto token = named_barrier(id, threads, "bar.arrive: bad id or thread count")->arrive();
    (void)token;
}

// ---- registers ----

template <int kRegs>
inline void setmaxnreg_dec() {}
template <int kRegs>
inline void setmaxnreg_inc() {}

}  // namespace ptx90
}  // namespace flash_cuda
