"""KV-cache decode on CUDA through the sm80 kernel's decode paths: split-KV (num_splits 0 =
heuristic, 1, 3, 16), GQA packing, paged caches (page sizes 16..256: pages smaller than, equal to
and larger than the 64-key tile), cache_batch_idx, cache_leftpad, the mask / bias features,
new tokens appended in place; plus CUDA-graph capture/replay of paged split decode steps and
varlen_fwd with block_table (paged prefill). Issue 5's cross product, sampled with a fixed
seed. Oracle: fp64 naive attention per sequence over the keys it sees, DESIGN.md section 9
rule (2x the input-dtype oracle's error); the cache after the call must equal the expected
append. Rotary is the append kernel's part and is not covered here.
"""

import itertools
import os
import pathlib
import random
import re
import sys
import zlib

import pytest
import torch

from api_utils import built_head_dims, capture_cuda_graph
from naive_attention import naive_attention, normalize_window

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "emulation"))
from driver import kernel_head_dim  # noqa: E402  (the kernel head dim serving a head dim)

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _flash():
    import flash_cuda

    return flash_cuda


BATCHES = (1, 3, 17)
CACHE_LENGTHS = (1, 63, 1000, 8192)
NEW_TOKENS = (0, 1, 5)
HEAD_DIMS = (64, 80, 128, 256)
GQA = (1, 4, 8)
LAYOUTS = ("contiguous", "paged16", "paged32", "paged64", "paged128", "paged256",
           "leftpad", "batch_idx")
FEATURES = ("plain", "causal", "window", "softcap", "alibi")
SPLITS = (0, 1, 3, 16)


def sampled_cases(n=72, seed=5):
    rng = random.Random(seed)
    grid = list(itertools.product(BATCHES, CACHE_LENGTHS, NEW_TOKENS, HEAD_DIMS, GQA, LAYOUTS,
                                  FEATURES, SPLITS))
    cases = rng.sample(grid, n)
    # Always: the decode shapes of the benchmark at small batch, every page size, every split.
    cases += [(1, 8192, 1, 128, 4, f"paged{p}", "plain", s) for p in (16, 256) for s in SPLITS]
    cases += [(3, 1000, 1, 128, 8, "contiguous", "causal", 0), (17, 63, 0, 64, 1, "leftpad", "plain", 0)]
    # Pages smaller than the kernel's copy steps (16 rows, 32 at d32: the lookup's per-row page
    # division) and odd sizes.
    cases += [(2, 200, 1, 128, 4, "paged8", "plain", 3), (3, 100, 0, 64, 1, "paged5", "causal", 0),
              (1, 96, 1, 32, 8, "paged16", "softcap", 1), (2, 40, 1, 256, 1, "paged1", "plain", 0)]
    return cases


def case_id(c):
    return "-".join(map(str, c))


class Cache:
    """A cache of `batch_cache` logical sequences of `capacity` keys: contiguous, or shuffled pages
    (plus spare blocks) addressed by a block table. dense() gives the logical rows."""

    def __init__(self, batch_cache, capacity, hk, d, dtype, page, gen):
        self.page = page
        dev = "cuda"
        if page is None:
            self.k = torch.randn(batch_cache, capacity, hk, d, device=dev, dtype=dtype, generator=gen)
            self.v = torch.randn_like(self.k)
            self.block_table = None
        else:
            pages = (capacity + page - 1) // page
            num_blocks = batch_cache * pages + 5
            self.k = torch.randn(num_blocks, page, hk, d, device=dev, dtype=dtype, generator=gen)
            self.v = torch.randn_like(self.k)
            perm = torch.randperm(num_blocks, device=dev, generator=gen)[: batch_cache * pages]
            self.block_table = perm.view(batch_cache, pages).int()

    def dense(self, i):
        """Logical rows of sequence i, (capacity', hk, d) each for k and v."""
        if self.block_table is None:
            return self.k[i], self.v[i]
        idx = self.block_table[i].long()
        return self.k[idx].flatten(0, 1), self.v[idx].flatten(0, 1)


