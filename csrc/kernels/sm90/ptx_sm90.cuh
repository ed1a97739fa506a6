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

// ---- async proxy ----

// fence.proxy.async.shared::cta: generic-proxy writes to shared memory (st.shared) become
// visible to the async proxy (wgmma operands, TMA stores) issued after it.
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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

// ---- wgmma ----

// Shared-memory matrix descriptor of a K-major operand with the 128-byte swizzle: start address
// (>> 4) in bits 0-13, leading byte offset 1 (unused for swizzled K-major) in bits 16-29,
// stride byte offset 1024 (>> 4: 64) in bits 32-45, base offset 0 (atoms 1024-byte aligned),
// swizzle mode 1 (128 B) in bits 62-63.
__device__ __forceinline__ uint64_t make_smem_desc_sw128(uint32_t smem_addr) {
    uint64_t desc = (smem_addr & 0x3FFFFu) >> 4;
    desc |= static_cast<uint64_t>(1) << 16;
    desc |= static_cast<uint64_t>(1024 >> 4) << 32;
    desc |= static_cast<uint64_t>(1) << 62;
    return desc;
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

// wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16: d (32 fp32 per thread, layout above)
// = (accumulate ? d : 0) + A B, A and B K-major from shared memory (descriptors), no
// transposes, scales 1.
__device__ __forceinline__ void wgmma_m64n64k16_bf16_ss(float (&d)[32], uint64_t desc_a,
                                                        uint64_t desc_b, bool accumulate) {
    asm volatile(
        "{\n"
        "  .reg .pred p;\n"
        "  setp.ne.b32 p, %34, 0;\n"
        "  wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
          "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
}

// wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 with A from registers (the "RS" form,
// O += P V in attention): a[4] holds the warp's 16 rows of A (64 x 16) in the mma.m16n8k16 A
// fragment layout (ptx.cuh), B from shared memory. kTransB: B stored MN-major (K rows of N
// contiguous elements, e.g. V as keys x head dim): with the 128-byte swizzle a 64-column slab of
// 8 K rows is a 1024-byte atom, atoms 1024 B apart along K (the descriptor's stride byte
// offset), so the k16 step j starts 2048 j bytes into the slab.
template <bool kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_bf16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                        uint64_t desc_b, bool accumulate) {
    asm volatile(
        "{\n"
        "  .reg .pred p;\n"
        "  setp.ne.b32 p, %37, 0;\n"
        "  wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
          "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b),
          "r"(static_cast<int>(accumulate)), "n"(kTransB ? 1 : 0));
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
