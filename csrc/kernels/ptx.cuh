// Thin wrappers around the PTX instructions the tensor-core kernels use. Each wrapper is one
// instruction (named in its comment) with C++ types; kernels never contain inline asm.
// All of these need sm_80 or newer (cp.async, bf16 mma, packed f32 -> bf16x2 conversion).
//
// Fragment layouts of mma.m16n8k16 (PTX ISA "Matrix fragments for mma.m16n8k16 with floating
// point type"), with g = lane / 4 (groupID) and t = lane % 4 (threadID_in_group):
//   A (16 x 16, row major), four 32-bit registers of two 16-bit elements each (low half first):
//     a[0] = A[g    ][2t, 2t+1]   a[1] = A[g + 8][2t, 2t+1]
//     a[2] = A[g    ][2t+8, 2t+9] a[3] = A[g + 8][2t+8, 2t+9]
//   B (16 x 8, "col": element (k, n) with k contiguous), two registers:
//     b[0] = B[2t, 2t+1][g]       b[1] = B[2t+8, 2t+9][g]
//   C/D (16 x 8, fp32), four floats:
//     c[0], c[1] = C[g][2t, 2t+1]  c[2], c[3] = C[g + 8][2t, 2t+1]
// ldmatrix.x4 (8 x 8 matrices of 16-bit elements, one per register): lanes 8i .. 8i+7 give the
// 16-byte row addresses of matrix i; lane l receives, in register i, row l / 4, elements
// 2 (l % 4) and 2 (l % 4) + 1 of matrix i (with .trans: column l / 4, rows 2 (l % 4), +1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flash_cuda {
namespace ptx {

// The kernel's dynamic shared memory (extern __shared__), 128-byte aligned.
__device__ __forceinline__ unsigned char* dynamic_smem() {
    extern __shared__ __align__(128) unsigned char flash_cuda_dynamic_smem[];
    return flash_cuda_dynamic_smem;
}

// 32-bit shared-memory address of a generic pointer into shared memory (cvta.to.shared).
__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// cp.async.cg.shared.global (16 bytes, L2 only): asynchronous global -> shared copy. When
// `in_bounds` is false no global byte is read (src-size 0) and the 16 shared bytes are zeroed.
__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void* gmem_src,
                                            bool in_bounds) {
    const int src_bytes = in_bounds ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst),
                 "l"(gmem_src), "r"(src_bytes)
                 : "memory");
}

// cp.async.ca.shared.global (4 bytes): the same for one 32-bit word (per-row fp32 values).
__device__ __forceinline__ void cp_async_4(uint32_t smem_dst, const void* gmem_src,
                                           bool in_bounds) {
    const int src_bytes = in_bounds ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_dst),
                 "l"(gmem_src), "r"(src_bytes)
                 : "memory");
}

// cp.async.commit_group: closes the group of cp.async issued since the last commit (an empty
// group is legal and completes at once).
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// cp.async.wait_group N: waits until at most `kPendingGroups` of this thread's committed groups
// are still in flight. Other threads' copies become visible only after a barrier.
template <int kPendingGroups>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPendingGroups) : "memory");
}

// barrier.sync 0 without .aligned: the CTA-wide barrier of __syncthreads() (bar.sync 0, which
// is barrier.sync.aligned 0) for code where warps reach it at different instructions, e.g. the
// decode tile's idle warps keeping step with the computing ones in a loop of their own. With
// .aligned that is undefined behaviour (PTX ISA: every thread must execute the same barrier
// instruction), and compute-sanitizer's synccheck reports it as a divergent-thread barrier.
__device__ __forceinline__ void barrier_sync_unaligned() {
    asm volatile("barrier.sync 0;\n" ::: "memory");
}

// ld.shared.v4.b32: one 16-byte shared-memory load.
__device__ __forceinline__ uint4 ld_shared_16(uint32_t smem_addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(smem_addr)
                 : "memory");
    return v;
}

// ld.shared.b32: one 4-byte shared-memory load.
__device__ __forceinline__ uint32_t ld_shared_4(uint32_t smem_addr) {
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr) : "memory");
    return v;
}

// st.shared.b32: one 4-byte shared-memory store.
__device__ __forceinline__ void st_shared_4(uint32_t smem_addr, uint32_t value) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem_addr), "r"(value) : "memory");
}

// st.global.b32 under a predicate: one predicated store, no branch around it (code that runs
// while wgmma are in flight must not diverge: ptxas waits for them before a divergent branch).
__device__ __forceinline__ void st_global_4_if(void* ptr, uint32_t value, bool pred) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.global.b32 [%0], %1;\n}\n" ::"l"(ptr),
        "r"(value), "r"(static_cast<uint32_t>(pred))
        : "memory");
}

// st.shared.v2.f32: two floats, 8-byte aligned.
__device__ __forceinline__ void st_shared_f32x2(uint32_t smem_addr, float a, float b) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(smem_addr), "f"(a), "f"(b) : "memory");
}

// mov.b32 behind an asm barrier: returns x, but the compiler cannot see that it does, so
// values derived from it are computed where they are used instead of being hoisted out of the
// main loop and kept in registers (register-pressure control, no instruction cost beyond a MOV).
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
    asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
    return x;
}
__device__ __forceinline__ int opaque(int x) {
    asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
    return x;
}