def run_case(case, dtype, hk=None):
    """hk: the KV heads (default: 1 or 2 for GQA, 1 or 4 for MHA, drawn from the case)."""
    b, capacity, s_new, d, g, layout, feature, num_splits = case
    rng = random.Random(zlib.crc32(repr(case).encode()))
    gen = torch.Generator(device="cuda").manual_seed(rng.randint(0, 1 << 30))
    drawn_hk = rng.choice((1, 2)) if g > 1 else rng.choice((1, 4))
    hk = drawn_hk if hk is None else hk
    h = hk * g
    capacity = max(capacity, s_new)
    page = int(layout[5:]) if layout.startswith("paged") else None
    batch_idx = leftpad = None
    batch_cache = b + 2 if layout == "batch_idx" else b
    cache = Cache(batch_cache, capacity, hk, d, dtype, page, gen)
    seqlens = [rng.randint(0, capacity - s_new) for _ in range(b)]
    if layout == "batch_idx":
        batch_idx = torch.tensor(rng.sample(range(batch_cache), b), dtype=torch.int32, device="cuda")
    if layout == "leftpad":
        leftpad = torch.tensor([rng.randint(0, n) for n in seqlens], dtype=torch.int32, device="cuda")
    sq = max(s_new, 1)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, generator=gen)
    k_new = torch.randn(b, s_new, hk, d, device="cuda", dtype=dtype, generator=gen) if s_new else None
    v_new = torch.randn_like(k_new) if s_new else None
    causal = feature == "causal"
    window = (rng.randint(0, 300), rng.randint(0, 3)) if feature == "window" else (-1, -1)
    softcap = 5.0 if feature == "softcap" else 0.0
    alibi = (torch.rand(b, h, device="cuda") * 0.3) if feature == "alibi" else None
    cache_seqlens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")

    # Expected cache after the append (logical rows per sequence).
    rows = [batch_idx[i].item() if batch_idx is not None else i for i in range(b)]
    expected = []
    for i in range(b):
        k_i, v_i = (t.clone() for t in cache.dense(rows[i]))
        if s_new:
            k_i[seqlens[i]:seqlens[i] + s_new] = k_new[i]
            v_i[seqlens[i]:seqlens[i] + s_new] = v_new[i]
        expected.append((k_i, v_i))
    untouched_k = cache.k.clone()

    out, lse = _flash().flash_attn_with_kvcache(
        q, cache.k, cache.v, k=k_new, v=v_new, cache_seqlens=cache_seqlens,
        cache_batch_idx=batch_idx, cache_leftpad=leftpad, block_table=cache.block_table,
        causal=causal, window_size=window, softcap=softcap, alibi_slopes=alibi,
        num_splits=num_splits, return_softmax_lse=True)

    # Cache contents: each sequence's logical rows as expected.
    for i in range(b):
        k_i, v_i = cache.dense(rows[i])
        assert torch.equal(k_i, expected[i][0]) and torch.equal(v_i, expected[i][1]), f"cache {i}"
    if batch_idx is not None:  # rows no batch entry uses are untouched
        for r in set(range(batch_cache)) - set(rows):
            assert torch.equal(cache.k[r], untouched_k[r])

    cap_total = capacity if page is None else cache.block_table.shape[1] * page
    left, right = normalize_window(causal, window, cap_total)
    for i in range(b):
        lp = 0 if leftpad is None else leftpad[i].item()
        n = seqlens[i] + s_new
        k_i, v_i = expected[i]
        ki, vi = k_i[lp:n].unsqueeze(0), v_i[lp:n].unsqueeze(0)
        qi = q[i:i + 1]
        opts = dict(window=(left, right), normalize=False, softcap=softcap,
                    alibi_slopes=None if alibi is None else alibi[i:i + 1])
        ref, ref_lse = naive_attention(qi.double(), ki.double(), vi.double(), **opts)
        out_pt, _ = naive_attention(qi, ki, vi, **opts)
        err = (out[i:i + 1].double() - ref).abs().max().item()
        err_pt = (out_pt.double() - ref).abs().max().item()
        assert torch.isfinite(out[i]).all(), f"sequence {i}: non-finite output"
        assert err <= 2 * err_pt + 1e-5, f"sequence {i}: max|out-ref| {err:.3e} > 2 * {err_pt:.3e}"
        assert torch.equal(torch.isposinf(lse[i:i + 1]), torch.isposinf(ref_lse)), f"sequence {i}"
        finite = torch.isfinite(ref_lse)
        if finite.any():
            assert (lse[i:i + 1][finite] - ref_lse[finite]).abs().max().item() < 1e-2
    return out, lse


