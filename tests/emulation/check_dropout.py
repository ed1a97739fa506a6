"""Checks dropout in the sm80 forward and backward kernels on the CPU emulator.

    /work/venv/bin/python tests/emulation/check_dropout.py [--quick]

Oracle: the CPU reference ops torch.ops.flash_cuda.fwd / bwd on fp64 copies of the inputs with
the same rng_state (they draw the mask of csrc/kernels/philox.cuh on the host). Checks:
  - mask: with V = identity (d >= sk) the kernel's output row i is P[i, :] o keep / (1 - p), so
    its zero pattern is the kernel's mask; it must equal the reference's (S_dmask sign bit)
    bitwise on every visible element; the kept fraction is reported;
  - values: max|out - ref| <= 2 max|out_pt - ref| + 1e-5 (DESIGN.md section 9), out_pt the naive
    math in the input dtype with the reference's mask; lse with tests/test_fwd_gpu.py's rule and
    bitwise equal to the lse of the same kernel dropping nothing (lse of the undropped softmax);
    gradients with the 3x rule;
  - philox_on_device (the CUDA-graph path: seed / offset read through device pointers): same
    results, and the forward writes the (seed, offset) it used to rng_state.
"""

from __future__ import annotations

import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(ROOT))

import flash_cuda  # noqa: E402,F401  (registers torch.ops.flash_cuda)
from bwd_driver import run_bwd_emulated  # noqa: E402
from driver import run_fwd_emulated  # noqa: E402
from naive_attention import naive_attention  # noqa: E402

ops = torch.ops.flash_cuda


def ref_fwd(q, k, v, p, rng_state, causal, window, softcap=0.0, alibi=None):
    """fp64 reference forward: out, lse, keep (b, h, sq, sk) from the S_dmask sign bit."""
    out, lse, s_dmask, rs = ops.fwd(q.double(), k.double(), v.double(), alibi, p,
                                    q.shape[-1] ** -0.5, causal, window[0], window[1], softcap,
                                    True, rng_state)
    assert torch.equal(rs, rng_state)
    sq, sk = q.shape[1], k.shape[1]
    keep = ~torch.signbit(s_dmask[:, :, :sq, :sk])
    return out, lse, keep


def close(name, got, ref, pt, factor):
    err = (got.double() - ref).abs().max().item()
    tol = factor * (pt.double() - ref).abs().max().item() + 1e-5
    bad = not (err <= tol) or torch.isnan(got).any().item()
    return not bad, f"{name} {err:.2e}/{tol:.2e}{' FAIL' if bad else ''}"


def rng_state_for(seed):
    g = torch.Generator().manual_seed(seed)
    s = int(torch.randint(-(1 << 62), 1 << 62, (1,), generator=g))
    off = int(torch.randint(0, 1 << 40, (1,), generator=g)) | ((1 << 32) - 2)  # crosses 2^32
    return torch.tensor([s, off], dtype=torch.int64)


def check_mask(dtype, d, sq, sk, h, hk, p, causal=False, window=(-1, -1), on_device=False, seed=0):
    """Bitwise mask check through V = identity (keys < d)."""
    assert sk <= d
    torch.manual_seed(seed)
    b = 2
    q = (0.1 * torch.randn(b, sq, h, d)).to(dtype)
    k = (0.1 * torch.randn(b, sk, hk, d)).to(dtype)
    v = torch.zeros(b, sk, hk, d, dtype=dtype)
    v[:, torch.arange(sk), :, torch.arange(sk)] = 1
    rs = rng_state_for(seed)
    out, lse, written = run_fwd_emulated(q, k, v, causal=causal, window=window, dropout_p=p,
                                         rng_state=rs, philox_on_device=on_device,
                                         return_rng_state=True)
    _, _, keep_ref = ref_fwd(q, k, v, p, rs, causal, window)
    keep_kernel = (out[..., :sk] != 0).permute(0, 2, 1, 3)  # (b, h, sq, sk)
    visible = ref_visible(sq, sk, causal, window)
    diff = ((keep_kernel != keep_ref) & visible).sum().item()
    frac = keep_kernel[visible.expand_as(keep_kernel)].double().mean().item()
    ok = diff == 0 and abs(frac - (1 - p)) < 0.05
    msg = f"mask diffs {diff}, kept {frac:.3f} (1-p {1 - p:.3f})"
    if on_device:
        ok &= torch.equal(written, rs)
        msg += f", rng_state written {written.tolist() == rs.tolist()}"
    return ok, msg


