// Alternative tile configurations of the sm80 forward kernel, for tuning on a GPU. Compiled only
// in tuning builds (FLASH_CUDA_FWD_TUNING=1 at build time defines FLASH_CUDA_FWD_TUNING) and
// selected at run time with FLASH_CUDA_FWD_TILE=<variant> (0, the default, is FwdConfig).
// A variant that wins becomes the FwdConfig of its head dim (traits.h), with the numbers that
// chose it in bench/NOTES.md. Shared memory above the A100's 163 KB is allowed here: the launch
// reports it on a GPU that cannot reserve it.
#pragma once

#include "kernels/sm80/traits.h"

namespace flash_cuda {
namespace sm80 {

constexpr int kNumTileVariants = 4;  // 0 = FwdConfig, 1..3 below where defined

template <int HeadDim, int Variant>
struct FwdTuneConfig {
    static constexpr bool kExists = false;  // falls back to FwdConfig
};

//                                   FwdTraits<HeadDim, BlockM, BlockN, NWarps, Stages>
template <> struct FwdTuneConfig<32, 1> { static constexpr bool kExists = true; using Traits = FwdTraits<32, 128, 64, 4, 2>; };
template <> struct FwdTuneConfig<32, 2> { static constexpr bool kExists = true; using Traits = FwdTraits<32, 64, 128, 4, 2>; };
template <> struct FwdTuneConfig<32, 3> { static constexpr bool kExists = true; using Traits = FwdTraits<32, 64, 64, 4, 2>; };
template <> struct FwdTuneConfig<64, 1> { static constexpr bool kExists = true; using Traits = FwdTraits<64, 64, 64, 4, 2>; };
template <> struct FwdTuneConfig<64, 2> { static constexpr bool kExists = true; using Traits = FwdTraits<64, 128, 128, 4, 2>; };
template <> struct FwdTuneConfig<64, 3> { static constexpr bool kExists = true; using Traits = FwdTraits<64, 128, 128, 8, 2>; };
template <> struct FwdTuneConfig<96, 1> { static constexpr bool kExists = true; using Traits = FwdTraits<96, 64, 64, 4, 2>; };
template <> struct FwdTuneConfig<96, 2> { static constexpr bool kExists = true; using Traits = FwdTraits<96, 128, 128, 8, 2>; };
template <> struct FwdTuneConfig<96, 3> { static constexpr bool kExists = true; using Traits = FwdTraits<96, 128, 32, 4, 2>; };
template <> struct FwdTuneConfig<128, 1> { static constexpr bool kExists = true; using Traits = FwdTraits<128, 64, 64, 4, 2>; };
template <> struct FwdTuneConfig<128, 2> { static constexpr bool kExists = true; using Traits = FwdTraits<128, 128, 128, 8, 2>; };
template <> struct FwdTuneConfig<128, 3> { static constexpr bool kExists = true; using Traits = FwdTraits<128, 128, 32, 4, 2>; };
template <> struct FwdTuneConfig<160, 1> { static constexpr bool kExists = true; using Traits = FwdTraits<160, 128, 64, 8, 2>; };
template <> struct FwdTuneConfig<160, 2> { static constexpr bool kExists = true; using Traits = FwdTraits<160, 64, 32, 4, 2>; };
template <> struct FwdTuneConfig<160, 3> { static constexpr bool kExists = true; using Traits = FwdTraits<160, 64, 64, 4, 1>; };
template <> struct FwdTuneConfig<192, 1> { static constexpr bool kExists = true; using Traits = FwdTraits<192, 64, 64, 4, 2>; };
template <> struct FwdTuneConfig<192, 2> { static constexpr bool kExists = true; using Traits = FwdTraits<192, 128, 64, 8, 2>; };
template <> struct FwdTuneConfig<192, 3> { static constexpr bool kExists = true; using Traits = FwdTraits<192, 128, 64, 8, 1>; };
template <> struct FwdTuneConfig<224, 1> { static constexpr bool kExists = true; using Traits = FwdTraits<224, 128, 64, 8, 2>; };
template <> struct FwdTuneConfig<224, 2> { static constexpr bool kExists = true; using Traits = FwdTraits<224, 64, 64, 4, 2>; };
template <> struct FwdTuneConfig<224, 3> { static constexpr bool kExists = true; using Traits = FwdTraits<224, 64, 32, 4, 2>; };
template <> struct FwdTuneConfig<256, 1> { static constexpr bool kExists = true; using Traits = FwdTraits<256, 64, 64, 4, 2>; };
template <> struct FwdTuneConfig<256, 2> { static constexpr bool kExists = true; using Traits = FwdTraits<256, 128, 64, 8, 1>; };
template <> struct FwdTuneConfig<256, 3> { static constexpr bool kExists = true; using Traits = FwdTraits<256, 64, 32, 4, 2>; };

// Decode tile variants (FLASH_CUDA_FWD_TILE=4..6; calls that take the decode tile), to A/B its
// K/V stages and idle-warp skipping in one build: 4 = 2 stages with idle warps skipping the
// math, 5 = decode_stages() without skipping, 6 = 2 stages without skipping (the decode tile
// before branch decodeperf). Variant 0 is FwdDecodeConfig (decode_stages(), skipping).
constexpr int kFirstDecodeVariant = 4;
constexpr int kNumDecodeVariants = 3;
template <int HeadDim, int Stages, bool SkipIdleWarps>
struct FwdDecodeTuneTraits : FwdTraits<HeadDim, 64, (HeadDim <= 64 ? 128 : 64), 4, Stages> {
    static constexpr bool kSplitKV = true;
    static constexpr bool kPagedKV = true;
    static constexpr bool kPackGQA = true;
    static constexpr bool kSkipIdleWarps = SkipIdleWarps;
};
template <int HeadDim, int Variant>
struct FwdDecodeTuneConfig;
template <int HeadDim>
struct FwdDecodeTuneConfig<HeadDim, 4> { using Traits = FwdDecodeTuneTraits<HeadDim, 2, true>; };
template <int HeadDim>
struct FwdDecodeTuneConfig<HeadDim, 5> {
    using Traits = FwdDecodeTuneTraits<HeadDim, decode_stages(HeadDim), false>;
};
template <int HeadDim>
struct FwdDecodeTuneConfig<HeadDim, 6> { using Traits = FwdDecodeTuneTraits<HeadDim, 2, false>; };

}  // namespace sm80
}  // namespace flash_cuda