@needs_cuda
@pytest.mark.parametrize("case", sampled_cases(), ids=case_id)
def test_kvcache_decode_grid(case):
    dtype = torch.bfloat16 if zlib.crc32(repr(case).encode()) % 2 else torch.float16
    run_case(case, dtype)


# d128 steps that take the 128-key key-split tile on the H200 (kernels/decode.h plan_key_blocks):
# 16-row tiles (GQA 4 / 8 packed, ALiBi unpacked), where 17 sequences of 8192 keys give tiles x
# most splits >= 2 CTAs per SM and ~15 splits; 32-row tiles (5 new tokens x GQA 4 in the kernel,
# MQA 32 query heads per KV head), which need at least as many tiles as SMs: 136 sequences.
# Every layout and feature. (case, rows of its tiles).
WIDE_TILE_CASES = [
    ((17, 8192, 1, 128, 4, "contiguous", "plain", 0), 16),
    ((17, 8192, 0, 128, 4, "paged16", "causal", 0), 16),
    ((17, 8192, 1, 128, 4, "paged256", "window", 3), 16),
    ((17, 8192, 1, 128, 4, "leftpad", "softcap", 0), 16),
    ((17, 8192, 0, 128, 4, "batch_idx", "plain", 16), 16),
    ((17, 8192, 1, 128, 4, "paged64", "alibi", 0), 16),
    ((17, 8192, 1, 128, 8, "paged32", "plain", 1), 16),
    ((17, 8192, 1, 128, 8, "paged128", "causal", 0), 16),
    ((136, 1000, 5, 128, 4, "contiguous", "causal", 0), 32),
    ((136, 1000, 5, 128, 4, "paged16", "window", 0), 32),
    ((136, 1000, 5, 128, 4, "leftpad", "plain", 3), 32),
    ((136, 1000, 1, 128, 32, "contiguous", "plain", 0), 32),
    ((136, 1000, 0, 128, 32, "paged16", "causal", 0), 32),
    ((136, 1000, 1, 128, 32, "batch_idx", "softcap", 0), 32),
]
# A key-split kernel's traits in its name (FwdKeySplitTraits<HeadDim, BlockN, Stages, RowSlices,
# PagedKV, ProducerWarps, HeadGroups, OverlapKV>), demangled or mangled: (block_n, row slices (1:
# 16 rows, 2: 32), PagedKV as 0 / 1, producer warps (4: the warp-specialised ring tile, 0: the
# plain one), HeadGroups as 0 / 1, OverlapKV as 0 / 1).
_KEYSPLIT_TILE = re.compile(
    r"FwdKeySplitTraits<\d+, (\d+), \d, (\d), (true|false), (\d)(?:, (true|false))?"
    r"(?:, (true|false))?>|"
    r"FwdKeySplitTraitsILi\d+ELi(\d+)ELi\dELi(\d)ELb([01])ELi(\d)E(?:Lb([01])E)?(?:Lb([01])E)?")


def keysplit_runs(prof):
    """{(block_n, row slices, paged-capable, ring tile, head groups, overlapped K / V copies)}
    of the key-split kernels a profile shows."""
    runs = set()
    for e in prof.events():
        m = _KEYSPLIT_TILE.search(e.name)
        if m:
            g = m.groups()
            n, slices, paged, producers, groups, overlap = g[:6] if g[0] is not None else g[6:]
            runs.add((int(n), int(slices), paged in ("true", "1"), int(producers) > 0,
                      groups in ("true", "1"), overlap in ("true", "1")))
    return runs


