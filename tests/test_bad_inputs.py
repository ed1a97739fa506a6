"""Every bad input raises a clear TypeError/ValueError naming the argument, before any output
(or the KV cache) is written.

The checks themselves are C++ (csrc/checks.cpp) and run first in every op; they are reached
here through the public functions on CPU tensors. fp32 on CUDA is checked by the ops' fakes on
fake CUDA tensors (no GPU here), which is also what a compiled graph reports.
"""

from __future__ import annotations

import pytest
import torch

import flash_cuda
from flash_cuda.layers.rotary import apply_rotary_emb
from api_utils import cu_seqlens, fake_mode, rand

fa = flash_cuda.flash_attn_func


def _qkv(b=2, sq=5, sk=6, h=4, hk=2, d=16, dtype=torch.float32):
    return rand(b, sq, h, d, dtype=dtype), rand(b, sk, hk, d, dtype=dtype), \
        rand(b, sk, hk, d, dtype=dtype)


# ----------------------------------------------------------------------------------------------
# fp32 on CUDA: a TypeError telling the user to cast (fake CUDA tensors: no GPU needed).


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fp32_on_cuda_rejected(dtype):
    with fake_mode():
        q = rand(2, 5, 4, 16, dtype=dtype, device="cuda")
        with pytest.raises(TypeError, match=r"fp16 and bf16: q .*cast"):
            fa(q, q, q)
        with pytest.raises(TypeError, match=r"fp16 and bf16: q"):
            flash_cuda.flash_attn_qkvpacked_func(rand(2, 5, 3, 4, 16, dtype=dtype,
                                                      device="cuda"))
        cu = cu_seqlens([3, 2], "cuda")
        with pytest.raises(TypeError, match=r"fp16 and bf16: q"):
            flash_cuda.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 3, 3)
        with pytest.raises(TypeError, match=r"fp16 and bf16: q"):
            flash_cuda.flash_attn_with_kvcache(q, q, q, cache_seqlens=1)


def test_fp32_on_cuda_rejected_when_compiling():
    fn = torch.compile(fa, fullgraph=True, backend="eager")
    with fake_mode():
        q = rand(2, 5, 4, 16, device="cuda")
        with pytest.raises(Exception, match=r"fp16 and bf16: q"):
            fn(q, q, q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fp32_on_real_cuda_rejected():
    q = rand(2, 5, 4, 16, device="cuda")
    with pytest.raises(TypeError, match=r"fp16 and bf16: q"):
        fa(q, q, q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_mismatched_devices():
    q, k, v = (t.cuda().half() for t in _qkv())
    with pytest.raises(ValueError, match="k must be on the same device as q"):
        fa(q, k.cpu(), v)
    cu = cu_seqlens([3, 2])
    with pytest.raises(ValueError, match="cu_seqlens_q must be on the same device as q"):
        flash_cuda.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu.cuda(), 3, 3)


# ----------------------------------------------------------------------------------------------
# Python-side rules (what the C++ cannot see).


def test_window_size_needs_two_elements():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="window_size must have 2 elements"):
        fa(q, k, v, window_size=(1, 2, 3))


def test_sdpa_head_mismatch_needs_enable_gqa():
    q, k = rand(2, 4, 5, 16), rand(2, 2, 5, 16)
    with pytest.raises(ValueError, match="enable_gqa"):
        flash_cuda.scaled_dot_product_attention(q, k, k)


def test_rotary_dim_larger_than_head_dim():
    x, cos = rand(2, 5, 3, 8), rand(5, 6)
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rotary_emb(x, cos, cos)
    with pytest.raises(ValueError, match="cos and sin"):
        apply_rotary_emb(x, cos[:, :2], cos[:, :3])


# ----------------------------------------------------------------------------------------------
# The C++ checks, through the public functions (CPU).

def test_mismatched_dtypes():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="k must have the same dtype as q"):
        fa(q, k.double(), v)
    with pytest.raises(TypeError, match="v must have the same dtype as q"):
        fa(q, k, v.half())
    with pytest.raises(TypeError, match="q must be fp16, bf16, fp32 or fp64"):
        fa(q.int(), k.int(), v.int())


