"""Fake (meta) implementations and autograd formulas of the torch.ops.flash_cuda ops.

The ops themselves are C++ (csrc/torch_bindings.cpp has the schemas). This file only tells
PyTorch what they return without running them (register_fake: shapes, dtypes, devices, so
torch.compile(fullgraph=True) and torch.export trace through every op, the KV-cache update
included) and how to differentiate fwd/varlen_fwd (register_autograd: the bwd ops; the public
functions call them through fwd() / varlen_fwd() below, the same formulas in an
autograd.Function, which costs less host time per call).

The fakes compute shapes only. Argument validation stays in csrc/checks.cpp; the one rule a
fake repeats is "fp16/bf16 only on CUDA", so that a compiled graph on fp32 CUDA inputs fails
with the same clear TypeError at trace time instead of deep inside the compiler.
"""

from __future__ import annotations

import torch

_ops = torch.ops.flash_cuda


def _round128(n):
    return (n + 127) // 128 * 128


def _check_cuda_dtype(t: torch.Tensor, name: str) -> None:
    """The C++ dtype rule for CUDA tensors (checks.cpp, check_attention_dtype)."""
    if t.device.type == "cuda" and t.dtype not in (torch.float16, torch.bfloat16):
        dtype = str(t.dtype).replace("torch.", "")
        raise TypeError(
            f"flash_cuda on CUDA supports only fp16 and bf16: {name} is {dtype}; "
            "cast it with .to(torch.bfloat16) or .half()"
        )


def _empty_rng_state(q: torch.Tensor) -> torch.Tensor:
    return q.new_empty((2,), dtype=torch.int64)


def _empty_out(q: torch.Tensor) -> torch.Tensor:
    """out has q's shape, dtype and device; contiguous (the ops allocate it fresh)."""
    return q.new_empty(q.shape)


# ---------------------------------------------------------------------------------------------
# Fakes: one per op, the shapes of csrc/torch_bindings.cpp.


@torch.library.register_fake("flash_cuda::fwd")
def _fwd_fake(q, k, v, alibi_slopes, dropout_p, softmax_scale, causal, window_size_left,
              window_size_right, softcap, return_softmax, rng_state=None, deterministic=False):
    _check_cuda_dtype(q, "q")
    b, sq, h, _ = q.shape
    sk = k.shape[1]
    lse = q.new_empty((b, h, sq), dtype=torch.float32)
    if return_softmax:
        s_dmask = q.new_empty((b, h, _round128(sq), _round128(sk)))
    else:
        s_dmask = q.new_empty((0,))
    return _empty_out(q), lse, s_dmask, _empty_rng_state(q)


@torch.library.register_fake("flash_cuda::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
                     max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                     window_size_left, window_size_right, softcap, return_softmax,
                     rng_state=None, deterministic=False):
    _check_cuda_dtype(q, "q")
    total_q, h, _ = q.shape
    b = cu_seqlens_q.shape[0] - 1
    lse = q.new_empty((h, total_q), dtype=torch.float32)
    if return_softmax:
        s_dmask = q.new_empty((b, h, _round128(max_seqlen_q), _round128(max_seqlen_k)))
    else:
        s_dmask = q.new_empty((0,))
    return _empty_out(q), lse, s_dmask, _empty_rng_state(q)


@torch.library.register_fake("flash_cuda::bwd")
def _bwd_fake(dout, q, k, v, out, softmax_lse, alibi_slopes, dropout_p, softmax_scale, causal,
              window_size_left, window_size_right, softcap, deterministic, rng_state):
    _check_cuda_dtype(q, "q")
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("flash_cuda::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                     max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                     window_size_left, window_size_right, softcap, deterministic, rng_state):
    _check_cuda_dtype(q, "q")
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("flash_cuda::fwd_kvcache")
def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin,
                      cache_batch_idx, cache_leftpad, block_table, alibi_slopes, softmax_scale,
                      causal, window_size_left, window_size_right, softcap, rotary_interleaved,
                      num_splits):
    _check_cuda_dtype(q, "q")
    b, sq, h, _ = q.shape
    return _empty_out(q), q.new_empty((b, h, sq), dtype=torch.float32)


@torch.library.register_fake("flash_cuda::combine_splits")
def _combine_splits_fake(out_partial, lse_partial, out_dtype):
    _, b, h, sq, d = out_partial.shape
    out = out_partial.new_empty((b, sq, h, d), dtype=out_dtype)
    return out, lse_partial.new_empty((b, h, sq))


# ---------------------------------------------------------------------------------------------
# Autograd: fwd -> bwd, varlen_fwd -> varlen_bwd. Only `out` is differentiable; the gradients
# arriving for softmax_lse, S_dmask and rng_state are ignored (as flash_attn does).


def _deterministic(requested: bool) -> bool:
    # flash_attn's `deterministic` argument (carried by the forward op for its backward), or
    # PyTorch's global switch (torch.use_deterministic_algorithms).
    return bool(requested) or torch.are_deterministic_algorithms_enabled()


def _lastdim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # The bwd ops take any strides but a unit last one; do not copy otherwise.
    return t if t.stride(-1) == 1 else t.contiguous()


