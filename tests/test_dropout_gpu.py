"""GPU tests of dropout in the sm80 kernels (csrc/kernels/dropout.cuh, fwd.cuh, bwd.cuh).

Dropout with return_attn_probs=False runs in the kernels; return_softmax=True (S_dmask, a
debugging output) runs the exact reference, which draws the same Philox mask
(csrc/kernels/philox.cuh) on the host. So the reference's S_dmask for a given rng_state is the
oracle of the kernels' mask.

Specification (DESIGN.md sections 4, 9; issue 4):
  * mask: the kernel's mask equals the reference's bitwise (read through V = one-hot rows under a
    window narrower than the head dim: out[i, j % d] = P[i, j] keep[i, j] / (1 - p));
  * kept fraction within 0.01 of 1 - p;
  * out against fp64 naive attention with the reference's mask: max|out - ref| <=
    2 max|out_pt - ref| + 1e-5; lse is that of the undropped softmax;
  * gradients (kernel backward, replaying the forward's mask from rng_state) against fp64
    autograd with the mask of S_dmask, 3x rule: the backward is consistent with the returned mask;
  * on an sm_90 GPU the forward (more than 64 query rows, no softcap / ALiBi; every head dim
    since session 45) runs the Hopper kernel's dropout variant (since session 40): mask bitwise,
    values, and the same mask as the sm80 kernel's (FLASH_CUDA_SM90=0); so does the backward
    (no ALiBi): gradients with the 3x rule, deterministic too;
  * the backward kernel covers varlen and deterministic=True too, and dropout with softcap /
    ALiBi runs the kernels both ways (the reference before session 40): gradients with the 3x
    rule, a CUDA graph captures them (the reference refuses dropout under capture: the kernel
    ran);
  * torch.manual_seed(s) reproduces out / lse / dk / dv bitwise (dq: fp32 atomics, rounding;
    deterministic=True: bitwise);
  * CUDA graphs: a captured dropout forward (and backward) draws a fresh mask on every replay
    (the generator's offset advances), and each replay equals the eager call with the rng_state
    the graph wrote.
"""

from __future__ import annotations

import itertools
import os

os.environ["FLASH_CUDA_BWD_KERNEL"] = "1"  # before the first op call (read once)

import pytest  # noqa: E402
import torch  # noqa: E402

from api_utils import built_head_dims, capture_cuda_graph  # noqa: E402
from sm90_utils import SM90_GPU, sm90_kernel_runs  # noqa: E402
from naive_attention import naive_attention, normalize_window, visible_mask  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = (torch.float16, torch.bfloat16)


def _ops():
    import flash_cuda  # noqa: F401  (registers torch.ops.flash_cuda)

    return torch.ops.flash_cuda


