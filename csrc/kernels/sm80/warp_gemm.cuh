// The two warp-level products of the sm80 forward, on swizzled shared-memory tiles
// (tile_io.cuh) with ldmatrix + mma.m16n8k16. Each warp computes its own kWarpRows query rows.
//
//   S (kWarpRows x kBlockN, fp32) += Q[warp rows] (kWarpRows x HeadDim) * K^T   (K: kBlockN x HeadDim)
//   O (kWarpRows x HeadDim, fp32) += P (kWarpRows x kBlockN, from S registers) * V   (V: kBlockN x HeadDim)
//   l (kWarpRows x 8, fp32)       += P * ones (kBlockN x 8): the softmax row sums of the fp16 P
//                                    (bf16 inputs: FADDs of the fp32 P, softmax.cuh)
//
// ldmatrix.x4 lane addresses (lane l gives the 16-byte row of matrix l / 8; see ptx.cuh):
//   Q (A operand, 16 rows x 16 k):  row l % 16,                col 8 (l / 16)
//        -> a[0] rows 0-7 k 0-7, a[1] rows 8-15 k 0-7, a[2] rows 0-7 k 8-15, a[3] rows 8-15 k 8-15
//   K (B operand of two n-tiles, 16 keys x 16 k; K rows are B columns, "col" layout as stored):
//        key l % 8 + 8 (l / 16),   col 8 ((l / 8) % 2)
//        -> b[0], b[1]: keys 0-7 (k 0-7, k 8-15); b[2], b[3]: keys 8-15
//   V (B operand of two d-tiles, 16 keys x 16 dims, transposed on load):
//        key l % 8 + 8 ((l / 8) % 2), col 8 (l / 16)
//        -> b[0], b[1]: dims 0-7 (keys 0-7, keys 8-15); b[2], b[3]: dims 8-15
// P to A operand without data movement: the S accumulator tiles 2kk and 2kk+1 (keys
// 16kk .. 16kk+15) hold, per thread, exactly the A fragment of the kk-th k16 step of P V:
//   a[0] = S[2kk][0..1], a[1] = S[2kk][2..3], a[2] = S[2kk+1][0..1], a[3] = S[2kk+1][2..3].
#pragma once

#include <cstdint>

#include "kernels/ptx.cuh"
#include "kernels/sm80/tile_io.cuh"

namespace flash_cuda {
namespace sm80 {

// acc[kMTiles][kNTiles][4] += Q[warp_row0 .., :] * K_tile^T.
// q_smem, k_smem: shared addresses of the Q tile and of one K tile.
template <typename Element, typename Traits>
__device__ __forceinline__ void warp_gemm_qk(float (&acc)[Traits::kMTiles][Traits::kNTiles][4],
                                             uint32_t q_smem, uint32_t k_smem, int warp_row0,
                                             int lane) {
    using QTile = typename Traits::QTile;
    using KTile = typename Traits::KVTile;
    // Per-thread bases, recomputed on every call (opaque lane): cheaper than keeping them in
    // registers through the main loop.
    lane = ptx::opaque(lane);
    const uint32_t q_base = q_smem + QTile::byte_offset(warp_row0 + lane % 16, 8 * (lane / 16));
    const uint32_t k_base = k_smem + KTile::byte_offset(lane % 8 + 8 * (lane / 16), 8 * ((lane / 8) % 2));
    static_for_each<Traits::kHeadDim / 16>([&](auto ks) {
        uint32_t a[Traits::kMTiles][4];
        static_for_each<Traits::kMTiles>([&](auto mt) {
            ptx::ldmatrix_x4(a[mt], QTile::template stepped<16 * mt, 16 * ks>(q_base));
        });
        static_for_each<Traits::kNTiles / 2>([&](auto np) {
            uint32_t b[4];
            ptx::ldmatrix_x4(b, KTile::template stepped<16 * np, 16 * ks>(k_base));
#pragma unroll
            for (int mt = 0; mt < Traits::kMTiles; ++mt) {
                ptx::mma_16816<Element>(acc[mt][2 * np], a[mt], b[0], b[1]);
                ptx::mma_16816<Element>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        });
    });
}

// One pair of P, p[mt][nt][2 half .. 2 half + 1] of the S accumulator layout, packed into its
// word of the A-operand fragments of P V (p_frag[mt][kk]: rows 16 mt .. +15, keys 16 kk .. +15;
// see the header).
template <typename Element, int kMTiles, int kKSteps>
__device__ __forceinline__ void pack_p_pair(uint32_t (&p_frag)[kMTiles][kKSteps][4], int mt,
                                            int nt, int half, float p0, float p1) {
    p_frag[mt][nt / 2][2 * (nt % 2) + half] = ptx::pack_float2<Element>(p0, p1);
}

// P (fp32, in the S accumulator layout) -> A-operand fragments of P V, Element pairs.
template <typename Element, typename Traits>
__device__ __forceinline__ void convert_p_to_a_fragments(
    uint32_t (&p_frag)[Traits::kMTiles][Traits::kBlockN / 16][4],
    const float (&p)[Traits::kMTiles][Traits::kNTiles][4]) {
#pragma unroll
    for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < Traits::kNTiles; ++nt) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                pack_p_pair<Element>(p_frag, mt, nt, half, p[mt][nt][2 * half],
                                     p[mt][nt][2 * half + 1]);
            }
        }
    }
}

