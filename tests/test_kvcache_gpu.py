"""KV-cache attention on CUDA (flash_attn_with_kvcache): contiguous caches with new tokens
appended in place against the naive oracle, the cache contents after the append, and CUDA-graph
capture/replay. Paged caches, cache_batch_idx, leftpad and split-KV: tests/test_paged_gpu.py.
Rotary runs the reference on CUDA.
"""

import random

import pytest
import torch

from api_utils import built_head_dims, capture_cuda_graph
from naive_attention import naive_attention, normalize_window

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _flash():
    import flash_cuda

    return flash_cuda


def check_sequence(out_i, lse_i, q_i, k_i, v_i, label, **opts):
    """One sequence (batch 1: q_i, and the keys / values k_i, v_i it sees) against the oracle:
    the DESIGN.md rule (2x the input-dtype oracle's error, fp64 reference); opts go to
    naive_attention."""
    ref, ref_lse = naive_attention(q_i.double(), k_i.double(), v_i.double(), **opts)
    out_pt, _ = naive_attention(q_i, k_i, v_i, **opts)
    err = (out_i.double() - ref).abs().max().item()
    err_pt = (out_pt.double() - ref).abs().max().item()
    assert err <= 2 * err_pt + 1e-5, f"{label}: max|out-ref| {err:.3e} > 2 * {err_pt:.3e}"
    assert torch.equal(torch.isposinf(lse_i), torch.isposinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    if finite.any():
        assert (lse_i[finite] - ref_lse[finite]).abs().max().item() < 1e-2


def check_against_oracle(out, lse, q, k_cache, v_cache, lengths, *, causal, window, softcap,
                         alibi_slopes):
    """Per sequence i: check_sequence over the cache's first lengths[i] rows of row i."""
    capacity = k_cache.shape[1]
    left, right = normalize_window(causal, window, capacity)
    for i, n in enumerate(lengths):
        check_sequence(out[i:i + 1], lse[i:i + 1], q[i:i + 1], k_cache[i:i + 1, :n],
                       v_cache[i:i + 1, :n], f"sequence {i}", window=(left, right),
                       normalize=False, softcap=softcap, alibi_slopes=alibi_slopes)


CASES = [
    # b, capacity, s_new, d, h, hk, feature
    (1, 1, 0, 64, 4, 4, "plain"),
    (1, 63, 1, 128, 32, 8, "causal"),
    (3, 1000, 5, 128, 8, 2, "causal"),
    (3, 1000, 1, 64, 8, 8, "window"),
    (17, 300, 1, 128, 4, 1, "softcap"),
    (3, 8192, 1, 128, 32, 8, "plain"),
    (2, 257, 5, 256, 8, 1, "alibi"),
    (3, 120, 0, 80, 4, 2, "causal"),   # head dim 80: the d96 kernel
]


@needs_cuda
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_kvcache_append_and_attend(dtype, case):
    b, capacity, s_new, d, h, hk, feature = case
    rng = random.Random(hash(case) & 0xFFFF)
    gen = torch.Generator(device="cuda").manual_seed(rng.randint(0, 1 << 30))
    k_cache = torch.randn(b, capacity, hk, d, device="cuda", dtype=dtype, generator=gen)
    v_cache = torch.randn(b, capacity, hk, d, device="cuda", dtype=dtype, generator=gen)
    seqlens = [rng.randint(0, capacity - s_new) for _ in range(b)]
    cache_seqlens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    q = torch.randn(b, max(s_new, 1), h, d, device="cuda", dtype=dtype, generator=gen)
    k_new = torch.randn(b, s_new, hk, d, device="cuda", dtype=dtype, generator=gen) if s_new else None
    v_new = torch.randn(b, s_new, hk, d, device="cuda", dtype=dtype, generator=gen) if s_new else None
    causal = feature == "causal"
    window = (rng.randint(0, 40), rng.randint(0, 3)) if feature == "window" else (-1, -1)
    softcap = 5.0 if feature == "softcap" else 0.0
    alibi = (torch.rand(h, device="cuda") * 0.3) if feature == "alibi" else None
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for i, n in enumerate(seqlens):
        if s_new:
            expected_k[i, n:n + s_new] = k_new[i]
            expected_v[i, n:n + s_new] = v_new[i]

    out, lse = _flash().flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=cache_seqlens, causal=causal,
        window_size=window, softcap=softcap, alibi_slopes=alibi, return_softmax_lse=True)

    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    lengths = [n + s_new for n in seqlens]
    check_against_oracle(out, lse, q, k_cache, v_cache, lengths, causal=causal, window=window,
                         softcap=softcap, alibi_slopes=alibi)


