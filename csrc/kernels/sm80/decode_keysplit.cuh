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
// fp32 partials or the final output and lse) for the 16 rows; warps 1-3 only join its barrier
// and its 16-byte stores.
// The warp with the max has c_w = 2^0 = 1 exactly, so a row with one visible key stays exact.
// RowSlices = 2 (32 rows: MQA 32/1 decode, 17..32 packed rows): warps 0-1 own rows 0-15 and
// warps 2-3 rows 16-31, each pair splitting every key block in two (kKeySlices = 2); warps 0
// and 2 merge their pair and store their rows.
//
// Everything else of fwd.cuh's kernel is unchanged: masks, ALiBi and softcap take the warp's
// key offset in the column (mask.cuh col0), split-KV, paged K/V, GQA packing (params.gqa_pack),
// cache_seqlens / leftpad / cache_batch_idx. No dropout (the host keeps dropout calls on the
// 64-row decode tile). Selected by the host (fwd_launch.cuh) when a tile has at most 32 rows,
// unless FLASH_CUDA_DECODE_KEYSPLIT=0 (kernels/decode.h uses_keysplit_tile).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/decode.h"
#include "kernels/ptx.cuh"
#include "kernels/softmax.cuh"
#include "kernels/sm80/kv_ring.cuh"
#include "kernels/sm80/tile_io.cuh"
#include "kernels/sm80/traits.h"

namespace flash_cuda {
namespace sm80 {

// PagedKV = false: the kernel for calls without a block table (no paged copy path compiled in).
// ProducerWarps = 4: the warp-specialised tile of sm_90 (kv_ring.cuh): 4 more warps copy K / V
// into a ring of Stages slots while the 4 compute warps only compute; 0: the compute warps copy.
// HeadGroups: the key columns are the (key, KV head) pairs of params.head_group KV heads
// (kernels/decode.h plan_packing; contiguous caches, 16 rows). OverlapKV: one-stage paged tiles
// issue each block's V copy with its K copy (sm80/fwd.cuh; kernels/decode.h plan_kv_overlap).
template <int HeadDim, int BlockN, int Stages, int RowSlices = 1, bool PagedKV = true,
          int ProducerWarps = 0, bool HeadGroups = false, bool OverlapKV = false>
struct FwdKeySplitTraits {
    static constexpr int kHeadDim = HeadDim;
    static constexpr int kRowSlices = RowSlices;  // 16-row slices: 1, or 2 (MQA-like 17..32 rows)
    static constexpr int kBlockM = 16 * RowSlices;
    static constexpr int kBlockN = BlockN;
    static constexpr int kNWarps = 4;  // the compute warps
    static constexpr int kKeySlices = kNWarps / RowSlices;  // warps sharing a row slice
    static constexpr int kNThreads = kNWarps * 32;  // compute threads (the copies' thread count)
    static constexpr int kProducerWarps = ProducerWarps;
    static constexpr int kProducerThreads = ProducerWarps * 32;
    static constexpr int kLaunchThreads = kNThreads + kProducerThreads;
    static constexpr int kStages = Stages;
    static constexpr bool kSplitKV = true;
    static constexpr bool kPagedKV = PagedKV;
    static constexpr bool kPackGQA = true;
    static constexpr bool kSkipIdleWarps = false;  // every warp has keys to work on
    static constexpr bool kKeySplit = true;
    static constexpr bool kHeadGroups = HeadGroups;
    static constexpr bool kOverlapKV = OverlapKV;
    static_assert(!OverlapKV || (Stages == 1 && PagedKV && ProducerWarps == 0 && !HeadGroups),
                  "the overlapped copies are for one-stage paged tiles without producer warps");
    // Every warp multiplies the same 16 Q rows with each of its key slices: at d <= 128 the
    // warp keeps Q's A fragments in registers (kHeadDim / 4 registers) from the first block on,
    // instead of re-reading the Q tile with ldmatrix every block.
    static constexpr bool kQInRegisters = HeadDim <= 128;

