"""GPU tests of the sm80 backward kernel (csrc/kernels/sm80/bwd.cuh) through torch.ops.flash_cuda.bwd.

The kernel runs by default where it covers a call (FLASH_CUDA_BWD_KERNEL=0, read once by the
extension, turns it off); this module sets the variable to 1 before the first op call so a stray
"0" in the environment cannot silently test the reference instead.

Specification (DESIGN.md sections 7 and 9):
  * oracle: autograd through tests/naive_attention.py in fp64 (`g_ref`) and in the input dtype
    (`g_pt`); pass when max|g - g_ref| <= 3 max|g_pt - g_ref| + 1e-5, for dq, dk and dv;
  * no NaN in any gradient, rows with no visible key (lse = +inf) give zero dq;
  * dk / dv bitwise identical over 3 runs (dq uses fp32 atomics: not required); with
    deterministic=True dq, dk, dv bitwise identical over 50 runs;
  * every kernel head dim and padded dims (40, 59, 80, 111) x {plain, causal, window, softcap,
    ALiBi, softcap + ALiBi} at least once (a sampled product of dtype, lengths, GQA, dout
    layout), varlen with random lengths (incl. 1 and sequences without keys);
  * the kernel path really runs: the CPU op (the exact reference) must differ at the bit level
    from the kernel's result (both pass the oracle rule).
"""

from __future__ import annotations

import itertools
import os
import random

os.environ["FLASH_CUDA_BWD_KERNEL"] = "1"  # before the first op call (read once)

import pytest  # noqa: E402
import torch  # noqa: E402

from naive_attention import naive_attention, normalize_window  # noqa: E402

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


def fwd(q, k, v, *, causal, window, scale, softcap=0.0, alibi_slopes=None):
    out, lse, _, _ = _ops().fwd(q, k, v, alibi_slopes, 0.0, scale, causal, window[0], window[1],
                                softcap, False)
    return out, lse


def bwd(dout, q, k, v, out, lse, *, causal, window, scale, deterministic=False, softcap=0.0,
        alibi_slopes=None):
    rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)
    return _ops().bwd(dout, q, k, v, out, lse, alibi_slopes, 0.0, scale, causal, window[0],
                      window[1], softcap, deterministic, rng_state)


def naive_grads(q, k, v, dout, *, causal, window, scale, softcap=0.0, alibi_slopes=None,
                normalize=True):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, _ = naive_attention(q, k, v, softmax_scale=scale, causal=causal, window=window,
                             softcap=softcap, alibi_slopes=alibi_slopes, normalize=normalize)
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


def check_grads(got, q, k, v, dout, *, causal, window, scale, **kw):
    ref = naive_grads(q.double(), k.double(), v.double(), dout.double(), causal=causal,
                      window=window, scale=scale, **kw)
    pt = naive_grads(q, k, v, dout, causal=causal, window=window, scale=scale, **kw)
    assert_grads_rule(got, ref, pt, q.dtype)


def assert_grads_rule(got, ref, pt, dtype):
    """DESIGN.md section 9, 3x for gradients, on each whole gradient tensor."""
    for name, g, r, p in zip(("dq", "dk", "dv"), got, ref, pt):
        assert g.shape == r.shape and g.dtype == dtype, name
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
    """The CPU op runs the exact reference; the kernel's result differs from it in bits."""
    q, k, v, dout, out, lse, got = run_case(torch.float16, d, 1023, 1024, "plain", 1)
    cpu = [t.cpu() for t in (dout, q, k, v, out, lse)]
    ref_path = bwd(*cpu, causal=False, window=(-1, -1), scale=d ** -0.5)
    ref_path = [t.cuda() for t in ref_path]
    check_grads(ref_path, q, k, v, dout, causal=False, window=(-1, -1), scale=d ** -0.5)
    assert any(not torch.equal(a, b) for a, b in zip(got, ref_path)), (
        "kernel and reference results are bitwise identical: was FLASH_CUDA_BWD_KERNEL=0 in effect "
        "before the first op call of this process?")


# ---- Every head dim x every feature (sampled product), varlen, deterministic mode.

ALL_HEAD_DIMS = (32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)
FEATURES = ("plain", "causal", "window", "softcap", "alibi", "softcap_alibi_causal")
FEATURE_SEQLENS = ((1, 1), (113, 203), (512, 256), (203, 113), (300, 77))


def feature_options(feature, b, h, gen_seed):
    """(causal, window, softcap, alibi_slopes) of a feature; slopes fp32 (h) or (b, h)."""
    causal = feature in ("causal", "softcap_alibi_causal")
    window = (64, 16) if feature == "window" else (-1, -1)
    softcap = 2.5 if "softcap" in feature else 0.0
    slopes = None
    if "alibi" in feature:
        gen = torch.Generator(device="cuda").manual_seed(gen_seed)
        shape = (b, h) if gen_seed % 2 else (h,)
        slopes = torch.rand(shape, device="cuda", generator=gen, dtype=torch.float32) * 0.3
    return causal, window, softcap, slopes


