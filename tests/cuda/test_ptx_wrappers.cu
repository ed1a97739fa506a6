// Single-warp checks of the PTX wrappers in csrc/kernels/ptx.cuh against the fragment layouts
// they document (PTX ISA, mma.m16n8k16 / ldmatrix). Built and run by tests/test_ptx_wrappers.py:
//   nvcc -std=c++20 -arch=sm_XX -Icsrc tests/cuda/test_ptx_wrappers.cu -o test_ptx_wrappers
// Prints one line per check and exits 1 if any fails.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda_ok.h"
#include "kernels/ptx.cuh"
#include "kernels/sm80/tile_io.cuh"

using namespace flash_cuda;

static int g_failures = 0;
static void report(const char* name, bool ok) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    if (!ok) ++g_failures;
}

// ---- mma.m16n8k16: fragments built by hand from the documented layout, D read back likewise.
// a: A (16 x 16) row major, b: B (16 x 8) as B[k][n] row major, c/d: 16 x 8 fp32 row major.
template <typename Element>
__global__ void mma_kernel(const Element* a, const Element* b, const float* c, float* d) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    auto pack = [](Element lo, Element hi) {
        uint16_t l, h;
        memcpy(&l, &lo, 2);
        memcpy(&h, &hi, 2);
        return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
    };
    uint32_t af[4];
    af[0] = pack(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]);
    af[1] = pack(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]);
    af[2] = pack(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]);
    af[3] = pack(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9]);
    const uint32_t b0 = pack(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]);
    const uint32_t b1 = pack(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]);
    float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                    c[(g + 8) * 8 + 2 * t + 1]};
    ptx::mma_16816<Element>(acc, af, b0, b1);
    d[g * 8 + 2 * t] = acc[0];
    d[g * 8 + 2 * t + 1] = acc[1];
    d[(g + 8) * 8 + 2 * t] = acc[2];
    d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

template <typename Element>
void check_mma(const char* name) {
    std::vector<Element> a(256), b(128);
    std::vector<float> af(256), bf(128), c(128), expect(128);
    for (int i = 0; i < 256; ++i) {
        af[i] = static_cast<float>((i * 7 + 3) % 11 - 5);  // small integers: exact in fp16/bf16
        a[i] = Element(af[i]);
    }
    for (int i = 0; i < 128; ++i) {
        bf[i] = static_cast<float>((i * 5 + 1) % 9 - 4);
        b[i] = Element(bf[i]);
        c[i] = static_cast<float>(i % 13) - 6.f;
    }
    for (int r = 0; r < 16; ++r) {
        for (int n = 0; n < 8; ++n) {
            float s = c[r * 8 + n];
            for (int k = 0; k < 16; ++k) s += af[r * 16 + k] * bf[k * 8 + n];
            expect[r * 8 + n] = s;
        }
    }
    Element *da, *db;
    float *dc, *dd;
    CUDA_OK(cudaMalloc(&da, 256 * sizeof(Element)));
    CUDA_OK(cudaMalloc(&db, 128 * sizeof(Element)));
    CUDA_OK(cudaMalloc(&dc, 128 * 4));
    CUDA_OK(cudaMalloc(&dd, 128 * 4));
    CUDA_OK(cudaMemcpy(da, a.data(), 256 * sizeof(Element), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, b.data(), 128 * sizeof(Element), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dc, c.data(), 128 * 4, cudaMemcpyHostToDevice));
    mma_kernel<Element><<<1, 32>>>(da, db, dc, dd);
    CUDA_OK(cudaGetLastError());
    std::vector<float> d(128);
    CUDA_OK(cudaMemcpy(d.data(), dd, 128 * 4, cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < 128; ++i) ok &= d[i] == expect[i];
    report(name, ok);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dd);
}

// ---- ldmatrix.x4 / .x4.trans on a plain row-major 16 x 16 tile of 16-bit values v(r, c) =
// r * 16 + c, with the lane addressing of warp_gemm.cuh (Q/K pattern and V pattern).
// out[lane * 4 + i] = register i of the lane.
__global__ void ldmatrix_kernel(uint32_t* out, uint32_t* out_trans) {
    __shared__ __align__(128) uint16_t tile[16 * 16];
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) tile[i] = static_cast<uint16_t>(i);
    __syncwarp();
    uint32_t regs[4];
    // Non-transposed (A-operand pattern): row lane % 16, column 8 (lane / 16).
    ptx::ldmatrix_x4(regs, ptx::smem_addr(&tile[(lane % 16) * 16 + 8 * (lane / 16)]));
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = regs[i];
    // Transposed (V pattern): row lane % 8 + 8 ((lane / 8) % 2), column 8 (lane / 16).
    ptx::ldmatrix_x4_trans(regs, ptx::smem_addr(&tile[(lane % 8 + 8 * ((lane / 8) % 2)) * 16 + 8 * (lane / 16)]));
    for (int i = 0; i < 4; ++i) out_trans[lane * 4 + i] = regs[i];
}

