"""The CPU ops (the exact blockwise reference of csrc/reference/) against the naive oracle.

Everything runs on the CPU. fp64 comparisons use a tolerance of ~1e-10 for outputs and
gradients; the lse the ops return is fp32 (DESIGN.md section 4), so it is compared at fp32
precision. The dropout mask is rebuilt here with a pure numpy Philox4x32-10, independent of the
C++ (checked against Random123's known-answer vectors).
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import flash_cuda  # noqa: F401  (registers torch.ops.flash_cuda)

sys.path.insert(0, os.path.dirname(__file__))
from naive_attention import alibi_bias, naive_attention, normalize_window, visible_mask  # noqa: E402

ops = torch.ops.flash_cuda
F64 = torch.float64
INF = float("inf")
TOL = 1e-10


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors here are small: intra-op threads only add contention on a shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ----------------------------------------------------------------------------------------------
# Philox4x32-10 and the dropout mask of csrc/kernels/philox.cuh, in numpy
# ----------------------------------------------------------------------------------------------

_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, seed: int):
    """Ten Philox4x32 rounds; counters are uint64 arrays holding 32-bit values."""
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64((seed >> 32) & 0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in (c0, c1, c2, c3))
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _MASK32, \
            (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _MASK32
        k0 = (k0 + np.uint64(0x9E3779B9)) & _MASK32
        k1 = (k1 + np.uint64(0xBB67AE85)) & _MASK32
    return c0, c1, c2, c3


def test_philox_known_answers():
    # Random123 kat_vectors: philox4x32_10 with counter 0 / key 0 and all-ones.
    out = philox4x32_10(0, 0, 0, 0, 0)
    assert [int(x) for x in out] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = 0xFFFFFFFF
    out = philox4x32_10(ones, ones, ones, ones, (ones << 32) | ones)
    assert [int(x) for x in out] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def keep_threshold(p: float) -> int:
    t = np.float32(np.float32(1.0 - p) * np.float32(65536.0)) + np.float32(0.5)
    return 65536 if t >= np.float32(65536.0) else int(t)


def dropout_keep(seed: int, offset: int, p: float, bh_start: int, nbh: int, sq: int, sk: int):
    """bool (nbh, sq, sk): element (bh, i, j) kept iff lane j%8 of philox(seed; j//8, i, bh+offset)."""
    groups = (sk + 7) // 8
    stream = np.arange(bh_start, bh_start + nbh, dtype=np.uint64) + np.uint64(offset)
    shape = (nbh, sq, groups)
    c0 = np.broadcast_to(np.arange(groups, dtype=np.uint64)[None, None, :], shape)
    c1 = np.broadcast_to(np.arange(sq, dtype=np.uint64)[None, :, None], shape)
    c2 = np.broadcast_to((stream & _MASK32)[:, None, None], shape)
    c3 = np.broadcast_to((stream >> np.uint64(32))[:, None, None], shape)
    words = philox4x32_10(c0, c1, c2, c3, seed)
    lanes = []
    for w in words:
        lanes += [w & np.uint64(0xFFFF), w >> np.uint64(16)]
    u = np.stack(lanes, axis=-1).reshape(nbh, sq, groups * 8)[:, :, :sk]
    return torch.from_numpy(u < np.uint64(keep_threshold(p)))


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

def rand(*shape, dtype=F64, noncontig=False):
    if noncontig:  # last dim contiguous, the others strided
        return torch.randn(*shape[:-1], shape[-1] + 3, dtype=dtype)[..., 1:shape[-1] + 1]
    return torch.randn(*shape, dtype=dtype)


def slopes_for(kind, b, h):
    if kind is None:
        return None
    if kind == "h":
        return torch.rand(h, dtype=torch.float32) * 0.5
    return torch.rand(b, h, dtype=torch.float32) * 0.5


def naive_probs(q, k, scale, window, softcap, alibi):
    """P = exp(s - lse) (0 where masked), (b, h, sq, sk); window already normalised."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        s = s + alibi_bias(alibi, sq, sk, b, h, s.dtype, q.device)
    s = s.masked_fill(~visible_mask(sq, sk, window[0], window[1]), -INF)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.exp(s - lse).nan_to_num(0.0)


def check_lse(lse, ref):
    assert lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse), torch.isinf(ref)), "empty rows differ"
    fin = torch.isfinite(ref)
    if fin.any():
        torch.testing.assert_close(lse.double()[fin], ref.double()[fin], rtol=2e-7, atol=2e-6)
    assert (lse[~fin] == INF).all()


def assert_close64(x, ref, tol=TOL):
    assert not torch.isnan(x).any()
    err = (x.double() - ref.double()).abs().max().item() if x.numel() else 0.0
    assert err <= tol, f"max error {err}"


def random_window(rng, sk):
    kind = rng.choice(["both", "left", "right"])
    left = rng.randint(0, max(sk, 1) + 3) if kind != "right" else -1
    right = rng.randint(0, max(sk, 1) + 3) if kind != "left" else -1
    return left, right


def fwd_op(q, k, v, *, scale, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
           dropout_p=0.0, return_softmax=False, rng_state=None):
    return ops.fwd(q, k, v, alibi, dropout_p, scale, causal, window[0], window[1], softcap,
                   return_softmax, rng_state)


# ----------------------------------------------------------------------------------------------
# Fixed-length forward, fp64
# ----------------------------------------------------------------------------------------------

SHAPES = [  # (b, sq, sk, h, hk, d)
    (1, 1, 1, 1, 1, 40),
    (2, 17, 17, 4, 1, 59),
    (1, 113, 113, 8, 1, 80),
    (2, 17, 113, 8, 2, 111),
    (2, 113, 17, 4, 4, 256),
    (1, 1023, 1023, 2, 1, 64),
    (1, 1, 1023, 8, 8, 40),
    (1, 1023, 17, 4, 1, 59),
    (3, 300, 700, 8, 1, 32),
]
FEATURES = ["plain", "causal", "window", "softcap", "alibi_h", "alibi_bh",
            "causal_softcap_alibi", "window_softcap_alibi_bh"]


def feature_args(feature, b, h, sk, rng):
    causal = "causal" in feature
    window = random_window(rng, sk) if "window" in feature else (-1, -1)
    softcap = rng.choice([0.5, 3.0, 30.0]) if "softcap" in feature else 0.0
    alibi = slopes_for("bh" if "alibi_bh" in feature else "h" if "alibi" in feature else None, b, h)
    return causal, window, softcap, alibi


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fwd_fp64(shape, feature):
    b, sq, sk, h, hk, d = shape
    rng = random.Random(str((shape, feature)))
    torch.manual_seed(rng.randint(0, 1 << 30))
    causal, window, softcap, alibi = feature_args(feature, b, h, sk, rng)
    scale = rng.choice([1.0 / math.sqrt(d), 0.3])
    q, k, v = rand(b, sq, h, d, noncontig=True), rand(b, sk, hk, d), rand(b, sk, hk, d, noncontig=True)
    out, lse, s_dmask, rng_state = fwd_op(q, k, v, scale=scale, causal=causal, window=window,
                                          softcap=softcap, alibi=alibi)
    ref, lse_ref = naive_attention(q, k, v, softmax_scale=scale, causal=causal, window=window,
                                   softcap=softcap, alibi_slopes=alibi)
    assert out.shape == q.shape and out.dtype == F64
    assert_close64(out, ref)
    assert lse.shape == (b, h, sq)
    check_lse(lse, lse_ref)
    assert s_dmask.shape == (0,)
    assert rng_state.dtype == torch.int64 and rng_state.shape == (2,) and rng_state.device.type == "cpu"


@pytest.mark.parametrize("sq,sk", [(0, 17), (17, 0), (0, 0)])
def test_fwd_empty_sequences(sq, sk):
    q, k, v = rand(2, sq, 4, 40), rand(2, sk, 2, 40), rand(2, sk, 2, 40)
    out, lse, _, rs = fwd_op(q, k, v, scale=0.2, causal=True)
    assert out.shape == q.shape and lse.shape == (2, 4, sq)
    assert (out == 0).all() and (lse == INF).all()
    dq, dk, dv = ops.bwd(torch.randn_like(out), q, k, v, out, lse, None, 0.0, 0.2, True, -1, -1,
                         0.0, False, rs)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()


# ----------------------------------------------------------------------------------------------
# Dropout: mask, scaling, S_dmask, rng_state
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,causal,window,softcap,alibi", [
    ((2, 17, 113, 4, 2, 40), False, (-1, -1), 0.0, None),
    ((1, 113, 17, 8, 1, 59), True, (-1, -1), 5.0, "h"),
    ((2, 130, 300, 2, 2, 32), False, (40, 7), 0.0, "bh"),
])
@pytest.mark.parametrize("p", [0.17, 0.5])
def test_fwd_dropout(shape, causal, window, softcap, alibi, p):
    b, sq, sk, h, hk, d = shape
    torch.manual_seed(int(p * 100) + sq)
    q, k, v = rand(b, sq, h, d), rand(b, sk, hk, d), rand(b, sk, hk, d)
    alibi = slopes_for(alibi, b, h)
    scale = 1.0 / math.sqrt(d)
    out, lse, s_dmask, rng_state = fwd_op(q, k, v, scale=scale, causal=causal, window=window,
                                          softcap=softcap, alibi=alibi, dropout_p=p,
                                          return_softmax=True)
    seed, offset = (int(x) for x in rng_state)
    seed &= (1 << 64) - 1
    keep = dropout_keep(seed, offset, p, 0, b * h, sq, sk).view(b, h, sq, sk)
    assert 0.2 < keep.double().mean().item() < 0.95
    ref, lse_ref = naive_attention(q, k, v, softmax_scale=scale, causal=causal, window=window,
                                   softcap=softcap, alibi_slopes=alibi, dropout_keep=keep,
                                   dropout_p=p)
    assert_close64(out, ref)
    check_lse(lse, lse_ref)  # lse without dropout
    # S_dmask: P = exp(s - lse), negated where dropped, zero padding.
    r128 = lambda x: (x + 127) // 128 * 128  # noqa: E731
    assert s_dmask.shape == (b, h, r128(sq), r128(sk)) and s_dmask.dtype == F64
    wl, wr = normalize_window(causal, window, sk)
    probs = naive_probs(q, k, scale, (wl, wr), softcap, alibi)
    assert_close64(s_dmask[:, :, :sq, :sk], torch.where(keep, probs, -probs))
    assert (s_dmask[:, :, sq:, :] == 0).all() and (s_dmask[:, :, :, sk:] == 0).all()
    assert torch.equal(torch.signbit(s_dmask[:, :, :sq, :sk]), ~keep)
    # Replaying rng_state reproduces the call; a fresh call draws a new seed.
    out2 = fwd_op(q, k, v, scale=scale, causal=causal, window=window, softcap=softcap,
                  alibi=alibi, dropout_p=p, rng_state=rng_state)[0]
    assert torch.equal(out, out2)
    out3, _, _, rng3 = fwd_op(q, k, v, scale=scale, causal=causal, window=window,
                              softcap=softcap, alibi=alibi, dropout_p=p)
    assert not torch.equal(rng3, rng_state)


def test_dropout_offset_and_seed_from_torch():
    q, k, v = rand(1, 9, 3, 16), rand(1, 20, 3, 16), rand(1, 20, 3, 16)
    state = torch.tensor([(1 << 63) + 12345 - (1 << 64), (1 << 32) + 7], dtype=torch.int64)
    out = fwd_op(q, k, v, scale=0.25, dropout_p=0.3, rng_state=state)[0]
    keep = dropout_keep((1 << 63) + 12345, (1 << 32) + 7, 0.3, 0, 3, 9, 20).view(1, 3, 9, 20)
    ref, _ = naive_attention(q, k, v, softmax_scale=0.25, dropout_keep=keep, dropout_p=0.3)
    assert_close64(out, ref)
    torch.manual_seed(5)
    a = fwd_op(q, k, v, scale=0.25, dropout_p=0.3)[3]
    torch.manual_seed(5)
    b = fwd_op(q, k, v, scale=0.25, dropout_p=0.3)[3]
    assert torch.equal(a, b)


# ----------------------------------------------------------------------------------------------
# Backward, fp64, against autograd through the naive oracle
# ----------------------------------------------------------------------------------------------

BWD_CASES = [  # (b, sq, sk, h, hk, d), feature, dropout_p
    ((1, 1, 1, 1, 1, 40), "plain", 0.0),
    ((2, 17, 113, 4, 1, 59), "causal", 0.0),
    ((2, 113, 17, 8, 2, 80), "causal", 0.0),      # rows with no visible key
    ((1, 113, 113, 4, 4, 111), "window", 0.0),
    ((2, 17, 17, 8, 1, 256), "softcap", 0.0),
    ((1, 300, 280, 4, 2, 40), "causal_softcap_alibi", 0.0),
    ((2, 113, 300, 4, 1, 64), "window_softcap_alibi_bh", 0.0),
    ((2, 113, 300, 4, 2, 40), "alibi_h", 0.2),
    ((1, 200, 113, 8, 2, 59), "causal_softcap_alibi", 0.35),
]


@pytest.mark.parametrize("shape,feature,p", BWD_CASES, ids=[f"{c[1]}-{c[2]}-{c[0][1]}x{c[0][2]}" for c in BWD_CASES])
def test_bwd_fp64(shape, feature, p):
    b, sq, sk, h, hk, d = shape
    rng = random.Random(sq * 1000 + sk)
    torch.manual_seed(sq + sk)
    causal, window, softcap, alibi = feature_args(feature, b, h, sk, rng)
    scale = 1.0 / math.sqrt(d)
    q, k, v = rand(b, sq, h, d, noncontig=True), rand(b, sk, hk, d), rand(b, sk, hk, d)
    out, lse, _, rng_state = fwd_op(q, k, v, scale=scale, causal=causal, window=window,
                                    softcap=softcap, alibi=alibi, dropout_p=p)
    keep = None
    if p > 0:
        keep = dropout_keep(int(rng_state[0]) & ((1 << 64) - 1), int(rng_state[1]), p, 0, b * h,
                            sq, sk).view(b, h, sq, sk)
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref, _ = naive_attention(qr, kr, vr, softmax_scale=scale, causal=causal, window=window,
                             softcap=softcap, alibi_slopes=alibi, dropout_keep=keep, dropout_p=p)
    assert_close64(out, ref)
    dout = torch.randn(b, h, sq, d, dtype=F64).transpose(1, 2)  # non-contiguous
    ref.backward(dout)
    dq, dk, dv = ops.bwd(dout, q, k, v, out, lse, alibi, p, scale, causal, window[0], window[1],
                         softcap, False, rng_state)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert_close64(dq, qr.grad, 1e-9)
    assert_close64(dk, kr.grad, 1e-9)
    assert_close64(dv, vr.grad, 1e-9)


def test_rows_without_keys():
    # sq > sk causal (first rows see nothing) and a window that hides everything from some rows.
    torch.manual_seed(3)
    for (sq, sk, causal, window) in [(40, 10, True, (-1, -1)), (20, 30, False, (2, -1)),
                                     (30, 30, False, (-1, 0))]:
        q, k, v = rand(2, sq, 4, 16), rand(2, sk, 2, 16), rand(2, sk, 2, 16)
        out, lse, _, rs = fwd_op(q, k, v, scale=0.3, causal=causal, window=window)
        wl, wr = normalize_window(causal, window, sk)
        empty = ~visible_mask(sq, sk, wl, wr).any(-1)
        dq, dk, dv = ops.bwd(torch.randn_like(out), q, k, v, out, lse, None, 0.0, 0.3, causal,
                             window[0], window[1], 0.0, False, rs)
        for t in (out, lse, dq, dk, dv):
            assert not torch.isnan(t).any()
        if empty.any():
            assert (out[:, empty] == 0).all() and (lse[:, :, empty] == INF).all()
            assert (dq[:, empty] == 0).all()


# ----------------------------------------------------------------------------------------------
# gradcheck through a tiny autograd.Function over the fwd/bwd ops
# ----------------------------------------------------------------------------------------------

class _Attn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kw):
        out, lse, _, rs = ops.fwd(q, k, v, kw["alibi"], kw["p"], kw["scale"], kw["causal"],
                                  kw["window"][0], kw["window"][1], kw["softcap"], False,
                                  kw["rng_state"])
        ctx.save_for_backward(q, k, v, out, lse, rs)
        ctx.kw = kw
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, rs = ctx.saved_tensors
        kw = ctx.kw
        dq, dk, dv = ops.bwd(dout, q, k, v, out, lse, kw["alibi"], kw["p"], kw["scale"],
                             kw["causal"], kw["window"][0], kw["window"][1], kw["softcap"], False,
                             rs)
        return dq, dk, dv, None


class _VarlenAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, kw):
        out, lse, _, rs = ops.varlen_fwd(q, k, v, cu_q, cu_k, None, None, kw["alibi"],
                                         kw["max_q"], kw["max_k"], kw["p"], kw["scale"],
                                         kw["causal"], kw["window"][0], kw["window"][1],
                                         kw["softcap"], False, kw["rng_state"])
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, rs)
        ctx.kw = kw
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu_q, cu_k, rs = ctx.saved_tensors
        kw = ctx.kw
        dq, dk, dv = ops.varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, kw["alibi"],
                                    kw["max_q"], kw["max_k"], kw["p"], kw["scale"], kw["causal"],
                                    kw["window"][0], kw["window"][1], kw["softcap"], False, rs)
        return dq, dk, dv, None, None, None


@pytest.mark.parametrize("causal,window,softcap,alibi,p", [
    (False, (-1, -1), 0.0, None, 0.0),
    (True, (-1, -1), 2.0, "h", 0.0),
    (False, (3, 1), 0.0, "bh", 0.0),
    (True, (-1, -1), 1.5, "h", 0.3),
])
def test_gradcheck(causal, window, softcap, alibi, p):
    torch.manual_seed(11)
    q = torch.randn(2, 4, 2, 3, dtype=F64, requires_grad=True)
    k = torch.randn(2, 5, 1, 3, dtype=F64, requires_grad=True)
    v = torch.randn(2, 5, 1, 3, dtype=F64, requires_grad=True)
    kw = dict(alibi=slopes_for(alibi, 2, 2), p=p, scale=0.4, causal=causal, window=window,
              softcap=softcap, rng_state=torch.tensor([1234, 8], dtype=torch.int64))
    assert torch.autograd.gradcheck(lambda a, b, c: _Attn.apply(a, b, c, kw), (q, k, v),
                                    eps=1e-6, atol=1e-7, rtol=1e-6)


def test_gradcheck_varlen():
    torch.manual_seed(12)
    cu_q = torch.tensor([0, 3, 3, 6, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 6, 9], dtype=torch.int32)
    q = torch.randn(7, 2, 3, dtype=F64, requires_grad=True)
    k = torch.randn(9, 1, 3, dtype=F64, requires_grad=True)
    v = torch.randn(9, 1, 3, dtype=F64, requires_grad=True)
    for p, causal in [(0.0, True), (0.25, False)]:
        kw = dict(alibi=slopes_for("bh", 4, 2), p=p, scale=0.5, causal=causal, window=(-1, -1),
                  softcap=1.0, rng_state=torch.tensor([99, 3], dtype=torch.int64), max_q=3, max_k=4)
        assert torch.autograd.gradcheck(
            lambda a, b, c: _VarlenAttn.apply(a, b, c, cu_q, cu_k, kw), (q, k, v),
            eps=1e-6, atol=1e-7, rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# Low precision input: DESIGN.md section 9 rule against the fp64 oracle
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape,feature", [
    ((2, 113, 113, 4, 1, 64), "causal_softcap_alibi"),
    ((1, 17, 300, 8, 2, 111), "window"),
    ((2, 300, 17, 4, 4, 40), "plain"),
])
def test_low_precision(dtype, shape, feature):
    b, sq, sk, h, hk, d = shape
    rng = random.Random(sq + sk + d)
    torch.manual_seed(sq * 7 + d)
    causal, window, softcap, alibi = feature_args(feature, b, h, sk, rng)
    scale = 1.0 / math.sqrt(d)
    q, k, v = (t.to(dtype) for t in (rand(b, sq, h, d), rand(b, sk, hk, d), rand(b, sk, hk, d)))
    kw = dict(softmax_scale=scale, causal=causal, window=window, softcap=softcap, alibi_slopes=alibi)
    out, lse, _, rs = fwd_op(q, k, v, scale=scale, causal=causal, window=window, softcap=softcap,
                             alibi=alibi)
    assert out.dtype == dtype and lse.dtype == torch.float32
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    ref, lse_ref = naive_attention(qr, kr, vr, **kw)
    qp, kp, vp = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out_pt, _ = naive_attention(qp, kp, vp, **kw)
    err = (out.double() - ref).abs().max().item()
    err_pt = (out_pt.double() - ref).abs().max().item()
    assert err <= 2 * err_pt + 1e-5, (err, err_pt)
    fin = torch.isfinite(lse_ref)
    assert (lse.double() - lse_ref).abs()[fin].max().item() < 1e-4
    dout = torch.randn_like(out)
    ref.backward(dout.double())
    out_pt.backward(dout)
    grads = ops.bwd(dout, q, k, v, out, lse, alibi, 0.0, scale, causal, window[0], window[1],
                    softcap, False, rs)
    for g, g_ref, g_pt in zip(grads, (qr.grad, kr.grad, vr.grad), (qp.grad, kp.grad, vp.grad)):
        assert g.dtype == dtype
        e = (g.double() - g_ref).abs().max().item()
        e_pt = (g_pt.double() - g_ref).abs().max().item()
        assert e <= 3 * e_pt + 1e-5, (e, e_pt)


# ----------------------------------------------------------------------------------------------
# varlen (packed, seqused_k, paged)
# ----------------------------------------------------------------------------------------------

def random_lengths(rng, n, hi):
    lens = [rng.randint(0, hi) for _ in range(n)]
    lens[0], lens[-1] = 1, 0
    return lens


def cumsum(lens):
    return torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32)


@pytest.mark.parametrize("case", range(6))
def test_varlen_fwd_bwd(case):
    rng = random.Random(100 + case)
    torch.manual_seed(100 + case)
    n = rng.randint(3, 6)
    h, hk = rng.choice([(4, 4), (4, 1), (8, 2)])
    d = rng.choice([40, 59, 80, 111])
    lq = random_lengths(rng, n, 120)
    lk = random_lengths(rng, n, 150)
    lk[-2] = 0 if case % 2 else lk[-2]
    feature = ["plain", "causal", "window", "softcap", "causal_softcap_alibi",
               "window_softcap_alibi_bh"][case]
    causal, window, softcap, alibi = feature_args(feature, n, h, max(lk), rng)
    p = 0.3 if case in (2, 4) else 0.0
    scale = 1.0 / math.sqrt(d)
    pad_q = 3  # rows past cu_seqlens_q[-1]: out 0, lse +inf
    q = rand(sum(lq) + pad_q, h, d)
    k, v = rand(sum(lk), hk, d), rand(sum(lk), hk, d)
    cu_q, cu_k = cumsum(lq), cumsum(lk)
    mq, mk = max(lq), max(lk) + 2
    out, lse, s_dmask, rs = ops.varlen_fwd(q, k, v, cu_q, cu_k, None, None, alibi, mq, mk, p,
                                           scale, causal, window[0], window[1], softcap, p > 0, None)
    assert out.shape == q.shape and lse.shape == (h, q.shape[0])
    wl, wr = normalize_window(causal, window, mk)  # varlen: normalised with max_seqlen_k
    dout = rand(*q.shape)
    dq, dk, dv = ops.varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, alibi, mq, mk, p, scale,
                                causal, window[0], window[1], softcap, False, rs)
    seed = int(rs[0]) & ((1 << 64) - 1)
    for i in range(n):
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        qi = q[q0:q0 + lq[i]][None].clone().requires_grad_()
        ki = k[k0:k0 + lk[i]][None].clone().requires_grad_()
        vi = v[k0:k0 + lk[i]][None].clone().requires_grad_()
        keep = None
        if p > 0:
            keep = dropout_keep(seed, int(rs[1]), p, i * h, h, lq[i], lk[i])[None]
        al = None if alibi is None else (alibi if alibi.dim() == 1 else alibi[i:i + 1])
        ref, lse_ref = naive_attention(qi, ki, vi, softmax_scale=scale, window=(wl, wr),
                                       softcap=softcap, alibi_slopes=al, dropout_keep=keep,
                                       dropout_p=p, normalize=False)
        assert_close64(out[q0:q0 + lq[i]], ref[0])
        check_lse(lse[:, q0:q0 + lq[i]], lse_ref[0])
        if p > 0 and lq[i] and lk[i]:
            probs = naive_probs(qi.detach(), ki.detach(), scale, (wl, wr), softcap, al)[0]
            assert_close64(s_dmask[i, :, :lq[i], :lk[i]], torch.where(keep[0], probs, -probs))
            assert (s_dmask[i, :, lq[i]:] == 0).all() and (s_dmask[i, :, :, lk[i]:] == 0).all()
        if lq[i] and lk[i]:
            ref.backward(dout[q0:q0 + lq[i]][None])
            assert_close64(dq[q0:q0 + lq[i]], qi.grad[0], 1e-9)
            assert_close64(dk[k0:k0 + lk[i]], ki.grad[0], 1e-9)
            assert_close64(dv[k0:k0 + lk[i]], vi.grad[0], 1e-9)
        else:
            assert (dq[q0:q0 + lq[i]] == 0).all() and (dk[k0:k0 + lk[i]] == 0).all()
    assert (out[-pad_q:] == 0).all() and (lse[:, -pad_q:] == INF).all()
    assert (dq[-pad_q:] == 0).all()
    if p > 0:
        assert s_dmask.shape == (n, h, (mq + 127) // 128 * 128, (mk + 127) // 128 * 128)


@pytest.mark.parametrize("page", [1, 7, 16])
@pytest.mark.parametrize("seqused", [False, True])
def test_varlen_paged(page, seqused):
    rng = random.Random(page * 10 + seqused)
    torch.manual_seed(page * 10 + seqused)
    n, h, hk, d = 4, 8, 2, 59
    lq = random_lengths(rng, n, 40)
    lk = [rng.randint(1, 90) for _ in range(n)]
    lk[2] = 0
    used = [rng.randint(0, x) for x in lk] if seqused else lk
    max_blocks = (max(lk) + page - 1) // page + 1
    num_blocks = n * max_blocks + 3
    k_pages, v_pages = rand(num_blocks, page, hk, d), rand(num_blocks, page, hk, d)
    block_table = torch.randperm(num_blocks)[: n * max_blocks].view(n, max_blocks).to(torch.int32)
    q = rand(sum(lq), h, d)
    cu_q, cu_k = cumsum(lq), cumsum(lk)
    seqused_k = torch.tensor(used, dtype=torch.int32) if seqused else None
    causal = bool(page % 2)
    scale = 0.2
    out, lse, _, _ = ops.varlen_fwd(q, k_pages, v_pages, cu_q, cu_k, seqused_k, block_table, None,
                                    max(lq), max(lk), 0.0, scale, causal, -1, -1, 0.0, False, None)
    wl, wr = normalize_window(causal, (-1, -1), max(lk))
    for i in range(n):
        q0 = int(cu_q[i])
        pos = torch.arange(used[i])
        blk = block_table[i].long()[pos // page]
        ki, vi = k_pages[blk, pos % page][None], v_pages[blk, pos % page][None]
        ref, lse_ref = naive_attention(q[q0:q0 + lq[i]][None], ki, vi, softmax_scale=scale,
                                       window=(wl, wr), normalize=False)
        assert_close64(out[q0:q0 + lq[i]], ref[0])
        check_lse(lse[:, q0:q0 + lq[i]], lse_ref[0])


def test_varlen_seqused_unpaged():
    torch.manual_seed(21)
    lq, lk, used = [5, 1, 30], [10, 20, 31], [3, 0, 31]
    q, k, v = rand(sum(lq), 4, 40), rand(sum(lk), 1, 40), rand(sum(lk), 1, 40)
    cu_q, cu_k = cumsum(lq), cumsum(lk)
    out, lse, _, _ = ops.varlen_fwd(q, k, v, cu_q, cu_k, torch.tensor(used, dtype=torch.int32),
                                    None, None, 30, 31, 0.0, 0.3, True, -1, -1, 0.0, False, None)
    for i in range(3):
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        ref, lse_ref = naive_attention(q[q0:q0 + lq[i]][None], k[k0:k0 + used[i]][None],
                                       v[k0:k0 + used[i]][None], softmax_scale=0.3,
                                       window=(-1, 0), normalize=False)
        assert_close64(out[q0:q0 + lq[i]], ref[0])
        check_lse(lse[:, q0:q0 + lq[i]], lse_ref[0])


# ----------------------------------------------------------------------------------------------
# KV cache
# ----------------------------------------------------------------------------------------------

def rotary_ref(x, cos, sin, pos, interleaved):
    """x (n, H, d); cos/sin (s_ro, rd/2); pos (n,)."""
    rd = 2 * cos.shape[1]
    c, s = cos[pos][:, None, :].double(), sin[pos][:, None, :].double()
    x = x.double()
    out = x.clone()
    sl_a, sl_b = (slice(0, rd, 2), slice(1, rd, 2)) if interleaved else \
        (slice(0, rd // 2), slice(rd // 2, rd))
    a, b = x[..., sl_a], x[..., sl_b]
    out[..., sl_a] = a * c - b * s
    out[..., sl_b] = b * c + a * s
    return out


def kvcache_ref(q, k_cache, v_cache, k, v, cache_seqlens, cos, sin, cache_batch_idx, leftpad,
                block_table, causal, window, softcap, alibi, interleaved, scale):
    """Python re-implementation: returns (out, lse, new k_cache, new v_cache)."""
    kc, vc = k_cache.clone(), v_cache.clone()
    b, sq, h, d = q.shape
    paged = block_table is not None
    page = kc.shape[1]
    cap = block_table.shape[1] * page if paged else kc.shape[1]
    wl, wr = normalize_window(causal, window, cap)
    local = causal or wl >= 0 or wr >= 0
    s_new = 0 if k is None else k.shape[1]
    seqlens = [cap] * b if cache_seqlens is None else cache_seqlens.tolist()
    lp = [0] * b if leftpad is None else leftpad.tolist()

    def loc(i, pos):
        if paged:
            return block_table[i].long()[pos // page], pos % page
        row = i if cache_batch_idx is None else int(cache_batch_idx[i])
        return torch.full_like(pos, row), pos

    if k is not None:
        for i in range(b):
            pos = torch.arange(seqlens[i], seqlens[i] + s_new)
            kn = k[i] if cos is None else rotary_ref(k[i], cos, sin, pos, interleaved).to(k.dtype)
            kc[loc(i, pos)] = kn
            vc[loc(i, pos)] = v[i]
    outs, lses = [], []
    for i in range(b):
        pos = torch.arange(lp[i], seqlens[i] + s_new)
        ki, vi = kc[loc(i, pos)][None], vc[loc(i, pos)][None]
        qi = q[i]
        if cos is not None:
            qpos = torch.arange(seqlens[i], seqlens[i] + sq) if local else \
                torch.full((sq,), seqlens[i])
            qi = rotary_ref(qi, cos, sin, qpos, interleaved).to(q.dtype)
        al = None if alibi is None else (alibi if alibi.dim() == 1 else alibi[i:i + 1])
        o, l = naive_attention(qi[None], ki, vi, softmax_scale=scale, window=(wl, wr),
                               softcap=softcap, alibi_slopes=al, normalize=False)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses), kc, vc


KV_CASES = [
    # name, dict of options
    ("plain", dict(d=40)),
    ("append", dict(new=3, d=111)),
    ("append_causal", dict(new=4, sq=4, causal=True)),
    ("rotary_inter_causal", dict(new=2, sq=2, rotary=16, interleaved=True, causal=True)),
    ("rotary_half_noncausal", dict(new=1, sq=3, rotary=40, interleaved=False)),
    ("rotary_full_window", dict(new=5, sq=5, d=58, rotary=58, interleaved=False, window=(6, 0))),
    ("leftpad", dict(new=2, sq=2, leftpad=True, causal=True, rotary=8, interleaved=True)),
    ("batch_idx", dict(new=2, batch_idx=True, alibi="bh", softcap=4.0)),
    ("paged", dict(new=3, sq=3, paged=16, causal=True, alibi="h")),
    ("paged_rotary", dict(new=2, sq=1, paged=5, rotary=20, interleaved=False, window=(9, 3))),
    ("no_seqlens", dict(seqlens=False, causal=True)),
    ("no_seqlens_paged", dict(seqlens=False, paged=8, window=(10, -1))),
    ("no_new_seqlens_window", dict(sq=4, window=(3, 2), softcap=2.0)),
    ("gqa8", dict(new=1, h=8, hk=1, sq=1, rotary=32, interleaved=True)),
]


@pytest.mark.parametrize("name,o", KV_CASES, ids=[c[0] for c in KV_CASES])
def test_kvcache(name, o):
    torch.manual_seed(len(name) * 31 + 7)
    rng = random.Random(name)
    b, h, hk, d = 3, o.get("h", 4), o.get("hk", 2), o.get("d", 64)
    sq, s_new = o.get("sq", 1), o.get("new", 0)
    paged = o.get("paged")
    s_cache = 40
    if paged:
        max_blocks = (s_cache + paged - 1) // paged
        num_blocks = b * max_blocks + 2
        k_cache, v_cache = rand(num_blocks, paged, hk, d), rand(num_blocks, paged, hk, d)
        block_table = torch.randperm(num_blocks)[: b * max_blocks].view(b, max_blocks).to(torch.int32)
        cap = max_blocks * paged
    else:
        b_cache = b + 2 if o.get("batch_idx") else b
        k_cache, v_cache = rand(b_cache, s_cache, hk, d), rand(b_cache, s_cache, hk, d)
        block_table = None
        cap = s_cache
    seqlens = None
    if o.get("seqlens", True):
        seqlens = torch.tensor([rng.randint(0, cap - s_new) for _ in range(b)], dtype=torch.int32)
        seqlens[0] = cap - s_new
        seqlens[1] = 0 if not o.get("leftpad") else 3
    leftpad = None
    if o.get("leftpad"):
        leftpad = torch.tensor([rng.randint(0, int(s)) for s in seqlens], dtype=torch.int32)
    batch_idx = torch.tensor([3, 0, 4], dtype=torch.int32) if o.get("batch_idx") else None
    q = rand(b, sq, h, d)
    k = rand(b, s_new, hk, d) if s_new else None
    v = rand(b, s_new, hk, d) if s_new else None
    cos = sin = None
    if o.get("rotary"):
        angle = torch.rand(cap + sq, o["rotary"] // 2, dtype=F64) * 6.0
        cos, sin = angle.cos(), angle.sin()
    alibi = slopes_for(o.get("alibi"), b, h)
    causal, window, softcap = o.get("causal", False), o.get("window", (-1, -1)), o.get("softcap", 0.0)
    interleaved = o.get("interleaved", True)
    scale = 1.0 / math.sqrt(d)
    ref_out, ref_lse, ref_kc, ref_vc = kvcache_ref(
        q, k_cache, v_cache, k, v, seqlens, cos, sin, batch_idx, leftpad, block_table, causal,
        window, softcap, alibi, interleaved, scale)
    kc, vc = k_cache.clone(), v_cache.clone()
    out, lse = ops.fwd_kvcache(q, kc, vc, k, v, seqlens, cos, sin, batch_idx, leftpad,
                               block_table, alibi, scale, causal, window[0], window[1], softcap,
                               interleaved, 0)
    assert out.shape == q.shape and lse.shape == (b, h, sq)
    assert_close64(kc, ref_kc, 1e-12)
    assert_close64(vc, ref_vc, 0.0)
    assert_close64(out, ref_out)
    check_lse(lse, ref_lse)


def test_kvcache_fp16():
    torch.manual_seed(8)
    b, sq, h, hk, d, s_cache, s_new = 2, 2, 4, 1, 80, 64, 2
    kc64, vc64 = rand(b, s_cache, hk, d), rand(b, s_cache, hk, d)
    q, k, v = rand(b, sq, h, d), rand(b, s_new, hk, d), rand(b, s_new, hk, d)
    seqlens = torch.tensor([10, 62], dtype=torch.int32)
    angle = torch.rand(s_cache, 16, dtype=F64) * 6
    args = dict(causal=True, window=(-1, -1), softcap=0.0, alibi=None, interleaved=False, scale=0.1)
    ref_out, ref_lse, _, _ = kvcache_ref(q, kc64, vc64, k, v, seqlens, angle.cos(), angle.sin(),
                                         None, None, None, **args)
    h16 = lambda t: t.half()  # noqa: E731
    pt_out, _, ref_kc, _ = kvcache_ref(h16(q), h16(kc64), h16(vc64), h16(k), h16(v), seqlens,
                                       h16(angle.cos()), h16(angle.sin()), None, None, None, **args)
    kc, vc = h16(kc64), h16(vc64)
    out, lse = ops.fwd_kvcache(h16(q), kc, vc, h16(k), h16(v), seqlens, h16(angle.cos()),
                               h16(angle.sin()), None, None, None, None, 0.1, True, -1, -1, 0.0,
                               False, 0)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    assert (kc.double() - ref_kc.double()).abs().max().item() <= 1e-2  # 1 fp16 ulp
    err = (out.double() - ref_out).abs().max().item()
    err_pt = (pt_out.double() - ref_out).abs().max().item()
    assert err <= 2 * err_pt + 1e-5, (err, err_pt)


# ----------------------------------------------------------------------------------------------
# combine_splits
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_combine_splits(out_dtype):
    torch.manual_seed(4)
    splits, b, h, sq, d = 5, 2, 3, 7, 40
    o = torch.randn(splits, b, h, sq, d, dtype=torch.float32)
    lse = torch.randn(splits, b, h, sq, dtype=torch.float32) * 3
    lse[1, 0] = -INF                # a split that saw nothing of batch 0
    lse[:, 1, 2, 4] = -INF          # a row no split saw
    o[:, 1, 2, 4] = float("nan")    # its partial outputs are garbage
    o[1, 0] = float("nan")
    out, lse_out = ops.combine_splits(o, lse, out_dtype)
    l64 = lse.double()
    ref_lse = torch.logsumexp(l64, dim=0)
    w = torch.exp(l64 - ref_lse).nan_to_num(0.0)
    ref = (w[..., None] * o.double().nan_to_num(0.0)).sum(0).permute(0, 2, 1, 3)
    ref_lse = ref_lse.masked_fill(ref_lse == -INF, INF)
    assert out.shape == (b, sq, h, d) and out.dtype == out_dtype
    assert lse_out.shape == (b, h, sq) and lse_out.dtype == torch.float32
    torch.testing.assert_close(lse_out.double(), ref_lse, rtol=1e-7, atol=1e-7)
    assert lse_out[1, 2, 4] == INF and (out[1, 4, 2] == 0).all()
    if out_dtype == torch.float64:
        assert_close64(out, ref, 1e-12)
    else:
        torch.testing.assert_close(out, ref.to(out_dtype))


# ----------------------------------------------------------------------------------------------
# Memory stays linear in the sequence length
# ----------------------------------------------------------------------------------------------

def test_forward_memory_linear():
    n = 16384
    script = textwrap.dedent(f"""
        import resource, torch, flash_cuda
        n = {n}
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, n, 1, 64) for _ in range(3))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out, lse, _, _ = torch.ops.flash_cuda.fwd(q, k, v, None, 0.0, 0.125, False, -1, -1, 0.0,
                                                  False, None)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        print((after - before) * 1024)
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         cwd=root, timeout=600)
    assert res.returncode == 0, res.stderr
    extra = int(res.stdout.strip().splitlines()[-1])
    score_matrix = n * n * 4
    assert extra < score_matrix / 10, f"peak extra memory {extra / 2**20:.1f} MiB"
