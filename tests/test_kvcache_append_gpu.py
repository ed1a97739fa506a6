"""The append step of flash_attn_with_kvcache on CUDA (csrc/kernels/kvcache_append.cuh, wired
into mha_fwd_kvcache_cuda): new k (rotary applied) and v written into contiguous or paged
caches, q rotated, then attention over the updated cache.

Against the reference (the CPU op, csrc/reference/kvcache.cpp, on copies): the caches after the
call are equal bit for bit; out/lse pass the DESIGN.md section 9 rule against the fp64 oracle
computed from the reference's cache and rotated q. Sampled grid (a few hundred cases) over batch
{1, 3, 17}, cache length {1, 63, 1000}, new tokens {0, 1, 5}, head dims {64, 80, 128, 256}, GQA
{1, 4, 8}, contiguous vs paged (page 16..256), rotary off/interleaved/half (rotary_dim <= d),
leftpad, cache_batch_idx, strided views, masks none/causal/window. Also: bf16 subnormal
products, CUDA-graph capture/replay with changing cache_seqlens, and rejected calls leaving the
cache untouched.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from api_utils import built_head_dims, capture_cuda_graph
from kvcache_append_cases import (
    ARG_ORDER, call_op, case_id, expected_q, make_case, reference_call, rotary_without_seqlens_case,
    sampled_grid, sequence_kv, to_device)
from naive_attention import naive_attention, normalize_window

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GRID = sampled_grid(300, seed=11)


def poison_allocator():
    """Fill free memory of the caching allocator with NaN, so unwritten outputs show."""
    junk = torch.full((64 << 20,), float("nan"), device="cuda", dtype=torch.float16)
    del junk


def check_out_against_oracle(case, out, lse, k_cache, v_cache):
    """Per sequence: max|out - ref| <= 2 max|out_pt - ref| + 1e-5 (ref fp64, out_pt in the
    input dtype), on the reference's cache and rotated q; lse close, +inf on empty rows."""
    q = expected_q(case)
    left, right = normalize_window(case["causal"], case["window"], case["capacity"])
    out, lse = out.cpu(), lse.cpu()
    for i in range(q.shape[0]):
        ki, vi = sequence_kv(case, k_cache, v_cache, i)
        qi = q[i:i + 1]
        opts = dict(window=(left, right), normalize=False, softmax_scale=case["scale"])
        ref, ref_lse = naive_attention(qi.double(), ki.double(), vi.double(), **opts)
        out_pt, _ = naive_attention(qi, ki, vi, **opts)
        err = (out[i:i + 1].double() - ref).abs().max().item() if ref.numel() else 0.0
        err_pt = (out_pt.double() - ref).abs().max().item() if ref.numel() else 0.0
        assert err <= 2 * err_pt + 1e-5, f"sequence {i}: max|out-ref| {err:.3e} > 2 * {err_pt:.3e}"
        assert torch.equal(torch.isposinf(lse[i:i + 1]), torch.isposinf(ref_lse))
        finite = torch.isfinite(ref_lse)
        if finite.any():
            assert (lse[i:i + 1][finite] - ref_lse[finite]).abs().max().item() < 1e-2


def run_and_check(case):
    dev = to_device(case, "cuda")
    k_ref, v_ref, _, _ = reference_call(case)
    poison_allocator()
    out, lse = call_op(dev)
    torch.cuda.synchronize()
    a = dev["args"]
    assert torch.equal(a["k_cache"].cpu(), k_ref), "k_cache differs from the reference append"
    assert torch.equal(a["v_cache"].cpu(), v_ref), "v_cache differs from the reference append"
    check_out_against_oracle(case, out, lse, k_ref, v_ref)


@needs_cuda
@pytest.mark.parametrize("c", GRID, ids=case_id)
def test_append_then_attend(c):
    run_and_check(make_case(c, seed=zlib.crc32(case_id(c).encode())))


