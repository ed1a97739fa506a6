"""Checks the sm80 backward kernels on the CPU emulator against the fp64 naive oracle.

    /work/venv/bin/python tests/emulation/check_bwd.py [--quick]

Rule (DESIGN.md section 9, gradients): max|g - g_ref| <= 3 max|g_pt - g_ref| + 1e-5, g_ref from
autograd through the naive attention in fp64, g_pt the same naive math in the input dtype.
"""

from __future__ import annotations

import itertools
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bwd_driver import run_bwd_emulated  # noqa: E402
from naive_attention import naive_attention  # noqa: E402


def grads(q, k, v, dout, **kw):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, _ = naive_attention(q, k, v, **kw)
    out.backward(dout.to(out.dtype))
    return q.grad, k.grad, v.grad


def check(dtype, d, sq, sk, causal, window, h, hk, b=1, transpose=False, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(b, sq, h, d, dtype=dtype)
    k = torch.randn(b, sk, hk, d, dtype=dtype)
    v = torch.randn(b, sk, hk, d, dtype=dtype)
    dout = torch.randn(b, sq, h, d, dtype=dtype)
    if transpose:  # non-contiguous dout / q (seq and head dims swapped in storage)
        dout = torch.randn(b, h, sq, d, dtype=dtype).transpose(1, 2)
        q = torch.randn(b, h, sq, d, dtype=dtype).transpose(1, 2)
    kw = dict(causal=causal, window=window)
    out64, lse = naive_attention(q.double(), k.double(), v.double(), **kw)
    out = out64.to(dtype)
    ref = grads(q.double(), k.double(), v.double(), dout.double(), **kw)
    pt = grads(q, k, v, dout, **kw)  # the same naive math in the input dtype
    got = run_bwd_emulated(dout, q, k, v, out, lse.float(), causal=causal, window=window)
    ok = True
    msgs = []
    for name, g, r, p in zip(("dq", "dk", "dv"), got, ref, pt):
        err = (g.double() - r).abs().max().item()
        tol = 3 * (p.double() - r).abs().max().item() + 1e-5
        bad = not (err <= tol) or torch.isnan(g).any().item()
        ok &= not bad
        msgs.append(f"{name} {err:.2e}/{tol:.2e}{' FAIL' if bad else ''}")
    return ok, " ".join(msgs)


def main():
    quick = "--quick" in sys.argv
    cases = []
    shapes = [(1, 1), (113, 203), (128, 128), (70, 40)] if not quick else [(113, 203), (70, 40)]
    masks = [(False, (-1, -1)), (True, (-1, -1)), (False, (17, 5))]
    for dtype, d, (sq, sk), (causal, window), (h, hk) in itertools.product(
        (torch.float16, torch.bfloat16), (64, 128), shapes, masks, ((2, 2), (4, 1))
    ):
        cases.append((dtype, d, sq, sk, causal, window, h, hk))
    if quick:
        cases = cases[::5]
    failures = 0
    for c in cases:
        t = time.time()
        ok, msg = check(*c)
        failures += not ok
        print(("ok  " if ok else "BAD ") + str(c) + " " + msg + f" ({time.time() - t:.1f}s)", flush=True)
    print(f"{len(cases) - failures}/{len(cases)} passed")
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
