// The kernels' score-bias template flags (HasAlibi, HasSoftcap) from a call's params, and the
// dispatch from those run-time flags to compile-time ones. Shared by the launchers (sm80 forward
// and backward, sm90 forward) and the CPU emulator harness. Plain C++; no CUDA calls.
#pragma once

#include <type_traits>

#include "kernels/params.h"

namespace flash_cuda {

struct ScoreBias {
    bool softcap, alibi;
};

// The forward's flags: softcap when softcap > 0; the ALiBi path with slopes, and also when the
// exponent factor of the plain path (scale * log2(e)) would not be positive -- the ALiBi path
// (natural-log scores, slope 0 without slopes) keeps the softmax well defined there.
inline ScoreBias fwd_score_bias(const FwdParams& params) {
    const bool softcap = params.softcap > 0.f;
    const bool alibi =
        params.alibi_slopes_ptr != nullptr || (!softcap && !(params.scale_softmax > 0.f));
    return {softcap, alibi};
}

// fn(std::bool_constant<HasAlibi>, std::bool_constant<HasSoftcap>) for the run-time flags.
template <typename Fn>
void with_bias_flags(bool has_softcap, bool has_alibi, Fn&& fn) {
    if (has_softcap && has_alibi) {
        fn(std::true_type{}, std::true_type{});
    } else if (has_softcap) {
        fn(std::false_type{}, std::true_type{});
    } else if (has_alibi) {
        fn(std::true_type{}, std::false_type{});
    } else {
        fn(std::false_type{}, std::false_type{});
    }
}

}  // namespace flash_cuda
