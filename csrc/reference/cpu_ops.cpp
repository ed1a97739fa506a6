// STUB (to be replaced): the CPU implementations of the ops: checks, then the reference.
#include "flash_api.h"

namespace flash_cuda {

FwdResult mha_fwd_cpu(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, double,
                      double, bool, int64_t, int64_t, double, bool, const OptTensor&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "not yet");
}
FwdResult mha_varlen_fwd_cpu(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                             int64_t, int64_t, double, double, bool, int64_t, int64_t, double,
                             bool, const OptTensor&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "not yet");
}
BwdResult mha_bwd_cpu(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&, const OptTensor&, double, double, bool, int64_t, int64_t,
                      double, bool, const Tensor&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "not yet");
}
BwdResult mha_varlen_bwd_cpu(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const OptTensor&, int64_t, int64_t, double, double, bool, int64_t,
                             int64_t, double, bool, const Tensor&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "not yet");
}
std::tuple<Tensor, Tensor> mha_fwd_kvcache_cpu(const Tensor&, Tensor&, Tensor&, const OptTensor&,
                                               const OptTensor&, const OptTensor&,
                                               const OptTensor&, const OptTensor&,
                                               const OptTensor&, const OptTensor&,
                                               const OptTensor&, const OptTensor&, double, bool,
                                               int64_t, int64_t, double, bool, int64_t) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "not yet");
}
std::tuple<Tensor, Tensor> combine_splits_cpu(const Tensor&, const Tensor&, at::ScalarType) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "not yet");
}

}  // namespace flash_cuda
