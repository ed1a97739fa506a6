"""The public API is flash_attn 2.8's: names, parameter order, defaults, return values, shapes.

Shape tests run on fake CUDA tensors (FakeTensorMode: the ops' register_fake implementations,
no GPU needed) and, where the CPU reference is built in, on real CPU tensors.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch

import flash_cuda
from flash_cuda import bert_padding
from flash_cuda.layers import rotary
from api_utils import built_head_dims, cu_seqlens, fake_mode, rand, round128

_ATTN_KW = [
    ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
    ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
    ("return_attn_probs", False),
]
_REQUIRED = inspect.Parameter.empty

# flash_attn 2.8's signatures: (name, default) in positional order.
SIGNATURES = {
    "flash_attn_func": [("q", _REQUIRED), ("k", _REQUIRED), ("v", _REQUIRED)] + _ATTN_KW,
    "flash_attn_qkvpacked_func": [("qkv", _REQUIRED)] + _ATTN_KW,
    "flash_attn_kvpacked_func": [("q", _REQUIRED), ("kv", _REQUIRED)] + _ATTN_KW,
    "flash_attn_varlen_func": [
        ("q", _REQUIRED), ("k", _REQUIRED), ("v", _REQUIRED), ("cu_seqlens_q", _REQUIRED),
        ("cu_seqlens_k", _REQUIRED), ("max_seqlen_q", _REQUIRED), ("max_seqlen_k", _REQUIRED),
    ] + _ATTN_KW + [("block_table", None)],
    "flash_attn_varlen_qkvpacked_func": [
        ("qkv", _REQUIRED), ("cu_seqlens", _REQUIRED), ("max_seqlen", _REQUIRED),
    ] + _ATTN_KW,
    "flash_attn_varlen_kvpacked_func": [
        ("q", _REQUIRED), ("kv", _REQUIRED), ("cu_seqlens_q", _REQUIRED),
        ("cu_seqlens_k", _REQUIRED), ("max_seqlen_q", _REQUIRED), ("max_seqlen_k", _REQUIRED),
    ] + _ATTN_KW,
    "flash_attn_with_kvcache": [
        ("q", _REQUIRED), ("k_cache", _REQUIRED), ("v_cache", _REQUIRED), ("k", None),
        ("v", None), ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
        ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0),
        ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
        ("return_softmax_lse", False),
    ],
    "scaled_dot_product_attention": [
        ("query", _REQUIRED), ("key", _REQUIRED), ("value", _REQUIRED), ("is_causal", False),
        ("scale", None), ("enable_gqa", False),
    ],
}
OTHER_SIGNATURES = [
    (bert_padding.pad_input, [("hidden_states", _REQUIRED), ("indices", _REQUIRED),
                              ("batch", _REQUIRED), ("seqlen", _REQUIRED)]),
    (bert_padding.unpad_input, [("hidden_states", _REQUIRED), ("attention_mask", _REQUIRED),
                                ("unused_mask", None)]),
    (rotary.apply_rotary_emb, [
        ("x", _REQUIRED), ("cos", _REQUIRED), ("sin", _REQUIRED), ("interleaved", False),
        ("inplace", False), ("seqlen_offsets", 0), ("cu_seqlens", None), ("max_seqlen", None),
    ]),
]


def _params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature(name):
    fn = getattr(flash_cuda, name)
    assert _params(fn) == SIGNATURES[name]
    for p in inspect.signature(fn).parameters.values():
        assert p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD, p


@pytest.mark.parametrize("fn, expected", OTHER_SIGNATURES, ids=lambda x: getattr(x, "__name__", ""))
def test_helper_signature(fn, expected):
    # pad_input's first argument is called `hidden_states` in flash_attn as well.
    assert _params(fn) == expected


def test_exports():
    assert set(flash_cuda.__all__) == set(SIGNATURES)
    assert flash_cuda.layers.apply_rotary_emb is rotary.apply_rotary_emb


# ----------------------------------------------------------------------------------------------
# Return values and shapes on fake CUDA tensors (fp16): every public function.

B, SQ, SK, H, HK, D = 2, 17, 33, 4, 2, 40


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_func_returns_fake(dropout_p):
    with fake_mode():
        q = rand(B, SQ, H, D, dtype=torch.float16, device="cuda")
        k = rand(B, SK, HK, D, dtype=torch.float16, device="cuda")
        v = rand(B, SK, HK, D, dtype=torch.float16, device="cuda")
        out = flash_cuda.flash_attn_func(q, k, v, dropout_p)
        assert isinstance(out, torch.Tensor)
        assert out.shape == (B, SQ, H, D) and out.dtype == torch.float16
        assert out.device.type == "cuda"
        out, lse, s_dmask = flash_cuda.flash_attn_func(q, k, v, dropout_p, return_attn_probs=True)
        assert out.shape == (B, SQ, H, D)
        assert lse.shape == (B, H, SQ) and lse.dtype == torch.float32
        if dropout_p > 0:  # S_dmask only with dropout, as flash_attn
            assert s_dmask.shape == (B, H, round128(SQ), round128(SK))
            assert s_dmask.dtype == torch.float16
        else:
            assert s_dmask.numel() == 0


def test_packed_returns_fake():
    with fake_mode():
        qkv = rand(B, SQ, 3, H, D, dtype=torch.bfloat16, device="cuda")
        out, lse, _ = flash_cuda.flash_attn_qkvpacked_func(qkv, causal=True,
                                                           return_attn_probs=True)
        assert out.shape == (B, SQ, H, D) and out.dtype == torch.bfloat16
        assert lse.shape == (B, H, SQ)
        q = rand(B, SQ, H, D, dtype=torch.bfloat16, device="cuda")
        kv = rand(B, SK, 2, HK, D, dtype=torch.bfloat16, device="cuda")
        out = flash_cuda.flash_attn_kvpacked_func(q, kv, window_size=(3, 2))
        assert out.shape == (B, SQ, H, D)


def test_varlen_returns_fake():
    lens_q, lens_k = [5, 12], [20, 13]
    tq, tk = sum(lens_q), sum(lens_k)
    with fake_mode():
        cq, ck = cu_seqlens(lens_q, "cuda"), cu_seqlens(lens_k, "cuda")
        q = rand(tq, H, D, dtype=torch.float16, device="cuda")
        k = rand(tk, HK, D, dtype=torch.float16, device="cuda")
        out = flash_cuda.flash_attn_varlen_func(q, k, k, cq, ck, 12, 20)
        assert out.shape == (tq, H, D)
        out, lse, s_dmask = flash_cuda.flash_attn_varlen_func(
            q, k, k, cq, ck, 12, 20, 0.1, return_attn_probs=True)
        assert lse.shape == (H, tq) and lse.dtype == torch.float32
        assert s_dmask.shape == (2, H, 128, 128)
        kv = rand(tk, 2, HK, D, dtype=torch.float16, device="cuda")
        out, lse, _ = flash_cuda.flash_attn_varlen_kvpacked_func(
            q, kv, cq, ck, 12, 20, return_attn_probs=True)
        assert out.shape == (tq, H, D) and lse.shape == (H, tq)
        qkv = rand(tk, 3, H, D, dtype=torch.float16, device="cuda")
        out = flash_cuda.flash_attn_varlen_qkvpacked_func(qkv, ck, 20, causal=True)
        assert out.shape == (tk, H, D)
        # Paged K/V: (num_blocks, page, hk, d) with block_table (b, max_blocks).
        k_paged = rand(6, 16, HK, D, dtype=torch.float16, device="cuda")
        table = torch.zeros(2, 3, dtype=torch.int32, device="cuda")
        out = flash_cuda.flash_attn_varlen_func(q, k_paged, k_paged, cq, ck, 12, 20,
                                                block_table=table)
        assert out.shape == (tq, H, D)


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_returns_fake(paged):
    with fake_mode():
        q = rand(B, 1, H, D, dtype=torch.float16, device="cuda")
        if paged:
            k_cache = rand(8, 16, HK, D, dtype=torch.float16, device="cuda")
            table = torch.zeros(B, 4, dtype=torch.int32, device="cuda")
        else:
            k_cache = rand(B, 64, HK, D, dtype=torch.float16, device="cuda")
            table = None
        v_cache = torch.empty_like(k_cache)
        k_new = rand(B, 1, HK, D, dtype=torch.float16, device="cuda")
        cos = rand(64, 8, dtype=torch.float16, device="cuda")
        out = flash_cuda.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, k_new, cos, cos,
                                                 cache_seqlens=5, block_table=table,
                                                 causal=True)
        assert isinstance(out, torch.Tensor) and out.shape == (B, 1, H, D)
        out, lse = flash_cuda.flash_attn_with_kvcache(q, k_cache, v_cache,
                                                      cache_seqlens=5, block_table=table,
                                                      return_softmax_lse=True)
        assert out.shape == (B, 1, H, D)
        assert lse.shape == (B, H, 1) and lse.dtype == torch.float32


@pytest.mark.parametrize("sq, sk", [(16, 16), (7, 19), (19, 7)])
def test_sdpa_returns_fake(sq, sk):
    with fake_mode():
        q = rand(B, H, sq, D, dtype=torch.float16, device="cuda")
        k = rand(B, HK, sk, D, dtype=torch.float16, device="cuda")
        out = flash_cuda.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        assert out.shape == (B, H, sq, D) and out.dtype == torch.float16


@pytest.mark.parametrize("d", [8, 59, 256])
def test_head_dims_fake(d):
    """Any head dim <= 256 keeps its size (padding is the CUDA op's business)."""
    with fake_mode():
        q = rand(1, 9, 2, d, dtype=torch.float16, device="cuda")
        out = flash_cuda.flash_attn_func(q, q, q)
        assert out.shape == (1, 9, 2, d)


def test_backward_shapes_meta():
    """Autograd through the fakes (the engine needs a real CUDA device, so use 'meta')."""
    f16 = dict(dtype=torch.float16, device="meta", requires_grad=True)
    q, k, v = rand(B, SQ, H, D, **f16), rand(B, SK, HK, D, **f16), rand(B, SK, HK, D, **f16)
    flash_cuda.flash_attn_func(q, k, v, causal=True).sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    qv, kv = rand(30, H, D, **f16), rand(40, 2, HK, D, **f16)
    cq, ck = cu_seqlens([10, 20]).to("meta"), cu_seqlens([25, 15]).to("meta")
    flash_cuda.flash_attn_varlen_kvpacked_func(qv, kv, cq, ck, 20, 25).sum().backward()
    assert qv.grad.shape == qv.shape and kv.grad.shape == kv.shape


def test_bwd_ops_fake():
    ops = torch.ops.flash_cuda
    with fake_mode():
        q = rand(B, SQ, H, D, dtype=torch.bfloat16, device="cuda")
        k = rand(B, SK, HK, D, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(B, H, SQ, device="cuda")
        rng = torch.empty(2, dtype=torch.int64, device="cuda")
        dq, dk, dv = ops.bwd(q, q, k, k, q, lse, None, 0.0, 0.1, True, -1, -1, 0.0, False, rng)
        assert dq.shape == q.shape and dk.shape == dv.shape == k.shape
        assert dq.dtype == dk.dtype == torch.bfloat16 and dq.device.type == "cuda"
        cq, ck = cu_seqlens([10, 20], "cuda"), cu_seqlens([25, 15], "cuda")
        qv = rand(30, H, D, dtype=torch.bfloat16, device="cuda")
        kv = rand(40, HK, D, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(H, 30, device="cuda")
        dq, dk, dv = ops.varlen_bwd(qv, qv, kv, kv, qv, lse, cq, ck, None, 20, 25, 0.0, 0.1,
                                    False, -1, -1, 0.0, False, rng)
        assert dq.shape == qv.shape and dk.shape == dv.shape == kv.shape


def test_combine_splits_fake():
    with fake_mode():
        o = torch.empty(3, B, H, SQ, D, device="cuda")
        lse = torch.empty(3, B, H, SQ, device="cuda")
        out, lse_out = torch.ops.flash_cuda.combine_splits(o, lse, torch.bfloat16)
        assert out.shape == (B, SQ, H, D) and out.dtype == torch.bfloat16
        assert lse_out.shape == (B, H, SQ) and lse_out.dtype == torch.float32


@pytest.mark.parametrize("window", [(3, 0), [3, 0], torch.tensor([3, 0]), (torch.tensor(3), 0)])
def test_window_size_forms(window):
    """window_size: any 2-sequence of int()-ables (callers pass tensors)."""
    q = rand(1, 9, 2, 16, dtype=torch.float16, device="meta")
    assert flash_cuda.flash_attn_func(q, q, q, window_size=window).shape == q.shape


# ----------------------------------------------------------------------------------------------
# The same on real CPU tensors (the reference), with values.


def test_func_returns_cpu():
    torch.manual_seed(0)
    q, k, v = rand(B, SQ, H, D), rand(B, SK, HK, D), rand(B, SK, HK, D)
    out = flash_cuda.flash_attn_func(q, k, v, causal=True)
    assert out.shape == (B, SQ, H, D) and out.dtype == torch.float32
    out2, lse, s_dmask = flash_cuda.flash_attn_func(q, k, v, causal=True,
                                                    return_attn_probs=True)
    torch.testing.assert_close(out2, out)
    assert lse.shape == (B, H, SQ) and lse.dtype == torch.float32
    assert s_dmask.numel() == 0
    _, _, s_dmask = flash_cuda.flash_attn_func(q, k, v, 0.2, return_attn_probs=True)
    assert s_dmask.shape == (B, H, round128(SQ), round128(SK)) and s_dmask.dtype == q.dtype


def test_values_match_naive_cpu():
    """One end-to-end value check per feature (the reference's own tests cover the grid)."""
    from naive_attention import naive_attention

    torch.manual_seed(1)
    q, k, v = rand(B, SQ, H, D), rand(B, SK, HK, D), rand(B, SK, HK, D)
    slopes = torch.rand(H)
    kw = dict(causal=True, window_size=(5, 0), softcap=2.0, alibi_slopes=slopes,
              softmax_scale=0.3)
    out, lse, _ = flash_cuda.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    ref, ref_lse = naive_attention(q.double(), k.double(), v.double(), softmax_scale=0.3,
                                   causal=True, window=(5, 0), softcap=2.0,
                                   alibi_slopes=slopes)
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse.float(), atol=1e-5, rtol=1e-5)
    # The default scale is 1 / sqrt(d).
    ref, _ = naive_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(flash_cuda.flash_attn_func(q, k, v), ref.float(),
                               atol=1e-5, rtol=1e-5)


def test_packed_equal_unpacked_cpu():
    torch.manual_seed(2)
    qkv = rand(B, SQ, 3, H, D)
    q, k, v = qkv.unbind(2)
    ref = flash_cuda.flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(flash_cuda.flash_attn_qkvpacked_func(qkv, causal=True), ref)
    torch.testing.assert_close(
        flash_cuda.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), causal=True), ref)


