// Autograd of the attention ops: fwd -> bwd and varlen_fwd -> varlen_bwd, as C++ kernels at the
// Autograd dispatch key (every caller -- the public Python functions, torch.ops, C++ code,
// torch.compile's traced backward -- records the same graph node).
//
// Only `out` is differentiable; softmax_lse, S_dmask and rng_state are marked non-differentiable
// and the gradients arriving for them are ignored (as flash_attn does). The backward saves
// q, k, v, out, softmax_lse and rng_state (plus alibi_slopes and, varlen, cu_seqlens_q/k);
// `deterministic` is the argument or PyTorch's global switch (torch.use_deterministic_algorithms)
// as it stands at the forward call.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "flash_api.h"

namespace flash_cuda {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The ops, called below the autograd keys (the autocast rules ran before these kernels; the
// device kernel or the fake runs after them). Their C++ signatures are flash_api.h's.
template <typename Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

const auto& fwd_op() {
    static const auto op = op_handle<decltype(mha_fwd_cpu)>("flash_cuda::fwd");
    return op;
}
const auto& varlen_fwd_op() {
    static const auto op = op_handle<decltype(mha_varlen_fwd_cpu)>("flash_cuda::varlen_fwd");
    return op;
}
const auto& bwd_op() {
    static const auto op = op_handle<decltype(mha_bwd_cpu)>("flash_cuda::bwd");
    return op;
}
const auto& varlen_bwd_op() {
    static const auto op = op_handle<decltype(mha_varlen_bwd_cpu)>("flash_cuda::varlen_bwd");
    return op;
}

bool records(const Tensor& q, const Tensor& k, const Tensor& v) {
    return at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() ||
                                          v.requires_grad());
}

bool deterministic_or_global(bool requested) {
    return requested || at::globalContext().deterministicAlgorithms();
}

// The gradient arriving for out: zeros when out was not used (undefined: the Functions do not
// materialise zero gradients), else with a unit last stride (what the bwd ops take).
Tensor dout_of(const Tensor& dout, const Tensor& out) {
    if (!dout.defined()) return at::zeros_like(out);
    return dout.stride(-1) == 1 ? dout : dout.contiguous();
}

OptTensor optional_of(const Tensor& t) {
    return t.defined() ? OptTensor(t) : std::nullopt;
}

// What both Functions' forwards do after the op. Saved, in order: q, k, v, out, softmax_lse,
// rng_state, alibi_slopes (undefined: none), then `extra` (varlen: cu_seqlens_q, cu_seqlens_k).
// The scalar arguments the backward op takes go to saved_data.
void finish_forward(AutogradContext* ctx, const FwdResult& result, const Tensor& q,
                    const Tensor& k, const Tensor& v, const OptTensor& alibi_slopes,
                    variable_list extra, double dropout_p, double softmax_scale, bool causal,
                    int64_t window_size_left, int64_t window_size_right, double softcap,
                    bool deterministic) {
    const auto& [out, lse, s_dmask, rng_state] = result;
    ctx->set_materialize_grads(false);
    variable_list saved{q, k, v, out, lse, rng_state, alibi_slopes.value_or(Tensor())};
    saved.insert(saved.end(), extra.begin(), extra.end());
    ctx->save_for_backward(saved);
    ctx->mark_non_differentiable({lse, s_dmask, rng_state});
    auto& data = ctx->saved_data;
    data["dropout_p"] = dropout_p;
    data["softmax_scale"] = softmax_scale;
    data["causal"] = causal;
    data["window_size_left"] = window_size_left;
    data["window_size_right"] = window_size_right;
    data["softcap"] = softcap;
    data["deterministic"] = deterministic_or_global(deterministic);
}

variable_list outputs_of(const FwdResult& result) {
    return {std::get<0>(result), std::get<1>(result), std::get<2>(result), std::get<3>(result)};
}

FwdResult result_of(const variable_list& outputs) {
    return {outputs[0], outputs[1], outputs[2], outputs[3]};
}

// (dq, dk, dv), then an undefined gradient for each of the forward's other arguments.
variable_list gradients_of(const BwdResult& grads, size_t num_forward_args) {
    variable_list result{std::get<0>(grads), std::get<1>(grads), std::get<2>(grads)};
    result.resize(num_forward_args);
    return result;
}

struct FwdFunction : public torch::autograd::Function<FwdFunction> {
    static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const OptTensor& alibi_slopes,
                                 double dropout_p, double softmax_scale, bool causal,
                                 int64_t window_size_left, int64_t window_size_right,
                                 double softcap, bool return_softmax, const OptTensor& rng_state,
                                 bool deterministic) {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        FwdResult result = fwd_op().call(q, k, v, alibi_slopes, dropout_p, softmax_scale,
                                         causal, window_size_left, window_size_right, softcap,
                                         return_softmax, rng_state, deterministic);
        finish_forward(ctx, result, q, k, v, alibi_slopes, {}, dropout_p, softmax_scale, causal,
                       window_size_left, window_size_right, softcap, deterministic);
        return outputs_of(result);
    }