    static constexpr int kWarpRows = 16;                   // warp w: rows 16 (w / kKeySlices)..
    static constexpr int kWarpKeys = kBlockN / kKeySlices; // ... of its own keys of each block
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
    // The ring's mbarriers (kv_ring.cuh), with producer warps: 3 per slot.
    static constexpr int kSmemBarriersOffset = kSmemScalarsOffset + kSmemScalarsBytes;
    static constexpr int kSmemBarriersBytes = ProducerWarps > 0 ? 3 * kStages * 8 : 0;
    static constexpr int kSmemBytes = kSmemBarriersOffset + kSmemBarriersBytes;

    // Merge area (over the K/V buffers, from kSmemKOffset): per warp and lane the (m, l) of its
    // two rows, then warps 1..3's scaled O fragments (kDTiles float4 per lane).
    static constexpr int kMergeStatsBytes = kNWarps * 2 * 2 * 32 * 4;
    static constexpr int kMergeOBytes = kNWarps * kDTiles * 32 * 16;  // (leaders' slots unused)
    static constexpr int kMergeBytes = kMergeStatsBytes + kMergeOBytes;

    // At a head dim of 32-column atoms (d96) the 16-row Q tile is copied by 64 of the 128
    // threads (tile_io.cuh TileCopy::kActiveThreads).
    static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dim: whole 32-column atoms");
    static_assert(kWarpKeys % 16 == 0, "each warp's keys: whole k16 steps, 16-row swizzle steps");
    static_assert(RowSlices >= 1 && kNWarps % RowSlices == 0 && kKeySlices >= 2,
                  "row slices: a divisor of the warps, at least two warps per slice");
    static_assert(kStages >= 1 && kStages <= (ProducerWarps > 0 ? 8 : 3),
                  "one to three K/V buffers (a ring of up to 8 with producer warps)");
    static_assert(ProducerWarps == 0 || ProducerWarps == kNWarps,
                  "each producer thread runs one compute thread's share of the K/V copies");
    static_assert(kMergeBytes <= 2 * kStages * kSmemKVTileBytes, "merge area over the K/V tiles");
    static_assert(kSmemBytes <= 227 * 1024, "must fit a Hopper CTA's shared memory");
    // Head groups: a copying thread's rows (kRowsPerStep apart) keep their head of the group,
    // and a block holds whole keys.
    static_assert(!HeadGroups || (!PagedKV && ProducerWarps == 0 && RowSlices == 1 &&
                                  KVCopy::kRowsPerStep % decode::kMaxHeadGroup == 0 &&
                                  kBlockN % decode::kMaxHeadGroup == 0),
                  "head groups: contiguous 16-row tiles of whole keys");
};

// Head dims with a key-split tile compiled in (the others, and every call with
// FLASH_CUDA_DECODE_KEYSPLIT=0, take the 64-row decode tile): kernels/decode.h, whose split count
// needs to know which tile runs.
template <int HeadDim>
constexpr bool kHasKeySplitTile = decode::has_keysplit_tile(HeadDim);

// Same key blocks and stages as the 64-row decode tile (FwdDecodeTraits). Traits: 16 rows, the 4
// warps split each key block 4 ways; Traits32: 32 rows (MQA 32/1 decode, 17..32 packed rows),
// 2 row slices x 2 key slices. PagedKV = false: the same tiles without the paged copy path, which
// the launcher runs for the plain variant (no ALiBi, no softcap) of calls without a block table
// (kernels/decode.h contiguous_keysplit). Every K/V copy site of the paged-capable kernel has its
// paged twin next to it, which scatters the hot code of a short decode CTA: at d128 the 16-row
// kernel has 4992 SASS instructions with the paged path and 3768 without (bench/NOTES.md run 78:
// 38% of its stall samples wait for instruction fetch; cuDNN's decode kernel has 1792).
template <int HeadDim, bool PagedKV = true>
struct FwdDecodeKeySplitConfig {
    using Traits =
        FwdKeySplitTraits<HeadDim, (HeadDim <= 64 ? 128 : 64), decode_stages(HeadDim), 1, PagedKV>;
    using Traits32 =
        FwdKeySplitTraits<HeadDim, (HeadDim <= 64 ? 128 : 64), decode_stages(HeadDim), 2, PagedKV>;
    // The kvcache op's calls at the head dims of kHasWideKeySplitTile where kernels/decode.h
    // plan_key_blocks takes them: 128-key blocks through one K/V stage, one barrier pair and one
    // online-softmax step per 128 keys instead of per 64. TraitsWide: 16 rows, each warp 32 keys
    // of a block (68 KB of shared memory; 214 registers at d128, so two CTAs per SM).
    // TraitsWide32: 32 rows (MQA, GQA with several query tokens), 2 row slices x 2 key slices
    // of 64 keys (72 KB; 217-225 registers).
    using TraitsWide = FwdKeySplitTraits<HeadDim, 128, 1, 1, PagedKV>;
    using TraitsWide32 = FwdKeySplitTraits<HeadDim, 128, 1, 2, PagedKV>;
    // Paged calls of TraitsWide that kernels/decode.h plan_kv_overlap gives params.kv_overlap:
    // each block's V copy issued with its K copy (sm80/fwd.cuh).
    using TraitsWideOverlap = FwdKeySplitTraits<HeadDim, 128, 1, 1, true, 0, false, true>;
    // sm_90, the kvcache op (kernels/decode.h plan_decode_tile), at the head dims of
    // kHasRingKeySplitTile: the warp-specialised twins (kv_ring.cuh), one CTA per SM, whose
    // shared memory holds a ring of 6 64-key slots (196 / 200 KB at d128). A ring of 3 128-key
    // slots ran at 1.004x this one on the contiguous one-token grid (bench/NOTES.md run 116)
    // and was dropped.
    using Ring = FwdKeySplitTraits<HeadDim, 64, 6, 1, PagedKV, 4>;
    using Ring32 = FwdKeySplitTraits<HeadDim, 64, 6, 2, PagedKV, 4>;
    // The head-group twins of Traits and TraitsWide (kernels/decode.h plan_packing; the
    // plain variant of contiguous one-token calls, at the head dims of kHasHeadGroupTile).
    using Groups = FwdKeySplitTraits<HeadDim, (HeadDim <= 64 ? 128 : 64), decode_stages(HeadDim),
                                     1, false, 0, true>;
    using GroupsWide = FwdKeySplitTraits<HeadDim, 128, 1, 1, false, 0, true>;
};
// Head dims with TraitsWide / TraitsWide32 compiled in (kernels/decode.h, whose plan_key_blocks
// chooses them). At d128 TraitsWide streams 1.1% faster than Traits on the decode steps that
// take it (geometric mean, bench/NOTES.md run 67).
template <int HeadDim>
constexpr bool kHasWideKeySplitTile = decode::has_wide_keysplit_tile(HeadDim);
template <int HeadDim>
constexpr bool kHasRingKeySplitTile = decode::has_ring_keysplit_tile(HeadDim);
template <int HeadDim>
constexpr bool kHasHeadGroupTile = decode::has_head_group_tile(HeadDim);

// The traits of key-split decode tile `tile` (kernels/decode.h decode_tile) at HeadDim, for the
// launcher (sm80/fwd_launch.cuh) and the CPU emulator (tests/emulation/fwd_emulated.cpp):
// fn(name, std::type_identity<T>, std::type_identity<P>), T the paged-capable traits and P their
// twin without the paged path. Returns false without calling fn for the 64-row decode tile and
// for tiles HeadDim has no kernel of.
template <int HeadDim, typename Fn>
bool with_keysplit_traits(decode::DecodeTile tile, Fn&& fn) {
    if constexpr (kHasKeySplitTile<HeadDim>) {
        using Config = FwdDecodeKeySplitConfig<HeadDim>;
        using Contig = FwdDecodeKeySplitConfig<HeadDim, false>;
        using std::type_identity;
        switch (tile) {
            case decode::DecodeTile::kKeySplit16:
                fn("16 rows", type_identity<typename Config::Traits>{},
                   type_identity<typename Contig::Traits>{});
                return true;
            case decode::DecodeTile::kKeySplit16WideOverlap:
                if constexpr (kHasWideKeySplitTile<HeadDim>) {
                    fn("16 rows, 128-key blocks, K and V copies overlapped",
                       type_identity<typename Config::TraitsWideOverlap>{},
                       type_identity<typename Contig::TraitsWide>{});
                    return true;
                }
                break;
            case decode::DecodeTile::kKeySplit32:
                fn("32 rows", type_identity<typename Config::Traits32>{},
                   type_identity<typename Contig::Traits32>{});
                return true;
            case decode::DecodeTile::kKeySplit16Wide:
                if constexpr (kHasWideKeySplitTile<HeadDim>) {
                    fn("16 rows, 128-key blocks", type_identity<typename Config::TraitsWide>{},
                       type_identity<typename Contig::TraitsWide>{});
                    return true;
                }
                break;
            case decode::DecodeTile::kKeySplit32Wide:
                if constexpr (kHasWideKeySplitTile<HeadDim>) {
                    fn("32 rows, 128-key blocks", type_identity<typename Config::TraitsWide32>{},
                       type_identity<typename Contig::TraitsWide32>{});
                    return true;
                }
                break;
            case decode::DecodeTile::kRing16:
                if constexpr (kHasRingKeySplitTile<HeadDim>) {
                    fn("16 rows, ring", type_identity<typename Config::Ring>{},
                       type_identity<typename Contig::Ring>{});
                    return true;
                }
                break;
            case decode::DecodeTile::kRing32:
                if constexpr (kHasRingKeySplitTile<HeadDim>) {
                    fn("32 rows, ring", type_identity<typename Config::Ring32>{},
                       type_identity<typename Contig::Ring32>{});
                    return true;
                }
                break;
            case decode::DecodeTile::kDecode64:
                break;
        }
    }
    return false;
}

// The head-group twin of key-split tile `tile` (kKeySplit16 or kKeySplit16Wide) at HeadDim, for
// calls with params.head_group > 1: fn(name, std::type_identity<T>). Returns false without
// calling fn where HeadDim has none.
template <int HeadDim, typename Fn>
bool with_head_group_traits(decode::DecodeTile tile, Fn&& fn) {
    if constexpr (kHasHeadGroupTile<HeadDim>) {
        using Config = FwdDecodeKeySplitConfig<HeadDim, false>;
        if (tile == decode::DecodeTile::kKeySplit16) {
            fn("16 rows, head groups", std::type_identity<typename Config::Groups>{});
            return true;
        }
        if (tile == decode::DecodeTile::kKeySplit16Wide) {
            fn("16 rows, 128-key blocks, head groups",
               std::type_identity<typename Config::GroupsWide>{});
            return true;
        }
    }
    return false;
}

// The 16-row Q tile's A fragments (ldmatrix layout of warp_gemm.cuh), held by each warp of the
// key-split tile through the key loop (Traits::kQInRegisters); an empty struct for other tiles.
template <typename Traits, bool = Traits::kKeySplit && Traits::kQInRegisters>
struct KeySplitQFragments {};
template <typename Traits>
struct KeySplitQFragments<Traits, true> {
    using QTile = typename Traits::QTile;
    static constexpr int kKSteps = Traits::kHeadDim / 16;
    uint32_t a[kKSteps][4];

