"""Building blocks around the attention functions (flash_attn.layers counterparts)."""

from .rotary import apply_rotary_emb

__all__ = ["apply_rotary_emb"]