@needs_cuda
def test_kvcache_decode_step_in_cuda_graph():
    """Capture one decode step; replays with other cache_seqlens and tokens equal eager calls."""
    b, capacity, h, hk, d, dtype = 4, 512, 16, 4, 128, torch.bfloat16
    k_cache = torch.randn(b, capacity, hk, d, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(b, 1, h, d, device="cuda", dtype=dtype)
    k_new = torch.randn(b, 1, hk, d, device="cuda", dtype=dtype)
    v_new = torch.randn_like(k_new)
    cache_seqlens = torch.tensor([3, 100, 0, 400], dtype=torch.int32, device="cuda")
    flash = _flash()

    def step():
        return flash.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                             cache_seqlens=cache_seqlens, causal=True)

    graph, out_graph = capture_cuda_graph(step, 128)
    for seqlens in ([10, 11, 12, 13], [0, 511, 200, 1]):
        cache_seqlens.copy_(torch.tensor(seqlens, dtype=torch.int32))
        q.normal_()
        k_new.normal_()
        v_new.normal_()
        k_before, v_before = k_cache.clone(), v_cache.clone()
        graph.replay()
        replay_out, replay_k = out_graph.clone(), k_cache.clone()
        k_cache.copy_(k_before)
        v_cache.copy_(v_before)
        eager_out = step()
        assert torch.equal(replay_out, eager_out)
        assert torch.equal(replay_k, k_cache)


@needs_cuda
@pytest.mark.parametrize("hk,num_splits", [(1, 16), (8, 33), (8, 3)], ids=("mqa-16", "gqa-33",
                                                                           "gqa-3"))
def test_split_decode_pdl_equals_plain_launch(hk, num_splits, monkeypatch):
    """The combine kernel launched with programmatic dependent launch (the default on sm_90; it
    may start while the attention kernel runs and waits for it in griddepcontrol.wait) gives the
    same bits as a plain launch (FLASH_CUDA_PDL=0), eagerly and in CUDA-graph replays with new
    queries each time (a combine reading the partials too early would see the previous step's)."""
    b, capacity, h, d, dtype = 2, 8192, 32, 128, torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(7)
    k_cache = torch.randn(b, capacity, hk, d, device="cuda", dtype=dtype, generator=gen)
    v_cache = torch.randn(b, capacity, hk, d, device="cuda", dtype=dtype, generator=gen)
    q = torch.randn(b, 1, h, d, device="cuda", dtype=dtype, generator=gen)
    cache_seqlens = torch.tensor([capacity, 5000], dtype=torch.int32, device="cuda")
    flash = _flash()

    def step():
        return flash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                             num_splits=num_splits, return_softmax_lse=True)

    def plain():
        monkeypatch.setenv("FLASH_CUDA_PDL", "0")
        try:
            return step()
        finally:
            monkeypatch.delenv("FLASH_CUDA_PDL")

    out, lse = step()
    out_plain, lse_plain = plain()
    assert torch.equal(out, out_plain) and torch.equal(lse, lse_plain)
    check_against_oracle(out, lse, q, k_cache, v_cache, [capacity, 5000], causal=False,
                         window=(-1, -1), softcap=0.0, alibi_slopes=None)

    graph, (out_graph, lse_graph) = capture_cuda_graph(step, 128)
    for _ in range(20):
        q.normal_(generator=gen)
        graph.replay()
        out_plain, lse_plain = plain()
        assert torch.equal(out_graph, out_plain) and torch.equal(lse_graph, lse_plain)