def fwd(q, k, v, p, *, causal=False, window=(-1, -1), scale=None, softcap=0.0, alibi=None,
        return_softmax=False, rng_state=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _ops().fwd(q, k, v, alibi, p, scale, causal, window[0], window[1], softcap,
                      return_softmax, rng_state)


def bwd(dout, q, k, v, out, lse, p, rng_state, *, causal=False, window=(-1, -1), scale=None,
        deterministic=False, softcap=0.0, alibi=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _ops().bwd(dout, q, k, v, out, lse, alibi, p, scale, causal, window[0], window[1],
                      softcap, deterministic, rng_state)


def reference_keep(q, k, v, p, rng_state, **kw):
    """The reference's mask (b, h, sq, sk) for rng_state: the sign bit of its S_dmask."""
    _, _, s_dmask, rs = fwd(q, k, v, p, return_softmax=True, rng_state=rng_state, **kw)
    assert torch.equal(rs.cpu(), rng_state.cpu())
    sq, sk = q.shape[1], k.shape[1]
    return ~torch.signbit(s_dmask[:, :, :sq, :sk])


def make_inputs(dtype, d, sq, sk, h, hk, b=2, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d, dtype=dtype, device="cuda", generator=gen)
    k = torch.randn(b, sk, hk, d, dtype=dtype, device="cuda", generator=gen)
    v = torch.randn(b, sk, hk, d, dtype=dtype, device="cuda", generator=gen)
    dout = torch.randn(b, sq, h, d, dtype=dtype, device="cuda", generator=gen)
    return q, k, v, dout


def rule(name, got, ref, pt, factor):
    assert not torch.isnan(got).any(), f"{name}: NaN"
    err = (got.double() - ref).abs().max().item()
    tol = factor * (pt.double() - ref).abs().max().item() + 1e-5
    assert err <= tol, f"{name}: max error {err:.3e} > {tol:.3e}"


# ----------------------------------------------------------------------------------------------
# The mask, bitwise
# ----------------------------------------------------------------------------------------------

MASK_CASES = [  # dtype, d, sq, sk, h, hk, p, causal, window (width < d)
    (torch.float16, 128, 113, 203, 4, 1, 0.17, False, (60, 60)),
    (torch.bfloat16, 128, 1023, 1024, 2, 2, 0.5, False, (63, 63)),
    (torch.float16, 64, 257, 300, 3, 1, 0.3, True, (62, 0)),
    (torch.bfloat16, 64, 17, 1, 2, 1, 0.9, False, (-1, -1)),
    (torch.float16, 256, 129, 255, 2, 2, 0.25, False, (100, 100)),
    (torch.float16, 32, 70, 40, 2, 2, 0.3, False, (15, 15)),
    (torch.bfloat16, 96, 200, 200, 4, 2, 0.6, True, (90, 0)),
]


def kernel_keep(dtype, d, sq, sk, h, hk, p, causal, window, rng_state, b=2, seed=0):
    """The kernel's mask (b, h, sq, sk) and visibility (sq, sk), through one-hot V rows."""
    left, right = normalize_window(causal, window, sk)
    width = (left if left >= 0 else sk) + (right if right >= 0 else sk) + 1
    assert min(width, sk) <= d, "visible keys of a row must have distinct residues mod d"
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = (0.1 * torch.randn(b, sq, h, d, device="cuda", generator=gen)).to(dtype)
    k = (0.1 * torch.randn(b, sk, hk, d, device="cuda", generator=gen)).to(dtype)
    v = torch.zeros(b, sk, hk, d, dtype=dtype, device="cuda")
    j = torch.arange(sk, device="cuda")
    v[:, j, :, j % d] = 1
    out, _, _, rs = fwd(q, k, v, p, causal=causal, window=window, rng_state=rng_state)
    vis = visible_mask(sq, sk, left, right, device="cuda")
    # out[b, i, h, j % d] = P[i, j] keep / (1 - p), P > 0 on visible keys (small scores).
    gathered = out.permute(0, 2, 1, 3)[..., (j % d)]  # (b, h, sq, sk)
    keep = gathered != 0
    ref_keep = reference_keep(q, k, v, p, rng_state, causal=causal, window=window)
    return keep, ref_keep, vis


@pytest.mark.parametrize("case", MASK_CASES, ids=lambda c: f"{c[0]}-d{c[1]}-{c[2]}x{c[3]}-p{c[6]}")
def test_mask_matches_reference(case):
    dtype, d, sq, sk, h, hk, p, causal, window = case
    rng_state = torch.tensor([0x1234_5678_9ABC_DEF0 - (1 << 64) + (1 << 63), (1 << 32) - 3],
                             dtype=torch.int64, device="cuda")
    keep, ref_keep, vis = kernel_keep(dtype, d, sq, sk, h, hk, p, causal, window, rng_state)
    diff = (keep != ref_keep) & vis
    assert diff.sum().item() == 0, f"{diff.sum().item()} mask elements differ"


@pytest.mark.parametrize("p", (0.1, 0.5, 0.83))
def test_kept_fraction(p):
    torch.manual_seed(7)
    rng_state = fwd(*make_inputs(torch.float16, 64, 8, 8, 1, 1)[:3], p)[3]  # a fresh draw
    keep, _, vis = kernel_keep(torch.float16, 128, 1024, 1024, 8, 8, p, False, (63, 63), rng_state)
    frac = keep[vis.expand_as(keep)].double().mean().item()
    assert abs(frac - (1 - p)) <= 0.01, f"kept fraction {frac:.4f}, 1 - p = {1 - p}"


SM90_CASES = [  # dtype, d, sq, sk, h, hk, p, causal, window (width < d)
    (torch.float16, 128, 300, 400, 4, 1, 0.3, False, (60, 60)),
    (torch.bfloat16, 64, 257, 300, 2, 2, 0.5, True, (62, 0)),
    (torch.bfloat16, 256, 129, 255, 2, 1, 0.17, False, (100, 100)),
    (torch.float16, 256, 200, 333, 3, 3, 0.4, True, (200, 0)),
    (torch.bfloat16, 192, 250, 341, 2, 1, 0.25, False, (90, 90)),
    (torch.float16, 192, 140, 300, 2, 2, 0.35, True, (180, 0)),
    # The ends of the 16-bit threshold: 0 (p_keep * 65536 rounds to 0: nothing kept) and 65536
    # (everything kept), which the d64 / d128 mask tests without a branch (dropout.cuh).
    (torch.bfloat16, 64, 130, 200, 2, 1, 1 - 2.0 ** -18, False, (30, 30)),
    (torch.float16, 128, 100, 150, 2, 2, 2.0 ** -18, True, (90, 0)),
]


@SM90_GPU
@pytest.mark.parametrize("case", SM90_CASES, ids=lambda c: f"d{c[1]}-{c[2]}x{c[3]}-p{c[6]}")
def test_sm90_forward_dropout(monkeypatch, case):
    """The Hopper forward's dropout variant: its mask equals the reference's and the sm80
    kernel's bitwise, and its out / lse pass the value rules (the profiler sees it ran)."""
    dtype, d, sq, sk, h, hk, p, causal, window = case
    if d not in built_head_dims():
        pytest.skip(f"head dim {d} not built (FLASH_CUDA_HEADDIMS)")
    rs = torch.tensor([0x0F1E_2D3C_4B5A_6978, (1 << 32) - 5], dtype=torch.int64, device="cuda")
    with sm90_kernel_runs(monkeypatch, "mha_fwd_sm90_kernel", "1", fwd_dropout=True):
        keep, ref_keep, vis = kernel_keep(dtype, d, sq, sk, h, hk, p, causal, window, rs)
        q, k, v, _ = make_inputs(dtype, d, sq, sk, h, hk, seed=d + sq)
        out, lse, _, _ = fwd(q, k, v, p, causal=causal, window=window, rng_state=rs)
    assert ((keep != ref_keep) & vis).sum().item() == 0
    monkeypatch.setenv("FLASH_CUDA_SM90", "0")
    keep_sm80, _, _ = kernel_keep(dtype, d, sq, sk, h, hk, p, causal, window, rs)
    assert torch.equal(keep & vis, keep_sm80 & vis)
    kw = dict(causal=causal, window=window, dropout_keep=reference_keep(
        q, k, v, p, rs, causal=causal, window=window), dropout_p=p)
    ref, lse_ref = naive_attention(q.double(), k.double(), v.double(), **kw)
    pt, lse_pt = naive_attention(q, k, v, **kw)
    rule("out", out, ref, pt, 2)
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref))
    err = (lse[finite].double() - lse_ref[finite]).abs().max().item()
    err_pt = (lse_pt.double()[finite] - lse_ref[finite]).abs().max().item()
    assert err <= 2 * err_pt + 1e-4 * (1.0 + lse_ref[finite].abs().max().item())


