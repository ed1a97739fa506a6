"""The public attention functions: flash_attn 2.8's names, argument order, defaults and returns.

Each function only normalises its arguments (packed tensors -> views, default softmax scale,
window_size -> two ints, cache_seqlens int -> tensor) and calls a torch.ops.flash_cuda op.
Argument checks live in the C++ ops (csrc/checks.cpp: TypeError/ValueError naming the
argument), their autograd in csrc/autograd.cpp, the fake tensors of torch.compile in
flash_cuda/_ops.py.
Layouts: (batch, seqlen, nheads, headdim); varlen (total, nheads, headdim) with int32
cu_seqlens (batch + 1). Semantics: DESIGN.md section 4 (bottom-right aligned causal/window).
"""

from __future__ import annotations

import torch

from . import _ops  # noqa: F401  (the fake tensors, registered on import)

_flash = torch.ops.flash_cuda
# The overloads themselves: a call skips the packet's overload resolution (host time per call).
_fwd = _flash.fwd.default
_varlen_fwd = _flash.varlen_fwd.default
_fwd_kvcache = _flash.fwd_kvcache.default


def _window(window_size) -> tuple[int, int]:
    """(left, right) as ints; accepts tuples, lists, 2-element tensors, anything int() takes."""
    if len(window_size) != 2:
        raise ValueError(
            f"flash_cuda: window_size must have 2 elements (left, right), got {window_size!r}"
        )
    return int(window_size[0]), int(window_size[1])


def _scale(softmax_scale, q: torch.Tensor) -> float:
    """Default 1 / sqrt(headdim) of the true (unpadded) head dim."""
    return q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale


def _result(out, softmax_lse, s_dmask, return_attn_probs):
    return (out, softmax_lse, s_dmask) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """q (b, sq, h, d), k/v (b, sk, hk, d), h % hk == 0 -> out (b, sq, h, d).

    return_attn_probs=True -> (out, softmax_lse fp32 (b, h, sq), S_dmask); S_dmask is
    (b, h, round128(sq), round128(sk)) when dropout_p > 0, else empty (as flash_attn).
    deterministic=True makes the backward bitwise reproducible (so does
    torch.use_deterministic_algorithms(True)).
    """
    left, right = _window(window_size)
    out, softmax_lse, s_dmask, _ = _fwd(
        q, k, v, alibi_slopes, dropout_p, _scale(softmax_scale, q), causal, left, right,
        softcap, return_attn_probs and dropout_p > 0, None, deterministic)
    return _result(out, softmax_lse, s_dmask, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """qkv (b, s, 3, h, d) -> out (b, s, h, d); see flash_attn_func."""
    q, k, v = qkv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """q (b, sq, h, d), kv (b, sk, 2, hk, d) -> out (b, sq, h, d); see flash_attn_func."""
    k, v = kv.unbind(dim=2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """q (total_q, h, d), k/v (total_k, hk, d), cu_seqlens_* int32 (b + 1), max_seqlen_* ints.

    With block_table int32 (b, max_blocks_per_seq), k/v are a paged cache
    (num_blocks, page_block_size, hk, d) (forward only). -> out (total_q, h, d);
    return_attn_probs=True -> (out, softmax_lse fp32 (h, total_q), S_dmask).
    """
    left, right = _window(window_size)
    out, softmax_lse, s_dmask, _ = _varlen_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, None, block_table, alibi_slopes, max_seqlen_q,
        max_seqlen_k, dropout_p, _scale(softmax_scale, q), causal, left, right, softcap,
        return_attn_probs and dropout_p > 0, None, deterministic)
    return _result(out, softmax_lse, s_dmask, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv (total, 3, h, d) -> out (total, h, d); see flash_attn_varlen_func."""
    q, k, v = qkv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """q (total_q, h, d), kv (total_k, 2, hk, d) -> out (total_q, h, d)."""
    k, v = kv.unbind(dim=1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """Attention over a KV cache, appending new keys/values in place first. No backward.

    q (b, sq, h, d); k_cache/v_cache (b_cache, s_cache, hk, d), or paged
    (num_blocks, page_block_size, hk, d) with block_table int32 (b, max_blocks_per_seq).
    k/v (b, s_new, hk, d), optional, are written into the caches at cache_seqlens (int or
    int32 (b,)), after rotary_cos/sin (s_ro, rotary_dim / 2) are applied to them (and to q).
    -> out (b, sq, h, d), or (out, softmax_lse fp32 (b, h, sq)) with return_softmax_lse.
    """
    left, right = _window(window_size)
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32,
                                   device=q.device)
    out, softmax_lse = _fwd_kvcache(
        q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin, cache_batch_idx,
        cache_leftpad, block_table, alibi_slopes, _scale(softmax_scale, q), causal, left, right,
        softcap, rotary_interleaved, num_splits)
    return (out, softmax_lse) if return_softmax_lse else out


def scaled_dot_product_attention(query, key, value, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's layout and semantics.

    query (b, h, sq, d), key/value (b, hk, sk, d) -> (b, h, sq, d). `is_causal` is torch's
    top-left aligned mask (query i sees keys j <= i), not flash_attn's bottom-right one;
    hk != h needs enable_gqa=True (query head i uses key head i // (h // hk)).
    """
    if query.dim() == 4 and key.dim() == 4 and query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(
            "flash_cuda: query has "
            f"{query.shape[1]} heads and key {key.shape[1]}; pass enable_gqa=True for "
            "grouped-query attention"
        )
    # (b, h, s, d) -> (b, s, h, d) views; only a strided last dim needs a copy.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    sq, sk = q.shape[1], k.shape[1]
    if not is_causal or sq == sk:
        out = flash_attn_func(q, k, v, softmax_scale=scale, causal=is_causal)
    elif sq < sk:
        # Top-left: no query reaches past key sq - 1, so the square causal mask on the first
        # sq keys is the same mask.
        out = flash_attn_func(q, k[:, :sq], v[:, :sq], softmax_scale=scale, causal=True)
    else:
        # Rows i < sk see keys 0..i (square causal); the rows below see every key.
        top = flash_attn_func(q[:, :sk], k, v, softmax_scale=scale, causal=True)
        bottom = flash_attn_func(q[:, sk:], k, v, softmax_scale=scale, causal=False)
        out = torch.cat([top, bottom], dim=1)
    return out.transpose(1, 2)