@needs_cuda
@pytest.mark.parametrize("causal", (True, False))
@pytest.mark.parametrize("layout", ("contiguous", 16, 256))
def test_more_queries_than_new_tokens(causal, layout):
    """sq = 4, one new token: q rows at cache_seqlens (+ row when causal), k at its own."""
    c = (3, 63, 1, 128, 4, layout, "half", "none", "causal" if causal else "none", torch.float16)
    run_and_check(make_case(c, seed=7, sq=4))


@needs_cuda
@pytest.mark.parametrize("rotary_dim", (2, 40))
def test_odd_head_dim(rotary_dim):
    """Head dim 59: rows that are not 16-byte multiples (attention takes the reference)."""
    c = (3, 63, 5, 59, 4, "contiguous", "interleaved", "strided", "causal", torch.bfloat16)
    run_and_check(make_case(c, seed=8, rotary_dim=rotary_dim))


@needs_cuda
def test_rotary_without_cache_seqlens():
    """No cache_seqlens (no new tokens): every query sits at the cache length."""
    run_and_check(rotary_without_seqlens_case())


@needs_cuda
@pytest.mark.parametrize("interleaved", (True, False))
def test_bf16_subnormal_products_kept(interleaved):
    """bf16 k and cos/sin around 1e-20: fp32 products are subnormal (~1e-40); the reference keeps
    them, so the kernel must not flush them (the build uses --use_fast_math)."""
    c = (3, 63, 5, 64, 1, "contiguous", "interleaved" if interleaved else "half", "none",
         "causal", torch.bfloat16)
    case = make_case(c, seed=9, rotary_dim=64)
    a = case["args"]
    a["k"] = (a["k"].float() * 1e-20).to(torch.bfloat16)
    a["rotary_cos"] = (a["rotary_cos"].float() * 1e-20).to(torch.bfloat16)
    a["rotary_sin"] = (a["rotary_sin"].float() * 1e-20).to(torch.bfloat16)
    k_ref, _, _, _ = reference_call(case)
    assert (k_ref != 0).any() and (k_ref.float().abs() < 1e-38).any(), "no subnormal in the test"
    dev = to_device(case, "cuda")
    call_op(dev)
    assert torch.equal(dev["args"]["k_cache"].cpu(), k_ref)


# ----------------------------------------------------------------------------------------------
# CUDA graphs: the append step has no host sync and no data-dependent allocation.

# Every layout runs the attention kernel (no host sync), so every replay case runs.
FEATURES = ("contiguous", "paged", "batch_idx", "leftpad")


