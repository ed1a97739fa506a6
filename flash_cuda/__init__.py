"""flash_cuda: exact attention in hand-written CUDA, a drop-in for flash_attn 2.x."""

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers the torch.ops.flash_cuda ops)
from . import _ops  # noqa: F401  (fake tensors and autograd of the ops)
from . import _autocast  # noqa: F401  (torch.autocast rules of the attention ops)
from .interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    scaled_dot_product_attention,
)

__version__ = "0.1.0"

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "scaled_dot_product_attention",
]