// Lane 0's x, in every lane (shfl.sync.idx; the warp converged): for a value the same across the
// warp anyway (a warpgroup index, a pipeline stage) that ptxas cannot prove so. From it ptxas
// derives shared addresses and wgmma descriptors in uniform registers (one uniform add per
// descriptor) instead of building them per lane and moving each to a uniform register (R2UR).
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

// mad.wide.u32: a * b + c with a 64-bit result, one IMAD.WIDE.U32 (C++'s uint64 arithmetic on
// the same operands gets extra adds of a zero high word from ptxas).
__device__ __forceinline__ uint64_t mad_wide_u32(uint32_t a, uint32_t b, uint64_t c) {
    uint64_t d;
    asm("mad.wide.u32 %0, %1, %2, %3;\n" : "=l"(d) : "r"(a), "r"(b), "l"(c));
    return d;
}

// mov.u32 from %tid.x, not merged with other reads: lets a kernel re-derive lane-dependent
// values after its main loop instead of keeping (or spilling) them through it.
__device__ __forceinline__ int thread_index_fresh() {
    int tid;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
    return tid;
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8x8 16-bit matrices from shared memory into
// the A/B-fragment register layout (see the header comment).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&regs)[4], uint32_t smem_row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3])
                 : "r"(smem_row_addr));
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: the same, each 8x8 matrix transposed (for a
// B operand stored with n contiguous, e.g. V laid out (key, head dim)).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&regs)[4], uint32_t smem_row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3])
                 : "r"(smem_row_addr));
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: acc (16x8 fp32) += A B.
template <typename Element>
__device__ __forceinline__ void mma_16816(float (&acc)[4], const uint32_t (&a)[4],
                                          uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&acc)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&acc)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// red.global.add.v2.f32 (sm_90+; PTX ISA 8.1): addr[0] += a, addr[1] += b as one vector
// reduction (no return value; addr 8-byte aligned, in global memory). One request per 8 bytes
// instead of two scalar ones: a warp's 32 lanes update whole 32-byte sectors. Before sm_90:
// two scalar fp32 atomicAdd. Either way each element is an atomic fp32 add (order not defined).
__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b)
                 : "memory");
#else
    atomicAdd(addr, a);
    atomicAdd(addr + 1, b);
#endif
}

// atomicAdd on an int in global memory, returning the old value (relaxed, device scope): the
// sm90 forward's tile counter (sm90/fwd_sm90.cuh TileRing).
__device__ __forceinline__ int atomic_add_global(int* addr, int value) {
    return atomicAdd(addr, value);
}

// Programmatic dependent launch (sm_90+; PTX ISA 7.8), the two halves of one kernel-to-kernel
// edge. launch_dependents (griddepcontrol.launch_dependents): the next kernel in the stream, if
// launched with the programmatic-serialization attribute, may start once every CTA of this grid
// has executed it or exited. wait_for_prior_grid (griddepcontrol.wait): blocks until the grid this
// kernel depends on has completed and its writes are visible. Both are no-ops for a kernel launched
// without the attribute, and compile to nothing before sm_90 (and in the CPU emulator).
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ld.volatile.global.f32 / .v4.f32: loads that ptxas keeps in program order with each other
// (it may sink plain loads towards their first use, after other loads' dependent math: a second
// round trip where one would do).
__device__ __forceinline__ float ld_volatile_f32(const float* ptr) {
    float v;
    asm volatile("ld.volatile.global.f32 %0, [%1];\n" : "=f"(v) : "l"(ptr) : "memory");
    return v;
}

__device__ __forceinline__ float4 ld_volatile_f32x4(const float* ptr) {
    float4 v;
    asm volatile("ld.volatile.global.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(ptr)
                 : "memory");
    return v;
}

// ex2.approx.ftz.f32: 2^x (ex2(-inf) = +0), the softmax exponential.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// tanh.approx.f32: hardware tanh (max relative error ~2^-11), for softcapping.
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// cvt.rn.{f16x2,bf16x2}.f32: two floats -> one packed 16-bit pair, `lo` in the low half (the
// lower column of an mma fragment register). The instruction takes the high source first.
template <typename Element>
__device__ __forceinline__ uint32_t pack_float2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack_float2<__half>(float lo, float hi) {
    uint32_t packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

template <>
__device__ __forceinline__ uint32_t pack_float2<__nv_bfloat16>(float lo, float hi) {
    uint32_t packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// The two 16-bit values of a pack_float2 pair, back to fp32 (exact): low half first.
template <typename Element>
__device__ __forceinline__ float2 unpack_float2(uint32_t packed);

template <>
__device__ __forceinline__ float2 unpack_float2<__half>(uint32_t packed) {
    return __half22float2(*reinterpret_cast<const __half2*>(&packed));
}

template <>
__device__ __forceinline__ float2 unpack_float2<__nv_bfloat16>(uint32_t packed) {
    return make_float2(__uint_as_float(packed << 16), __uint_as_float(packed & 0xffff0000u));
}

}  // namespace ptx
}  // namespace flash_cuda