def ref_visible(sq, sk, causal, window):
    from naive_attention import normalize_window, visible_mask
    left, right = normalize_window(causal, window, sk)
    return visible_mask(sq, sk, left, right)[None, None]


def lse_check(lse, lse_ref, lse_pt):
    """tests/test_fwd_gpu.py's lse rule: 2 x the input-dtype naive error + 1e-4 (1 + max|lse|)."""
    fin = torch.isfinite(lse_ref)
    if not torch.equal(fin, torch.isfinite(lse)):
        return False, "lse inf pattern FAIL"
    if not fin.any():
        return True, "lse all inf"
    err = (lse[fin].double() - lse_ref[fin]).abs().max().item()
    tol = 2 * (lse_pt.double()[fin] - lse_ref[fin]).abs().max().item() + \
        1e-4 * (1 + lse_ref[fin].abs().max().item())
    return err <= tol, f"lse {err:.2e}/{tol:.2e}{'' if err <= tol else ' FAIL'}"


def check_fwd(dtype, d, sq, sk, h, hk, p, causal=False, window=(-1, -1), softcap=0.0,
              alibi=False, on_device=False, seed=0):
    torch.manual_seed(seed)
    b = 2
    q = torch.randn(b, sq, h, d, dtype=dtype)
    k = torch.randn(b, sk, hk, d, dtype=dtype)
    v = torch.randn(b, sk, hk, d, dtype=dtype)
    slopes = torch.rand(b, h) * 0.5 if alibi else None
    rs = rng_state_for(seed)
    out, lse = run_fwd_emulated(q, k, v, causal=causal, window=window, softcap=softcap,
                                alibi_slopes=slopes, dropout_p=p, rng_state=rs,
                                philox_on_device=on_device)
    ref, lse_ref, keep = ref_fwd(q, k, v, p, rs, causal, window, softcap, slopes)
    pt, lse_pt = naive_attention(q, k, v, causal=causal, window=window, softcap=softcap,
                                 alibi_slopes=slopes, dropout_keep=keep, dropout_p=p)
    ok, msg = close("out", out, ref, pt, 2)
    lse_ok, lse_msg = lse_check(lse, lse_ref, lse_pt)
    # lse is that of the undropped softmax: bitwise that of the same kernel dropping nothing
    # (p = 1e-7: the dropout kernel and tiles, keep threshold 65536).
    _, lse_nodrop = run_fwd_emulated(q, k, v, causal=causal, window=window, softcap=softcap,
                                     alibi_slopes=slopes, dropout_p=1e-7, rng_state=rs)
    same = torch.equal(lse, lse_nodrop)
    return ok and lse_ok and same, msg + f" {lse_msg}, lse == lse(p=0) {same}"


def check_varlen_fwd(dtype, d, lens_q, lens_k, h, hk, p, causal=False, seed=0):
    """varlen: rows / keys relative to each sequence, sequence index as the batch of the mask."""
    torch.manual_seed(seed)
    cu = lambda lens: torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))],  # noqa: E731
                                   dtype=torch.int32)
    cu_q, cu_k = cu(lens_q), cu(lens_k)
    q = torch.randn(sum(lens_q), h, d, dtype=dtype)
    k = torch.randn(sum(lens_k), hk, d, dtype=dtype)
    v = torch.randn(sum(lens_k), hk, d, dtype=dtype)
    rs = rng_state_for(seed)
    mq, mk = max(lens_q), max(lens_k)
    out, lse = run_fwd_emulated(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                max_seqlen_q=mq, max_seqlen_k=mk, dropout_p=p, rng_state=rs)
    ref, lse_ref, s_dmask, _ = ops.varlen_fwd(q.double(), k.double(), v.double(), cu_q, cu_k, None,
                                              None, None, mq, mk, p, d ** -0.5, causal, -1,
                                              0 if causal else -1, 0.0, True, rs)
    pt = torch.zeros_like(q)
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq == 0:
            continue
        sl_q, sl_k = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        keep = ~torch.signbit(s_dmask[i:i + 1, :, :lq, :lk])
        pt[sl_q] = naive_attention(q[None, sl_q], k[None, sl_k], v[None, sl_k], causal=causal,
                                   dropout_keep=keep, dropout_p=p)[0][0]
    ok, msg = close("out", out, ref, pt, 2)
    _, lse_nodrop = run_fwd_emulated(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                     max_seqlen_q=mq, max_seqlen_k=mk, dropout_p=1e-7,
                                     rng_state=rs)
    same = torch.equal(lse, lse_nodrop)
    return ok and same, msg + f", lse == lse(p=0) {same}"


