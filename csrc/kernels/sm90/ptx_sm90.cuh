// Thin wrappers around the Hopper-only (sm_90a) PTX instructions of the planned sm90 kernels
// (../shared/DESIGN.md section 6): mbarriers, bulk and tensor (TMA) copies, the async-proxy fence,
// wgmma and setmaxnreg. One instruction per wrapper, C++ types; no kernel holds inline asm.
// Build with -gencode=arch=compute_90a,code=sm_90a (plain sm_90 rejects wgmma and setmaxnreg).
//
// wgmma.m64nNk16 (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): a
// warpgroup (4 consecutive warps, 128 threads) computes D (64 x N, fp32) += A (64 x 16) B (16 x
// N). Accumulator layout, thread t of the warpgroup, w = t / 32, g = (t % 32) / 4, q = t % 4,
// register i in [0, N / 2):
//   d[i] = D[16 w + g + 8 ((i / 2) % 2)][8 (i / 4) + 2 q + (i % 2)]
// (the mma.m16n8 C layout of each warp's 16 rows, repeated over the N / 8 column tiles).
// Operands from shared memory through 64-bit descriptors (make_smem_desc). With both operands
// "K-major" (no transpose: A stored as 64 rows x K, B stored as N rows x K) and the 128-byte
// swizzle, a row holds 64 16-bit elements (128 B), 8 rows form a 1024-byte atom (its 16-byte
// chunk c of row r sits at chunk c ^ (r % 8)), atoms follow each other every 1024 B (the stride
// byte offset), and the k16 step j of a 64-column slab starts 32 j bytes after the slab's start.
// The TMA's CU_TENSOR_MAP_SWIZZLE_128B writes exactly this layout for a box 64 elements wide.
#pragma once

#include <cstdint>

#include "kernels/sm90/wgmma.cuh"

namespace flash_cuda {
namespace ptx90 {

// ---- mbarrier (64-bit, in shared memory) ----

// mbarrier.init.shared::cta.b64: `count` arrivals complete a phase.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// fence.mbarrier_init.release.cluster: makes initialised barriers visible to the async proxy
// (TMA) and other threads; once, after the inits, before a __syncthreads.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// mbarrier.arrive.expect_tx.shared::cta.b64: one arrival, and `bytes` more transaction bytes
// the current phase waits for (the copies that complete_tx on this barrier).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

// mbarrier.arrive.shared::cta.b64: one arrival (a consumer releasing a buffer).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// mbarrier.arrive.shared::cta.b64 with a count: `count` arrivals at once (one thread arriving
// for its warpgroup).
__device__ __forceinline__ void mbarrier_arrive_count(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count)
                 : "memory");
}

// mbarrier.try_wait.parity.shared::cta.b64: true once the phase with this parity has completed
// (may also return false after a system-dependent time; callers loop).
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n"
        "  .reg .pred p;\n"
        "  mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "  selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}

// cp.async.mbarrier.arrive.noinc.shared::cta.b64: one arrival on the mbarrier once every
// cp.async this thread issued before it has landed (noinc: the arrival is one of the phase's
// expected count, which therefore counts the threads that signal this way). An sm_80
// instruction, here with the waits it pairs with (kernels/sm80/kv_ring.cuh).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// ---- shared-memory stores ----

// stmatrix.sync.aligned.m8n8.x4.shared.b16 (warp-collective): four 8x8 matrices of 16-bit
// elements; r_i holds this lane's two elements of matrix i (row lane / 4, columns 2 (lane % 4)
// and + 1: the mma fragment layout), and lane 8 i + j gives the shared address of row j of
// matrix i (16 bytes, 16-byte aligned).
__device__ __forceinline__ void stmatrix_x4(uint32_t row_addr, uint32_t r0, uint32_t r1,
                                            uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(row_addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// ---- async proxy ----

// fence.proxy.async.shared::cta: generic-proxy writes to shared memory (st.shared) become
// visible to the async proxy (wgmma operands, TMA stores) issued after it.
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// fence.proxy.async.global: orders this thread's async-proxy accesses of global memory (the TMA
// reductions a bulk_wait_group has seen complete) with its later generic-proxy ones (a release).
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: `bytes` (a multiple of
// 16, both addresses 16-byte aligned) from global to shared memory; completes `bytes`
// transaction bytes on the mbarrier.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t smem_dst, const void* gmem_src,
                                              uint32_t bytes, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
        ::"r"(smem_dst), "l"(gmem_src), "r"(bytes), "r"(bar)
        : "memory");
}

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes: the box of the
// tensor map at (inner coordinate c0, outer c1) into shared memory (1024-byte aligned for the
// 128-byte swizzle); rows past the tensor are zero-filled. tensor_map: the address of a
// __grid_constant__ CUtensorMap kernel parameter.
__device__ __forceinline__ void tma_load_2d(uint32_t smem_dst, const void* tensor_map, int c0,
                                            int c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_dst),
        "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// cp.async.bulk.tensor.4d...: the box of a rank-4 tensor map at coordinates (c0 innermost ..
// c3), e.g. (column, row, head, batch) of a (b, s, h, d) tensor; rows past the tensor's extent in
// any dimension are zero-filled.
__device__ __forceinline__ void tma_load_4d(uint32_t smem_dst, const void* tensor_map, int c0,
                                            int c1, int c2, int c3, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_dst),
        "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// cp.async.bulk.tensor.4d.global.shared::cta.bulk_group: shared memory (1024-byte aligned for
// the 128-byte swizzle) into the box of a rank-4 tensor map at (c0 innermost .. c3); elements
// past the tensor's extent in any dimension are not written. Asynchronous: the shared memory may
// be overwritten only after bulk_wait_group_read, and the generic proxy's writes to it must be
// made visible to the async proxy first (fence_proxy_async_shared).
__device__ __forceinline__ void tma_store_4d(const void* tensor_map, uint32_t smem_src, int c0,
                                             int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
        ::"l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(smem_src), "r"(c0), "r"(c1), "r"(c2),
        "r"(c3)
        : "memory");
}

// cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group: the box at (c0, c1) of
// an fp32 map, read from shared memory at smem_src (the map's swizzle), added element-wise to
// global memory by the TMA unit (elements outside the tensor are skipped). A bulk group as
// tma_store_4d.
__device__ __forceinline__ void tma_reduce_add_2d(const void* tensor_map, uint32_t smem_src,
                                                  int c0, int c1) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], "
        "[%1];\n" ::"l"(reinterpret_cast<uint64_t>(tensor_map)),
        "r"(smem_src), "r"(c0), "r"(c1)
        : "memory");
}

// cp.async.bulk.commit_group: the thread's bulk stores issued since the last commit form a
// group.
__device__ __forceinline__ void bulk_commit_group() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// cp.async.bulk.wait_group.read N: all but the newest N of the thread's groups have read their
// shared memory (it may be overwritten).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// cp.async.bulk.wait_group N: all but the newest N of the thread's groups are complete (their
// writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- wgmma ----

// Shared-memory matrix descriptor with the 128-byte swizzle: start address (>> 4) in bits
// 0-13, leading byte offset (>> 4) in bits 16-29, stride byte offset 1024 (>> 4: 64) in bits
// 32-45, base offset 0 (atoms 1024-byte aligned), swizzle mode 1 (128 B) in bits 62-63.
// K-major operand (rows of 64 K elements, 128 B, 8-row atoms 1024 B apart): the leading byte
// offset is unused (1). MN-major operand (rows of 64 MN elements per K index, 8-row atoms 1024 B
// apart along K): `lbo_bytes` is the distance between the 64-element MN blocks (slabs).
__device__ __forceinline__ uint64_t make_smem_desc_sw128(uint32_t smem_addr,
                                                         uint32_t lbo_bytes = 16) {
    uint64_t desc = (smem_addr & 0x3FFFFu) >> 4;
    desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
    desc |= static_cast<uint64_t>(1024 >> 4) << 32;
    desc |= static_cast<uint64_t>(1) << 62;
    return desc;
}

// The descriptor of the operand `byte_offset` bytes past the one `desc` describes (a k step or a
// slab further): the start address field (bits 0-13, address >> 4) plus byte_offset >> 4, an add
// to the low 32 bits only (shared addresses are below 2^18, so the field does not carry). One add
// per wgmma where rebuilding the descriptor from the address took about six instructions.
__device__ __forceinline__ uint64_t smem_desc_advance(uint64_t desc, uint32_t byte_offset) {
    const uint32_t lo = static_cast<uint32_t>(desc) + (byte_offset >> 4);
    return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// wgmma.fence.sync.aligned: orders register accesses to the accumulators before the wgmma
// that follow (each warpgroup thread, before the first wgmma of a batch).
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// wgmma.commit_group.sync.aligned: closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// wgmma.wait_group.sync.aligned N: waits until at most N committed groups are pending.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The wgmma instructions themselves: wgmma.cuh (generated), wgmma_ss / wgmma_rs.

// An empty asm that "reads and writes" each register of `r`: the compiler may not move other
// accesses of these values across it. Around a wgmma batch (before the fence, after the wait) it
// keeps the arithmetic on accumulators and A fragments out of the window in which the tensor
// cores own them (the asm of wgmma.mma_async looks complete to the compiler at issue).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <typename T, int N>
__device__ __forceinline__ void fence_operand(T (&r)[N]) {  // arrays of any rank
#pragma unroll
    for (int i = 0; i < N; ++i) fence_operand(r[i]);
}

// ---- named barriers ----

// bar.sync id, threads: the `threads` threads (a multiple of 32) that use barrier `id` (1..15; 0
// is __syncthreads) wait for each other, e.g. the consumer warpgroups of a warp-specialised
// kernel without the producer.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive: this warp's threads count towards named barrier `id` of `threads` threads without
// waiting for it (the producer side of a bar.sync elsewhere).
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- global flags (the deterministic backward's semaphores) ----

// Spins until the int at `addr` (global memory) reads `value`, with acquire semantics at GPU
// scope: what the writer did before its release is visible after.
__device__ __forceinline__ void wait_global_equal(const int* addr, int value) {
    int v;
    do {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
    } while (v != value);
}
// st.release.gpu: `value` at `addr`, after every earlier memory operation of this thread.
__device__ __forceinline__ void store_release_global(int* addr, int value) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(addr), "r"(value) : "memory");
}

// ---- registers ----

// setmaxnreg.{dec,inc}.sync.aligned.u32: the warpgroup gives back / takes registers (producer
// warpgroup down to 24, consumers up to 240 in the warp-specialised kernels).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace ptx90
}  // namespace flash_cuda
