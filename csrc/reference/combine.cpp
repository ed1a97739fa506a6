// Reference merge of split-KV partial results: lse = logsumexp over the splits,
// out = sum_i exp(lse_i - lse) * out_i. Computed in fp64 (the oracle of the combine kernel).
#include <limits>

#include "reference/reference.h"

namespace flash_cuda::reference {

std::tuple<Tensor, Tensor> combine_splits(const Tensor& out_partial, const Tensor& lse_partial,
                                          at::ScalarType out_dtype) {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    // A split that saw no key of a row carries lse -inf (or the +inf empty-row marker): weight 0.
    Tensor lse_i = lse_partial.to(at::kDouble);
    lse_i = lse_i.masked_fill(lse_i == kInf, -kInf);
    const Tensor m = std::get<0>(lse_i.max(0));  // (b, h, sq)
    const Tensor m_safe = m.masked_fill(m == -kInf, 0.0);
    const Tensor w = at::exp(lse_i - m_safe);  // (splits, b, h, sq)
    const Tensor w_sum = w.sum(0);
    const Tensor seen = w_sum > 0;
    const Tensor lse = at::where(seen, m_safe + at::log(w_sum), kInf).to(at::kFloat);
    // Zero weight contributes nothing even if that split's partial output is not finite.
    const Tensor w5 = w.unsqueeze(4);
    const Tensor acc = at::where(w5 > 0, w5 * out_partial.to(at::kDouble), 0.0).sum(0);
    const Tensor out = at::where(seen.unsqueeze(3), acc / w_sum.unsqueeze(3), 0.0);  // (b, h, sq, d)
    return {out.permute({0, 2, 1, 3}).to(out_dtype).contiguous(), lse.contiguous()};
}

}  // namespace flash_cuda::reference
