"""GPU tests of the sm80 backward kernel (csrc/kernels/sm80/bwd.cuh) through torch.ops.flash_cuda.bwd.

The kernel runs by default where it covers a call (FLASH_CUDA_BWD_KERNEL=0, read once by the
extension, turns it off); this module sets the variable to 1 before the first op call so a stray
"0" in the environment cannot silently test the reference instead.

Specification (DESIGN.md sections 7 and 9):
  * oracle: autograd through tests/naive_attention.py in fp64 (`g_ref`) and in the input dtype
    (`g_pt`); pass when max|g - g_ref| <= 3 max|g_pt - g_ref| + 1e-5, for dq, dk and dv;
  * no NaN in any gradient, rows with no visible key (lse = +inf) give zero dq;
  * dk / dv bitwise identical over 3 runs (dq uses fp32 atomics: not required);
  * the kernel path really runs: deterministic=True routes the same call to the exact reference,
    whose result must differ at the bit level from the kernel's (both pass the oracle rule).
"""

from __future__ import annotations

import os

os.environ["FLASH_CUDA_BWD_KERNEL"] = "1"  # before the first op call (read once)

import pytest  # noqa: E402
import torch  # noqa: E402

from naive_attention import naive_attention  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128)
SEQLENS = ((1, 1), (113, 203), (128, 128), (256, 512), (512, 256), (1023, 1024))
MASKS = {"plain": (False, (-1, -1)), "causal": (True, (-1, -1)), "window": (False, (64, 16))}
GQA_RATIOS = (1, 4)


def _ops():
    import flash_cuda  # noqa: F401  (registers torch.ops.flash_cuda)

    return torch.ops.flash_cuda


def poison_allocator(num_bytes: int) -> None:
    n = max(num_bytes // 4, 1 << 20)
    junk = [torch.full((n,), float("nan"), device="cuda") for _ in range(3)]
    del junk


def fwd(q, k, v, *, causal, window, scale):
    out, lse, _, _ = _ops().fwd(q, k, v, None, 0.0, scale, causal, window[0], window[1], 0.0,
                                False)
    return out, lse


def bwd(dout, q, k, v, out, lse, *, causal, window, scale, deterministic=False):
    rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)
    return _ops().bwd(dout, q, k, v, out, lse, None, 0.0, scale, causal, window[0], window[1],
                      0.0, deterministic, rng_state)


def naive_grads(q, k, v, dout, *, causal, window, scale):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, _ = naive_attention(q, k, v, softmax_scale=scale, causal=causal, window=window)
    out.backward(dout.to(out.dtype))
    return q.grad, k.grad, v.grad


def make_inputs(dtype, d, sq, sk, h, hk, b=2, seed=0, transposed_dout=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d, dtype=dtype, device="cuda", generator=gen)
    k = torch.randn(b, sk, hk, d, dtype=dtype, device="cuda", generator=gen)
    v = torch.randn(b, sk, hk, d, dtype=dtype, device="cuda", generator=gen)
    if transposed_dout:
        dout = torch.randn(b, h, sq, d, dtype=dtype, device="cuda", generator=gen).transpose(1, 2)
    else:
        dout = torch.randn(b, sq, h, d, dtype=dtype, device="cuda", generator=gen)
    return q, k, v, dout


def check_grads(got, q, k, v, dout, *, causal, window, scale):
    ref = naive_grads(q.double(), k.double(), v.double(), dout.double(), causal=causal,
                      window=window, scale=scale)
    pt = naive_grads(q, k, v, dout, causal=causal, window=window, scale=scale)
    for name, g, r, p in zip(("dq", "dk", "dv"), got, ref, pt):
        assert g.shape == r.shape and g.dtype == q.dtype, name
        assert not torch.isnan(g).any(), f"{name}: NaN"
        err = (g.double() - r).abs().max().item()
        tol = 3 * (p.double() - r).abs().max().item() + 1e-5
        assert err <= tol, f"{name}: max error {err:.3e} > {tol:.3e}"


