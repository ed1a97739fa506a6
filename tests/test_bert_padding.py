"""flash_cuda.bert_padding against a direct loop over the mask (flash_attn 2.x semantics)."""

from __future__ import annotations

import torch

from flash_cuda.bert_padding import pad_input, unpad_input


def _mask(lengths, seqlen, left=False):
    ar = torch.arange(seqlen)[None, :]
    lens = torch.tensor(lengths)[:, None]
    return (ar >= seqlen - lens) if left else (ar < lens)


def test_unpad_matches_loop():
    torch.manual_seed(0)
    b, s = 3, 7
    x = torch.randn(b, s, 4, 5)
    mask = torch.rand(b, s) > 0.4
    mask[1] = False  # an empty sequence
    x_unpad, indices, cu, max_seqlen, seqused = unpad_input(x, mask)
    rows = [x[i, j] for i in range(b) for j in range(s) if mask[i, j]]
    torch.testing.assert_close(x_unpad, torch.stack(rows))
    assert indices.tolist() == [i * s + j for i in range(b) for j in range(s) if mask[i, j]]
    lengths = mask.sum(1).tolist()
    assert cu.dtype == torch.int32 and cu.tolist() == [0] + torch.tensor(lengths).cumsum(0).tolist()
    assert isinstance(max_seqlen, int) and max_seqlen == max(lengths)
    assert seqused.dtype == torch.int32 and seqused.tolist() == lengths


def test_unpad_int_mask_and_unused_mask():
    b, s = 2, 6
    x = torch.randn(b, s, 3)
    attn = _mask([2, 4], s).int()
    unused = torch.zeros(b, s, dtype=torch.int32)
    unused[0, 2:4] = 1  # allocated but unused tokens follow the used ones
    x_unpad, indices, cu, max_seqlen, seqused = unpad_input(x, attn, unused)
    assert cu.tolist() == [0, 4, 8]
    assert max_seqlen == 4
    assert seqused.tolist() == [2, 4]
    assert indices.tolist() == [0, 1, 2, 3, 6, 7, 8, 9]
    torch.testing.assert_close(x_unpad, x.reshape(b * s, 3)[indices])


def test_pad_roundtrip_and_zeros():
    torch.manual_seed(1)
    b, s = 3, 5
    x = torch.randn(b, s, 2, 4)
    mask = _mask([5, 2, 3], s, left=True)
    x_unpad, indices, *_ = unpad_input(x, mask)
    padded = pad_input(x_unpad, indices, b, s)
    torch.testing.assert_close(padded, x * mask[..., None, None])


def test_gradients_flow():
    b, s = 2, 4
    x = torch.randn(b, s, 3, dtype=torch.float64, requires_grad=True)
    mask = _mask([3, 1], s)
    x_unpad, indices, *_ = unpad_input(x, mask)
    w = torch.randn_like(x_unpad)
    (x_unpad * w).sum().backward()
    expected = torch.zeros(b * s, 3, dtype=torch.float64)
    expected[indices] = w
    torch.testing.assert_close(x.grad, expected.reshape(b, s, 3))
    h = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: pad_input(h, indices, b, s), (h,))