def runs_ring_tiles():
    """Whether the warp-specialised ring tiles can run here (kernels/decode.h plan_decode_tile:
    compute capability 9.0, the sm90 kernels not switched off, FLASH_CUDA_DECODE_RING not 0)."""
    return (torch.cuda.get_device_capability() == (9, 0) and
            os.environ.get("FLASH_CUDA_SM90") != "0" and
            os.environ.get("FLASH_CUDA_DECODE_RING") != "0")


def expects_paged_kernel(case):
    """Whether a key-split step runs the paged-capable kernel: with a block table, ALiBi or
    softcap, or FLASH_CUDA_DECODE_CONTIG=0; else its twin without the paged path (decode.h
    contiguous_keysplit)."""
    _, _, _, _, _, layout, feature, _ = case
    return (layout.startswith("paged") or feature in ("softcap", "alibi") or
            os.environ.get("FLASH_CUDA_DECODE_CONTIG") == "0")


def check_keysplit_kernel(case, dtype, *, block_n, rows, ring=False, groups=False,
                          overlap=False, hk=None):
    """Runs a grid case (checked like the grid; hk: run_case's) under the profiler, which must
    show exactly one key-split kernel: block_n-key blocks, rows // 16 row slices, the
    paged-capable one or its twin without the paged path as expects_paged_kernel says, the ring
    tile or not, the head-group twin or not, the twin with overlapped K / V copies or not.
    Returns run_case's (out, lse)."""
    from torch.profiler import ProfilerActivity, profile

    kernel_dim = kernel_head_dim(case[3])
    if kernel_dim not in built_head_dims():
        pytest.skip(f"head dim {kernel_dim} not built (FLASH_CUDA_HEADDIMS)")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = run_case(case, dtype, hk=hk)
        torch.cuda.synchronize()
    runs = keysplit_runs(prof)
    assert runs == {(block_n, rows // 16, expects_paged_kernel(case), ring, groups, overlap)}, \
        f"key-split runs: {runs}"
    return result


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and
                    torch.cuda.get_device_properties(0).multi_processor_count > 135,
                    reason="the 32-row steps (136 tiles, one split) need more tiles than SMs")
@pytest.mark.parametrize("case,rows", WIDE_TILE_CASES,
                         ids=lambda c: case_id(c) if isinstance(c, tuple) else f"rows{c}")
def test_kvcache_128key_tile(case, rows, monkeypatch):
    """Steps that take the 128-key key-split tile (FwdDecodeKeySplitConfig::TraitsWide /
    TraitsWide32) where the ring tiles do not run (FLASH_CUDA_DECODE_RING=0): checked like the
    grid, and the profiler must show that tile's kernel (the paged-capable one or its twin
    without the paged path, as expects_paged_kernel says)."""
    monkeypatch.setenv("FLASH_CUDA_DECODE_HGROUP", "1")  # the tiles without head groups
    monkeypatch.setenv("FLASH_CUDA_DECODE_RING", "0")
    monkeypatch.setenv("FLASH_CUDA_DECODE_OVERLAP", "0")  # test_kvcache_128key_overlap has it
    dtype = torch.bfloat16 if zlib.crc32(repr(case).encode()) % 2 else torch.float16
    check_keysplit_kernel(case, dtype, block_n=128, rows=rows)


@needs_cuda
@pytest.mark.parametrize("case,rows", [c for c in WIDE_TILE_CASES
                                       if c[0][5].startswith("paged") and c[1] == 16],
                         ids=lambda c: case_id(c) if isinstance(c, tuple) else f"rows{c}")
def test_kvcache_128key_overlap(case, rows, monkeypatch):
    """Paged steps on the 16-row 128-key tile's twin that issues each block's V copy with its K
    copy (FwdParams::kv_overlap, forced by FLASH_CUDA_DECODE_OVERLAP=1): checked like the grid,
    the profiler shows that twin (and with =0 the plain tile), and out and lse equal those of
    the plain tile bit for bit (the copies move, the math does not)."""
    monkeypatch.setenv("FLASH_CUDA_DECODE_HGROUP", "1")
    monkeypatch.setenv("FLASH_CUDA_DECODE_RING", "0")
    dtype = torch.bfloat16 if zlib.crc32(repr(case).encode()) % 2 else torch.float16
    results = []
    for overlap in ("1", "0"):
        monkeypatch.setenv("FLASH_CUDA_DECODE_OVERLAP", overlap)
        torch.manual_seed(0)  # the same inputs twice (Cache draws v from the global generator)
        results.append(check_keysplit_kernel(case, dtype, block_n=128, rows=rows,
                                             overlap=overlap == "1"))
    (out_1, lse_1), (out_0, lse_0) = results
    assert torch.equal(out_1, out_0) and torch.equal(lse_1, lse_0)


# 64-key key-split steps (short caches of few heads: decode.h plan_key_blocks keeps them off the
# 128-key tile; d96 / d80 have only 64-key ones), every layout: contiguous plain calls run the
# kernel without the paged path.
KEYSPLIT64_CASES = [
    ((1, 1000, 1, 128, 4, "contiguous", "plain", 0), 16),
    ((1, 1000, 0, 128, 4, "leftpad", "causal", 3), 16),
    ((1, 1000, 1, 128, 4, "paged16", "plain", 0), 16),
    ((1, 1000, 1, 128, 4, "contiguous", "softcap", 0), 16),
    ((1, 1000, 1, 128, 32, "batch_idx", "window", 0), 32),
    ((1, 1000, 1, 128, 32, "paged256", "plain", 0), 32),
    ((17, 8192, 1, 96, 4, "contiguous", "plain", 0), 16),
    ((3, 1000, 5, 96, 4, "paged16", "causal", 3), 32),
    ((1, 1000, 1, 80, 8, "leftpad", "alibi", 0), 16),
    ((3, 63, 1, 80, 32, "paged32", "window", 16), 32),
]


@needs_cuda
@pytest.mark.parametrize("case,rows", KEYSPLIT64_CASES,
                         ids=lambda c: case_id(c) if isinstance(c, tuple) else f"rows{c}")
def test_kvcache_keysplit_kernel(case, rows, monkeypatch):
    """The 64-key key-split steps (FLASH_CUDA_DECODE_RING=0 at d128) run the paged-capable
    kernel or its twin without the paged path as expects_paged_kernel says, and are checked like
    the grid."""
    monkeypatch.setenv("FLASH_CUDA_DECODE_HGROUP", "1")  # the tiles without head groups
    monkeypatch.setenv("FLASH_CUDA_DECODE_RING", "0")
    check_keysplit_kernel(case, torch.bfloat16, block_n=64, rows=rows)


# d128 key-split steps for the warp-specialised ring tiles (kernels/sm80/kv_ring.cuh), 16 and 32
# rows, every layout and feature, one split, explicit splits and the heuristic's count, and
# sequences shorter than the ring (63 keys: one block); (case, rows of its tiles).
RING_CASES = [
    ((1, 8192, 1, 128, 4, "contiguous", "plain", 0), 16),
    ((3, 1000, 1, 128, 8, "paged16", "causal", 0), 16),
    ((17, 8192, 1, 128, 4, "paged256", "window", 3), 16),
    ((3, 1000, 5, 128, 4, "leftpad", "softcap", 16), 32),
    ((1, 8192, 1, 128, 32, "batch_idx", "plain", 0), 32),
    ((3, 1000, 0, 128, 32, "paged16", "plain", 1), 32),
    ((2, 1000, 1, 128, 1, "paged64", "alibi", 3), 16),
    ((17, 63, 1, 128, 8, "paged32", "plain", 0), 16),
    ((3, 1000, 1, 128, 4, "contiguous", "plain", 1), 16),
    ((17, 8192, 0, 128, 32, "paged128", "causal", 0), 32),
]


needs_h200_sms = pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_properties(0).multi_processor_count != 132,
    reason="the cases' plans are those of 132 SMs (the H200)")