SM90_BWD_CASES = [  # dtype, d, sq, sk, h, hk, p, causal, deterministic
    (torch.bfloat16, 64, 300, 517, 4, 2, 0.3, False, False),
    (torch.float16, 128, 257, 300, 4, 1, 0.5, True, False),
    (torch.bfloat16, 128, 200, 333, 2, 2, 0.17, False, True),
    (torch.float16, 256, 150, 260, 2, 1, 0.3, True, False),
    (torch.bfloat16, 256, 130, 90, 2, 2, 0.4, False, True),
    # d192: the d192 forward's mask replayed by the wide d192 backward (session 46; the d256
    # kernel, zero-padded, in session 45), deterministic too
    (torch.bfloat16, 192, 200, 301, 2, 1, 0.3, True, False),
    (torch.float16, 192, 130, 90, 2, 2, 0.4, False, True),
]


@SM90_GPU
@pytest.mark.parametrize("case", SM90_BWD_CASES,
                         ids=lambda c: f"d{c[1]}-{c[2]}x{c[3]}-{'det' if c[8] else 'atomic'}")
def test_sm90_backward_dropout(monkeypatch, case):
    """The Hopper backward's dropout variant (the profiler sees it ran, and the forward's):
    gradients with the 3x rule against fp64 autograd under the reference's mask."""
    dtype, d, sq, sk, h, hk, p, causal, deterministic = case
    if d not in built_head_dims():
        pytest.skip(f"head dim {d} not built (FLASH_CUDA_HEADDIMS)")
    q, k, v, dout = make_inputs(dtype, d, sq, sk, h, hk, seed=d + sk)
    kernel = "mha_bwd_sm90_wide_kernel" if d > 128 else "mha_bwd_sm90_kernel"
    with sm90_kernel_runs(monkeypatch, kernel, "1", fwd_dropout=True, bwd_dropout=True):
        out, lse, _, rs = fwd(q, k, v, p, causal=causal)
        dq, dk, dv = bwd(dout, q, k, v, out, lse, p, rs, causal=causal,
                         deterministic=deterministic)
    keep = reference_keep(q, k, v, p, rs, causal=causal)
    nkw = dict(causal=causal, dropout_keep=keep, dropout_p=p)
    ref = naive_grads(q.double(), k.double(), v.double(), dout.double(), **nkw)
    pt = naive_grads(q, k, v, dout, **nkw)
    for name, g, r, t in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, pt):
        rule(name, g, r, t, 3)