def _save(ctx, tensors, alibi_slopes):
    # The gradients of softmax_lse, S_dmask and rng_state are ignored: not materialised as
    # zero tensors (three allocations and fills per backward call otherwise). dout is None when
    # only those outputs were used: then it is made zeros (_dout).
    ctx.set_materialize_grads(False)
    ctx.has_alibi = alibi_slopes is not None
    ctx.save_for_backward(*tensors, *((alibi_slopes,) if ctx.has_alibi else ()))


def _fwd_setup_context(ctx, inputs, output):
    (q, k, v, alibi_slopes, dropout_p, softmax_scale, causal, window_size_left,
     window_size_right, softcap, _return_softmax, _rng_state, deterministic) = inputs
    out, softmax_lse, _s_dmask, rng_state = output
    _save(ctx, (q, k, v, out, softmax_lse, rng_state), alibi_slopes)
    ctx.args = (dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap)
    ctx.deterministic = _deterministic(deterministic)


def _dout(dout, out):
    # The gradient arriving for out (None: out was not used, as a zero gradient), unit last stride.
    return torch.zeros_like(out) if dout is None else _lastdim_contiguous(dout)


def _fwd_backward(ctx, dout, _dlse, _ds_dmask, _drng_state):
    q, k, v, out, softmax_lse, rng_state, *alibi = ctx.saved_tensors
    alibi_slopes = alibi[0] if ctx.has_alibi else None
    dropout_p, softmax_scale, causal, left, right, softcap = ctx.args
    dq, dk, dv = _ops.bwd(_dout(dout, out), q, k, v, out, softmax_lse, alibi_slopes,
                          dropout_p, softmax_scale, causal, left, right, softcap,
                          ctx.deterministic, rng_state)
    # One gradient per input of fwd: q, k, v, then none for the 10 non-differentiable ones.
    return (dq, dk, dv) + (None,) * 10


def _varlen_fwd_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, max_seqlen_q,
     max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
     softcap, _return_softmax, _rng_state, deterministic) = inputs
    out, softmax_lse, _s_dmask, rng_state = output
    _save(ctx, (q, k, v, out, softmax_lse, rng_state, cu_seqlens_q, cu_seqlens_k), alibi_slopes)
    # The backward has no paged-KV or seqused_k form (neither has flash_attn's).
    ctx.unsupported = ("block_table" if block_table is not None
                       else "seqused_k" if seqused_k is not None else None)
    ctx.args = (max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left,
                window_size_right, softcap)
    ctx.deterministic = _deterministic(deterministic)


def _varlen_fwd_backward(ctx, dout, _dlse, _ds_dmask, _drng_state):
    if ctx.unsupported is not None:
        raise NotImplementedError(
            f"flash_cuda: the backward of varlen attention with {ctx.unsupported} is not "
            "supported"
        )
    q, k, v, out, softmax_lse, rng_state, cu_seqlens_q, cu_seqlens_k, *alibi = ctx.saved_tensors
    alibi_slopes = alibi[0] if ctx.has_alibi else None
    max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, left, right, softcap = ctx.args
    dq, dk, dv = _ops.varlen_bwd(_dout(dout, out), q, k, v, out, softmax_lse,
                                 cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q,
                                 max_seqlen_k, dropout_p, softmax_scale, causal, left, right,
                                 softcap, ctx.deterministic, rng_state)
    return (dq, dk, dv) + (None,) * 16


torch.library.register_autograd("flash_cuda::fwd", _fwd_backward,
                                setup_context=_fwd_setup_context)
torch.library.register_autograd("flash_cuda::varlen_fwd", _varlen_fwd_backward,
                                setup_context=_varlen_fwd_setup_context)


# The public functions' route to fwd / varlen_fwd when autograd records an eager call: the same
# formulas in an autograd.Function of their own. The op's registered autograd (above, for direct
# callers of torch.ops.flash_cuda) refills the op's defaulted arguments from its schema on every
# call, tens of microseconds of host time (bench/NOTES.md session 38).
def _recorded(q, k, v) -> bool:
    # Autograd records this eager call, outside an autocast region of the inputs' device (there
    # the op's autocast rule casts q, k, v first and its registered autograd sees the cast
    # tensors). Traced calls (torch.compile, export) keep the op: a compiled graph pays no
    # per-call host cost, and Dynamo refuses an autograd.Function given one tensor twice (k is v).
    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return False
    device = q.device.type
    return ((q.requires_grad or k.requires_grad or v.requires_grad)
            and not (device in ("cpu", "cuda") and torch.is_autocast_enabled(device)))


def _eager_route(name, op, setup_context, backward):
    """op(*args), differentiable in q, k, v (args[:3]): through the autograd.Function `name`
    (forward = op, then setup_context; backward) where _recorded, else the op itself."""
    def forward(ctx, *inputs):
        output = op(*inputs)
        setup_context(ctx, inputs, output)
        return output

    function = type(name, (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "backward": staticmethod(backward)})

    def call(*args):
        return function.apply(*args) if _recorded(*args[:3]) else op(*args)
    return call


fwd = _eager_route("_FwdFunction", _ops.fwd, _fwd_setup_context, _fwd_backward)
varlen_fwd = _eager_route("_VarlenFwdFunction", _ops.varlen_fwd, _varlen_fwd_setup_context,
                          _varlen_fwd_backward)