needs_ring_device = pytest.mark.skipif(
    not torch.cuda.is_available() or not runs_ring_tiles(),
    reason="the ring tiles run on compute capability 9.0 with the sm90 kernels on")


@needs_cuda
@needs_ring_device
@pytest.mark.parametrize("case,rows", RING_CASES,
                         ids=lambda c: case_id(c) if isinstance(c, tuple) else f"rows{c}")
def test_kvcache_ring_tile(case, rows, monkeypatch):
    """The warp-specialised ring tiles on every d128 key-split step (FLASH_CUDA_DECODE_RING=1):
    checked like the grid (outputs, lse and the cache after the append), and the profiler must
    show the ring kernel (the paged-capable one or its twin as expects_paged_kernel says)."""
    monkeypatch.setenv("FLASH_CUDA_DECODE_HGROUP", "1")  # the tiles without head groups
    monkeypatch.setenv("FLASH_CUDA_DECODE_RING", "1")
    dtype = torch.bfloat16 if zlib.crc32(repr(case).encode()) % 2 else torch.float16
    check_keysplit_kernel(case, dtype, block_n=64, rows=rows, ring=True)


# The default rule (kernels/decode.h plan_decode_tile): paged 32-row steps whose plain plan puts
# at most one CTA on each SM, with at least 8 key blocks per CTA, take the ring tile, and so do
# paged steps of 16 or 32 rows whose tiles the ring runs in one wave without a split (at least
# 8 blocks each); contiguous ones, and paged ones with shorter or more splits, keep the plain
# key-split tiles. (case, rows, block_n, ring) on 132 SMs; these MQA cases get one KV head
# (run_case's draw): 8 tiles, 16 splits of 8 blocks; at b1, 64 splits of 2 blocks. The 16-row
# ring cases: 64 tiles (one KV head) and 128 (two) of 16 blocks, one split each.
RING_RULE_CASES = [
    ((8, 8192, 1, 128, 32, "paged16", "plain", 0), 32, 64, True),
    ((8, 8192, 1, 128, 32, "paged256", "causal", 0), 32, 64, True),
    ((1, 8192, 1, 128, 32, "paged16", "plain", 0), 32, 64, False),
    ((8, 8192, 1, 128, 32, "contiguous", "plain", 0), 32, 64, False),
    ((8, 8192, 1, 128, 4, "paged16", "plain", 0), 16, 64, False),
    ((64, 1024, 1, 128, 4, "paged16", "plain", 0), 16, 64, True),
    ((64, 1024, 1, 128, 4, "paged256", "plain", 0), 16, 64, True),
]