# ----------------------------------------------------------------------------------------------
# Forward values
# ----------------------------------------------------------------------------------------------

FWD_CASES = [  # d, sq, sk, h, hk, causal, window, softcap, alibi
    (64, 113, 203, 4, 4, False, (-1, -1), 0.0, False),
    (128, 1023, 1024, 4, 1, True, (-1, -1), 0.0, False),
    (128, 512, 256, 8, 2, False, (64, 16), 0.0, False),
    (40, 17, 1, 2, 1, False, (-1, -1), 0.0, False),
    (59, 1, 17, 2, 2, True, (-1, -1), 0.0, False),
    (96, 257, 129, 4, 4, False, (-1, -1), 5.0, True),
    (256, 200, 333, 2, 1, True, (-1, -1), 0.0, False),
    (160, 128, 128, 2, 2, False, (-1, -1), 0.0, False),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", FWD_CASES, ids=lambda c: f"d{c[0]}-{c[1]}x{c[2]}-h{c[3]}/{c[4]}")
@pytest.mark.parametrize("p", (0.17, 0.5))
def test_fwd_values(dtype, case, p):
    d, sq, sk, h, hk, causal, window, softcap, alibi = case
    q, k, v, _ = make_inputs(dtype, d, sq, sk, h, hk, seed=sq + sk + d)
    slopes = torch.rand(2, h, device="cuda") * 0.3 if alibi else None
    kw = dict(causal=causal, window=window, softcap=softcap, alibi=slopes)
    out, lse, s_dmask, rs = fwd(q, k, v, p, **kw)
    assert s_dmask.numel() == 0
    keep = reference_keep(q, k, v, p, rs, **kw)
    nkw = dict(causal=causal, window=window, softcap=softcap, alibi_slopes=slopes,
               dropout_keep=keep, dropout_p=p)
    ref, lse_ref = naive_attention(q.double(), k.double(), v.double(), **nkw)
    pt, lse_pt = naive_attention(q, k, v, **nkw)
    rule("out", out, ref, pt, 2)
    # lse: of the undropped softmax, with test_fwd_gpu.py's rule (the input-dtype oracle's lse
    # error, doubled, plus 1e-4 relative): the kernel's l sums the 16-bit P that P·V uses.
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref))
    if finite.any():
        err = (lse[finite].double() - lse_ref[finite]).abs().max().item()
        err_pt = (lse_pt.double()[finite] - lse_ref[finite]).abs().max().item()
        bound = 2 * err_pt + 1e-4 * (1.0 + lse_ref[finite].abs().max().item())
        assert err <= bound, f"lse error {err:.3e} > {bound:.3e} (dtype oracle {err_pt:.3e})"


