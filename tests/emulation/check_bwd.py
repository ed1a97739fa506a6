"""Checks the sm80 backward kernels on the CPU emulator against the fp64 naive oracle.

    /work/venv/bin/python tests/emulation/check_bwd.py [--quick] [--d=64|--d=128] [--sm90]
    (d64 / d96 / d128 / d192 / d256 without dropout run bwd_v2.cuh, as the launcher does;
    the rest bwd.cuh; FLASH_CUDA_EMU_BWD_TILE=n: the v2 tuning variant n of bwd_tune_configs.h)

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

# --sm90: the sm90 backward (kernels/sm90/bwd_sm90.cuh) where it covers a case.
SM90 = "--sm90" in sys.argv
from driver import normalize_mask  # noqa: E402
from naive_attention import naive_attention  # noqa: E402


def grads(q, k, v, dout, **kw):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, _ = naive_attention(q, k, v, **kw)
    out.backward(dout.to(out.dtype))
    return q.grad, k.grad, v.grad


def check(dtype, d, sq, sk, causal, window, h, hk, b=1, transpose=False, seed=0, softcap=0.0,
          alibi=False, deterministic=False, splits=1, varlen_lens=None, sm90=None):
    """One case. varlen_lens: list of (seqlen_q, seqlen_k) per sequence (then sq / sk / b are
    ignored; packed inputs, the window normalised with the max seqlen_k as the host does).
    sm90: run the sm90 backward where it covers the case (default: --sm90 on the command line);
    bwd_driver.LAST_STDOUT says whether it ran."""
    sm90 = SM90 if sm90 is None else sm90
    torch.manual_seed(seed)
    if varlen_lens is not None:
        return check_varlen(dtype, d, varlen_lens, causal, window, h, hk, softcap=softcap,
                            alibi=alibi, deterministic=deterministic, splits=splits, sm90=sm90)
    q = torch.randn(b, sq, h, d, dtype=dtype)
    k = torch.randn(b, sk, hk, d, dtype=dtype)
    v = torch.randn(b, sk, hk, d, dtype=dtype)
    dout = torch.randn(b, sq, h, d, dtype=dtype)
    if transpose:  # non-contiguous dout / q (seq and head dims swapped in storage)
        dout = torch.randn(b, h, sq, d, dtype=dtype).transpose(1, 2)
        q = torch.randn(b, h, sq, d, dtype=dtype).transpose(1, 2)
    # alibi=True: (b, h) slopes; alibi="h": (h) slopes shared by the batch
    slopes = (torch.rand(h) if alibi == "h" else torch.rand(b, h)) * 0.3 if alibi else None
    kw = dict(causal=causal, window=window, softcap=softcap)
    out64, lse = naive_attention(q.double(), k.double(), v.double(), alibi_slopes=slopes, **kw)
    out = out64.to(dtype)
    ref = grads(q.double(), k.double(), v.double(), dout.double(), alibi_slopes=slopes, **kw)
    pt = grads(q, k, v, dout, alibi_slopes=slopes, **kw)  # the same naive math in the input dtype
    got = run_bwd_emulated(dout, q, k, v, out, lse.float(), alibi_slopes=slopes,
                           deterministic=deterministic, splits=splits, sm90=sm90, **kw)
    return compare(got, ref, pt)


def compare(got, ref, pt):
    ok = True
    msgs = []
    for name, g, r, p in zip(("dq", "dk", "dv"), got, ref, pt):
        err = (g.double() - r).abs().max().item()
        tol = 3 * (p.double() - r).abs().max().item() + 1e-5
        bad = not (err <= tol) or torch.isnan(g).any().item()
        ok &= not bad
        msgs.append(f"{name} {err:.2e}/{tol:.2e}{' FAIL' if bad else ''}")
    return ok, " ".join(msgs)


def check_varlen(dtype, d, lens, causal, window, h, hk, softcap=0.0, alibi=False,
                 deterministic=False, splits=1, sm90=False, max_seqlen_q=None):
    """max_seqlen_q: what the kernel is told (default: the longest sequence; smaller is an
    invalid input the host's value checks would reject, which the kernel must survive)."""
    b = len(lens)
    max_q, max_k = max(lq for lq, _ in lens), max(lk for _, lk in lens)
    causal_n, left, right = normalize_mask(causal, window[0], window[1], max_k)
    cu_q = torch.tensor([0] + list(itertools.accumulate(lq for lq, _ in lens)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lk for _, lk in lens)), dtype=torch.int32)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    q = torch.randn(tq, h, d, dtype=dtype)
    k = torch.randn(tk, hk, d, dtype=dtype)
    v = torch.randn(tk, hk, d, dtype=dtype)
    dout = torch.randn(tq, h, d, dtype=dtype)
    slopes = torch.rand(b, h) * 0.3 if alibi else None
    outs, lses = [], []
    refs = [torch.zeros(tq, h, d, dtype=torch.float64), torch.zeros(tk, hk, d, dtype=torch.float64),
            torch.zeros(tk, hk, d, dtype=torch.float64)]
    pts = [torch.zeros(tq, h, d, dtype=dtype), torch.zeros(tk, hk, d, dtype=dtype),
           torch.zeros(tk, hk, d, dtype=dtype)]
    for i, (lq, lk) in enumerate(lens):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        kw = dict(window=(left, right), softcap=softcap, normalize=False,
                  alibi_slopes=None if slopes is None else slopes[i:i + 1])
        sub = [t[None] for t in (q[qs], k[ks], v[ks], dout[qs])]
        o64, l = naive_attention(*(t.double() for t in sub[:3]), **kw)
        outs.append(o64[0].to(dtype))
        lses.append(l[0].float())
        for acc, g in ((refs, grads(*(t.double() for t in sub), **kw)), (pts, grads(*sub, **kw))):
            acc[0][qs] = g[0][0].to(acc[0].dtype)
            acc[1][ks] = g[1][0].to(acc[1].dtype)
            acc[2][ks] = g[2][0].to(acc[2].dtype)
    out = torch.cat(outs)
    lse = torch.cat(lses, dim=1)  # (h, total_q)
    got = run_bwd_emulated(dout, q, k, v, out, lse, causal=causal, window=window, softcap=softcap,
                           alibi_slopes=slopes, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                           max_seqlen_q=max_q if max_seqlen_q is None else max_seqlen_q,
                           max_seqlen_k=max_k, deterministic=deterministic,
                           splits=splits, sm90=sm90)
    return compare(got, refs, pts)