// A pair of fp16 ones: the B fragment of a matrix of ones (no shared memory needed).
constexpr uint32_t kPackedHalfOnes = 0x3C003C00u;

// row_sum[kMTiles][2] (rows g and g + 8 of each 16-row slice) += P * ones, fp16 inputs (bf16:
// softmax.cuh kRowSumsOfFp32P): the row sums of P as rounded to 16 bits for P V, from the tensor
// cores. Every column of P * ones is the row sum, so one short-lived m16n8 fragment per slice
// gives whole rows (no quad reduction).
template <typename Traits>
__device__ __forceinline__ void warp_gemm_p_rowsum(
    float (&row_sum)[Traits::kMTiles][2],
    const uint32_t (&p_frag)[Traits::kMTiles][Traits::kBlockN / 16][4]) {
#pragma unroll
    for (int mt = 0; mt < Traits::kMTiles; ++mt) {
        float block_sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kk = 0; kk < Traits::kBlockN / 16; ++kk) {
            ptx::mma_16816<__half>(block_sum, p_frag[mt][kk], kPackedHalfOnes, kPackedHalfOnes);
        }
        row_sum[mt][0] += block_sum[0];
        row_sum[mt][1] += block_sum[2];
    }
}

// acc[kMTiles][kDTiles][4] += P * V_tile, with P given as A fragments (convert_p_to_a_fragments).
// v_smem: shared address of one V tile.
template <typename Element, typename Traits>
__device__ __forceinline__ void warp_gemm_pv(
    float (&acc)[Traits::kMTiles][Traits::kDTiles][4],
    const uint32_t (&p_frag)[Traits::kMTiles][Traits::kBlockN / 16][4], uint32_t v_smem, int lane) {
    using VTile = typename Traits::KVTile;
    lane = ptx::opaque(lane);
    const uint32_t v_base = v_smem + VTile::byte_offset(lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16));
    static_for_each<Traits::kBlockN / 16>([&](auto kk) {
        static_for_each<Traits::kHeadDim / 16>([&](auto dp) {
            uint32_t b[4];
            ptx::ldmatrix_x4_trans(b, VTile::template stepped<16 * kk, 16 * dp>(v_base));
#pragma unroll
            for (int mt = 0; mt < Traits::kMTiles; ++mt) {
                ptx::mma_16816<Element>(acc[mt][2 * dp], p_frag[mt][kk], b[0], b[1]);
                ptx::mma_16816<Element>(acc[mt][2 * dp + 1], p_frag[mt][kk], b[2], b[3]);
            }
        });
    });
}

}  // namespace sm80
}  // namespace flash_cuda