@needs_cuda
@pytest.mark.parametrize("rotary", ("off", "interleaved", "half"))
@pytest.mark.parametrize("feature", FEATURES)
def test_graph_replay_equals_eager(rotary, feature):
    layout = 16 if feature == "paged" else "contiguous"
    extra = feature if feature in ("batch_idx", "leftpad") else "none"
    c = (4, 500, 1, 128, 4, layout, rotary, extra, "causal", torch.bfloat16)
    case = make_case(c, seed=10, rotary_dim=64)
    if rotary != "off":  # positions up to the cache length, for every replay below
        angle = torch.rand(case["capacity"] + 8, 32) * 6.28
        case["args"]["rotary_cos"] = angle.cos().to(torch.bfloat16)
        case["args"]["rotary_sin"] = angle.sin().to(torch.bfloat16)
    case = to_device(case, "cuda")
    a = case["args"]
    seqlens = a["cache_seqlens"]

    graph, (out_graph, lse_graph) = capture_cuda_graph(lambda: call_op(case), 128)
    for new_lens in ([10, 11, 12, 13], [0, 499, 200, 1], [37, 0, 0, 250]):
        seqlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        if a["cache_leftpad"] is not None:
            a["cache_leftpad"].copy_(torch.tensor([n // 3 for n in new_lens], dtype=torch.int32))
        for name in ("q", "k", "v"):
            a[name].normal_()
        k_before, v_before = a["k_cache"].clone(), a["v_cache"].clone()
        graph.replay()
        replay = out_graph.clone(), lse_graph.clone(), a["k_cache"].clone(), a["v_cache"].clone()
        a["k_cache"].copy_(k_before)
        a["v_cache"].copy_(v_before)
        eager = call_op(case) + (a["k_cache"], a["v_cache"])
        for r, e in zip(replay, eager):
            assert torch.equal(r, e)


# ----------------------------------------------------------------------------------------------
# Rejected calls on CUDA leave the cache untouched (the checks run before the append kernel).


def _cuda_case(dtype=torch.float16):
    """b 2, 8 cache slots, h 4, hk 2, d 64; 2 new tokens at cache_seqlens (1, 3)."""
    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    args = dict(q=randn(2, 1, 4, 64), k_cache=randn(2, 8, 2, 64), v_cache=randn(2, 8, 2, 64),
                k=randn(2, 2, 2, 64), v=randn(2, 2, 2, 64), cache_seqlens=_i32([1, 3]))
    for name in ARG_ORDER:
        args.setdefault(name, None)
    return dict(args=args, causal=False, window=(-1, -1), softcap=0.0, interleaved=True,
                scale=0.125, num_splits=0, capacity=8)


def _assert_rejected_untouched(case, exc, match):
    a = case["args"]
    k0, v0 = a["k_cache"].clone(), a["v_cache"].clone()
    with pytest.raises(exc, match=match):
        call_op(case)
    torch.cuda.synchronize()
    assert torch.equal(a["k_cache"], k0) and torch.equal(a["v_cache"], v0)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def _paged(case, num_blocks, page, table):
    a = case["args"]
    hk, d = a["k_cache"].shape[2:]
    a["k_cache"] = torch.randn(num_blocks, page, hk, d, device="cuda", dtype=a["q"].dtype)
    a["v_cache"] = torch.randn(num_blocks, page, hk, d, device="cuda", dtype=a["q"].dtype)
    a["block_table"] = _i32(table)
    case["capacity"] = len(table[0]) * page


def _rotary(case, seqlen_ro, half=8):
    a = case["args"]
    a["rotary_cos"] = torch.rand(seqlen_ro, half, device="cuda").to(a["q"].dtype)
    a["rotary_sin"] = torch.rand(seqlen_ro, half, device="cuda").to(a["q"].dtype)


@needs_cuda
def test_rejected_block_table_too_small():
    case = _cuda_case()
    # Sequence 1 holds 3 + 2 new = 5 keys at page 2: 3 pages, the table has 2 per sequence.
    _paged(case, 6, 2, [[0, 1], [2, 3]])
    _assert_rejected_untouched(case, ValueError, "block_table has 2 blocks per sequence")


@needs_cuda
def test_rejected_block_table_entry_out_of_range():
    case = _cuda_case()
    _paged(case, 4, 2, [[0, 1, 2], [3, 2, 7]])
    _assert_rejected_untouched(case, ValueError, r"block_table\[1, 2\] = 7 is out of range")


@needs_cuda
def test_rejected_page_size_zero():
    case = _cuda_case()
    _paged(case, 4, 0, [[0, 1], [2, 3]])
    _assert_rejected_untouched(case, ValueError, "page size")


@needs_cuda
def test_rejected_cache_batch_idx_out_of_range():
    case = _cuda_case()
    case["args"]["cache_batch_idx"] = _i32([0, 2])
    _assert_rejected_untouched(case, ValueError, r"cache_batch_idx\[1\] = 2 is out of range")


@needs_cuda
def test_rejected_cache_dtype_mismatch():
    case = _cuda_case()
    a = case["args"]
    a["v_cache"] = a["v_cache"].to(torch.bfloat16)
    _assert_rejected_untouched(case, TypeError, "v_cache must have the same dtype")


@needs_cuda
def test_rejected_cache_overflow():
    case = _cuda_case()
    case["args"]["cache_seqlens"] = _i32([1, 7])  # 7 + 2 new > 8 slots
    _assert_rejected_untouched(case, ValueError, "exceeds the cache length")


@needs_cuda
def test_rejected_rotary_table_too_short_for_keys():
    case = _cuda_case()
    _rotary(case, 4)  # sequence 1 needs positions up to 3 + 2 - 1 = 4
    _assert_rejected_untouched(case, ValueError, "rotary_cos/sin have 4")


@needs_cuda
@pytest.mark.parametrize("causal", (True, False))
def test_rejected_rotary_table_too_short_for_queries(causal):
    """No new tokens, 3 queries: causal rows sit at cache_seqlens + row (up to 5), else at 3."""
    case = _cuda_case()
    a = case["args"]
    a["k"] = a["v"] = None
    a["q"] = torch.randn(2, 3, 4, 64, device="cuda", dtype=torch.float16)
    case["causal"] = causal
    _rotary(case, 5 if causal else 3)
    _assert_rejected_untouched(case, ValueError, "rotary_cos/sin have")
    _rotary(case, 6 if causal else 4)
    call_op(case)  # one more position is enough


# ----------------------------------------------------------------------------------------------
# The value checks' host copies (csrc/checks.cpp HostCopies): a CUDA tensor's copy is kept while
# PyTorch has not modified the tensor, so a model's later layers reuse it without a stream sync;
# an in-place change, a new tensor or FLASH_CUDA_CHECK_VALUES=always copy again.


class _SyncsRaise:
    """torch.cuda's sync debug mode set to error: a synchronizing call inside raises. Skips the
    test on builds without head dim 64 (_cuda_case's): there the attention runs on the reference
    path, which synchronizes whatever the checks do."""

    def __init__(self):
        if 64 not in built_head_dims():
            pytest.skip("head dim 64 not built: the reference fallback synchronizes")

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")


@needs_cuda
@pytest.mark.parametrize("paged", (False, True), ids=("contiguous", "paged"))
def test_value_checks_reuse_unmodified_host_copies(paged):
    case = _cuda_case()
    a = case["args"]
    if paged:
        _paged(case, 6, 4, [[0, 1], [2, 3]])  # 8 slots per sequence
    a["k"] = a["v"] = None  # no append: every call sees the same cache
    first = call_op(case)  # copies cache_seqlens (and block_table) to the host
    with _SyncsRaise():
        again = call_op(case)  # the same tensors, unmodified: no device-to-host copy
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    fresh = _i32([1, 3])  # equal values, another tensor: copied again
    a["cache_seqlens"] = fresh
    with _SyncsRaise(), pytest.raises(RuntimeError, match="synchroniz"):
        call_op(case)
    # In-place changes bump the version counter: the checks see the new values.
    a["k"], a["v"] = (torch.randn(2, 2, 2, 64, device="cuda", dtype=torch.float16)
                      for _ in range(2))
    call_op(case)
    fresh[1] = 7  # 7 + 2 new > 8 slots
    _assert_rejected_untouched(case, ValueError, "exceeds the cache length|needs 3")
    if paged:
        fresh[1] = 3
        call_op(case)
        a["block_table"][1, 1] = 6
        _assert_rejected_untouched(case, ValueError, r"block_table\[1, 1\] = 6 is out of range")


@needs_cuda
def test_stale_kept_copy_never_rejects_a_good_call():
    """A write PyTorch does not track (through .data: the version counter stays) leaves the kept
    copy stale; checks that fail on it run again on a fresh copy (checks.h
    recheck_on_fresh_copies), so the call goes through and appends where the tensor says."""
    case = _cuda_case()
    a = case["args"]
    new_k, new_v = a["k"], a["v"]
    seqlens = _i32([1, 7])
    a["cache_seqlens"], a["k"], a["v"] = seqlens, None, None
    call_op(case)  # keeps [1, 7]: 7 keys fit in 8 slots
    seqlens.data[1] = 3  # untracked: the kept copy still says 7
    a["k"], a["v"] = new_k, new_v  # 7 + 2 new would not fit; 3 + 2 does
    call_op(case)
    torch.cuda.synchronize()
    assert torch.equal(a["k_cache"][1, 3:5], new_k[1])
    assert torch.equal(a["v_cache"][1, 3:5], new_v[1])


@needs_cuda
def test_value_checks_copy_every_call_when_asked(monkeypatch):
    case = _cuda_case()
    case["args"]["k"] = case["args"]["v"] = None
    call_op(case)
    monkeypatch.setenv("FLASH_CUDA_CHECK_VALUES", "always")
    with _SyncsRaise(), pytest.raises(RuntimeError, match="synchroniz"):
        call_op(case)