@needs_cuda
@needs_ring_device
@needs_h200_sms
@pytest.mark.parametrize("case,rows,block_n,ring", RING_RULE_CASES,
                         ids=lambda c: case_id(c) if isinstance(c, tuple) else str(c))
def test_kvcache_ring_rule(case, rows, block_n, ring, monkeypatch):
    """Without FLASH_CUDA_DECODE_RING the ring tile runs where the rule says, checked like the
    grid."""
    monkeypatch.setenv("FLASH_CUDA_DECODE_HGROUP", "1")  # the tiles without head groups
    monkeypatch.delenv("FLASH_CUDA_DECODE_RING", raising=False)
    check_keysplit_kernel(case, torch.bfloat16, block_n=block_n, rows=rows, ring=ring)


# Head groups (kernels/decode.h plan_packing): one-token d128 steps on contiguous caches without
# ALiBi, softcap or a left window can run the head-group twin of the key-split tile, G KV heads'
# query rows per tile (G = 16 for MHA, 8 / 4 / 2 for 2 / 4 / 8 query heads per KV head); the
# rest keep the plain tiles. Forced (FLASH_CUDA_DECODE_HGROUP=16: the largest possible G):
# (case, hk, block_n, groups) with the plans of 132 SMs (tiles x splits): 6 x 42, 17 x 15, 4 x 3,
# 1 x 8 (63 keys x 8 heads, one 64-column block a split), 17 x 1, 128 x 2; softcap and a left
# window 96 / 48 x 1 on the plain 64-key tile.
HEAD_GROUP_CASES = [
    ((3, 1000, 1, 128, 1, "contiguous", "plain", 0), 32, 128, True),
    ((17, 8192, 0, 128, 1, "leftpad", "causal", 0), 16, 128, True),
    ((2, 8192, 1, 128, 4, "batch_idx", "plain", 3), 8, 128, True),
    ((1, 63, 1, 128, 2, "contiguous", "plain", 16), 8, 64, True),
    ((17, 1000, 0, 128, 8, "contiguous", "causal", 1), 2, 64, True),
    ((64, 1000, 1, 128, 1, "contiguous", "plain", 0), 32, 128, True),
    ((3, 1000, 1, 128, 1, "contiguous", "softcap", 0), 32, 64, False),
    ((3, 1000, 1, 128, 1, "contiguous", "window", 0), 16, 64, False),
]