    __device__ __forceinline__ void load(uint32_t q_smem, int warp_row0, int lane) {
        const uint32_t q_base = q_smem + QTile::byte_offset(warp_row0 + lane % 16, 8 * (lane / 16));
        static_for_each<kKSteps>([&](auto ks) {
            ptx::ldmatrix_x4(a[ks], QTile::template stepped<0, 16 * ks>(q_base));
        });
    }
};

// acc[1][kNTiles][4] += Q * K_slice^T with Q from registers (warp_gemm_qk otherwise);
// k_smem: the warp's first key row of one K tile.
template <typename Element, typename Traits>
__device__ __forceinline__ void keysplit_gemm_qk(float (&acc)[1][Traits::kNTiles][4],
                                                 const KeySplitQFragments<Traits>& q,
                                                 uint32_t k_smem, int lane) {
    using KTile = typename Traits::KVTile;
    lane = ptx::opaque(lane);
    const uint32_t k_base =
        k_smem + KTile::byte_offset(lane % 8 + 8 * (lane / 16), 8 * ((lane / 8) % 2));
    static_for_each<Traits::kHeadDim / 16>([&](auto ks) {
        static_for_each<Traits::kNTiles / 2>([&](auto np) {
            uint32_t b[4];
            ptx::ldmatrix_x4(b, KTile::template stepped<16 * np, 16 * ks>(k_base));
            ptx::mma_16816<Element>(acc[0][2 * np], q.a[ks], b[0], b[1]);
            ptx::mma_16816<Element>(acc[0][2 * np + 1], q.a[ks], b[2], b[3]);
        });
    });
}

// End of the key loop of the key-split tile: merges the (m, l, O) of the kKeySlices warps of
// each 16-row slice into the slice's first warp (warp 0 when there is one slice): its `softmax`
// and `acc_o` (see the header). Called by all compute threads of the CTA; `merge_smem` is the
// start of the K/V buffers (every copy into them has landed: the cp.async groups waited for, or
// the ring's last full barriers). Two barriers: the other warps publish their raw (m, l, O), then
// each slice's first warp computes the scales of all and sums.
template <typename Traits>
__device__ __forceinline__ void keysplit_merge_warps(
    float (&acc_o)[1][Traits::kDTiles][4], OnlineSoftmax<1>& softmax, float log2_scale,
    unsigned char* merge_smem, int warp, int lane) {
    constexpr int kDTiles = Traits::kDTiles;
    constexpr int kSlices = Traits::kKeySlices;
    float* stat_max = reinterpret_cast<float*>(merge_smem);    // [warp][half][lane]
    float* stat_sum = stat_max + Traits::kNWarps * 2 * 32;      // [warp][half][lane]
    float4* o_part = reinterpret_cast<float4*>(merge_smem + Traits::kMergeStatsBytes);
    auto part = [&](int w, int dt) -> float4& { return o_part[(w * kDTiles + dt) * 32 + lane]; };
    const int key_slice = warp % kSlices;  // 0: the slice's first warp, which merges

    compute_warps_sync<Traits>();  // every warp is done with the last block's K and V tiles
    if (key_slice != 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            stat_max[(warp * 2 + half) * 32 + lane] = softmax.row_max[0][half];
            stat_sum[(warp * 2 + half) * 32 + lane] = softmax.row_sum[0][half];
        }
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
            part(warp, dt) =
                make_float4(acc_o[0][dt][0], acc_o[0][dt][1], acc_o[0][dt][2], acc_o[0][dt][3]);
        }
    }
    compute_warps_sync<Traits>();
    if (key_slice != 0) return;
    // Scale of key slice j's state: 2^((m_j - M) log2_scale); 0 where slice j saw no key of the
    // row (its l and O are 0 then), and for every slice when none did (M = -inf: l stays 0, so
    // the epilogue writes out = 0, lse = +inf); exactly 1 for the slice holding the max.
    auto scale_of = [&](float m_j, float m) {
        return m_j == -INFINITY ? 0.f : ptx::exp2_approx((m_j - m) * log2_scale);
    };
    float scale[kSlices][2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float m_j[kSlices];
        m_j[0] = softmax.row_max[0][half];
        float m = m_j[0];
#pragma unroll
        for (int j = 1; j < kSlices; ++j) {
            m_j[j] = stat_max[((warp + j) * 2 + half) * 32 + lane];
            m = fmaxf(m, m_j[j]);
        }
        float l = 0.f;
#pragma unroll
        for (int j = 0; j < kSlices; ++j) {
            scale[j][half] = scale_of(m_j[j], m);
            const float l_j =
                j == 0 ? softmax.row_sum[0][half] : stat_sum[((warp + j) * 2 + half) * 32 + lane];
            l = fmaf(l_j, scale[j][half], l);
        }
        softmax.row_max[0][half] = m;
        softmax.row_sum[0][half] = l;
    }
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
        float o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = acc_o[0][dt][e] * scale[0][e / 2];
#pragma unroll
        for (int j = 1; j < kSlices; ++j) {
            const float4 p = part(warp + j, dt);
            o[0] = fmaf(p.x, scale[j][0], o[0]);
            o[1] = fmaf(p.y, scale[j][0], o[1]);
            o[2] = fmaf(p.z, scale[j][1], o[2]);
            o[3] = fmaf(p.w, scale[j][1], o[3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[0][dt][e] = o[e];
    }
}

}  // namespace sm80
}  // namespace flash_cuda
