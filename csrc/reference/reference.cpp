// STUB (to be replaced by the blockwise reference implementation).
#include "reference/reference.h"

namespace flash_cuda::reference {

std::tuple<Tensor, Tensor, Tensor> fwd(const Tensor&, const Tensor&, const Tensor&,
                                       const AttnOptions&, bool) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "flash_cuda: reference fwd not implemented yet");
}
std::tuple<Tensor, Tensor, Tensor> bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const Tensor&, const AttnOptions&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "flash_cuda: reference bwd not implemented yet");
}
std::tuple<Tensor, Tensor, Tensor> varlen_fwd(const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, const Tensor&, const OptTensor&,
                                              const OptTensor&, int64_t, int64_t,
                                              const AttnOptions&, bool) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "flash_cuda: reference varlen_fwd not implemented yet");
}
std::tuple<Tensor, Tensor, Tensor> varlen_bwd(const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, const Tensor&, int64_t, int64_t,
                                              const AttnOptions&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "flash_cuda: reference varlen_bwd not implemented yet");
}
std::tuple<Tensor, Tensor> kvcache(const Tensor&, Tensor&, Tensor&, const OptTensor&,
                                   const OptTensor&, const OptTensor&, const OptTensor&,
                                   const OptTensor&, const OptTensor&, const OptTensor&,
                                   const OptTensor&, bool, const AttnOptions&) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "flash_cuda: reference kvcache not implemented yet");
}
std::tuple<Tensor, Tensor> combine_splits(const Tensor&, const Tensor&, at::ScalarType) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "flash_cuda: reference combine_splits not implemented yet");
}

}  // namespace flash_cuda::reference