@needs_cuda
@needs_h200_sms
@pytest.mark.parametrize("case,hk,block_n,groups", HEAD_GROUP_CASES,
                         ids=lambda c: case_id(c) if isinstance(c, tuple) else str(c))
def test_kvcache_head_groups(case, hk, block_n, groups, monkeypatch):
    """FLASH_CUDA_DECODE_HGROUP=16: the head-group twin runs wherever head groups are possible
    (never the ring tile), checked like the grid: outputs, lse, the cache after the append."""
    monkeypatch.setenv("FLASH_CUDA_DECODE_HGROUP", "16")
    dtype = torch.bfloat16 if zlib.crc32(repr(case).encode()) % 2 else torch.float16
    check_keysplit_kernel(case, dtype, block_n=block_n, rows=16, groups=groups, hk=hk)


# The default rule (decode.h plan_packing: the largest G whose plan is unsplit on nearly as many
# CTAs as the plan without head groups, up to a wave, else one with long 128-key splits): MHA
# b128 kv1k G = 16 and b32 kv1k G = 4 (256 tiles; 3 explicit splits there), GQA 4 b128 kv1k
# G = 4; MHA b8 and GQA b32 kv1k keep the plain tiles (head groups would split them into short
# splits). All on the 128-key tile, on 132 SMs.
HEAD_GROUP_RULE_CASES = [
    ((128, 1000, 1, 128, 1, "contiguous", "plain", 0), 32, True),
    ((128, 1000, 0, 128, 4, "leftpad", "causal", 0), 8, True),
    ((32, 1000, 1, 128, 1, "batch_idx", "plain", 3), 32, True),
    ((8, 1000, 1, 128, 1, "contiguous", "plain", 0), 32, False),
    ((32, 1000, 1, 128, 4, "contiguous", "plain", 0), 8, False),
]


@needs_cuda
@needs_h200_sms
@pytest.mark.parametrize("case,hk,groups", HEAD_GROUP_RULE_CASES,
                         ids=lambda c: case_id(c) if isinstance(c, tuple) else str(c))
def test_kvcache_head_group_rule(case, hk, groups, monkeypatch):
    """Without FLASH_CUDA_DECODE_HGROUP head groups run where the rule says, checked like the
    grid."""
    monkeypatch.delenv("FLASH_CUDA_DECODE_HGROUP", raising=False)
    check_keysplit_kernel(case, torch.bfloat16, block_n=128, rows=16, groups=groups, hk=hk)


@needs_cuda
@needs_h200_sms
@pytest.mark.parametrize("cap", (2, 4, 8))
def test_kvcache_head_group_caps(cap, monkeypatch):
    """FLASH_CUDA_DECODE_HGROUP=N forces G = N (MHA, 32 KV heads; 80 / 40 / 20 tiles of the
    128-key tile on 132 SMs): every G of the head-group tile gives the oracle's result."""
    monkeypatch.setenv("FLASH_CUDA_DECODE_HGROUP", str(cap))
    case = (5, 1000, 1, 128, 1, "leftpad", "plain", 0)
    check_keysplit_kernel(case, torch.bfloat16, block_n=128, rows=16, groups=True, hk=32)


