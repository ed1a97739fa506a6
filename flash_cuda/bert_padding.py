"""Padded (batch, seqlen, ...) <-> packed (total, ...) conversion for the varlen functions.

Same contract as flash_attn.bert_padding (2.x): unpad_input gathers the tokens an attention
mask selects, in row-major order, and returns what flash_attn_varlen_func needs; pad_input
scatters them back with zeros elsewhere. Both are plain differentiable index ops.
"""

from __future__ import annotations

import torch


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...); attention_mask (batch, seqlen), bool or 0/1 ints.

    unused_mask (batch, seqlen), optional: tokens that are allocated but not attended to; they
    are kept in the packed tensor (counted in cu_seqlens) but not in seqused.
    Returns (hidden_unpad (total, ...), indices int64 (total,) into the flattened
    batch * seqlen tokens, cu_seqlens int32 (batch + 1,), max_seqlen int, seqused int32 (batch,)).
    """
    keep = attention_mask.bool()
    if unused_mask is not None:
        keep = keep | unused_mask.bool()
    seqlens = keep.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(keep.flatten()).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() > 0 else 0
    cu_seqlens = torch.zeros(seqlens.shape[0] + 1, dtype=torch.int32, device=seqlens.device)
    cu_seqlens[1:] = torch.cumsum(seqlens, dim=0, dtype=torch.int32)
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat.index_select(0, indices), indices, cu_seqlens, max_seqlen, seqused


def pad_input(hidden_states, indices, batch, seqlen):
    """hidden_states (total, ...), indices (total,) from unpad_input -> (batch, seqlen, ...),
    zeros where no token was kept."""
    rest = hidden_states.shape[1:]
    padded = hidden_states.new_zeros((batch * seqlen, *rest))
    padded = padded.index_copy(0, indices, hidden_states)
    return padded.reshape(batch, seqlen, *rest)
