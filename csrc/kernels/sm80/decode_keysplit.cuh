// Key-split decode tile of the sm80 forward kernel (flash-decoding inside the CTA).
//
// The decode tile (traits.h FwdDecodeTraits: 64 query rows, 4 warps of 16 rows) has 1..16 real
// rows in a decode step (MHA: 1; GQA 32/8 packed: 4), so warp 0 does all the math of every key
// block while warps 1-3 idle. This tile has 16 query rows and 4 warps that split the keys
// instead: in every key block of kBlockN keys, warp w computes S = Q K^T for all 16 rows and its
// own kWarpKeys = kBlockN / 4 keys (rows [w kWarpKeys, (w + 1) kWarpKeys) of the K and V tiles),
// and keeps its own online-softmax state (row max m_w, row sum l_w) and O accumulator O_w over
// its key slices of the whole split. The K/V tiles, the cp.async pipeline and the barriers are
// those of the decode tile (same kBlockN and stages, so kernels/decode.h's split heuristic and
// CTA-per-SM count hold as they are). After the key loop the four states are merged exactly
// through shared memory (over the K/V buffers, free by then):
//   M = max_w m_w,  c_w = 2^((m_w - M) log2_scale)  (0 where warp w saw no key: m_w = -inf;
//   all c_w = 0 for a row no warp saw a key of),  l = sum_w c_w l_w,  O = sum_w c_w O_w,
// into warp 0's registers, which then runs the usual epilogue (fwd.cuh store_output: split-KV
// fp32 partials or the final output and lse) for the 16 rows; warps 1-3 only join its barrier.
// The warp with the max has c_w = 2^0 = 1 exactly, so a row with one visible key stays exact.
//
// Everything else of fwd.cuh's kernel is unchanged: masks, ALiBi and softcap take the warp's
// key offset in the column (mask.cuh col0), split-KV, paged K/V, GQA packing (params.gqa_pack),
// cache_seqlens / leftpad / cache_batch_idx. No dropout (the host keeps dropout calls on the
// 64-row decode tile). Selected by the host (fwd_launch.cuh) when FLASH_CUDA_DECODE_KEYSPLIT=1
// and a tile has at most 16 rows (kernels/decode.h uses_keysplit_tile).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/ptx.cuh"
#include "kernels/softmax.cuh"
#include "kernels/sm80/tile_io.cuh"
#include "kernels/sm80/traits.h"

namespace flash_cuda {
namespace sm80 {

template <int HeadDim, int BlockN, int Stages>
struct FwdKeySplitTraits {
    static constexpr int kHeadDim = HeadDim;
    static constexpr int kBlockM = 16;
    static constexpr int kBlockN = BlockN;
    static constexpr int kNWarps = 4;
    static constexpr int kNThreads = kNWarps * 32;
    static constexpr int kStages = Stages;
    static constexpr bool kSplitKV = true;
    static constexpr bool kPagedKV = true;
    static constexpr bool kPackGQA = true;
    static constexpr bool kSkipIdleWarps = false;  // every warp has keys to work on
    static constexpr bool kKeySplit = true;

    static constexpr int kWarpRows = kBlockM;             // every warp computes all 16 rows
    static constexpr int kWarpKeys = kBlockN / kNWarps;   // ... of its own keys of each block
    static constexpr int kMTiles = 1;
    static constexpr int kNTiles = kWarpKeys / 8;         // 8-column tiles of a warp's S
    static constexpr int kDTiles = kHeadDim / 8;

    using QTile = SwizzledTile<kBlockM, kHeadDim>;  // also the O tile of the epilogue
    using KVTile = SwizzledTile<kBlockN, kHeadDim>;
    using QCopy = TileCopy<QTile, kNThreads>;
    using KVCopy = TileCopy<KVTile, kNThreads>;

    // The geometry the warp GEMMs (warp_gemm.cuh) see: 16 rows x kWarpKeys keys of the full
    // K/V tile, whose base the kernel moves to the warp's first key row.
    struct WarpGemm {
        static constexpr int kHeadDim = HeadDim;
        static constexpr int kBlockN = kWarpKeys;
        static constexpr int kMTiles = 1;
        static constexpr int kNTiles = kWarpKeys / 8;
        static constexpr int kDTiles = HeadDim / 8;
        using QTile = FwdKeySplitTraits::QTile;
        using KVTile = FwdKeySplitTraits::KVTile;
    };
    // Byte offset of key row `key0` (a multiple of 16) in a K/V tile: inside an atom a shift by
    // 16 rows keeps every 128-byte line's swizzle phase (line % 8), so it is linear.
    __device__ __forceinline__ static uint32_t kv_row_byte_offset(int key0) {
        return static_cast<uint32_t>(key0) * KVTile::kAtomCols * 2u;
    }

    static constexpr int kSmemQBytes = QTile::kBytes;
    static constexpr int kSmemKVTileBytes = KVTile::kBytes;
    static constexpr int kSmemKOffset = kSmemQBytes;
    static constexpr int kSmemVOffset = kSmemKOffset + kStages * kSmemKVTileBytes;
    static constexpr int kSmemScalarsOffset = kSmemVOffset + kStages * kSmemKVTileBytes;
    static constexpr int kSmemScalarsBytes = 128;
    static constexpr int kSmemBytes = kSmemScalarsOffset + kSmemScalarsBytes;