    // grads: d(out), then the ignored d(softmax_lse), d(S_dmask), d(rng_state).
    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        const variable_list s = ctx->get_saved_variables();
        const auto& data = ctx->saved_data;
        BwdResult dqkv = bwd_op().call(
            dout_of(grads[0], s[3]), s[0], s[1], s[2], s[3], s[4], optional_of(s[6]),
            data.at("dropout_p").toDouble(), data.at("softmax_scale").toDouble(),
            data.at("causal").toBool(), data.at("window_size_left").toInt(),
            data.at("window_size_right").toInt(), data.at("softcap").toDouble(),
            data.at("deterministic").toBool(), s[5]);
        return gradients_of(dqkv, 13);
    }
};

struct VarlenFwdFunction : public torch::autograd::Function<VarlenFwdFunction> {
    static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& cu_seqlens_q,
                                 const Tensor& cu_seqlens_k, const OptTensor& seqused_k,
                                 const OptTensor& block_table, const OptTensor& alibi_slopes,
                                 int64_t max_seqlen_q, int64_t max_seqlen_k, double dropout_p,
                                 double softmax_scale, bool causal, int64_t window_size_left,
                                 int64_t window_size_right, double softcap, bool return_softmax,
                                 const OptTensor& rng_state, bool deterministic) {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        FwdResult result = varlen_fwd_op().call(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
            max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left,
            window_size_right, softcap, return_softmax, rng_state, deterministic);
        finish_forward(ctx, result, q, k, v, alibi_slopes, {cu_seqlens_q, cu_seqlens_k},
                       dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                       softcap, deterministic);
        ctx->saved_data["max_seqlen_q"] = max_seqlen_q;
        ctx->saved_data["max_seqlen_k"] = max_seqlen_k;
        // The backward has no paged-KV or seqused_k form (neither has flash_attn's).
        ctx->saved_data["unsupported"] = std::string(block_table.has_value() ? "block_table"
                                                     : seqused_k.has_value() ? "seqused_k"
                                                                             : "");
        return outputs_of(result);
    }

    static variable_list backward(AutogradContext* ctx, variable_list grads) {
        const auto& data = ctx->saved_data;
        const std::string unsupported = data.at("unsupported").toStringRef();
        TORCH_CHECK_NOT_IMPLEMENTED(unsupported.empty(),
                                    "flash_cuda: the backward of varlen attention with ",
                                    unsupported, " is not supported");
        const variable_list s = ctx->get_saved_variables();
        BwdResult dqkv = varlen_bwd_op().call(
            dout_of(grads[0], s[3]), s[0], s[1], s[2], s[3], s[4], s[7], s[8],
            optional_of(s[6]), data.at("max_seqlen_q").toInt(), data.at("max_seqlen_k").toInt(),
            data.at("dropout_p").toDouble(), data.at("softmax_scale").toDouble(),
            data.at("causal").toBool(), data.at("window_size_left").toInt(),
            data.at("window_size_right").toInt(), data.at("softcap").toDouble(),
            data.at("deterministic").toBool(), s[5]);
        return gradients_of(dqkv, 19);
    }
};

// The Autograd kernels: the Function where autograd records the call, else the op below the
// autograd keys (no graph node, no saved tensors).
FwdResult fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                       const OptTensor& alibi_slopes, double dropout_p, double softmax_scale,
                       bool causal, int64_t window_size_left, int64_t window_size_right,
                       double softcap, bool return_softmax, const OptTensor& rng_state,
                       bool deterministic) {
    if (!records(q, k, v)) {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        return fwd_op().call(q, k, v, alibi_slopes, dropout_p, softmax_scale, causal,
                             window_size_left, window_size_right, softcap, return_softmax,
                             rng_state, deterministic);
    }
    return result_of(FwdFunction::apply(q, k, v, alibi_slopes, dropout_p, softmax_scale, causal,
                                        window_size_left, window_size_right, softcap,
                                        return_softmax, rng_state, deterministic));
}

FwdResult varlen_fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                              const OptTensor& seqused_k, const OptTensor& block_table,
                              const OptTensor& alibi_slopes, int64_t max_seqlen_q,
                              int64_t max_seqlen_k, double dropout_p, double softmax_scale,
                              bool causal, int64_t window_size_left, int64_t window_size_right,
                              double softcap, bool return_softmax, const OptTensor& rng_state,
                              bool deterministic) {
    if (!records(q, k, v)) {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        return varlen_fwd_op().call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                                    alibi_slopes, max_seqlen_q, max_seqlen_k, dropout_p,
                                    softmax_scale, causal, window_size_left, window_size_right,
                                    softcap, return_softmax, rng_state, deterministic);
    }
    return result_of(VarlenFwdFunction::apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
        softcap, return_softmax, rng_state, deterministic));
}

}  // namespace
}  // namespace flash_cuda

TORCH_LIBRARY_IMPL(flash_cuda, Autograd, m) {
    m.impl("fwd", &flash_cuda::fwd_autograd);
    m.impl("varlen_fwd", &flash_cuda::varlen_fwd_autograd);
}
