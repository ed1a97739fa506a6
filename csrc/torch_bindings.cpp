// Op schemas (TORCH_LIBRARY), their CPU and CUDA implementations (TORCH_LIBRARY_IMPL) and the
// PyInit__C stub that lets `import flash_cuda._C` load this library (abi3: no pybind11 module).
//
// The schemas are designed for every feature of DESIGN.md section 4 so that kernels can be filled
// in without changing them. Layouts: (batch, seqlen, heads, head_dim); varlen (total, heads,
// head_dim); lse fp32 (batch, heads, seqlen_q) or (heads, total_q) for varlen; rng_state int64 (2)
// = (philox seed, philox offset) on the device of q.
#ifndef FLASH_CUDA_NO_PYTHON  // CMakeLists.txt builds a plain C++ library without the stub
#include <Python.h>
#endif
#include <torch/library.h>

#include "flash_api.h"

#ifndef FLASH_CUDA_NO_PYTHON
extern "C" {
// The module object holds only `built_head_dims` (a string, e.g. "64,128": the kernel head dims
// compiled in; tests skip kernel checks of the others): the ops register themselves with the
// dispatcher when the shared library loads. Limited API, so one build serves every
// CPython >= 3.10.
PyObject* PyInit__C(void) {
    static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
    PyObject* module = PyModule_Create(&module_def);
    if (module != nullptr &&
        PyModule_AddStringConstant(module, "built_head_dims",
                                   flash_cuda::built_head_dims().c_str()) != 0) {
        Py_DECREF(module);
        return nullptr;
    }
    return module;
}
}
#endif  // FLASH_CUDA_NO_PYTHON

TORCH_LIBRARY(flash_cuda, m) {
    m.def(
        "fwd(Tensor q, Tensor k, Tensor v, Tensor? alibi_slopes, float dropout_p, "
        "float softmax_scale, bool causal, int window_size_left, int window_size_right, "
        "float softcap, bool return_softmax, Tensor? rng_state=None, bool deterministic=False) "
        "-> (Tensor out, Tensor softmax_lse, Tensor S_dmask, Tensor rng_state)");
    m.def(
        "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "Tensor? seqused_k, Tensor? block_table, Tensor? alibi_slopes, int max_seqlen_q, "
        "int max_seqlen_k, float dropout_p, float softmax_scale, bool causal, "
        "int window_size_left, int window_size_right, float softcap, bool return_softmax, "
        "Tensor? rng_state=None, bool deterministic=False) "
        "-> (Tensor out, Tensor softmax_lse, Tensor S_dmask, Tensor rng_state)");
    m.def(
        "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor? alibi_slopes, float dropout_p, float softmax_scale, bool causal, "
        "int window_size_left, int window_size_right, float softcap, bool deterministic, "
        "Tensor rng_state) -> (Tensor dq, Tensor dk, Tensor dv)");
    m.def(
        "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? alibi_slopes, int max_seqlen_q, "
        "int max_seqlen_k, float dropout_p, float softmax_scale, bool causal, "
        "int window_size_left, int window_size_right, float softcap, bool deterministic, "
        "Tensor rng_state) -> (Tensor dq, Tensor dk, Tensor dv)");
    m.def(
        "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, "
        "Tensor? cache_seqlens, Tensor? rotary_cos, Tensor? rotary_sin, Tensor? cache_batch_idx, "
        "Tensor? cache_leftpad, Tensor? block_table, Tensor? alibi_slopes, float softmax_scale, "
        "bool causal, int window_size_left, int window_size_right, float softcap, "
        "bool rotary_interleaved, int num_splits) -> (Tensor out, Tensor softmax_lse)");
    // Merge split-KV partial results: out_partial fp32 (splits, b, h, sq, d), lse_partial fp32
    // (splits, b, h, sq) -> out (b, sq, h, d) in out_dtype, lse fp32 (b, h, sq).
    m.def(
        "combine_splits(Tensor out_partial, Tensor lse_partial, ScalarType out_dtype) "
        "-> (Tensor out, Tensor softmax_lse)");
}

TORCH_LIBRARY_IMPL(flash_cuda, CPU, m) {
    m.impl("fwd", &flash_cuda::mha_fwd_cpu);
    m.impl("varlen_fwd", &flash_cuda::mha_varlen_fwd_cpu);
    m.impl("bwd", &flash_cuda::mha_bwd_cpu);
    m.impl("varlen_bwd", &flash_cuda::mha_varlen_bwd_cpu);
    m.impl("fwd_kvcache", &flash_cuda::mha_fwd_kvcache_cpu);
    m.impl("combine_splits", &flash_cuda::combine_splits_cpu);
}

TORCH_LIBRARY_IMPL(flash_cuda, CUDA, m) {
    m.impl("fwd", &flash_cuda::mha_fwd_cuda);
    m.impl("varlen_fwd", &flash_cuda::mha_varlen_fwd_cuda);
    m.impl("bwd", &flash_cuda::mha_bwd_cuda);
    m.impl("varlen_bwd", &flash_cuda::mha_varlen_bwd_cuda);
    m.impl("fwd_kvcache", &flash_cuda::mha_fwd_kvcache_cuda);
    m.impl("combine_splits", &flash_cuda::combine_splits_cuda);
}