def test_kernel_path_runs():
    """Dropout without return_softmax is the kernel: close to the reference, not bit-equal."""
    if 128 not in built_head_dims():  # without its kernel the call takes the reference path
        pytest.skip("head dim 128 not built (FLASH_CUDA_HEADDIMS)")
    q, k, v, _ = make_inputs(torch.float16, 128, 300, 300, 4, 4, seed=3)
    out, lse, _, rs = fwd(q, k, v, 0.3)
    out_ref, lse_ref, _, _ = fwd(q, k, v, 0.3, return_softmax=True, rng_state=rs)
    assert (out.float() - out_ref.float()).abs().max().item() < 2e-2
    assert not torch.equal(out, out_ref) or not torch.equal(lse, lse_ref)


def test_varlen_dropout():
    """varlen forward: sequence-relative rows / keys and batch index = sequence index."""
    torch.manual_seed(11)
    lens_q, lens_k = [17, 0, 130, 64], [40, 5, 129, 64]
    h, hk, d = 4, 2, 64
    cu_q = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), h, d, dtype=torch.float16, device="cuda")
    k = torch.randn(sum(lens_k), hk, d, dtype=torch.float16, device="cuda")
    v = torch.randn(sum(lens_k), hk, d, dtype=torch.float16, device="cuda")
    args = (None, None, None, max(lens_q), max(lens_k), 0.4, d ** -0.5, True, -1, 0, 0.0)
    out, lse, _, rs = _ops().varlen_fwd(q, k, v, cu_q, cu_k, *args, False)
    out_ref, lse_ref, s_dmask, _ = _ops().varlen_fwd(q, k, v, cu_q, cu_k, *args, True, rs)
    err = (out.float() - out_ref.float()).abs().max().item()
    assert err < 2e-2, err
    fin = torch.isfinite(lse_ref)
    assert torch.equal(fin, torch.isfinite(lse))
    assert (lse[fin] - lse_ref[fin]).abs().max().item() < 1e-3


# ----------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------

BWD_CASES = [  # d, sq, sk, h, hk, causal, window
    (64, 113, 203, 2, 2, False, (-1, -1)),
    (128, 113, 203, 4, 1, True, (-1, -1)),
    (64, 1023, 1024, 2, 1, True, (-1, -1)),
    (128, 512, 256, 4, 4, False, (64, 16)),
    (40, 1, 17, 2, 2, False, (-1, -1)),
    (111, 257, 129, 8, 2, True, (-1, -1)),
]


def naive_grads(q, k, v, dout, **kw):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, _ = naive_attention(q, k, v, **kw)
    out.backward(dout.to(out.dtype))
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: f"d{c[0]}-{c[1]}x{c[2]}-h{c[3]}/{c[4]}")
@pytest.mark.parametrize("p", (0.17, 0.5))
def test_bwd_values(dtype, case, p):
    d, sq, sk, h, hk, causal, window = case
    q, k, v, dout = make_inputs(dtype, d, sq, sk, h, hk, seed=sq * 3 + sk + d)
    kw = dict(causal=causal, window=window)
    out, lse, _, rs = fwd(q, k, v, p, **kw)
    dq, dk, dv = bwd(dout, q, k, v, out, lse, p, rs, **kw)
    # The mask the backward must be consistent with: S_dmask of return_attn_probs=True.
    keep = reference_keep(q, k, v, p, rs, **kw)
    nkw = dict(causal=causal, window=window, dropout_keep=keep, dropout_p=p)
    ref = naive_grads(q.double(), k.double(), v.double(), dout.double(), **nkw)
    pt = naive_grads(q, k, v, dout, **nkw)
    for name, g, r, t in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, pt):
        rule(name, g, r, t, 3)