@needs_cuda
@pytest.mark.parametrize("page", (None, 16, 256))
@pytest.mark.parametrize("num_splits", (0, 1, 16))
def test_decode_graph_replay(page, num_splits):
    """Capture a decode step (paged or not, split or not); replay with changing cache_seqlens
    equals eager calls, outputs and caches alike."""
    b, capacity, h, hk, d, dtype = 3, 4096, 32, 8, 128, torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(7)
    cache = Cache(b, capacity, hk, d, dtype, page, gen)
    q = torch.randn(b, 1, h, d, device="cuda", dtype=dtype)
    k_new = torch.randn(b, 1, hk, d, device="cuda", dtype=dtype)
    v_new = torch.randn_like(k_new)
    cache_seqlens = torch.tensor([3, 1000, 0], dtype=torch.int32, device="cuda")
    flash = _flash()

    def step():
        return flash.flash_attn_with_kvcache(q, cache.k, cache.v, k=k_new, v=v_new,
                                             cache_seqlens=cache_seqlens,
                                             block_table=cache.block_table, causal=True,
                                             num_splits=num_splits, return_softmax_lse=True)

    graph, (out_graph, lse_graph) = capture_cuda_graph(step, 128)
    for seqlens in ([10, 11, 12], [0, 4095, 2000], [4000, 1, 63]):
        cache_seqlens.copy_(torch.tensor(seqlens, dtype=torch.int32))
        q.normal_()
        k_new.normal_()
        v_new.normal_()
        k_before, v_before = cache.k.clone(), cache.v.clone()
        graph.replay()
        replay = (out_graph.clone(), lse_graph.clone(), cache.k.clone(), cache.v.clone())
        cache.k.copy_(k_before)
        cache.v.copy_(v_before)
        eager_out, eager_lse = step()
        assert torch.equal(replay[0], eager_out) and torch.equal(replay[1], eager_lse)
        assert torch.equal(replay[2], cache.k) and torch.equal(replay[3], cache.v)


@needs_cuda
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
@pytest.mark.parametrize("page", (16, 32, 64, 128, 256))
@pytest.mark.parametrize("d", (64, 128))
def test_varlen_block_table(dtype, page, d):
    """flash_attn_varlen_func with block_table (paged prefill / chunked prefill)."""
    rng = random.Random(page * 1000 + d)
    gen = torch.Generator(device="cuda").manual_seed(page + d)
    h, hk = 8, 2
    seqlens_k = [rng.randint(1, 700) for _ in range(4)]
    seqlens_q = [rng.randint(1, n) for n in seqlens_k]  # chunked prefill: a suffix of the keys
    b = len(seqlens_k)
    capacity = (max(seqlens_k) + page - 1) // page * page
    cache = Cache(b, capacity, hk, d, dtype, page, gen)
    cu_q = torch.tensor([0] + list(itertools.accumulate(seqlens_q)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(itertools.accumulate(seqlens_k)), dtype=torch.int32, device="cuda")
    q = torch.randn(int(cu_q[-1]), h, d, device="cuda", dtype=dtype, generator=gen)
    for causal in (False, True):
        out, lse, _ = _flash().flash_attn_varlen_func(
            q, cache.k, cache.v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal,
            block_table=cache.block_table, return_attn_probs=True)
        for i in range(b):
            q0, q1 = int(cu_q[i]), int(cu_q[i + 1])
            k_i, v_i = cache.dense(i)
            ki, vi = k_i[:seqlens_k[i]].unsqueeze(0), v_i[:seqlens_k[i]].unsqueeze(0)
            qi = q[q0:q1].unsqueeze(0)
            ref, ref_lse = naive_attention(qi.double(), ki.double(), vi.double(), causal=causal)
            out_pt, _ = naive_attention(qi, ki, vi, causal=causal)
            err = (out[q0:q1].double() - ref[0]).abs().max().item()
            err_pt = (out_pt.double() - ref).abs().max().item()
            assert err <= 2 * err_pt + 1e-5, f"seq {i} causal={causal}: {err:.3e} > 2 * {err_pt:.3e}"
            finite = torch.isfinite(ref_lse[0])
            assert (lse[:, q0:q1][finite] - ref_lse[0][finite]).abs().max().item() < 1e-2