def test_varlen_matches_per_sequence_cpu():
    torch.manual_seed(3)
    lens_q, lens_k = [5, 12, 1], [20, 13, 7]
    cq, ck = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q, k, v = rand(sum(lens_q), H, D), rand(sum(lens_k), HK, D), rand(sum(lens_k), HK, D)
    out, lse, _ = flash_cuda.flash_attn_varlen_func(q, k, v, cq, ck, 12, 20, causal=True,
                                                    return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (H, q.shape[0])
    for i in range(3):
        qs, ks = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        o_i, lse_i, _ = flash_cuda.flash_attn_func(q[None, qs], k[None, ks], v[None, ks],
                                                   causal=True, return_attn_probs=True)
        torch.testing.assert_close(out[qs], o_i[0])
        torch.testing.assert_close(lse[:, qs], lse_i[0])
    kv = torch.stack([k, v], 1)
    torch.testing.assert_close(
        flash_cuda.flash_attn_varlen_kvpacked_func(q, kv, cq, ck, 12, 20, causal=True), out)
    qkv = rand(sum(lens_k), 3, H, D)
    ref = flash_cuda.flash_attn_varlen_func(*qkv.unbind(1), ck, ck, 20, 20)
    torch.testing.assert_close(flash_cuda.flash_attn_varlen_qkvpacked_func(qkv, ck, 20), ref)


def test_kvcache_appends_and_attends_cpu():
    torch.manual_seed(4)
    b, s_cache, d = 2, 32, 16
    k_cache, v_cache = rand(b, s_cache, HK, d), rand(b, s_cache, HK, d)
    q, k_new, v_new = rand(b, 2, H, d), rand(b, 2, HK, d), rand(b, 2, HK, d)
    seqlens = torch.tensor([3, 10], dtype=torch.int32)
    k0, v0 = k_cache.clone(), v_cache.clone()
    out, lse = flash_cuda.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                  cache_seqlens=seqlens, causal=True,
                                                  return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (b, H, 2)
    for i, s in enumerate(seqlens.tolist()):
        torch.testing.assert_close(k_cache[i, s:s + 2], k_new[i])
        torch.testing.assert_close(v_cache[i, s:s + 2], v_new[i])
        torch.testing.assert_close(k_cache[i, :s], k0[i, :s])
        torch.testing.assert_close(k_cache[i, s + 2:], k0[i, s + 2:])
        ref = flash_cuda.flash_attn_func(q[i:i + 1], k_cache[i:i + 1, :s + 2],
                                         v_cache[i:i + 1, :s + 2], causal=True)
        torch.testing.assert_close(out[i:i + 1], ref)
    # An int cache_seqlens means the same length for every sequence.
    k1, v1 = k0.clone(), v0.clone()
    out_int = flash_cuda.flash_attn_with_kvcache(q, k1, v1, k_new, v_new, cache_seqlens=3)
    k2, v2 = k0.clone(), v0.clone()
    out_t = flash_cuda.flash_attn_with_kvcache(q, k2, v2, k_new, v_new,
                                               cache_seqlens=torch.full((b,), 3,
                                                                        dtype=torch.int32))
    torch.testing.assert_close(out_int, out_t)
    torch.testing.assert_close(k1, k2)


def test_window_size_tensor_same_result_cpu():
    torch.manual_seed(5)
    q, k, v = rand(1, 9, 2, 16), rand(1, 9, 2, 16), rand(1, 9, 2, 16)
    ref = flash_cuda.flash_attn_func(q, k, v, window_size=(3, 1))
    for window in ([3, 1], torch.tensor([3, 1]), (torch.tensor(3), torch.tensor(1))):
        torch.testing.assert_close(flash_cuda.flash_attn_func(q, k, v, window_size=window), ref)


def test_dropout_cpu():
    """Dropout draws a fresh mask per call; S_dmask marks the dropped entries (sign bit)."""
    torch.manual_seed(6)
    q, k, v = rand(1, 6, 2, 16), rand(1, 7, 2, 16), rand(1, 7, 2, 16)
    out1, _, s1 = flash_cuda.flash_attn_func(q, k, v, 0.5, return_attn_probs=True)
    out2, _, s2 = flash_cuda.flash_attn_func(q, k, v, 0.5, return_attn_probs=True)
    assert s1.shape == (1, 2, 128, 128)
    assert not torch.equal(out1, out2)
    dropped = (s1[:, :, :6, :7] < 0).float().mean().item()
    assert 0.2 < dropped < 0.8
    # The mask comes from torch's generator: manual_seed makes it reproducible.
    torch.manual_seed(7)
    out1 = flash_cuda.flash_attn_func(q, k, v, 0.5)
    torch.manual_seed(7)
    torch.testing.assert_close(flash_cuda.flash_attn_func(q, k, v, 0.5), out1)


def test_built_head_dims_follow_the_build_variable():
    """flash_cuda._C.built_head_dims lists the kernel head dims compiled in (tests of kernel
    choices skip the others). Where FLASH_CUDA_HEADDIMS is set, as scripts/run_tests.sh sets it for
    the build and the tests alike (CI: 64), they are the ones it names."""
    all_dims = {32, 64, 96, 128, 160, 192, 224, 256}
    dims = built_head_dims()
    assert dims <= all_dims
    env = os.environ.get("FLASH_CUDA_HEADDIMS", "").strip()
    if env:
        expected = set() if env == "none" else {int(x) for x in env.split(",") if x.strip()}
        assert dims == expected, f"built {sorted(dims)}, FLASH_CUDA_HEADDIMS={env!r}"
