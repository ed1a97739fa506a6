// Alternative tile configurations of the sm80 backward kernel v2 (bwd_v2.cuh), for tuning on a
// GPU. Compiled only in tuning builds (FLASH_CUDA_BWD_TUNING=1 at build time defines
// FLASH_CUDA_BWD_TUNING) and selected at run time with FLASH_CUDA_BWD_TILE=<variant> (read once
// per process; 0 or unset = BwdV2Config; 9 = bwd.cuh, see kBwdTileV1). A variant applies to the
// non-dropout calls of its head dim, like BwdV2Config; a variant that wins becomes the
// BwdV2Config of its head dim, with the numbers that chose it in bench/NOTES_kernel_bwd.md
// ("Backward v2 at d256 ... and tile variants").
// kBlockN must divide 128 (the host rounds the dk / dv workspaces to 128 rows); the host's
// deterministic split count (at most ceil(seqlen_k / 64)) does not depend on kBlockN.
#pragma once

#include "kernels/sm80/bwd_v2.cuh"

namespace flash_cuda {
namespace sm80 {

constexpr int kNumBwdTileVariants = 7;  // 0 = BwdV2Config, 1..6 below where defined
// FLASH_CUDA_BWD_TILE=9: the non-dropout calls of every head dim run bwd.cuh's
// mha_bwd_sm80_kernel (BwdConfig), as before v2 (A/B of v2 against it in one build).
constexpr int kBwdTileV1 = 9;

template <int HeadDim, int Variant>
struct BwdV2TuneConfig {
    static constexpr bool kExists = false;  // falls back to BwdV2Config
};

// BwdV2Traits<HeadDim, BlockM, BlockN, NWarps, SWarpsM, GWarpsN, QWarpsM, QStages, QChunks>
// d64 (default since run 25: variant 4 below, 128 x 128 in two phase-1 passes; variants 1-3 were
// tried against the earlier 64 x 128 default BwdV2Traits<64>, grids 2x4 / 4x2 / 2x4, 2 stages)
template <> struct BwdV2TuneConfig<64, 1> { static constexpr bool kExists = true; using Traits = BwdV2Traits<64, 64, 128, 8, 2, 4, 2, 1, 1>; };
template <> struct BwdV2TuneConfig<64, 2> { static constexpr bool kExists = true; using Traits = BwdV2Traits<64, 64, 64, 8, 2, 4, 2, 2, 1>; };
template <> struct BwdV2TuneConfig<64, 3> { static constexpr bool kExists = true; using Traits = BwdV2Traits<64, 128, 64, 8, 4, 4, 4, 2, 1>; };
// d64 128 x 128, 8 warps (FA2's d64 tile shape), phase 1 in two 64-query passes on 2 x 4
// warps (BwdV2SplitS: S / dP 32 fp32 per warp), phase 2 4 x 2 (32 keys x 32 columns, 8
// k-steps), phase 3 4 x 2 (32 queries x 32 columns). The double-buffered one won run 25 (+4-8%
// fwd+bwd) and is now BwdV2Config<64>; variant 4 keeps the old 64 x 128 default for A/B; 5: the
// 128 x 128 tile single-buffered (bench/NOTES_kernel_bwd.md, "d64 128 x 128 tile variants").
template <> struct BwdV2TuneConfig<64, 4> { static constexpr bool kExists = true; using Traits = BwdV2Traits<64>; };
template <> struct BwdV2TuneConfig<64, 5> { static constexpr bool kExists = true; using Traits = BwdV2SplitS<BwdV2Traits<64, 128, 128, 8, 2, 4, 4, 1, 1>, 2>; };
// 6: 128 x 128 on 16 warps (two CTAs' worth of warps for latency hiding, 128-register cap):
// phase 1 2 x 8 per pass (32 queries x 16 keys), phase 2 4 x 4 (32 keys x 16 columns), phase
// 3 4 x 4 (32 queries x 16 columns); double-buffered.
template <> struct BwdV2TuneConfig<64, 6> { static constexpr bool kExists = true; using Traits = BwdV2SplitS<BwdV2Traits<64, 128, 128, 16, 2, 4, 4, 2, 1>, 2>; };
// d128 (default 64 x 128, grids 2x4 / 4x2 / 2x4, 2 stages)
template <> struct BwdV2TuneConfig<128, 1> { static constexpr bool kExists = true; using Traits = BwdV2Traits<128, 64, 64, 8, 2, 4, 2, 2, 1>; };
template <> struct BwdV2TuneConfig<128, 2> { static constexpr bool kExists = true; using Traits = BwdV2Traits<128, 128, 64, 8, 4, 4, 4, 2, 2>; };
template <> struct BwdV2TuneConfig<128, 3> { static constexpr bool kExists = true; using Traits = BwdV2Traits<128, 64, 128, 8, 2, 4, 2, 2, 2>; };
// d256 (default 64 x 64, grids 2x4 / 2x4 / 2x4, 2 stages, dQ in 2 passes)
template <> struct BwdV2TuneConfig<256, 1> { static constexpr bool kExists = true; using Traits = BwdV2Traits<256, 64, 64, 8, 2, 2, 2, 1, 2>; };
template <> struct BwdV2TuneConfig<256, 2> { static constexpr bool kExists = true; using Traits = BwdV2Traits<256, 64, 64, 8, 2, 4, 2, 2, 2>; };
template <> struct BwdV2TuneConfig<256, 3> { static constexpr bool kExists = true; using Traits = BwdV2Traits<256, 32, 64, 8, 2, 2, 2, 2, 1>; };

}  // namespace sm80
}  // namespace flash_cuda
