"""flash_cuda.layers.rotary.apply_rotary_emb against a per-token loop (flash_attn semantics)."""

from __future__ import annotations

import pytest
import torch

from flash_cuda.layers.rotary import apply_rotary_emb


def _rotate_token(x, cos, sin, interleaved):
    """x (h, d) at one position; cos/sin (rotary_dim / 2,) or None for 'no rotation'."""
    if cos is None:
        return x.clone()
    half = cos.shape[0]
    out = x.clone()
    for i in range(half):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
        out[:, a] = x[:, a] * cos[i] - x[:, b] * sin[i]
        out[:, b] = x[:, a] * sin[i] + x[:, b] * cos[i]
    return out


def _at(cos, sin, pos):
    return (cos[pos], sin[pos]) if 0 <= pos < cos.shape[0] else (None, None)


def _loop(x, cos, sin, interleaved, offsets, cu_seqlens=None):
    out = x.clone()
    if cu_seqlens is None:
        for b in range(x.shape[0]):
            off = int(offsets[b]) if isinstance(offsets, torch.Tensor) else offsets
            for t in range(x.shape[1]):
                out[b, t] = _rotate_token(x[b, t], *_at(cos, sin, t + off), interleaved)
        return out
    cu = cu_seqlens.tolist()
    for b in range(len(cu) - 1):
        off = int(offsets[b]) if isinstance(offsets, torch.Tensor) else offsets
        for t in range(cu[b], cu[b + 1]):
            out[t] = _rotate_token(x[t], *_at(cos, sin, t - cu[b] + off), interleaved)
    return out


def _cos_sin(s_ro, half):
    angle = torch.rand(s_ro, half, dtype=torch.float64) * 6
    return angle.cos(), angle.sin()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [8, 4])  # full head dim and partial
@pytest.mark.parametrize("offsets", [0, 3, "tensor"])
def test_fixed_length(interleaved, rotary_dim, offsets):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64)
    cos, sin = _cos_sin(7, rotary_dim // 2)  # offsets push some positions past s_ro = 7
    if offsets == "tensor":
        offsets = torch.tensor([0, 4])
    out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=offsets)
    torch.testing.assert_close(out, _loop(x, cos, sin, interleaved, offsets))
    assert not torch.equal(out, x)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offsets", [0, "tensor"])
def test_varlen(interleaved, offsets):
    torch.manual_seed(1)
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    x = torch.randn(10, 2, 6, dtype=torch.float64)  # 2 padding rows past cu[-1]
    cos, sin = _cos_sin(8, 2)
    if offsets == "tensor":
        offsets = torch.tensor([2, 0, 1])
    out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=offsets, cu_seqlens=cu,
                           max_seqlen=5)
    torch.testing.assert_close(out, _loop(x, cos, sin, interleaved, offsets, cu))
    torch.testing.assert_close(out[8:], x[8:])


def test_inplace_and_dtype():
    torch.manual_seed(2)
    x = torch.randn(2, 4, 2, 8, dtype=torch.bfloat16)
    cos, sin = _cos_sin(4, 4)
    expected = apply_rotary_emb(x, cos.float(), sin.float())
    assert expected.dtype == torch.bfloat16
    y = x.clone()
    out = apply_rotary_emb(y, cos.float(), sin.float(), inplace=True)
    assert out.data_ptr() == y.data_ptr()
    torch.testing.assert_close(y, expected)


def test_differentiable():
    torch.manual_seed(3)
    x = torch.randn(1, 3, 2, 6, dtype=torch.float64, requires_grad=True)
    cos, sin = _cos_sin(3, 2)
    assert torch.autograd.gradcheck(
        lambda x: apply_rotary_emb(x, cos, sin, interleaved=True, seqlen_offsets=1), (x,))
    # A rotation preserves norms, so the gradient of |rope(x)|^2 is 2x.
    y = apply_rotary_emb(x, cos, sin)
    (g,) = torch.autograd.grad((y ** 2).sum(), x)
    torch.testing.assert_close(g, 2 * x.detach())


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_kvcache_rotary_is_apply_rotary_emb(interleaved, causal):
    """flash_attn_with_kvcache(rotary_cos, rotary_sin) == apply_rotary_emb on the new keys (at
    cache_seqlens + t) and on q (at cache_seqlens + t when causal/local, else all rows at
    cache_seqlens: flash_attn's rule), then attention over the cache."""
    import flash_cuda

    torch.manual_seed(4)
    b, s_cache, h, hk, d, s_new = 2, 16, 4, 2, 16, 3
    q = torch.randn(b, s_new, h, d, dtype=torch.float64)
    k_new, v_new = (torch.randn(b, s_new, hk, d, dtype=torch.float64) for _ in range(2))
    k_cache, v_cache = (torch.randn(b, s_cache, hk, d, dtype=torch.float64) for _ in range(2))
    seqlens = torch.tensor([2, 9], dtype=torch.int32)
    cos, sin = _cos_sin(s_cache, 3)  # rotary_dim 6 < d
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    out = flash_cuda.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cos, sin,
                                             seqlens, causal=causal,
                                             rotary_interleaved=interleaved)
    k_rot = apply_rotary_emb(k_new, cos, sin, interleaved, seqlen_offsets=seqlens)
    if causal:
        q_rot = apply_rotary_emb(q, cos, sin, interleaved, seqlen_offsets=seqlens)
    else:
        q_rot = apply_rotary_emb(q.reshape(b * s_new, 1, h, d), cos, sin, interleaved,
                                 seqlen_offsets=seqlens.repeat_interleave(s_new)).reshape(q.shape)
    for i, s in enumerate(seqlens.tolist()):
        k_ref[i, s:s + s_new], v_ref[i, s:s + s_new] = k_rot[i], v_new[i]
        ref = flash_cuda.flash_attn_func(q_rot[i:i + 1], k_ref[i:i + 1, :s + s_new],
                                         v_ref[i:i + 1, :s + s_new], causal=causal)
        torch.testing.assert_close(out[i:i + 1], ref)
    torch.testing.assert_close(k_cache, k_ref)
    torch.testing.assert_close(v_cache, v_ref)