FEATURE_CASES = [
    (d, feature, DTYPES[(i + j) % 2], FEATURE_SEQLENS[(i + 2 * j) % len(FEATURE_SEQLENS)],
     (1, 4, 8)[(i + j) % 3], (i + j) % 3 == 0)
    for i, d in enumerate(ALL_HEAD_DIMS) for j, feature in enumerate(FEATURES)
]


@pytest.mark.parametrize("d,feature,dtype,seqlens,ratio,transposed", FEATURE_CASES,
                         ids=lambda x: str(x))
def test_bwd_features(d, feature, dtype, seqlens, ratio, transposed):
    sq, sk = seqlens
    h = 8
    hk = h // ratio
    b = 2
    q, k, v, dout = make_inputs(dtype, d, sq, sk, h, hk, b=b, seed=d, transposed_dout=transposed)
    causal, window, softcap, slopes = feature_options(feature, b, h, d)
    scale = d ** -0.5
    out, lse = fwd(q, k, v, causal=causal, window=window, scale=scale, softcap=softcap,
                   alibi_slopes=slopes)
    poison_allocator(4 * (q.numel() + k.numel()) * 4)
    got = bwd(dout, q, k, v, out, lse, causal=causal, window=window, scale=scale,
              softcap=softcap, alibi_slopes=slopes)
    check_grads(got, q, k, v, dout, causal=causal, window=window, scale=scale, softcap=softcap,
                alibi_slopes=slopes)
    if causal and sq > sk:  # rows with no visible key: zero dq
        empty = torch.isinf(lse)
        assert empty.any() and (got[0].permute(0, 2, 1, 3)[empty] == 0).all()


def varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, *, causal, window, scale,
               softcap=0.0, alibi_slopes=None, deterministic=False):
    rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)
    return _ops().varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, alibi_slopes, max_q, max_k,
                             0.0, scale, causal, window[0], window[1], softcap, deterministic,
                             rng_state)


def make_varlen(dtype, d, h, hk, seed, b=5):
    rng = random.Random(seed)
    lens_q = [1] + [rng.randint(1, 300) for _ in range(b - 1)]
    lens_k = [rng.randint(1, 300) for _ in range(b - 2)] + [1, 0]
    rng.shuffle(lens_k)
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sum(lens_q), h, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(sum(lens_k), hk, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(sum(lens_k), hk, d, device="cuda", dtype=dtype, generator=gen)
    # non-contiguous dout: (h, total, d) storage
    dout = torch.randn(h, sum(lens_q), d, device="cuda", dtype=dtype, generator=gen).transpose(0, 1)
    return lens_q, lens_k, cu_q, cu_k, q, k, v, dout


def run_varlen_case(dtype, d, feature, ratio, seed, deterministic=False):
    h = 4 if ratio < 8 else 8
    hk = h // ratio
    lens_q, lens_k, cu_q, cu_k, q, k, v, dout = make_varlen(dtype, d, h, hk, seed)
    b = len(lens_q)
    causal, window, softcap, slopes = feature_options(feature, b, h, seed)
    scale = d ** -0.5
    max_q, max_k = max(lens_q), max(lens_k)
    out, lse, _, _ = _ops().varlen_fwd(q, k, v, cu_q, cu_k, None, None, slopes, max_q, max_k, 0.0,
                                       scale, causal, window[0], window[1], softcap, False)
    poison_allocator(4 * (q.numel() + k.numel()) * 4)
    args = (dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k)
    kw = dict(causal=causal, window=window, scale=scale, softcap=softcap, alibi_slopes=slopes)
    got = varlen_bwd(*args, deterministic=deterministic, **kw)
    # Oracle per sequence, the rule on the whole packed gradients (as for fixed length: a
    # length-1 sequence's dk is exactly 0, where D = rowsum(dO o O) and dP = dO V^T, summed in
    # different orders, leave ~1e-5; the rule bounds the tensor, not each sequence alone).
    # The window is normalised once with max_seqlen_k (flash_attn's rule).
    left, right = normalize_window(causal, window, max_k)
    ref = [torch.zeros(t.shape, dtype=torch.float64, device=t.device) for t in (q, k, v)]
    pt = [torch.zeros_like(t) for t in (q, k, v)]
    for i in range(b):
        qs, qe = cu_q[i].item(), cu_q[i + 1].item()
        ks, ke = cu_k[i].item(), cu_k[i + 1].item()
        if ke == ks:  # no keys: zero dq, nothing to dk / dv
            assert (got[0][qs:qe] == 0).all()
            continue
        seq_slopes = None
        if slopes is not None:
            seq_slopes = slopes[i] if slopes.dim() == 2 else slopes
        seq = dict(causal=False, window=(left, right), scale=scale, softcap=softcap,
                   alibi_slopes=seq_slopes, normalize=False)
        seq_tensors = (q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], dout[None, qs:qe])
        for dst, grads in ((ref, naive_grads(*(t.double() for t in seq_tensors), **seq)),
                           (pt, naive_grads(*seq_tensors, **seq))):
            dst[0][qs:qe], dst[1][ks:ke], dst[2][ks:ke] = (g[0] for g in grads)
    assert_grads_rule(got, ref, pt, q.dtype)
    return args, kw, got