@needs_cuda
@pytest.mark.parametrize("num_splits", (1, 0), ids=("splits1", "heuristic"))
@pytest.mark.parametrize("page", (None, 16), ids=("contiguous", "paged16"))
def test_append_step_pdl_equals_plain_launch(page, num_splits, monkeypatch):
    """An appending step's attention kernel launched with programmatic dependent launch after the
    append kernel (the default on sm_90: it may be scheduled as the append kernel's CTAs finish,
    and waits for that grid in griddepcontrol.wait) gives the same bits and the same cache as
    plain launches (FLASH_CUDA_PDL=0): eagerly, and over CUDA-graph replays of a decode loop whose
    new tokens, rotated queries and key counts change every step (an attention reading them before
    the append finished would see the previous step's)."""
    b, capacity, h, hk, d, rotary_dim, dtype = 3, 2048, 32, 8, 128, 64, torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(11)
    if page is None:
        k_cache = torch.randn(b, capacity, hk, d, device="cuda", dtype=dtype, generator=gen)
        block_table = None
    else:
        pages = capacity // page
        k_cache = torch.randn(b * pages + 5, page, hk, d, device="cuda", dtype=dtype, generator=gen)
        perm = torch.randperm(k_cache.shape[0], device="cuda", generator=gen)[: b * pages]
        block_table = perm.view(b, pages).int()
    v_cache = torch.randn(k_cache.shape, device="cuda", dtype=dtype, generator=gen)
    q = torch.randn(b, 1, h, d, device="cuda", dtype=dtype, generator=gen)
    k_new = torch.randn(b, 1, hk, d, device="cuda", dtype=dtype, generator=gen)
    v_new = torch.randn(b, 1, hk, d, device="cuda", dtype=dtype, generator=gen)
    angles = torch.rand(capacity, rotary_dim // 2, device="cuda", generator=gen) * 6.3
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    cache_seqlens = torch.tensor([1500, 7, 1100], dtype=torch.int32, device="cuda")
    flash = _flash()

    def step():
        return flash.flash_attn_with_kvcache(
            q, k_cache, v_cache, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
            cache_seqlens=cache_seqlens, block_table=block_table, causal=True,
            num_splits=num_splits, return_softmax_lse=True)

    def compare(run_pdl):
        """run_pdl() (returning out, lse) against a plain eager step from the same cache."""
        k_before, v_before = k_cache.clone(), v_cache.clone()
        out, lse = (t.clone() for t in run_pdl())
        k_pdl, v_pdl = k_cache.clone(), v_cache.clone()
        k_cache.copy_(k_before)
        v_cache.copy_(v_before)
        monkeypatch.setenv("FLASH_CUDA_PDL", "0")
        try:
            out_plain, lse_plain = step()
        finally:
            monkeypatch.delenv("FLASH_CUDA_PDL")
        assert torch.equal(out, out_plain) and torch.equal(lse, lse_plain)
        assert torch.equal(k_pdl, k_cache) and torch.equal(v_pdl, v_cache)
        assert not torch.equal(k_pdl, k_before)  # the step appended

    compare(step)
    graph, (out_graph, lse_graph) = capture_cuda_graph(step, 128)
    for _ in range(12):
        cache_seqlens.add_(1)
        for t in (q, k_new, v_new):
            t.normal_(generator=gen)
        compare(lambda: (graph.replay(), (out_graph, lse_graph))[1])


@needs_cuda
@pytest.mark.parametrize("paged", (False, True), ids=("contiguous", "paged16"))
def test_unchecked_out_of_range_values_read_inside(paged, monkeypatch):
    """With the value checks off (FLASH_CUDA_CHECK_VALUES=0; so too in CUDA-graph capture, or with
    a stale kept host copy) out-of-range cache_seqlens, cache_batch_idx, cache_leftpad and
    block-table entries reach the kernel: it clamps them (sm80/fwd.cuh SequenceInfo,
    PagedKVRows::clamp_page), so the call reads inside its tensors (no illegal address: the
    values below point megabytes past them) and returns attention over the clamped values."""
    if 128 not in built_head_dims():
        pytest.skip("head dim 128 not built")
    monkeypatch.setenv("FLASH_CUDA_CHECK_VALUES", "0")
    b, capacity, h, hk, d, dtype = 3, 192, 8, 2, 128, torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(23)
    seqlens = [capacity + 50, 77, 10**6]
    lengths = [min(n, capacity) for n in seqlens]
    q = torch.randn(b, 1, h, d, device="cuda", dtype=dtype, generator=gen)
    kwargs = dict(cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device="cuda"),
                  num_splits=3)
    if paged:
        page, pages = 16, capacity // 16
        num_pages = b * pages + 2
        k_cache = torch.randn(num_pages, page, hk, d, device="cuda", dtype=dtype, generator=gen)
        v_cache = torch.randn_like(k_cache)
        table = torch.randperm(num_pages, device="cuda", generator=gen)[: b * pages]
        table = table.view(b, pages).int()
        table[0, 2], table[2, 0] = 10**6, -5
        kwargs["block_table"] = table
        clamped = table.long()
        clamped[(clamped < 0) | (clamped >= num_pages)] = num_pages - 1
        seqs = [(k_cache[clamped[i]].flatten(0, 1)[:lengths[i]],
                 v_cache[clamped[i]].flatten(0, 1)[:lengths[i]]) for i in range(b)]
    else:
        k_cache = torch.randn(b + 1, capacity, hk, d, device="cuda", dtype=dtype, generator=gen)
        v_cache = torch.randn_like(k_cache)
        rows, lefts = [10**6, 1, -2], [0, 60, -7]
        kwargs.update(cache_batch_idx=torch.tensor(rows, dtype=torch.int32, device="cuda"),
                      cache_leftpad=torch.tensor(lefts, dtype=torch.int32, device="cuda"))
        rows = [min(max(r, 0), b) for r in rows]
        lefts = [max(x, 0) for x in lefts]
        seqs = [(k_cache[rows[i], lefts[i]:lengths[i]], v_cache[rows[i], lefts[i]:lengths[i]])
                for i in range(b)]
    out, lse = _flash().flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True,
                                                **kwargs)
    torch.cuda.synchronize()  # an illegal address would raise here
    for i, (k_i, v_i) in enumerate(seqs):
        check_sequence(out[i:i + 1], lse[i:i + 1], q[i:i + 1], k_i[None], v_i[None],
                       f"sequence {i}")
