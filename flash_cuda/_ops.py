"""Fake (meta) implementations of the torch.ops.flash_cuda ops.

The ops themselves are C++ (csrc/torch_bindings.cpp has the schemas, csrc/autograd.cpp the
autograd of fwd / varlen_fwd). This file only tells PyTorch what they return without running
them (register_fake: shapes, dtypes, devices, so torch.compile(fullgraph=True) and torch.export
trace through every op, the KV-cache update and the backward included).

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