    // Merge area (over the K/V buffers, from kSmemKOffset): per warp and lane the (m, l) of its
    // two rows, then warps 1..3's scaled O fragments (kDTiles float4 per lane).
    static constexpr int kMergeStatsBytes = kNWarps * 2 * 2 * 32 * 4;
    static constexpr int kMergeOBytes = (kNWarps - 1) * kDTiles * 32 * 16;
    static constexpr int kMergeBytes = kMergeStatsBytes + kMergeOBytes;

    static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256,
                  "16-row Q tile copies need 64-element atoms (head dim a multiple of 64)");
    static_assert(kWarpKeys % 16 == 0, "each warp's keys: whole k16 steps, 16-row swizzle steps");
    static_assert(kStages >= 1 && kStages <= 3, "one to three K/V buffers");
    static_assert(kMergeBytes <= 2 * kStages * kSmemKVTileBytes, "merge area over the K/V tiles");
    static_assert(kSmemBytes <= 227 * 1024, "must fit a Hopper CTA's shared memory");
};

// Head dims with a key-split tile compiled in (the others, and every call without
// FLASH_CUDA_DECODE_KEYSPLIT=1, take the 64-row decode tile). d192 would work as well (head dim
// a multiple of 64); left out to keep the build small.
template <int HeadDim>
constexpr bool kHasKeySplitTile = HeadDim == 64 || HeadDim == 128 || HeadDim == 256;

// Same key blocks and stages as the 64-row decode tile (FwdDecodeTraits).
template <int HeadDim>
struct FwdDecodeKeySplitConfig {
    static constexpr int kBlockM = 16;
    using Traits = FwdKeySplitTraits<HeadDim, (HeadDim <= 64 ? 128 : 64), decode_stages(HeadDim)>;
};

// End of the key loop of the key-split tile: merges the 4 warps' (m, l, O) into warp 0's
// `softmax` and `acc_o` (see the header). Called by all threads of the CTA; `merge_smem` is the
// start of the K/V buffers (every cp.async group has been waited for). Three barriers.
template <typename Traits>
__device__ __forceinline__ void keysplit_merge_warps(
    float (&acc_o)[1][Traits::kDTiles][4], OnlineSoftmax<1>& softmax, float log2_scale,
    unsigned char* merge_smem, int warp, int lane) {
    constexpr int kDTiles = Traits::kDTiles;
    float* stat_max = reinterpret_cast<float*>(merge_smem);               // [warp][half][lane]
    float* stat_sum = stat_max + Traits::kNWarps * 2 * 32;                // [warp][half][lane]
    float4* o_part = reinterpret_cast<float4*>(merge_smem + Traits::kMergeStatsBytes);
    // [warp - 1][dt][lane]

    __syncthreads();  // every warp is done with the last block's K and V tiles
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        stat_max[(warp * 2 + half) * 32 + lane] = softmax.row_max[0][half];
    }
    __syncthreads();
    float scale[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float m = stat_max[half * 32 + lane];
#pragma unroll
        for (int w = 1; w < Traits::kNWarps; ++w) m = fmaxf(m, stat_max[(w * 2 + half) * 32 + lane]);
        const float own = softmax.row_max[0][half];
        // 0 where this warp saw no key of the row (then its l and O are 0 too); 1 for the max.
        scale[half] = own == -INFINITY ? 0.f : ptx::exp2_approx((own - m) * log2_scale);
        softmax.row_max[0][half] = m;
        softmax.row_sum[0][half] *= scale[half];
        stat_sum[(warp * 2 + half) * 32 + lane] = softmax.row_sum[0][half];
    }
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
        acc_o[0][dt][0] *= scale[0];
        acc_o[0][dt][1] *= scale[0];
        acc_o[0][dt][2] *= scale[1];
        acc_o[0][dt][3] *= scale[1];
        if (warp != 0) {
            o_part[((warp - 1) * kDTiles + dt) * 32 + lane] =
                make_float4(acc_o[0][dt][0], acc_o[0][dt][1], acc_o[0][dt][2], acc_o[0][dt][3]);
        }
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float l = softmax.row_sum[0][half];
#pragma unroll
            for (int w = 1; w < Traits::kNWarps; ++w) l += stat_sum[(w * 2 + half) * 32 + lane];
            softmax.row_sum[0][half] = l;
        }
#pragma unroll
        for (int w = 1; w < Traits::kNWarps; ++w) {
#pragma unroll
            for (int dt = 0; dt < kDTiles; ++dt) {
                const float4 part = o_part[((w - 1) * kDTiles + dt) * 32 + lane];
                acc_o[0][dt][0] += part.x;
                acc_o[0][dt][1] += part.y;
                acc_o[0][dt][2] += part.z;
                acc_o[0][dt][3] += part.w;
            }
        }
    }
}

}  // namespace sm80
}  // namespace flash_cuda