def grads(q, k, v, dout, **kw):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, _ = naive_attention(q, k, v, **kw)
    out.backward(dout.to(out.dtype))
    return q.grad, k.grad, v.grad


def check_bwd(dtype, d, sq, sk, h, hk, p, causal=False, window=(-1, -1), on_device=False, seed=0):
    torch.manual_seed(seed)
    b = 2
    q = torch.randn(b, sq, h, d, dtype=dtype)
    k = torch.randn(b, sk, hk, d, dtype=dtype)
    v = torch.randn(b, sk, hk, d, dtype=dtype)
    dout = torch.randn(b, sq, h, d, dtype=dtype)
    rs = rng_state_for(seed)
    out64, lse, keep = ref_fwd(q, k, v, p, rs, causal, window)
    ref = ops.bwd(dout.double(), q.double(), k.double(), v.double(), out64, lse, None, p,
                  d ** -0.5, causal, window[0], window[1], 0.0, False, rs)
    kw = dict(causal=causal, window=window, dropout_keep=keep, dropout_p=p)
    pt = grads(q, k, v, dout, **kw)
    got = run_bwd_emulated(dout, q, k, v, out64.to(dtype), lse.float(), causal=causal,
                           window=window, dropout_p=p, rng_state=rs, philox_on_device=on_device)
    ok, msgs = True, []
    for name, g, r, t in zip(("dq", "dk", "dv"), got, ref, pt):
        o, m = close(name, g, r, t, 3)
        ok &= o
        msgs.append(m)
    return ok, " ".join(msgs)


def main():
    quick = "--quick" in sys.argv
    f16, b16 = torch.float16, torch.bfloat16
    cases = [
        (check_mask, (f16, 128, 70, 113, 4, 1, 0.3), dict(seed=1)),
        (check_mask, (b16, 64, 33, 64, 2, 2, 0.5), dict(causal=True, on_device=True, seed=2)),
        (check_fwd, (f16, 64, 113, 203, 2, 2, 0.17), dict(seed=3)),
        (check_fwd, (b16, 128, 70, 113, 4, 1, 0.5), dict(causal=True, seed=4)),
        (check_fwd, (f16, 59, 17, 40, 2, 1, 0.3), dict(window=(17, 5), on_device=True, seed=5)),
        (check_fwd, (b16, 64, 33, 70, 2, 2, 0.2), dict(softcap=5.0, alibi=True, seed=6)),
        (check_fwd, (f16, 32, 70, 113, 2, 1, 0.3), dict(causal=True, seed=12)),
        (check_fwd, (b16, 96, 113, 70, 2, 2, 0.5), dict(window=(30, 10), seed=13)),
        (check_fwd, (b16, 160, 17, 90, 2, 2, 0.4), dict(seed=14)),
        (check_mask, (f16, 256, 40, 200, 2, 1, 0.3), dict(seed=15)),
        (check_varlen_fwd, (b16, 64, [17, 0, 130, 64], [40, 5, 129, 64], 4, 2, 0.4),
         dict(causal=True, seed=11)),
        (check_bwd, (f16, 64, 113, 203, 2, 2, 0.17), dict(seed=7)),
        (check_bwd, (b16, 128, 70, 113, 4, 1, 0.5), dict(causal=True, seed=8)),
        (check_bwd, (f16, 64, 70, 40, 2, 1, 0.3), dict(window=(17, 5), on_device=True, seed=9)),
        (check_bwd, (b16, 128, 1, 17, 2, 2, 0.4), dict(seed=10)),
        # d >= 192: the two-pass key blocks (the mask replayed in both passes)
        (check_bwd, (b16, 256, 70, 130, 2, 1, 0.3), dict(causal=True, seed=16)),
        (check_bwd, (f16, 192, 97, 150, 2, 2, 0.4), dict(seed=17)),
    ]
    if quick:
        cases = cases[:2] + cases[10:12]
    failures = 0
    for fn, args, kw in cases:
        t = time.time()
        ok, msg = fn(*args, **kw)
        failures += not ok
        print(("ok  " if ok else "BAD ") + f"{fn.__name__}{args} {kw} {msg} ({time.time() - t:.1f}s)",
              flush=True)
    print(f"{len(cases) - failures}/{len(cases)} passed")
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
