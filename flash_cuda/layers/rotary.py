"""Rotary position embedding (RoPE) in plain PyTorch, flash_attn.layers.rotary's contract.

The first rotary_dim = 2 * cos.shape[1] features of every head are rotated by the angle of the
token's position; the rest pass through. Pairs are (x[i], x[i + rotary_dim / 2]) (GPT-NeoX
style) or, with interleaved=True, (x[2i], x[2i + 1]) (GPT-J style):
    (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos).
Positions at or past cos.shape[0] are left unrotated (cos 1, sin 0), as flash_attn's kernel
does. Differentiable with respect to x (and cos/sin) through ordinary autograd.
"""

from __future__ import annotations

import torch


def _positions(x, seqlen_offsets, cu_seqlens, max_seqlen):
    """Position of every token: (b, s) for x (b, s, h, d), (total,) for varlen x (total, h, d).

    Tokens outside every sequence (varlen padding after cu_seqlens[-1]) get position -1.
    """
    if cu_seqlens is None:
        b, s = x.shape[0], x.shape[1]
        pos = torch.arange(s, device=x.device).expand(b, s)
        if isinstance(seqlen_offsets, torch.Tensor):
            return pos + seqlen_offsets.to(device=x.device, dtype=torch.long).reshape(b, 1)
        return pos + seqlen_offsets
    total = x.shape[0]
    cu = cu_seqlens.to(device=x.device, dtype=torch.long)
    token = torch.arange(total, device=x.device)
    seq = torch.searchsorted(cu[1:], token, right=True)  # sequence of each token
    inside = seq < cu.shape[0] - 1
    seq = seq.clamp(max=cu.shape[0] - 2)
    pos = token - cu[seq]
    if isinstance(seqlen_offsets, torch.Tensor):
        pos = pos + seqlen_offsets.to(device=x.device, dtype=torch.long)[seq]
    else:
        pos = pos + seqlen_offsets
    return torch.where(inside, pos, torch.full_like(pos, -1))


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """x (b, s, h, d), or (total, h, d) with cu_seqlens int32 (b + 1) (max_seqlen: unused,
    accepted for compatibility); cos/sin (s_ro, rotary_dim / 2); seqlen_offsets int or (b,):
    shift of each sequence's positions (decoding with a KV cache). -> rotated x, same shape
    (written into x when inplace=True)."""
    if cos.dim() != 2 or sin.shape != cos.shape:
        raise ValueError(
            "flash_cuda: cos and sin must both have shape (seqlen_rotary, rotary_dim / 2), got "
            f"{tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    seqlen_ro, half = cos.shape
    rotary_dim = 2 * half
    if rotary_dim > x.shape[-1]:
        raise ValueError(
            f"flash_cuda: rotary_dim (2 * cos.shape[1] = {rotary_dim}) must be <= headdim "
            f"({x.shape[-1]})"
        )
    pos = _positions(x, seqlen_offsets, cu_seqlens, max_seqlen)
    valid = (pos >= 0) & (pos < seqlen_ro)
    idx = pos.clamp(0, max(seqlen_ro - 1, 0))
    # (..., 1, half): one angle per token, broadcast over heads.
    c = torch.where(valid[..., None], cos[idx], torch.ones_like(cos[idx])).unsqueeze(-2)
    s = torch.where(valid[..., None], sin[idx], torch.zeros_like(sin[idx])).unsqueeze(-2)
    c, s = c.to(x.dtype), s.to(x.dtype)

    rot = x[..., :rotary_dim]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    if inplace:
        x[..., :rotary_dim].copy_(rotated)
        return x
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
