"""flash_cuda: exact attention in hand-written CUDA, a drop-in for flash_attn 2.x."""

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers the torch.ops.flash_cuda ops)

__version__ = "0.1.0"