void check_ldmatrix() {
    uint32_t *d_out, *d_trans;
    CUDA_OK(cudaMalloc(&d_out, 128 * 4));
    CUDA_OK(cudaMalloc(&d_trans, 128 * 4));
    ldmatrix_kernel<<<1, 32>>>(d_out, d_trans);
    CUDA_OK(cudaGetLastError());
    std::vector<uint32_t> out(128), trans(128);
    CUDA_OK(cudaMemcpy(out.data(), d_out, 512, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(trans.data(), d_trans, 512, cudaMemcpyDeviceToHost));
    auto v = [](int r, int c) { return static_cast<uint32_t>(r * 16 + c); };
    bool ok = true, ok_trans = true;
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        // A fragment: a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..).
        const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int i = 0; i < 4; ++i) {
            ok &= out[lane * 4 + i] == (v(rows[i], cols[i]) | (v(rows[i], cols[i] + 1) << 16));
        }
        // B fragments of V^T: register i covers keys 8 (i % 2) + 2t, +1 and dim 8 (i / 2) + g.
        for (int i = 0; i < 4; ++i) {
            const int key = 8 * (i % 2) + 2 * t, dim = 8 * (i / 2) + g;
            ok_trans &= trans[lane * 4 + i] == (v(key, dim) | (v(key + 1, dim) << 16));
        }
    }
    report("ldmatrix.x4 (A-operand lane pattern)", ok);
    report("ldmatrix.x4.trans (V lane pattern)", ok_trans);
    cudaFree(d_out);
    cudaFree(d_trans);
}

// ---- Swizzled tile: stepped<>() equals byte_offset() of the stepped position; ldmatrix from
// a swizzled tile gives the same registers as from a plain one.
template <int kRows, int kCols>
__global__ void swizzle_kernel(int* mismatches) {
    using Tile = sm80::SwizzledTile<kRows, kCols>;
    const int lane = threadIdx.x;
    int bad = 0;
    const int row = lane % 16, col = 8 * (lane / 16);
    const uint32_t base = Tile::byte_offset(row, col);
    sm80::static_for_each<kRows / 16>([&](auto rs) {
        sm80::static_for_each<kCols / 16>([&](auto cs) {
            bad += Tile::template stepped<16 * rs, 16 * cs>(base) !=
                   Tile::byte_offset(row + 16 * rs, col + 16 * cs);
        });
    });
    // Epilogue pattern: row lane / 4 (+8), column 2 (lane % 4) stepped by 8 columns.
    const int erow = lane / 4, ecol = 2 * (lane % 4);
    const uint32_t ebase = Tile::byte_offset(erow, ecol);
    sm80::static_for_each<2>([&](auto half) {
        sm80::static_for_each<kCols / 8>([&](auto dt) {
            bad += Tile::template stepped<8 * half, 8 * dt>(ebase) !=
                   Tile::byte_offset(erow + 8 * half, ecol + 8 * dt);
        });
    });
    // Bijectivity on 16-byte chunks: every chunk of the tile maps to a distinct chunk.
    if (lane == 0) {
        __shared__ unsigned char seen[kRows * kCols / 8];
        for (int i = 0; i < kRows * kCols / 8; ++i) seen[i] = 0;
        for (int r = 0; r < kRows; ++r) {
            for (int c = 0; c < kCols; c += 8) seen[Tile::offset(r, c) / 8] += 1;
        }
        for (int i = 0; i < kRows * kCols / 8; ++i) bad += seen[i] != 1;
    }
    atomicAdd(mismatches, bad);
}

template <int kRows, int kCols>
void check_swizzle(const char* name) {
    int* d;
    CUDA_OK(cudaMalloc(&d, 4));
    CUDA_OK(cudaMemset(d, 0, 4));
    swizzle_kernel<kRows, kCols><<<1, 32>>>(d);
    CUDA_OK(cudaGetLastError());
    int bad = -1;
    CUDA_OK(cudaMemcpy(&bad, d, 4, cudaMemcpyDeviceToHost));
    report(name, bad == 0);
    cudaFree(d);
}