@pytest.mark.parametrize("bad, match", [
    (lambda q, k, v: (q[0], k, v), "q must have 4 dimensions"),
    (lambda q, k, v: (q, k[..., None], v), "k must have 4 dimensions"),
    (lambda q, k, v: (q, k[:1], v[:1]), "k must have shape"),
    (lambda q, k, v: (q, k, v[:, :3]), "v must have shape"),
    (lambda q, k, v: (q, k[..., :8], v[..., :8]), "same head dimension"),
])
def test_wrong_rank_or_shape(bad, match):
    with pytest.raises(ValueError, match=match):
        fa(*bad(*_qkv()))


def test_last_dim_not_contiguous():
    q, k, v = _qkv()
    q_t = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # same shape, stride(-1) != 1
    with pytest.raises(ValueError, match="q must have a contiguous last dimension"):
        fa(q_t, k, v)
    with pytest.raises(ValueError, match="v must have a contiguous last dimension"):
        fa(q, k, v.transpose(-1, -2).contiguous().transpose(-1, -2))


def test_head_dim_too_large():
    q, k, v = _qkv(d=264)
    with pytest.raises(ValueError, match="head dimension .* between 1 and 256"):
        fa(q, k, v)


def test_heads_not_divisible():
    q, k, v = _qkv(h=4, hk=3)
    with pytest.raises(ValueError, match="query heads .* divisible"):
        fa(q, k, v)