VARLEN_CASES = [
    (d, feature, DTYPES[(i + j) % 2], (1, 4, 8)[(i + j) % 3])
    for i, d in enumerate((32, 59, 64, 96, 128, 160, 256))
    for j, feature in enumerate(FEATURES) if (i + j) % 2 == 0
]


@pytest.mark.parametrize("d,feature,dtype,ratio", VARLEN_CASES, ids=lambda x: str(x))
def test_varlen_bwd(d, feature, dtype, ratio):
    run_varlen_case(dtype, d, feature, ratio, seed=d * 10 + FEATURES.index(feature))


@pytest.mark.parametrize("d,feature", [(64, "causal"), (128, "plain"), (96, "softcap_alibi_causal"),
                                       (256, "window")])
def test_deterministic_bitwise(d, feature):
    """deterministic=True: dq, dk, dv bitwise identical over 50 runs (fixed length)."""
    dtype = torch.bfloat16
    h, hk, b = 8, 2, 2
    q, k, v, dout = make_inputs(dtype, d, 700, 1100, h, hk, b=b, seed=d)
    causal, window, softcap, slopes = feature_options(feature, b, h, d)
    kw = dict(causal=causal, window=window, scale=d ** -0.5, softcap=softcap, alibi_slopes=slopes)
    out, lse = fwd(q, k, v, **kw)
    first = bwd(dout, q, k, v, out, lse, deterministic=True, **kw)
    check_grads(first, q, k, v, dout, **kw)
    for _ in range(49):
        again = bwd(dout, q, k, v, out, lse, deterministic=True, **kw)
        for name, a, g in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, g), f"{name} differs between deterministic runs"


def test_global_deterministic_switch(d=128, varlen=False):
    """torch.use_deterministic_algorithms(True) makes a deterministic=False call's backward the
    deterministic one (the public function's autograd reads the switch at the forward): its
    gradients are bitwise those of deterministic=True, where the atomic dQ additions of 16
    query blocks per key block would differ in their last bits."""
    import flash_cuda
    from api_utils import built_head_dims

    if d not in built_head_dims():
        pytest.skip(f"no d{d} kernels in this build (the reference is deterministic anyway)")
    torch.manual_seed(d)
    b, s, h, dtype = 2, 2048, 8, torch.bfloat16
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(4))

    def grads(deterministic):
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        if varlen:
            cu = torch.arange(0, b * s + 1, s, device="cuda", dtype=torch.int32)
            out = flash_cuda.flash_attn_varlen_func(
                *(x.flatten(0, 1) for x in (qg, kg, vg)), cu, cu, s, s, causal=True,
                deterministic=deterministic).unflatten(0, (b, s))
        else:
            out = flash_cuda.flash_attn_func(qg, kg, vg, causal=True,
                                             deterministic=deterministic)
        return torch.autograd.grad(out, (qg, kg, vg), dout)

    expected = grads(True)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got = grads(False)
    finally:
        torch.use_deterministic_algorithms(previous)
    for name, e, g in zip(("dq", "dk", "dv"), expected, got):
        assert torch.equal(e, g), f"{name} is not the deterministic backward's"


def test_global_deterministic_switch_varlen():
    test_global_deterministic_switch(d=64, varlen=True)


@pytest.mark.parametrize("d", (64, 128, 224))
def test_varlen_deterministic_bitwise(d):
    args, kw, first = run_varlen_case(torch.float16, d, "causal", 4, seed=d, deterministic=True)
    for _ in range(49):
        again = varlen_bwd(*args, deterministic=True, **kw)
        for name, a, g in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, g), f"{name} differs between deterministic runs"


@pytest.mark.parametrize("d", (32, 96, 160, 256))
def test_dk_dv_bitwise_without_deterministic(d):
    q, k, v, dout = make_inputs(torch.float16, d, 511, 777, 8, 1, seed=d)
    kw = dict(causal=False, window=(-1, -1), scale=d ** -0.5, softcap=1.5)
    out, lse = fwd(q, k, v, **kw)
    _, dk0, dv0 = bwd(dout, q, k, v, out, lse, **kw)
    for _ in range(5):
        _, dk, dv = bwd(dout, q, k, v, out, lse, **kw)
        assert torch.equal(dk, dk0) and torch.equal(dv, dv0)