// ---- cp.async with zero fill, commit/wait; pack_float2 order; exp2 / tanh accuracy.
__global__ void misc_kernel(const uint4* src, uint4* dst, uint32_t* packed, float* math_out) {
    __shared__ __align__(16) uint4 buf[2];
    const int lane = threadIdx.x;
    if (lane < 2) {
        buf[lane] = make_uint4(0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu);
        ptx::cp_async_16(ptx::smem_addr(&buf[lane]), src + lane, /*in_bounds=*/lane == 0);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    __syncwarp();
    if (lane < 2) dst[lane] = buf[lane];
    if (lane == 0) {
        packed[0] = ptx::pack_float2<__half>(1.0f, -2.0f);
        packed[1] = ptx::pack_float2<__nv_bfloat16>(1.0f, -2.0f);
    }
    const float x = -8.f + 0.5f * lane;
    math_out[lane] = ptx::exp2_approx(x);
    math_out[32 + lane] = ptx::tanh_approx(0.25f * x);
    if (lane == 0) math_out[64] = ptx::exp2_approx(-INFINITY);
}

void check_misc() {
    uint4 host_src[2] = {make_uint4(1, 2, 3, 4), make_uint4(5, 6, 7, 8)};
    uint4 *d_src, *d_dst;
    uint32_t* d_packed;
    float* d_math;
    CUDA_OK(cudaMalloc(&d_src, 32));
    CUDA_OK(cudaMalloc(&d_dst, 32));
    CUDA_OK(cudaMalloc(&d_packed, 8));
    CUDA_OK(cudaMalloc(&d_math, 65 * 4));
    CUDA_OK(cudaMemcpy(d_src, host_src, 32, cudaMemcpyHostToDevice));
    misc_kernel<<<1, 32>>>(d_src, d_dst, d_packed, d_math);
    CUDA_OK(cudaGetLastError());
    uint4 dst[2];
    uint32_t packed[2];
    float math[65];
    CUDA_OK(cudaMemcpy(dst, d_dst, 32, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(packed, d_packed, 8, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(math, d_math, 65 * 4, cudaMemcpyDeviceToHost));
    report("cp.async copies in bounds",
           dst[0].x == 1 && dst[0].y == 2 && dst[0].z == 3 && dst[0].w == 4);
    report("cp.async zero-fills out of bounds",
           dst[1].x == 0 && dst[1].y == 0 && dst[1].z == 0 && dst[1].w == 0);
    // fp16: 1.0 = 0x3C00 (low), -2.0 = 0xC000 (high); bf16: 0x3F80, 0xC000.
    report("cvt.rn.f16x2.f32 puts the first argument in the low half", packed[0] == 0xC0003C00u);
    report("cvt.rn.bf16x2.f32 puts the first argument in the low half", packed[1] == 0xC0003F80u);
    bool ok_exp = true, ok_tanh = true;
    for (int lane = 0; lane < 32; ++lane) {
        const double x = -8.0 + 0.5 * lane;
        ok_exp &= std::fabs(math[lane] - std::exp2(x)) <= 1e-6 * std::exp2(x);
        ok_tanh &= std::fabs(math[32 + lane] - std::tanh(0.25 * x)) <= 1e-3;
    }
    report("ex2.approx.ftz.f32 matches exp2", ok_exp);
    report("ex2.approx.ftz.f32(-inf) = 0", math[64] == 0.f);
    report("tanh.approx.f32 matches tanh", ok_tanh);
    cudaFree(d_src);
    cudaFree(d_dst);
    cudaFree(d_packed);
    cudaFree(d_math);
}

// ---- red.global.add.v2.f32 (two atomicAdd before sm_90): 4 blocks x 32 lanes add
// (lane, -lane / 2) into float pair lane % 8, so pair j gets 16 adds (lanes j, j + 8, j + 16,
// j + 24 of each block); integer / half-integer sums, exact in any order.
__global__ void red_kernel(float* out) {
    const int lane = threadIdx.x;
    ptx::red_add_f32x2(out + 2 * (lane % 8), static_cast<float>(lane), -0.5f * lane);
}

void check_red() {
    float* d_out;
    CUDA_OK(cudaMalloc(&d_out, 16 * sizeof(float)));
    CUDA_OK(cudaMemset(d_out, 0, 16 * sizeof(float)));
    red_kernel<<<4, 32>>>(d_out);
    CUDA_OK(cudaGetLastError());
    float out[16];
    CUDA_OK(cudaMemcpy(out, d_out, sizeof(out), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int pair = 0; pair < 8; ++pair) {
        float sum = 0.f;  // lanes pair, pair + 8, pair + 16, pair + 24, in 4 blocks
        for (int lane = pair; lane < 32; lane += 8) sum += 4.f * lane;
        ok &= out[2 * pair] == sum && out[2 * pair + 1] == -0.5f * sum;
    }
    report("red.global.add.v2.f32 (red_add_f32x2) adds both elements", ok);
    cudaFree(d_out);
}

int main() {
    check_mma<__half>("mma.m16n8k16 f16");
    check_mma<__nv_bfloat16>("mma.m16n8k16 bf16");
    check_ldmatrix();
    check_swizzle<64, 128>("swizzle 64x128 (64-wide atoms)");
    check_swizzle<128, 96>("swizzle 128x96 (32-wide atoms)");
    check_swizzle<64, 32>("swizzle 64x32");
    check_swizzle<64, 256>("swizzle 64x256");
    check_misc();
    check_red();
    CUDA_OK(cudaDeviceSynchronize());
    std::printf("%d failure(s)\n", g_failures);
    return g_failures == 0 ? 0 : 1;
}