@pytest.mark.parametrize("kwargs, match", [
    (dict(window_size=(-2, -1)), r"window_size\[0\]"),
    (dict(window_size=(0, -5)), r"window_size\[1\]"),
    (dict(softcap=-1.0), "softcap"),
    (dict(dropout_p=1.0), "dropout_p"),
    (dict(dropout_p=-0.1), "dropout_p"),
    (dict(softmax_scale=float("nan")), "softmax_scale"),
])
def test_bad_scalars(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fa(*_qkv(), **kwargs)


def test_bad_alibi():
    q, k, v = _qkv(b=2, h=4)
    with pytest.raises(TypeError, match="alibi_slopes must be float32"):
        fa(q, k, v, alibi_slopes=torch.rand(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        fa(q, k, v, alibi_slopes=torch.rand(3))
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        fa(q, k, v, alibi_slopes=torch.rand(4, 2))


def test_bad_backward_inputs():
    q, k, v = _qkv()
    args = (None, 0.0, 0.25, False, -1, -1, 0.0)
    out, lse, _, rng = torch.ops.flash_cuda.fwd(q, k, v, *args, False)
    bwd = torch.ops.flash_cuda.bwd
    with pytest.raises(ValueError, match="dout must have the shape of q"):
        bwd(out[:, :2], q, k, v, out, lse, *args, False, rng)
    with pytest.raises(TypeError, match="softmax_lse must be float32"):
        bwd(out, q, k, v, out, lse.double(), *args, False, rng)
    with pytest.raises(TypeError, match="rng_state must be int64"):
        bwd(out, q, k, v, out, lse, *args, False, rng.int())


# ----------------------------------------------------------------------------------------------
# varlen


def _varlen(lens_q=(3, 5), lens_k=(4, 6), h=4, hk=2, d=16):
    q = rand(sum(lens_q), h, d)
    k, v = rand(sum(lens_k), hk, d), rand(sum(lens_k), hk, d)
    return q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k), max(lens_q), max(lens_k)


def test_cu_seqlens_not_int32():
    q, k, v, cq, ck, mq, mk = _varlen()
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32"):
        flash_cuda.flash_attn_varlen_func(q, k, v, cq.long(), ck, mq, mk)
    with pytest.raises(TypeError, match="cu_seqlens_k must be int32"):
        flash_cuda.flash_attn_varlen_func(q, k, v, cq, ck.long(), mq, mk)


def test_cu_seqlens_not_monotone():
    q, k, v, cq, ck, mq, mk = _varlen()
    bad = torch.tensor([0, 7, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_k must be non-decreasing"):
        flash_cuda.flash_attn_varlen_func(q, k, v, cq, bad, mq, 10)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[0\] must be 0"):
        flash_cuda.flash_attn_varlen_func(q, k, v, cq + 1, ck, mq, mk)


def test_cu_seqlens_wrong_length():
    q, k, v, cq, ck, mq, mk = _varlen()
    with pytest.raises(ValueError, match="cu_seqlens_k must have shape"):
        flash_cuda.flash_attn_varlen_func(q, k, v, cq, ck[:2], mq, mk)
    with pytest.raises(ValueError, match="cu_seqlens_q must have shape"):
        flash_cuda.flash_attn_varlen_func(q, k, v, cq[:1], ck[:1], mq, mk)


def test_cu_seqlens_past_the_tensor():
    q, k, v, cq, ck, mq, mk = _varlen()
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\]"):
        flash_cuda.flash_attn_varlen_func(q, k[:5], v[:5], cq, ck, mq, mk)


def test_max_seqlen_too_small():
    q, k, v, cq, ck, mq, mk = _varlen()
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash_cuda.flash_attn_varlen_func(q, k, v, cq, ck, mq - 1, mk)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        flash_cuda.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk - 1)
    qkv = torch.stack([k.repeat(1, 2, 1), k.repeat(1, 2, 1), k.repeat(1, 2, 1)], 1)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash_cuda.flash_attn_varlen_qkvpacked_func(qkv, ck, mk - 1)


def test_varlen_wrong_rank():
    q, k, v, cq, ck, mq, mk = _varlen()
    with pytest.raises(ValueError, match="q must have 3 dimensions"):
        flash_cuda.flash_attn_varlen_func(q[None], k, v, cq, ck, mq, mk)


def test_varlen_paged_block_table_out_of_range():
    q, _, _, cq, ck, mq, mk = _varlen(lens_k=(4, 6))
    k_pages, v_pages = rand(3, 4, 2, 16), rand(3, 4, 2, 16)  # 3 blocks of 4 keys
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)  # sequence 1 needs block 3
    with pytest.raises(ValueError, match="block_table"):
        flash_cuda.flash_attn_varlen_func(q, k_pages, v_pages, cq, ck, mq, mk, block_table=table)


# ----------------------------------------------------------------------------------------------
# KV cache: every rejection leaves the cache untouched.


def _cache(b=2, s_cache=8, h=4, hk=2, d=16, s_new=2):
    return dict(q=rand(b, 1, h, d), k_cache=rand(b, s_cache, hk, d),
                v_cache=rand(b, s_cache, hk, d), k=rand(b, s_new, hk, d), v=rand(b, s_new, hk, d),
                cache_seqlens=torch.tensor([1, 3], dtype=torch.int32))


def _assert_rejected_untouched(kwargs, exc, match):
    k0, v0 = kwargs["k_cache"].clone(), kwargs["v_cache"].clone()
    with pytest.raises(exc, match=match):
        flash_cuda.flash_attn_with_kvcache(**kwargs)
    assert torch.equal(kwargs["k_cache"], k0) and torch.equal(kwargs["v_cache"], v0)


def test_kvcache_block_table_out_of_range_leaves_cache():
    kw = _cache()
    kw["k_cache"] = rand(4, 2, 2, 16)  # 4 pages of 2 keys
    kw["v_cache"] = rand(4, 2, 2, 16)
    # Sequence 1 holds 3 + 2 new = 5 keys: 3 pages, and its third page (7) does not exist.
    kw["block_table"] = torch.tensor([[0, 1, 2], [3, 2, 7]], dtype=torch.int32)
    _assert_rejected_untouched(kw, ValueError, r"block_table\[1, 2\] = 7 is out of range")
    # A table entry past what the sequence uses is not read, so it is not an error.
    kw["block_table"] = torch.tensor([[0, 1, 7], [3, 2, 1]], dtype=torch.int32)
    flash_cuda.flash_attn_with_kvcache(**kw)


def test_kvcache_overflow_leaves_cache():
    kw = _cache(s_cache=4)
    _assert_rejected_untouched(kw, ValueError, "cache_seqlens.* exceeds the cache length")


@pytest.mark.parametrize("change, exc, match", [
    (dict(k=rand(2, 2, 3, 16)), ValueError, "k must have shape"),
    (dict(v=None), ValueError, "k and v .* together"),
    (dict(k=rand(2, 2, 2, 16).double()), TypeError, "k must have the same dtype"),
    (dict(cache_seqlens=torch.tensor([1, 3])), TypeError, "cache_seqlens must be int32"),
    (dict(cache_seqlens=torch.tensor([1], dtype=torch.int32)), ValueError,
     "cache_seqlens must have shape"),
    (dict(rotary_cos=rand(16, 10), rotary_sin=rand(16, 10)), ValueError, "rotary_dim"),
    (dict(rotary_cos=rand(4, 4), rotary_sin=rand(4, 4)), ValueError, "rotary_cos/sin have 4"),
    (dict(rotary_cos=rand(16, 4)), ValueError, "rotary_cos and rotary_sin"),
    (dict(window_size=(-3, 0)), ValueError, r"window_size\[0\]"),
    (dict(softcap=-0.5), ValueError, "softcap"),
    (dict(alibi_slopes=torch.rand(5)), ValueError, "alibi_slopes must have shape"),
    (dict(num_splits=-1), ValueError, "num_splits"),
    (dict(cache_batch_idx=torch.tensor([0, 5], dtype=torch.int32)), ValueError,
     "cache_batch_idx"),
    (dict(cache_leftpad=torch.tensor([2, 0], dtype=torch.int32)), ValueError,
     r"cache_leftpad\[0\]"),
])
def test_kvcache_bad_inputs_leave_cache(change, exc, match):
    kw = _cache()
    kw.update(change)
    _assert_rejected_untouched(kw, exc, match)


def test_kvcache_page_size_zero_rejected():
    kw = _cache()
    kw["k_cache"], kw["v_cache"] = rand(4, 0, 2, 16), rand(4, 0, 2, 16)
    kw["block_table"] = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    _assert_rejected_untouched(kw, ValueError, "page size")


def _pages_strided(page_stride, num_blocks=1, page=8, hk=2, d=16):
    """A paged cache whose pages lie page_stride elements apart (a view of a small storage)."""
    storage = rand((num_blocks - 1) * page_stride + page * hk * d)
    return storage.as_strided((num_blocks, page, hk, d), (page_stride, hk * d, d, 1))


def test_paged_cache_strides_over_32_bits_rejected():
    """The kernels form paged row addresses from 32-bit page and row strides."""
    kw = _cache()
    kw["k_cache"], kw["v_cache"] = _pages_strided(2**31), _pages_strided(2**31)
    kw["block_table"] = torch.tensor([[0], [0]], dtype=torch.int32)
    _assert_rejected_untouched(kw, ValueError, r"k_cache with block_table must have page and "
                               r"row strides .* below 2\^31")
    kw["k_cache"] = _pages_strided(2**31 - 1)
    _assert_rejected_untouched(kw, ValueError, "v_cache with block_table must have page")
    q, _, _, cq, ck, mq, mk = _varlen(lens_k=(4, 6))
    with pytest.raises(ValueError, match="k with block_table must have page and row strides"):
        flash_cuda.flash_attn_varlen_func(q, _pages_strided(2**31), _pages_strided(2**31), cq, ck,
                                          mq, mk, block_table=torch.zeros(2, 1, dtype=torch.int32))


@pytest.mark.parametrize("causal", (True, False))
def test_kvcache_rotary_query_position_out_of_table(causal):
    """Queries past the new tokens need rotary positions too: cache_seqlens (+ row, causal)."""
    kw = _cache()
    kw.update(q=rand(2, 3, 4, 16), k=None, v=None, causal=causal)
    n = 5 if causal else 3  # sequence 1 (cache_seqlens 3): rows at 3, 4, 5 or all at 3
    kw.update(rotary_cos=rand(n, 4), rotary_sin=rand(n, 4))
    _assert_rejected_untouched(kw, ValueError, f"rotary_cos/sin have {n} positions, but query row")
    kw.update(rotary_cos=rand(n + 1, 4), rotary_sin=rand(n + 1, 4))
    flash_cuda.flash_attn_with_kvcache(**kw)
    # Without cache_seqlens the queries sit at the cache length (8).
    kw.update(cache_seqlens=None, rotary_cos=rand(8, 4), rotary_sin=rand(8, 4))
    _assert_rejected_untouched(kw, ValueError, "without cache_seqlens query row")