# Feature cases (head dims, softcap, ALiBi, varlen, deterministic): (args, kwargs) of check().
F16, BF16 = torch.float16, torch.bfloat16
FEATURE_CASES = [
    # every kernel head dim (padded dims 40, 59, 80, 111 too), odd lengths, masks, GQA
    ((F16, 32, 113, 203, True, (-1, -1), 4, 1), {}),
    ((BF16, 40, 70, 40, False, (17, 5), 2, 2), {}),
    ((F16, 59, 113, 203, False, (-1, -1), 2, 1), {"transpose": True}),
    ((BF16, 80, 113, 203, True, (-1, -1), 2, 2), {}),
    ((F16, 96, 70, 40, False, (17, 5), 4, 1), {}),
    ((BF16, 111, 113, 203, False, (-1, -1), 2, 1), {}),
    ((F16, 160, 113, 203, True, (-1, -1), 2, 1), {}),
    ((BF16, 192, 70, 40, False, (17, 5), 2, 2), {}),
    ((F16, 224, 113, 203, False, (-1, -1), 2, 2), {}),
    ((BF16, 256, 113, 203, True, (-1, -1), 2, 1), {}),
    ((F16, 64, 1, 1, False, (-1, -1), 2, 2), {"softcap": 5.0}),
    # softcap / ALiBi / both
    ((F16, 64, 113, 203, True, (-1, -1), 2, 1), {"softcap": 2.0}),
    ((BF16, 128, 70, 40, False, (17, 5), 2, 2), {"softcap": 1.5}),
    ((F16, 64, 113, 203, False, (-1, -1), 4, 1), {"alibi": True}),
    ((BF16, 96, 113, 203, True, (-1, -1), 2, 2), {"alibi": True}),
    ((F16, 128, 113, 203, True, (-1, -1), 2, 1), {"alibi": True, "softcap": 3.0}),
    ((BF16, 32, 70, 40, False, (17, 5), 2, 1), {"alibi": True, "softcap": 3.0}),
    ((F16, 256, 70, 40, False, (17, 5), 2, 2), {"alibi": True}),
    ((BF16, 160, 113, 203, False, (-1, -1), 2, 1), {"softcap": 2.0}),
    # rows with no visible key (causal, sq > sk)
    ((F16, 64, 203, 113, True, (-1, -1), 2, 1), {"alibi": True}),
    # deterministic dq slices (3 key blocks of 128 over 2 slices)
    ((F16, 64, 150, 300, False, (-1, -1), 2, 1), {"deterministic": True, "splits": 2}),
    ((BF16, 128, 150, 300, True, (-1, -1), 2, 2), {"deterministic": True, "splits": 3}),
    ((F16, 256, 70, 150, False, (-1, -1), 2, 1), {"deterministic": True, "splits": 2}),
    # varlen (lengths incl. 1, seqlen_q > seqlen_k, rows with no key)
    ((F16, 64, 0, 0, False, (-1, -1), 2, 1),
     {"varlen_lens": [(1, 1), (37, 90), (130, 70), (5, 200)]}),
    ((BF16, 128, 0, 0, True, (-1, -1), 2, 2),
     {"varlen_lens": [(70, 20), (1, 150), (64, 64)]}),
    ((F16, 96, 0, 0, False, (17, 5), 4, 1),
     {"varlen_lens": [(33, 140), (1, 1), (90, 45)], "softcap": 2.0, "alibi": True}),
    ((BF16, 32, 0, 0, True, (-1, -1), 2, 1),
     {"varlen_lens": [(150, 200), (7, 3)], "deterministic": True, "splits": 2}),
    ((F16, 224, 0, 0, False, (-1, -1), 2, 2),
     {"varlen_lens": [(20, 70), (1, 9)], "alibi": True}),
    # extra: window normalised with max_seqlen_k only; varlen / fixed deterministic with
    # several key blocks per slice; softcap with rows without keys; (h) slopes, b = 2
    ((BF16, 64, 0, 0, False, (150, 3), 2, 1),
     {"varlen_lens": [(50, 20), (30, 200), (9, 140)]}),
    ((F16, 128, 0, 0, False, (-1, -1), 4, 2),
     {"varlen_lens": [(200, 300), (1, 130), (77, 260)], "deterministic": True, "splits": 3}),
    ((F16, 96, 200, 333, False, (40, 7), 2, 2), {"b": 2, "deterministic": True, "splits": 2}),
    ((BF16, 256, 130, 70, True, (-1, -1), 2, 1), {"softcap": 1.5}),
    ((F16, 160, 113, 203, True, (-1, -1), 4, 2), {"b": 2, "alibi": "h", "transpose": True}),
    # the two-pass key blocks of d >= 192 (dV pass, then dK + dQ pass): odd and even numbers
    # of query blocks per key block (the second pass continues the first's Q / dO buffer
    # alternation), softcap, ALiBi, both, deterministic slices, varlen, window, GQA
    ((F16, 192, 130, 200, True, (-1, -1), 2, 1), {"softcap": 2.0, "deterministic": True,
                                                  "splits": 2}),
    ((BF16, 224, 150, 150, False, (40, 7), 4, 2), {"alibi": "h"}),
    ((BF16, 256, 0, 0, True, (-1, -1), 2, 1),
     {"varlen_lens": [(70, 130), (1, 1), (33, 20)], "deterministic": True, "splits": 2}),
    ((BF16, 192, 0, 0, False, (-1, -1), 2, 2),
     {"varlen_lens": [(90, 70), (5, 140)], "softcap": 1.5, "alibi": True}),
    ((F16, 224, 70, 150, True, (-1, -1), 2, 1), {"softcap": 3.0, "alibi": True,
                                                 "transpose": True}),
    ((F16, 256, 97, 130, False, (-1, -1), 2, 2), {}),
]


def main():
    quick = "--quick" in sys.argv
    if "--features" in sys.argv:
        failures = 0
        only = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")]
        for i, (args, kw) in enumerate(FEATURE_CASES):
            if only and str(i) not in only[0].split(","):
                continue
            t = time.time()
            ok, msg = check(*args, **kw)
            failures += not ok
            print(("ok  " if ok else "BAD ") + f"[{i}] {args} {kw} {msg} ({time.time() - t:.1f}s)",
                  flush=True)
        print(f"{failures} failures")
        return failures
    cases = []
    shapes = [(1, 1), (113, 203), (128, 128), (70, 40)] if not quick else [(113, 203), (70, 40)]
    masks = [(False, (-1, -1)), (True, (-1, -1)), (False, (17, 5))]
    # --d=128: one head dim only
    dims = [int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--d=")] or [64, 128]
    for dtype, d, (sq, sk), (causal, window), (h, hk) in itertools.product(
        (torch.float16, torch.bfloat16), dims, shapes, masks, ((2, 2), (4, 1))
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