# Varlen (sequences of 0, 1 and several blocks; GQA; the mask's rows / keys relative to each
# sequence, the sequence index as its batch) and deterministic=True, both on the kernel.
VARLEN_BWD_CASES = [  # d, lens_q, lens_k, h, hk, causal
    (64, [17, 0, 130, 64, 1], [40, 5, 129, 64, 90], 4, 2, True),
    (128, [300, 1, 77], [257, 1, 300], 4, 1, False),
    (96, [50, 129], [200, 70], 2, 2, False),
]


def varlen_inputs(dtype, d, lens_q, lens_k, h, hk, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cu = lambda lens: torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32,  # noqa: E731
                                   device="cuda")
    q = torch.randn(sum(lens_q), h, d, dtype=dtype, device="cuda", generator=gen)
    k = torch.randn(sum(lens_k), hk, d, dtype=dtype, device="cuda", generator=gen)
    v = torch.randn(sum(lens_k), hk, d, dtype=dtype, device="cuda", generator=gen)
    dout = torch.randn(sum(lens_q), h, d, dtype=dtype, device="cuda", generator=gen)
    return q, k, v, dout, cu(lens_q), cu(lens_k)


def varlen_fwd(q, k, v, cu_q, cu_k, mq, mk, p, causal, return_softmax=False, rng_state=None):
    return _ops().varlen_fwd(q, k, v, cu_q, cu_k, None, None, None, mq, mk, p,
                             q.shape[-1] ** -0.5, causal, -1, 0 if causal else -1, 0.0,
                             return_softmax, rng_state)


def varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, p, causal, deterministic, rs):
    return _ops().varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, None, mq, mk, p,
                             q.shape[-1] ** -0.5, causal, -1, 0 if causal else -1, 0.0,
                             deterministic, rs)


@pytest.mark.parametrize("deterministic", (False, True), ids=("atomic", "deterministic"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", VARLEN_BWD_CASES, ids=lambda c: f"d{c[0]}-{len(c[1])}seqs")
def test_varlen_bwd_values(case, dtype, deterministic):
    d, lens_q, lens_k, h, hk, causal = case
    if d not in built_head_dims():
        pytest.skip(f"head dim {d} not built (FLASH_CUDA_HEADDIMS)")
    p = 0.3
    q, k, v, dout, cu_q, cu_k = varlen_inputs(dtype, d, lens_q, lens_k, h, hk, seed=d)
    mq, mk = max(lens_q), max(lens_k)
    out, lse, _, rs = varlen_fwd(q, k, v, cu_q, cu_k, mq, mk, p, causal)
    dq, dk, dv = (t.clone() for t in
                  varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, p, causal,
                             deterministic, rs))
    if deterministic:  # the same call again: bitwise
        again = varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, p, causal, True, rs)
        for name, x, y in zip(("dq", "dk", "dv"), (dq, dk, dv), again):
            assert torch.equal(x, y), name
    s_dmask = varlen_fwd(q, k, v, cu_q, cu_k, mq, mk, p, causal, True, rs)[2]
    ref = [torch.zeros_like(t, dtype=torch.float64) for t in (q, k, v)]
    pt = [torch.zeros_like(t) for t in (q, k, v)]
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq == 0 or lk == 0:
            continue
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        keys = slice(int(cu_k[i]), int(cu_k[i + 1]))
        keep = ~torch.signbit(s_dmask[i:i + 1, :, :lq, :lk])
        nkw = dict(causal=causal, dropout_keep=keep, dropout_p=p)
        seq = (q[None, rows], k[None, keys], v[None, keys], dout[None, rows])
        for acc, grads in ((ref, naive_grads(*(t.double() for t in seq), **nkw)),
                           (pt, naive_grads(*seq, **nkw))):
            acc[0][rows], acc[1][keys], acc[2][keys] = (g[0] for g in grads)
    for name, g, r, t in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, pt):
        rule(name, g, r, t, 3)


