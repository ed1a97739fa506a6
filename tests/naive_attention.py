"""Naive attention: materialises the full score matrix, in whatever dtype it is given.

The oracle of the tests (fp64/fp32 inputs give the reference `ref`; inputs in fp16/bf16 give
`out_pt`, the same math in the input dtype, for the DESIGN.md section 9 tolerance rule).
Semantics are flash_attn 2.x's (DESIGN.md section 4). Window arguments are taken as already
normalised (see `normalize_window`), exactly as the ops' C++ does before any kernel runs.
"""

from __future__ import annotations

import math

import torch


def normalize_window(causal: bool, window: tuple[int, int], seqlen_k: int):
    """flash_attn's host-side rule: sides >= seqlen_k are unbounded; causal => right = 0."""
    left, right = int(window[0]), int(window[1])
    if left >= seqlen_k:
        left = -1
    if right >= seqlen_k:
        right = -1
    if causal:
        right = 0
    return left, right


def visible_mask(seqlen_q: int, seqlen_k: int, left: int, right: int, device=None):
    """(sq, sk) bool: query i sees key j iff i+sk-sq-left <= j <= i+sk-sq+right (-1 = unbounded)."""
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    shift = i + seqlen_k - seqlen_q
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= shift - left
    if right >= 0:
        mask &= j <= shift + right
    return mask


def alibi_bias(slopes, seqlen_q: int, seqlen_k: int, batch: int, heads: int, dtype, device):
    """(b, h, sq, sk) bias -slope * |i + sk - sq - j|; slopes fp32 (h) or (b, h)."""
    slopes = slopes.to(device=device, dtype=dtype)
    if slopes.dim() == 1:
        slopes = slopes[None, :].expand(batch, heads)
    i = torch.arange(seqlen_q, device=device, dtype=dtype)[:, None]
    j = torch.arange(seqlen_k, device=device, dtype=dtype)[None, :]
    dist = (i + seqlen_k - seqlen_q - j).abs()
    return -slopes[:, :, None, None] * dist


def naive_attention(q, k, v, *, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0,
                    alibi_slopes=None, dropout_keep=None, dropout_p=0.0, normalize=True):
    """q (b, sq, h, d), k/v (b, sk, hk, d) -> out (b, sq, h, d), lse (b, h, sq) (+inf if empty).

    dropout_keep: optional bool (b, h, sq, sk) of kept probabilities (scaled by 1/(1-p)).
    Computes in the dtype of q (lse in fp32 at least).
    """
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    left, right = normalize_window(causal, window, sk) if normalize else window
    if h != hk:
        k = k.repeat_interleave(h // hk, dim=2)
        v = v.repeat_interleave(h // hk, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, sq, sk, b, h, scores.dtype, q.device)
    mask = visible_mask(sq, sk, left, right, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores.float() if scores.dtype in (torch.float16, torch.bfloat16)
                          else scores, dim=-1)
    empty = ~mask.any(dim=-1)  # (sq,)
    probs = torch.softmax(scores, dim=-1)
    probs = probs.masked_fill(empty[None, None, :, None], 0.0)
    if dropout_keep is not None:
        probs = probs * dropout_keep.to(probs.dtype) / (1.0 - dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    lse = lse.masked_fill(empty[None, None, :], float("inf"))
    return out.to(q.dtype), lse