def run_case(dtype, d, sq, sk, mask, ratio, **kw):
    causal, window = MASKS[mask]
    h = 4
    hk = h // ratio
    q, k, v, dout = make_inputs(dtype, d, sq, sk, h, hk, **kw)
    scale = d ** -0.5
    out, lse = fwd(q, k, v, causal=causal, window=window, scale=scale)
    poison_allocator(4 * (q.numel() + k.numel()) * 4)
    got = bwd(dout, q, k, v, out, lse, causal=causal, window=window, scale=scale)
    check_grads(got, q, k, v, dout, causal=causal, window=window, scale=scale)
    return q, k, v, dout, out, lse, got


@pytest.mark.parametrize("ratio", GQA_RATIOS)
@pytest.mark.parametrize("mask", tuple(MASKS))
@pytest.mark.parametrize("sq,sk", SEQLENS)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bwd_matches_oracle(dtype, d, sq, sk, mask, ratio):
    run_case(dtype, d, sq, sk, mask, ratio)


@pytest.mark.parametrize("d", (40, 59, 111))
@pytest.mark.parametrize("dtype", DTYPES)
def test_bwd_padded_head_dims(dtype, d):
    """Head dims padded to 64 / 128 inside the op."""
    run_case(dtype, d, 113, 203, "causal", 4)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_bwd_non_contiguous_dout(d):
    run_case(torch.float16, d, 200, 300, "window", 1, transposed_dout=True)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_bwd_strided_qkv(d):
    """q, k, v as slices of a packed (b, s, 3, h, d) tensor (row stride 3 h d)."""
    dtype, b, s, h = torch.bfloat16, 2, 173, 4
    qkv = torch.randn(b, s, 3, h, d, dtype=dtype, device="cuda")
    q, k, v = qkv.unbind(2)
    dout = torch.randn(b, s, h, d, dtype=dtype, device="cuda")
    scale = d ** -0.5
    out, lse = fwd(q, k, v, causal=True, window=(-1, -1), scale=scale)
    got = bwd(dout, q, k, v, out, lse, causal=True, window=(-1, -1), scale=scale)
    check_grads(got, q, k, v, dout, causal=True, window=(-1, -1), scale=scale)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_bwd_rows_without_keys(d):
    """Causal with sq > sk and a window past the end: rows with lse = +inf get zero dq."""
    dtype = torch.float16
    q, k, v, dout = make_inputs(dtype, d, 300, 100, 4, 1)
    scale = d ** -0.5
    out, lse = fwd(q, k, v, causal=True, window=(-1, -1), scale=scale)
    dq, dk, dv = bwd(dout, q, k, v, out, lse, causal=True, window=(-1, -1), scale=scale)
    empty = torch.isinf(lse)  # (b, h, sq)
    assert empty.any()
    assert (dq.permute(0, 2, 1, 3)[empty] == 0).all()
    check_grads((dq, dk, dv), q, k, v, dout, causal=True, window=(-1, -1), scale=scale)


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("ratio", GQA_RATIOS)
def test_bwd_dk_dv_bitwise_reproducible(d, ratio):
    q, k, v, dout, out, lse, (dq0, dk0, dv0) = run_case(torch.bfloat16, d, 1023, 1024, "causal",
                                                       ratio)
    for _ in range(3):
        dq, dk, dv = bwd(dout, q, k, v, out, lse, causal=True, window=(-1, -1), scale=d ** -0.5)
        assert torch.equal(dk, dk0) and torch.equal(dv, dv0)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_kernel_path_taken(d):
    """deterministic=True goes to the exact reference; the kernel's result differs in bits."""
    q, k, v, dout, out, lse, got = run_case(torch.float16, d, 1023, 1024, "plain", 1)
    ref_path = bwd(dout, q, k, v, out, lse, causal=False, window=(-1, -1), scale=d ** -0.5,
                   deterministic=True)
    check_grads(ref_path, q, k, v, dout, causal=False, window=(-1, -1), scale=d ** -0.5)
    assert any(not torch.equal(a, b) for a, b in zip(got, ref_path)), (
        "kernel and reference results are bitwise identical: was FLASH_CUDA_BWD_KERNEL=0 in effect "
        "before the first op call of this process?")
