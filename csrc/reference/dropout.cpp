// The dropout keep-mask of a tile, drawn on the host with the Philox of kernels/philox.cuh (the
// same definition the CUDA kernels use) and moved to the problem's device.
#include <vector>

#include "kernels/philox.cuh"
#include "reference/blockwise.h"

namespace flash_cuda::reference::detail {

Tensor dropout_keep(const Problem& p, const AttnOptions& opts, int64_t g0, int64_t g1, int64_t i0,
                    int64_t i1, int64_t j0, int64_t j1) {
    const int64_t gc = g1 - g0, npos = i1 - i0, ncol = j1 - j0, ratio = p.ratio;
    const uint32_t threshold = dropout_keep_threshold(static_cast<float>(1.0 - opts.dropout_p));
    Tensor keep = at::empty({gc, npos * ratio, ncol}, at::TensorOptions().dtype(at::kBool));
    bool* out = keep.data_ptr<bool>();
    for (int64_t g = 0; g < gc; ++g) {
        const int64_t batch = p.batch_offset + (g0 + g) / p.heads_k;
        const int64_t kv_head = (g0 + g) % p.heads_k;
        for (int64_t i = i0; i < i1; ++i) {
            for (int64_t r = 0; r < ratio; ++r) {
                const uint64_t bh = static_cast<uint64_t>(batch * p.heads + kv_head * ratio + r);
                Philox4 draws{};
                for (int64_t j = j0; j < j1; ++j) {
                    if (j == j0 || j % 8 == 0) {
                        draws = dropout_draws(opts.philox_seed, opts.philox_offset, bh,
                                              static_cast<uint32_t>(i),
                                              static_cast<uint32_t>(j / 8));
                    }
                    *out++ = dropout_lane(draws, static_cast<int>(j % 8)) < threshold;
                }
            }
        }
    }
    return keep.to(p.q.device());
}

}  // namespace flash_cuda::reference::detail