def replayed_once(step, head_dim):
    """step()'s tensors from one replay of a CUDA graph that captured it, cloned."""
    graph, captured = capture_cuda_graph(step, head_dim)
    graph.replay()
    torch.cuda.synchronize()
    return [t.clone() for t in captured]


@pytest.mark.parametrize("deterministic", (False, True), ids=("atomic", "deterministic"))
def test_cuda_graph_varlen_bwd(deterministic):
    """A varlen dropout forward + backward captured in a CUDA graph (the kernel: the reference
    refuses dropout under capture) equals the eager calls with the rng_state it wrote."""
    d, lens_q, lens_k, h, hk, causal = VARLEN_BWD_CASES[0]
    if d not in built_head_dims():
        pytest.skip(f"head dim {d} not built (FLASH_CUDA_HEADDIMS)")
    q, k, v, dout, cu_q, cu_k = varlen_inputs(torch.float16, d, lens_q, lens_k, h, hk, seed=3)
    mq, mk, p = max(lens_q), max(lens_k), 0.3

    def step():
        out, lse, _, rs = varlen_fwd(q, k, v, cu_q, cu_k, mq, mk, p, causal)
        grads = varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, p, causal,
                           deterministic, rs)
        return out, lse, rs, *grads
    out, lse, rs, dq, dk, dv = replayed_once(step, d)
    out_e, lse_e, _, _ = varlen_fwd(q, k, v, cu_q, cu_k, mq, mk, p, causal, rng_state=rs)
    assert torch.equal(out_e, out) and torch.equal(lse_e, lse)
    dq_e, dk_e, dv_e = varlen_bwd(dout, q, k, v, out_e, lse_e, cu_q, cu_k, mq, mk, p, causal,
                                  deterministic, rs)
    assert torch.equal(dk_e, dk) and torch.equal(dv_e, dv)
    if deterministic:
        assert torch.equal(dq_e, dq)
    else:
        assert torch.allclose(dq_e.float(), dq.float(), atol=1e-2, rtol=1e-2)


