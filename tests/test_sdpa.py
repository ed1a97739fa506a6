"""flash_cuda.scaled_dot_product_attention == torch.nn.functional.scaled_dot_product_attention.

Torch's layout (b, h, s, d) and its top-left aligned causal mask, with sq != sk both ways and
grouped-query attention (enable_gqa); forward and gradients, CPU in fp64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flash_cuda
from api_utils import rand


@pytest.mark.parametrize("sq, sk", [(8, 8), (5, 11), (11, 5), (1, 7), (7, 1)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("hk", [4, 2])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_sdpa_matches_torch(sq, sk, is_causal, hk, scale):
    torch.manual_seed(0)
    kw = dict(dtype=torch.float64, requires_grad=True)
    q, k, v = rand(2, 4, sq, 16, **kw), rand(2, hk, sk, 16, **kw), rand(2, hk, sk, 16, **kw)
    gqa = hk != 4
    out = flash_cuda.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale,
                                                  enable_gqa=gqa)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale,
                                         enable_gqa=gqa)
    assert out.shape == ref.shape == (2, 4, sq, 16)
    torch.testing.assert_close(out, ref)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_sdpa_any_strides():
    """Inputs in (b, s, h, d) memory transposed to (b, h, s, d), and a strided last dim."""
    torch.manual_seed(1)
    q = rand(2, 6, 4, 16, dtype=torch.float64).transpose(1, 2)
    k = rand(2, 16, 9, 4, dtype=torch.float64).permute(0, 3, 2, 1)
    assert k.stride(-1) != 1
    out = flash_cuda.scaled_dot_product_attention(q, k, k, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, k, is_causal=True))