BIAS_CASES = [  # d, sq, sk, h, hk, causal, softcap, alibi
    (64, 113, 203, 2, 2, False, 0.0, True),
    (128, 257, 300, 4, 1, True, 5.0, False),
    (96, 200, 150, 2, 2, False, 4.0, True),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", BIAS_CASES, ids=lambda c: f"d{c[0]}-softcap{c[6]:g}-alibi{c[7]}")
def test_bias_dropout_kernels(dtype, case):
    """Dropout with softcap / ALiBi: forward and backward on the kernels (captured in a CUDA
    graph, which the reference path refuses), the same results as the eager calls with the
    rng_state the graph wrote, out and gradients by the rules against fp64 naive attention."""
    d, sq, sk, h, hk, causal, softcap, alibi = case
    if d not in built_head_dims():
        pytest.skip(f"head dim {d} not built (FLASH_CUDA_HEADDIMS)")
    q, k, v, dout = make_inputs(dtype, d, sq, sk, h, hk, seed=d + sq)
    slopes = torch.rand(2, h, device="cuda") * 0.3 if alibi else None
    kw = dict(causal=causal, softcap=softcap, alibi=slopes)
    p = 0.3

    def step():
        out, lse, _, rs = fwd(q, k, v, p, **kw)
        return (out, lse, rs, *bwd(dout, q, k, v, out, lse, p, rs, **kw))
    out, lse, rs, dq, dk, dv = replayed_once(step, d)
    out_e, lse_e, _, _ = fwd(q, k, v, p, rng_state=rs, **kw)
    assert torch.equal(out_e, out) and torch.equal(lse_e, lse)
    dq_e, dk_e, dv_e = bwd(dout, q, k, v, out_e, lse_e, p, rs, **kw)
    assert torch.equal(dk_e, dk) and torch.equal(dv_e, dv)
    keep = reference_keep(q, k, v, p, rs, **kw)
    nkw = dict(causal=causal, softcap=softcap, alibi_slopes=slopes, dropout_keep=keep,
               dropout_p=p)
    ref, _ = naive_attention(q.double(), k.double(), v.double(), **nkw)
    pt, _ = naive_attention(q, k, v, **nkw)
    rule("out", out, ref, pt, 2)
    ref_g = naive_grads(q.double(), k.double(), v.double(), dout.double(), **nkw)
    pt_g = naive_grads(q, k, v, dout, **nkw)
    for name, g, r, t in zip(("dq", "dk", "dv"), (dq, dk, dv), ref_g, pt_g):
        rule(name, g, r, t, 3)


def test_same_seed_bitwise():
    """torch.manual_seed reproduces a training step: out, lse, dk, dv bitwise; dq to rounding
    (fp32 atomics); with deterministic=True (the kernel's dq slices) every gradient bitwise."""
    import flash_cuda

    q0, k0, v0, dout = make_inputs(torch.bfloat16, 128, 300, 300, 4, 2, seed=5)

    def step(deterministic):
        q, k, v = (t.detach().clone().requires_grad_(True) for t in (q0, k0, v0))
        out = flash_cuda.flash_attn_func(q, k, v, 0.3, causal=True, deterministic=deterministic)
        out.backward(dout)
        lse = fwd(q0, k0, v0, 0.3, causal=True)[1]
        return out, lse, q.grad, k.grad, v.grad

    for deterministic in (False, True):
        torch.manual_seed(1234)
        a = step(deterministic)
        torch.manual_seed(1234)
        b = step(deterministic)
        torch.manual_seed(4321)
        c = step(deterministic)
        for name, x, y in zip(("out", "lse", "dq", "dk", "dv"), a, b):
            if name == "dq" and not deterministic:
                assert torch.allclose(x.float(), y.float(), atol=1e-2, rtol=1e-2)
            else:
                assert torch.equal(x, y), name
        assert not torch.equal(a[0], c[0])
        assert not torch.equal(a[3], c[3])


def test_rng_state_advances():
    q, k, v, _ = make_inputs(torch.float16, 64, 64, 64, 4, 4)
    torch.manual_seed(0)
    out1, _, _, rs1 = fwd(q, k, v, 0.5)
    out2, _, _, rs2 = fwd(q, k, v, 0.5)
    assert rs1[0] == rs2[0] and rs2[1] >= rs1[1] + 2 * 4  # b * h counters per call
    assert not torch.equal(out1, out2)
    out1b = fwd(q, k, v, 0.5, rng_state=rs1)[0]
    assert torch.equal(out1, out1b)


# ----------------------------------------------------------------------------------------------
# CUDA graphs
# ----------------------------------------------------------------------------------------------

def test_cuda_graph_advances_offset():
    if 64 not in built_head_dims():  # capture needs the kernel; the reference path refuses it
        pytest.skip("head dim 64 not built (FLASH_CUDA_HEADDIMS)")
    q, k, v, dout = make_inputs(torch.float16, 64, 200, 200, 4, 2, seed=9)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture
        for _ in range(2):
            o, l_, _, r = fwd(q, k, v, 0.3)
            bwd(dout, q, k, v, o, l_, 0.3, r)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse, _, rs = fwd(q, k, v, 0.3)
        dq, dk, dv = bwd(dout, q, k, v, out, lse, 0.3, rs)
    results = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        results.append([t.clone() for t in (out, lse, rs, dq, dk, dv)])
    (o1, l1, r1, dq1, dk1, dv1), (o2, l2, r2, *_) = results
    assert r1[0] == r2[0] and r2[1] > r1[1], "the offset must advance between replays"
    assert not torch.equal(o1, o2)
    assert torch.equal(l1, l2)
    # Each replay equals the eager call with the rng_state the graph wrote.
    o_e, l_e, _, _ = fwd(q, k, v, 0.3, rng_state=r1)
    assert torch.equal(o_e, o1) and torch.equal(l_e, l1)
    dq_e, dk_e, dv_e = bwd(dout, q, k, v, o_e, l_e, 0.3, r1)
    assert torch.equal(dk_e, dk1) and torch.equal(dv_e, dv1)
    assert torch.allclose(dq_e.float(), dq1.float(), atol=1e-2, rtol=1e-2)
