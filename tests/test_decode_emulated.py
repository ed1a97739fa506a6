"""The decode / KV-cache paths of the sm80 forward kernel on the CPU emulator (tests/emulation):
split-KV partial outputs (merged with combine.cu's formula), GQA packing, paged K/V through a
block table (pages smaller than, equal to and larger than the key tile), cache_batch_idx,
cache_leftpad, and paged varlen prefill. The host steps (packing, split count) are the ones of
flash_api.cpp (kernels/decode.h); the append of new tokens is not part of the kernel and is not
emulated. Same oracle and rule as the GPU tests (DESIGN.md section 9). Small shapes: the
emulator is slow.
"""

from __future__ import annotations

import pathlib
import random
import shutil
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "emulation"))

import driver  # noqa: E402
from driver import CUDA_INCLUDE, kernel_head_dim, run_fwd_emulated  # noqa: E402
from test_fwd_gpu import assert_close_to_oracle  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("g++") is None or not (CUDA_INCLUDE / "cuda_fp16.h").exists(),
                       reason="needs g++ and the CUDA headers"),
]


def make_cache(b, capacity, hk, d, dtype, page, gen):
    """A (b, capacity) logical cache, stored contiguous (page None) or in shuffled pages with a
    block table. Returns (k_store, v_store, block_table, k_dense, v_dense): the dense views are
    the logical rows (b, capacity, hk, d)."""
    k_dense = torch.randn(b, capacity, hk, d, generator=gen).to(dtype)
    v_dense = torch.randn(b, capacity, hk, d, generator=gen).to(dtype)
    if page is None:
        return k_dense, v_dense, None, k_dense, v_dense
    pages_per_seq = capacity // page
    num_blocks = b * pages_per_seq + 3  # a few unused blocks
    perm = torch.randperm(num_blocks, generator=gen)[: b * pages_per_seq]
    block_table = perm.view(b, pages_per_seq).int()
    k_store = torch.randn(num_blocks, page, hk, d, generator=gen).to(dtype)
    v_store = torch.randn(num_blocks, page, hk, d, generator=gen).to(dtype)
    for i in range(b):
        for j in range(pages_per_seq):
            blk = int(block_table[i, j])
            k_store[blk] = k_dense[i, j * page:(j + 1) * page]
            v_store[blk] = v_dense[i, j * page:(j + 1) * page]
    return k_store, v_store, block_table, k_dense, v_dense


CASES = [
    # name, dtype, d, b, h, hk, sq, capacity, page, seqused, options
    ("packed-split3-empty-splits", torch.bfloat16, 128, 3, 8, 2, 1, 192, None, [1, 192, 77],
     dict(num_splits=3, pack_gqa=True)),
    ("paged16-mha-d64", torch.float16, 64, 2, 2, 2, 1, 256, 16, [256, 130], dict(num_splits=1)),
    ("paged32-causal-sq5-split2", torch.bfloat16, 128, 2, 4, 2, 5, 192, 32, [192, 70],
     dict(num_splits=2, causal=True, pack_gqa=True)),
    ("paged256-split4-packed", torch.bfloat16, 128, 1, 4, 1, 1, 512, 256, [300],
     dict(num_splits=4, pack_gqa=True)),
    # Pages smaller than a copy step's rows (16, 32 at d32: the lookup's per-row division) and
    # pages that a step crosses once (its one-division-per-block path).
    ("paged8-split3", torch.bfloat16, 128, 2, 4, 2, 1, 200, 8, [200, 77],
     dict(num_splits=3, pack_gqa=True)),
    ("paged5-d64", torch.float16, 64, 1, 2, 1, 1, 100, 5, [93], dict(num_splits=1)),
    ("paged16-d32", torch.float16, 32, 1, 2, 1, 1, 96, 16, [96], dict(num_splits=1)),
    ("batchidx-leftpad-window-split3", torch.float16, 64, 2, 4, 2, 1, 160, None, [150, 97],
     dict(num_splits=3, window=(50, 0), pack_gqa=True, batch_idx=[2, 0], leftpad=[9, 0],
          cache_batch=3)),
    ("alibi-gqa2-split2", torch.bfloat16, 64, 2, 4, 2, 1, 200, None, [200, 33],
     dict(num_splits=2, alibi=True, pack_gqa=True)),
    ("softcap-packed-heuristic", torch.float16, 128, 1, 8, 1, 1, 1024, 64, [1000],
     dict(num_splits=0, softcap=30.0, pack_gqa=True)),
    ("d80-sq4-split16", torch.bfloat16, 80, 1, 2, 1, 4, 256, None, [250],
     dict(num_splits=16, causal=True)),
    # Head dims whose tile rows are three 32-column atoms: d80 (below its d96 tile width: the
    # chunks past the row's columns are zero-filled), d96 (every block but the last a whole tile).
    ("paged16-d80-split2", torch.bfloat16, 80, 2, 4, 2, 1, 192, 16, [192, 70],
     dict(num_splits=2, pack_gqa=True)),
    ("paged32-d96-whole-tiles", torch.float16, 96, 1, 2, 1, 1, 320, 32, [320],
     dict(num_splits=1)),
    ("d96-whole-tiles-split2", torch.float16, 96, 2, 2, 2, 1, 320, None, [320, 200],
     dict(num_splits=2)),
    # In-kernel GQA packing (several query rows per KV head group, or a left window).
    ("inkernel-sq8-g8-causal-split3", torch.bfloat16, 128, 2, 8, 1, 8, 320, None, [300, 9],
     dict(num_splits=3, causal=True, pack_gqa=True)),
    ("inkernel-sq17-g4-window-paged16", torch.float16, 64, 2, 8, 2, 17, 256, 16, [256, 40],
     dict(num_splits=1, window=(30, 2), pack_gqa=True)),
    ("inkernel-sq3-g2-softcap-empty-rows", torch.float16, 64, 3, 4, 2, 3, 128, None, [0, 2, 128],
     dict(num_splits=2, causal=True, softcap=20.0, pack_gqa=True)),
]


# Cases for the key-split decode tile (kernels/sm80/decode_keysplit.cuh; all run with both tiles):
# d256 (2 stages), exactly 16 packed rows, ALiBi + softcap together, short windows whose keys
# fall in one warp's slice of a block (the other warps see no key: m = -inf in the merge).
KEYSPLIT_CASES = [
    ("ks-d256-paged16-sq2-g4-window-split2", torch.bfloat16, 256, 2, 4, 1, 2, 192, 16, [190, 37],
     dict(num_splits=2, window=(40, 0), pack_gqa=True)),
    ("ks-d128-sq4-g4-causal-16rows-split3", torch.bfloat16, 128, 1, 8, 2, 4, 256, None, [251],
     dict(num_splits=3, causal=True, pack_gqa=True)),
    ("ks-d128-mha-alibi-softcap", torch.float16, 128, 2, 3, 3, 1, 160, None, [130, 5],
     dict(num_splits=1, alibi=True, softcap=15.0)),
    ("ks-d64-window5-one-warp-keys-split2", torch.float16, 64, 2, 4, 2, 1, 320, 32, [300, 77],
     dict(num_splits=2, window=(5, 0), pack_gqa=True)),
    ("ks-d128-sq3-g4-window2-empty-rows", torch.bfloat16, 128, 2, 8, 2, 3, 128, None, [2, 127],
     dict(num_splits=1, causal=True, window=(2, 0), pack_gqa=True)),
    # 17..32 rows: the 32-row key-split tile (2 row slices x 2 key slices).
    ("ks32-mqa-32x1-split3", torch.bfloat16, 128, 1, 32, 1, 1, 256, None, [201],
     dict(num_splits=3, pack_gqa=True)),
    ("ks32-sq5-g4-causal-paged16-empty-rows", torch.float16, 64, 2, 8, 2, 5, 192, 16, [190, 3],
     dict(num_splits=2, causal=True, pack_gqa=True)),
    ("ks32-d256-sq2-g12-window-split2", torch.bfloat16, 256, 1, 12, 1, 2, 160, None, [150],
     dict(num_splits=2, window=(20, 0), pack_gqa=True)),
    # d96 tiles (three 32-column atoms: 64 of the 128 threads copy the 16-row Q tile and store
    # O, tile_io.cuh TileCopy::kActiveThreads) and d80 below them (zero-filled columns 80-95):
    # 16 and 32 rows, paged, split, a window whose keys fall in one warp's slice, packed rows
    # past the valid ones, ALiBi + softcap unpacked.
    ("ks-d96-paged16-sq2-g4-window-split2", torch.float16, 96, 2, 8, 2, 2, 256, 16, [250, 41],
     dict(num_splits=2, window=(9, 0), pack_gqa=True)),
    ("ks-d96-g4-split3", torch.bfloat16, 96, 1, 8, 2, 1, 320, None, [311],
     dict(num_splits=3, pack_gqa=True)),
    ("ks-d80-mha-alibi-softcap-leftpad", torch.bfloat16, 80, 2, 2, 2, 1, 200, None, [190, 64],
     dict(num_splits=1, alibi=True, softcap=12.0, leftpad=[5, 0])),
    ("ks32-d96-mqa-24x1-paged32-split2", torch.bfloat16, 96, 1, 24, 1, 1, 256, 32, [230],
     dict(num_splits=2, pack_gqa=True)),
    ("ks32-d80-sq3-g8-causal-empty-rows", torch.float16, 80, 2, 8, 1, 3, 192, None, [190, 2],
     dict(num_splits=1, causal=True, pack_gqa=True)),
    # The 32-row tile with 128-key blocks (TraitsWide32; on the 1-SM device of tile "keysplit").
    ("ks32w-mqa-b2-paged16-split2", torch.bfloat16, 128, 2, 32, 1, 1, 512, 16, [500, 130],
     dict(num_splits=2, pack_gqa=True)),
    ("ks32w-sq8-g4-causal-window-split3", torch.float16, 128, 1, 8, 2, 8, 384, None, [383],
     dict(num_splits=3, causal=True, window=(100, 0), pack_gqa=True)),
]


def keysplit_qualifies(case):
    """Whether the key-split tile runs a case (kernels/decode.h uses_keysplit_tile, and a head
    dim with the tile compiled in): at most 32 tile rows after GQA packing."""
    _, _, d, _, h, hk, sq, _, _, _, extra = case
    if kernel_head_dim(d + (-d) % 8) not in (64, 96, 128, 256):
        return False
    packed = extra.get("pack_gqa") and h > hk and not extra.get("alibi")
    return sq * (h // hk if packed else 1) <= 32


def heuristic_splits(tiles, seqlen_k, key_block, ctas_per_sm, num_sms, cost_block=64):
    """kernels/decode.h num_splits with requested == 0 (the decode tile's split estimate)."""
    n_blocks = max(1, -(-seqlen_k // key_block))
    most = min(128, max(1, n_blocks // 2))
    slots = num_sms * ctas_per_sm
    block_cost = max(1, key_block // cost_block)
    best = None
    for s in range(1, most + 1):
        waves = -(-tiles * s // slots)
        cost = waves * (-(-n_blocks // s) * block_cost + 2) + (8 if s > 1 else 0)
        if best is None or cost < best[1]:
            best = (s, cost)
    return best[0]


def head_group_of(case, cap=16):
    """kernels/decode.h head_group_size: the KV heads of one head-group tile for a case of the
    kvcache op (pack_gqa; the key-split tile on) with FLASH_CUDA_DECODE_HGROUP=cap, 1 where the
    case can take none. One query row, a contiguous cache, d = 128, no ALiBi / softcap / left
    window, G the largest power of two <= cap dividing hk with G x (h / hk) <= 16 rows."""
    _, _, d, _, h, hk, sq, _, page, _, extra = case
    window_left = extra.get("window", (-1, -1))[0]
    if (d != 128 or sq != 1 or page is not None or not extra.get("pack_gqa") or hk < 2
            or h % hk or extra.get("alibi") or "softcap" in extra or window_left >= 0):
        return 1
    group, cap = 1, min(cap, 16 // (h // hk))
    while group * 2 <= cap and hk % (group * 2) == 0:
        group *= 2
    return group


def tile_rows(case):
    """Rows of a key-split case's tile: the query rows, times h / hk where GQA is packed."""
    _, _, _, _, h, hk, sq, _, _, _, extra = case
    packed = extra.get("pack_gqa") and h > hk and not extra.get("alibi")
    return sq * (h // hk if packed else 1)


def wide_qualifies(case, num_sms, group=1):
    """Whether a key-split case runs the 128-key tile (kernels/decode.h plan_key_blocks): kernel
    head dim 128, tiles x its most splits >= 2 CTAs per SM, 32-row tiles only where tiles >= SMs,
    and the split count it then gets puts more than one CTA on an SM. With head groups of G KV
    heads: b hk / G tiles of G x the keys' columns."""
    _, _, d, b, h, hk, sq, capacity, page, _, extra = case
    packed = extra.get("pack_gqa") and h > hk and not extra.get("alibi")
    if kernel_head_dim(d + (-d) % 8) != 128:
        return False
    seqlen_k = (capacity if page is None else capacity // page * page) * group
    most_splits = min(128, max(1, -(-seqlen_k // 128) // 2))
    tiles = b * (hk if packed else h) // group
    rows = tile_rows(case) * group
    if tiles * most_splits < 2 * num_sms or (rows > 16 and tiles < num_sms):
        return False
    return tiles * heuristic_splits(tiles, seqlen_k, 128, 2, num_sms) > num_sms


def is_contiguous_plain(case):
    """Whether a key-split case runs the tile's kernel without the paged path (kernels/decode.h
    contiguous_keysplit: no block table; the launcher uses it for the plain variant only)."""
    extra = case[-1]
    return case[8] is None and "softcap" not in extra and not extra.get("alibi")


# Contiguous plain key-split cases: 16 and 32 rows, split and not, three head dims.
CONTIG_CASES = [c for c in KEYSPLIT_CASES if keysplit_qualifies(c) and is_contiguous_plain(c)]


@pytest.mark.parametrize("case", CONTIG_CASES, ids=lambda c: c[0])
def test_contiguous_keysplit_same_bits(case, monkeypatch):
    """The key-split tile's kernel without the paged path (FLASH_CUDA_DECODE_CONTIG, on by
    default) writes the same bits as the paged-capable kernel on calls without a block table."""
    name, dtype, d, b, h, hk, sq, capacity, page, seqused, extra = case
    gen = torch.Generator().manual_seed(hash(name) % 2**31)
    k_store, v_store, _, _, _ = make_cache(extra.get("cache_batch", b), capacity, hk, d, dtype,
                                           None, gen)
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    opts = {"causal": True} if extra.get("causal") else {}
    if "window" in extra:
        opts["window"] = extra["window"]
    monkeypatch.setenv("FLASH_CUDA_DECODE_HGROUP", "1")  # the tiles without head groups
    runs = []
    for contig in (True, False):
        runs.append(run_fwd_emulated(
            q, k_store, v_store, seqused_k=torch.tensor(seqused, dtype=torch.int32),
            cache_batch_idx=(None if extra.get("batch_idx") is None
                             else torch.tensor(extra["batch_idx"], dtype=torch.int32)),
            cache_leftpad=(None if extra.get("leftpad") is None
                           else torch.tensor(extra["leftpad"], dtype=torch.int32)),
            num_splits=extra.get("num_splits", 1), pack_gqa=extra.get("pack_gqa", False),
            keysplit=True, kvcache_op=True, contig=contig, **opts))
        assert ("no paged path" in driver.LAST_STDOUT) == contig, driver.LAST_STDOUT
    (out_c, lse_c), (out_p, lse_p) = runs
    assert torch.equal(out_c.view(torch.int16), out_p.view(torch.int16))
    assert torch.equal(lse_c, lse_p)


# tile: "decode64" = the 64-row decode tile (FLASH_CUDA_DECODE_KEYSPLIT=0); "keysplit" = the
# key-split tiles as the host picks them for a 1-SM device, where most d128 key-split tiles take
# the 128-key blocks; "keysplit-132sms": as the host picks them on the H200 without the ring
# tiles (these small caches: mostly the 64-key tile); "keysplit-kv64" = the 64-key key-split
# tile on the cases that would take the 128-key one (FLASH_CUDA_DECODE_KV128=0); "ring": the
# warp-specialised ring tiles of an sm_90 GPU (kernels/sm80/kv_ring.cuh, d128;
# FLASH_CUDA_DECODE_RING=1), whose producer warps' copies land in shared memory only when the
# ring's full barrier completes; "keysplit-overlap": "keysplit" with the paged 16-row 128-key
# tile's twin that issues each block's V copy with its K copy (FwdParams::kv_overlap,
# FLASH_CUDA_DECODE_OVERLAP=1; "keysplit" has it off, the others follow decode.h
# plan_kv_overlap).
@pytest.mark.parametrize("tile", ("decode64", "keysplit", "keysplit-132sms", "keysplit-kv64",
                                  "ring", "keysplit-overlap"))
@pytest.mark.parametrize("case", CASES + KEYSPLIT_CASES, ids=lambda c: c[0])
def test_decode_emulated(case, tile, monkeypatch):
    keysplit = tile != "decode64"
    ring = True if tile == "ring" else None
    num_sms = 1 if tile in ("keysplit", "keysplit-kv64", "keysplit-overlap") else 132
    overlap = tile == "keysplit-overlap"
    d128 = kernel_head_dim(case[2] + (-case[2]) % 8) == 128
    if keysplit and not keysplit_qualifies(case):
        pytest.skip("the key-split tile does not take this case (more than 32 rows or head dim)")
    if tile == "keysplit-132sms" and not d128:
        pytest.skip("only d128 has the 128-key tile")
    if ring and not d128:
        pytest.skip("only d128 has the ring tiles")
    if tile == "keysplit-kv64" and not wide_qualifies(case, num_sms):
        pytest.skip("the 128-key tile does not take this case either")
    if overlap and (case[8] is None or not wide_qualifies(case, num_sms) or tile_rows(case) > 16):
        pytest.skip("the overlapped copies are for paged calls on the 16-row 128-key tile")
    if tile == "keysplit":
        monkeypatch.setenv("FLASH_CUDA_DECODE_OVERLAP", "0")
    elif overlap:
        monkeypatch.setenv("FLASH_CUDA_DECODE_OVERLAP", "1")
    monkeypatch.setenv("FLASH_CUDA_DECODE_KV128", "0" if tile == "keysplit-kv64" else "1")
    # The tiles without head groups (test_head_groups_emulated has those).
    monkeypatch.setenv("FLASH_CUDA_DECODE_HGROUP", "1")
    name, dtype, d, b, h, hk, sq, capacity, page, seqused, extra = case
    gen = torch.Generator().manual_seed(hash(name) % 2**31)
    cache_batch = extra.get("cache_batch", b)
    k_store, v_store, block_table, k_dense, v_dense = make_cache(cache_batch, capacity, hk, d,
                                                                 dtype, page, gen)
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    seqused_k = torch.tensor(seqused, dtype=torch.int32)
    batch_idx = extra.get("batch_idx")
    leftpad = extra.get("leftpad")
    opts = {}
    if extra.get("causal"):
        opts["causal"] = True
    if "window" in extra:
        opts["window"] = extra["window"]
    if "softcap" in extra:
        opts["softcap"] = extra["softcap"]
    slopes = None
    if extra.get("alibi"):
        slopes = torch.rand(b, h, generator=gen) * 0.3
        opts["alibi_slopes"] = slopes
    out, lse = run_fwd_emulated(
        q, k_store, v_store, seqused_k=seqused_k, block_table=block_table,
        cache_batch_idx=None if batch_idx is None else torch.tensor(batch_idx, dtype=torch.int32),
        cache_leftpad=None if leftpad is None else torch.tensor(leftpad, dtype=torch.int32),
        num_splits=extra.get("num_splits", 1), pack_gqa=extra.get("pack_gqa", False),
        keysplit=keysplit, kvcache_op=True, num_sms=num_sms, ring=ring, **opts)
    assert ("key-split decode tile" in driver.LAST_STDOUT) == keysplit
    assert (", ring" in driver.LAST_STDOUT) == bool(ring), driver.LAST_STDOUT
    wide = (tile in ("keysplit", "keysplit-132sms", "keysplit-overlap")
            and wide_qualifies(case, num_sms))
    assert ("128-key blocks" in driver.LAST_STDOUT) == wide, driver.LAST_STDOUT
    if tile != "keysplit-132sms":
        assert ("K and V copies overlapped" in driver.LAST_STDOUT) == overlap, driver.LAST_STDOUT
    contiguous = keysplit and is_contiguous_plain(case)
    assert ("no paged path" in driver.LAST_STDOUT) == contiguous, driver.LAST_STDOUT
    for i in range(b):
        row = batch_idx[i] if batch_idx is not None else i
        lp = leftpad[i] if leftpad is not None else 0
        k_i = k_dense[row:row + 1, lp:seqused[i]]
        v_i = v_dense[row:row + 1, lp:seqused[i]]
        opts_i = dict(opts)
        if slopes is not None:
            opts_i["alibi_slopes"] = slopes[i:i + 1]
        assert_close_to_oracle(out[i:i + 1], lse[i:i + 1], q[i:i + 1], k_i, v_i, **opts_i)


@pytest.mark.parametrize("row_kernel", (True, False), ids=("cta_per_row", "warp_per_row"))
@pytest.mark.parametrize("num_splits", (8, 16, 33, 100))
def test_combine_row_kernel_emulated(num_splits, row_kernel, monkeypatch):
    """The split combine with a CTA per row (combine.cuh, the default at splits >= 8; 4, 4, 8 and
    16 warps here) and, with FLASH_CUDA_COMBINE_ROW=0, the warp per row: float4 and scalar paths
    (the harness checks they write the same bits), empty splits (cache lengths shorter than the
    splits' key ranges). Explicit counts are clamped to the key blocks (decode.h num_splits), so
    the cache holds at least a 128-key block per split. (FLASH_CUDA_COMBINE_FEW=0: 8 splits
    would otherwise take the few-splits kernel, test_combine_few_splits_kernel_emulated.)"""
    monkeypatch.setenv("FLASH_CUDA_COMBINE_ROW", "1" if row_kernel else "0")
    monkeypatch.setenv("FLASH_CUDA_COMBINE_FEW", "0")
    gen = torch.Generator().manual_seed(num_splits)
    dtype, d, b, h, hk = torch.bfloat16, 128, 2, 4, 1
    capacity = max(1088, 128 * num_splits)
    seqused = [capacity, 200]
    k, v, _, _, _ = make_cache(b, capacity, hk, d, dtype, None, gen)
    q = torch.randn(b, 1, h, d, generator=gen).to(dtype)
    out, lse = run_fwd_emulated(q, k, v, seqused_k=torch.tensor(seqused, dtype=torch.int32),
                                num_splits=num_splits, pack_gqa=True)
    assert ("CTA per row" in driver.LAST_STDOUT) == row_kernel
    warps = (4 if num_splits <= 32 else 8 if num_splits <= 64 else 16) if row_kernel else 4
    assert f"{num_splits} splits, {warps} warps per CTA" in driver.LAST_STDOUT, driver.LAST_STDOUT
    for i in range(b):
        assert_close_to_oracle(out[i:i + 1], lse[i:i + 1], q[i:i + 1], k[i:i + 1, :seqused[i]],
                               v[i:i + 1, :seqused[i]])


@pytest.mark.parametrize("num_splits,d", [(2, 128), (5, 64), (8, 128), (3, 256)])
def test_combine_few_splits_kernel_emulated(num_splits, d):
    """At most 8 splits on the float4 layout with at most 128 columns: the few-splits kernel
    (combine.cuh combine_few_splits_kernel: the lse and the partial rows in one round trip), whose
    bits the harness checks against the scalar warp kernel's; empty splits (a cache shorter than
    the splits' key ranges). d256 rows are too wide for it and keep the other kernels."""
    gen = torch.Generator().manual_seed(num_splits * d)
    dtype, b, h, hk = torch.float16, 2, 4, 1
    capacity = 128 * num_splits + 64
    seqused = [capacity, 70]
    k, v, _, _, _ = make_cache(b, capacity, hk, d, dtype, None, gen)
    q = torch.randn(b, 1, h, d, generator=gen).to(dtype)
    out, lse = run_fwd_emulated(q, k, v, seqused_k=torch.tensor(seqused, dtype=torch.int32),
                                num_splits=num_splits, pack_gqa=True)
    assert f"{num_splits} splits" in driver.LAST_STDOUT, driver.LAST_STDOUT
    assert ("combine kernel (few splits), float4 path" in driver.LAST_STDOUT) == (d <= 128), \
        driver.LAST_STDOUT
    for i in range(b):
        assert_close_to_oracle(out[i:i + 1], lse[i:i + 1], q[i:i + 1], k[i:i + 1, :seqused[i]],
                               v[i:i + 1, :seqused[i]])


@pytest.mark.parametrize("paged", (False, True), ids=("contiguous", "paged16"))
def test_out_of_range_cache_values_read_inside_emulated(paged):
    """Values the host's value checks reject reach the kernel unchecked in CUDA-graph capture,
    with FLASH_CUDA_CHECK_VALUES=0 or through a stale kept host copy (and always here: the
    emulator calls the kernel directly): cache_seqlens past the capacity, cache_batch_idx and
    block-table entries out of range, a negative cache_leftpad. The kernel clamps them
    (sm80/fwd.cuh SequenceInfo, PagedKVRows::clamp_page) and reads only inside its tensors (the
    emulator fails a cp.async source outside them); the result is attention over the clamped
    values: lengths at most the capacity, rows and pages into range (a negative page entry to the
    last page), leftpad at least 0."""
    gen = torch.Generator().manual_seed(17)
    dtype, d, b, h, hk, capacity = torch.bfloat16, 128, 3, 8, 2, 192
    page = 16 if paged else None
    b_cache = b if paged else b + 1
    k_store, v_store, table, k_dense, v_dense = make_cache(b_cache, capacity, hk, d, dtype, page,
                                                           gen)
    seqused = torch.tensor([capacity + 50, 77, 10**6], dtype=torch.int32)
    lengths = [min(int(n), capacity) for n in seqused]
    q = torch.randn(b, 1, h, d, generator=gen).to(dtype)
    kwargs = dict(seqused_k=seqused, num_splits=3, pack_gqa=True)
    if paged:
        num_pages = k_store.shape[0]
        table = table.clone()
        table[0, 2] = num_pages + 100
        table[2, 0] = -5
        kwargs["block_table"] = table
        clamped = table.clone()
        clamped[(clamped < 0) | (clamped >= num_pages)] = num_pages - 1
        seqs = [(k_store[clamped[i].long()].flatten(0, 1)[:lengths[i]],
                 v_store[clamped[i].long()].flatten(0, 1)[:lengths[i]]) for i in range(b)]
    else:
        batch_idx = torch.tensor([7, 1, -2], dtype=torch.int32)
        leftpad = torch.tensor([0, 60, -7], dtype=torch.int32)
        kwargs.update(cache_batch_idx=batch_idx, cache_leftpad=leftpad)
        rows = batch_idx.clamp(0, b_cache - 1).tolist()
        lefts = leftpad.clamp(min=0).tolist()
        seqs = [(k_dense[rows[i], lefts[i]:lengths[i]], v_dense[rows[i], lefts[i]:lengths[i]])
                for i in range(b)]
    out, lse = run_fwd_emulated(q, k_store, v_store, **kwargs)
    for i, (k_i, v_i) in enumerate(seqs):
        assert_close_to_oracle(out[i:i + 1], lse[i:i + 1], q[i:i + 1], k_i[None], v_i[None])


@pytest.mark.parametrize("page", (16, 64))
def test_paged_varlen_prefill_emulated(page):
    """varlen_fwd with block_table: packed q, keys of sequence i at block-table positions
    0 .. cu_seqlens_k[i+1] - cu_seqlens_k[i]."""
    rng = random.Random(page)
    gen = torch.Generator().manual_seed(page)
    dtype, d, h, hk = torch.float16, 64, 4, 2
    seqlens_q, seqlens_k = [70, 3, 17], [100, 40, 17]
    b = len(seqlens_q)
    capacity = 128
    k_store, v_store, block_table, k_dense, v_dense = make_cache(b, capacity, hk, d, dtype, page,
                                                                 gen)
    cu_q = torch.tensor([0] + list(torch.tensor(seqlens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(seqlens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), h, d, generator=gen).to(dtype)
    causal = rng.random() < 2  # always: the common prefill case
    out, lse = run_fwd_emulated(q, k_store, v_store, causal=causal, cu_seqlens_q=cu_q,
                                cu_seqlens_k=cu_k, max_seqlen_q=max(seqlens_q),
                                max_seqlen_k=max(seqlens_k), block_table=block_table)
    for i in range(b):
        q0, q1 = int(cu_q[i]), int(cu_q[i + 1])
        k_i = k_dense[i:i + 1, :seqlens_k[i]]
        v_i = v_dense[i:i + 1, :seqlens_k[i]]
        assert_close_to_oracle(out[q0:q1].unsqueeze(0), lse[:, q0:q1].unsqueeze(0),
                               q[q0:q1].unsqueeze(0), k_i, v_i, causal=causal)


@pytest.mark.parametrize("seqlens_q", ((5, 1, 16), (16, 0, 9)), ids=("q5-1-16", "q16-0-9"))
def test_varlen_short_query_keysplit_emulated(seqlens_q):
    """varlen_fwd with max seqlen_q <= 16 (paged and not) through the key-split tile: packed q,
    per-sequence lengths, causal, an empty query sequence."""
    gen = torch.Generator().manual_seed(sum(seqlens_q))
    dtype, d, h, hk = torch.bfloat16, 128, 2, 1
    seqlens_k = [100, 40, 17]
    b = len(seqlens_q)
    page = 16 if seqlens_q[0] == 5 else None
    k_store, v_store, block_table, k_dense, v_dense = make_cache(b, 128, hk, d, dtype, page, gen)
    cu_q = torch.tensor([0] + list(torch.tensor(seqlens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(seqlens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), h, d, generator=gen).to(dtype)
    if page is None:  # contiguous packed k / v
        k_store = torch.cat([k_dense[i, :seqlens_k[i]] for i in range(b)])
        v_store = torch.cat([v_dense[i, :seqlens_k[i]] for i in range(b)])
    out, lse = run_fwd_emulated(q, k_store, v_store, causal=True, cu_seqlens_q=cu_q,
                                cu_seqlens_k=cu_k, max_seqlen_q=max(seqlens_q),
                                max_seqlen_k=max(seqlens_k), block_table=block_table,
                                keysplit=True)
    assert "key-split decode tile" in driver.LAST_STDOUT
    for i in range(b):
        q0, q1 = int(cu_q[i]), int(cu_q[i + 1])
        if q1 == q0:
            continue
        k_i = k_dense[i:i + 1, :seqlens_k[i]]
        v_i = v_dense[i:i + 1, :seqlens_k[i]]
        assert_close_to_oracle(out[q0:q1].unsqueeze(0), lse[:, q0:q1].unsqueeze(0),
                               q[q0:q1].unsqueeze(0), k_i, v_i, causal=True)


@pytest.mark.parametrize("keysplit", (False, True), ids=("decode64", "keysplit"))
@pytest.mark.parametrize("feature", ("plain", "causal", "window", "softcap", "alibi"))
def test_short_query_fwd_emulated(feature, keysplit):
    """Plain fwd with seqlen_q <= 64 now runs the decode tile (64 x 64/128): the grid cases of
    test_fwd_gpu at short query lengths."""
    from test_fwd_gpu import feature_options
    rng = random.Random(FEATURE_SEEDS[feature])
    gen = torch.Generator().manual_seed(FEATURE_SEEDS[feature])
    # keysplit: (17, 203, 128) takes the 32-row key-split tile, (1, 239, 64), (16, 203, 256) and
    # (1, 203, 128) the 16-row one (at d128 the 64-key one: flash_attn_func never splits).
    shapes = ((17, 203, 128), (1, 239, 64)) + (((16, 203, 256), (1, 203, 128)) if keysplit else ())
    for (sq, sk, d) in shapes:
        b, h, hk = 2, 4, 2
        q = torch.randn(b, sq, h, d, generator=gen).half()
        k = torch.randn(b, sk, hk, d, generator=gen).half()
        v = torch.randn(b, sk, hk, d, generator=gen).half()
        opts = feature_options(feature, sq, sk, b, h, rng, device="cpu")
        out, lse = run_fwd_emulated(q, k, v, keysplit=keysplit, **opts)
        assert ("key-split decode tile" in driver.LAST_STDOUT) == keysplit
        assert "128-key blocks" not in driver.LAST_STDOUT  # the kvcache op's tile only
        assert_close_to_oracle(out, lse, q, k, v, **opts)


FEATURE_SEEDS = {"plain": 1, "causal": 2, "window": 3, "softcap": 4, "alibi": 5}


def test_keysplit_switch_leaves_dropout_on_decode64_emulated():
    """Dropout calls keep the 64-row decode tile with the key-split tile enabled (it has no dropout
    code): bitwise the same output as with the switch off."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 5, 2, 128, generator=gen).to(torch.bfloat16)
    k = torch.randn(2, 77, 2, 128, generator=gen).to(torch.bfloat16)
    v = torch.randn(2, 77, 2, 128, generator=gen).to(torch.bfloat16)
    runs = []
    for keysplit in (False, True):
        runs.append(run_fwd_emulated(q, k, v, causal=True, dropout_p=0.3, rng_state=(123, 8),
                                     keysplit=keysplit))
        assert "key-split decode tile" not in driver.LAST_STDOUT
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


# Head groups (kernels/decode.h plan_packing): the query rows of G KV heads in one 16-row
# key-split tile whose key columns are (key, KV head) pairs. G = 16 (MHA), 8 (GQA 2), 4, 2, two
# groups per sequence, a capped G, both key tiles (64 keys on the 132-SM plan of these small
# caches, 128 on the 1-SM one), splits with empty ones, cache lengths that end inside a block
# and inside a copy step, an empty sequence, cache_batch_idx, cache_leftpad, and a cache whose
# heads are not d elements apart (a padded head stride).
HEAD_GROUP_CASES = [
    # name, dtype, d, b, h, hk, sq, capacity, page, seqused, options
    ("hg-mha16-split3", torch.bfloat16, 128, 2, 16, 16, 1, 200, None, [200, 37],
     dict(num_splits=3, pack_gqa=True)),
    ("hg-gqa2-g8-heuristic-leftpad", torch.float16, 128, 2, 16, 8, 1, 300, None, [300, 123],
     dict(num_splits=0, pack_gqa=True, leftpad=[7, 0])),
    ("hg-gqa4-g4-batchidx-empty", torch.bfloat16, 128, 3, 16, 4, 1, 130, None, [130, 0, 65],
     dict(num_splits=2, pack_gqa=True, batch_idx=[3, 1, 0], cache_batch=4)),
    ("hg-mha32-two-groups-one-block", torch.float16, 128, 1, 32, 32, 1, 64, None, [61],
     dict(num_splits=1, pack_gqa=True)),
    ("hg-gqa8-g2-short", torch.bfloat16, 128, 2, 16, 2, 1, 77, None, [77, 1],
     dict(num_splits=2, pack_gqa=True)),
    ("hg-gqa2-g8-padded-heads", torch.bfloat16, 128, 1, 16, 8, 1, 150, None, [149],
     dict(num_splits=2, pack_gqa=True, head_pad=8)),
]


@pytest.mark.parametrize("sms", (132, 1))
@pytest.mark.parametrize("cap", (16, 4))
@pytest.mark.parametrize("case", HEAD_GROUP_CASES, ids=lambda c: c[0])
def test_head_groups_emulated(case, cap, sms):
    """Head groups forced (FLASH_CUDA_DECODE_HGROUP=cap: the largest possible G <= cap, whatever
    the rule of decode.h plan_packing says) on the SM counts of the H200 and of one SM."""
    name, dtype, d, b, h, hk, sq, capacity, page, seqused, extra = case
    group = head_group_of(case, cap)
    assert group > 1, "every case here takes head groups"
    gen = torch.Generator().manual_seed(hash(name) % 2**31)
    cache_batch = extra.get("cache_batch", b)
    pad = extra.get("head_pad", 0)
    # (b, s, hk, d + pad) storage, viewed as (b, s, hk, d): head stride d + pad.
    k_store = torch.randn(cache_batch, capacity, hk, d + pad, generator=gen).to(dtype)[..., :d]
    v_store = torch.randn(cache_batch, capacity, hk, d + pad, generator=gen).to(dtype)[..., :d]
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    batch_idx, leftpad = extra.get("batch_idx"), extra.get("leftpad")
    out, lse = run_fwd_emulated(
        q, k_store, v_store, seqused_k=torch.tensor(seqused, dtype=torch.int32),
        cache_batch_idx=None if batch_idx is None else torch.tensor(batch_idx, dtype=torch.int32),
        cache_leftpad=None if leftpad is None else torch.tensor(leftpad, dtype=torch.int32),
        num_splits=extra["num_splits"], pack_gqa=True, keysplit=True, kvcache_op=True,
        num_sms=sms, head_group=cap)
    assert f"head groups (G {group})" in driver.LAST_STDOUT, driver.LAST_STDOUT
    assert ("128-key blocks" in driver.LAST_STDOUT) == wide_qualifies(case, sms, group), \
        driver.LAST_STDOUT
    for i in range(b):
        row = batch_idx[i] if batch_idx is not None else i
        lp = leftpad[i] if leftpad is not None else 0
        assert_close_to_oracle(out[i:i + 1], lse[i:i + 1], q[i:i + 1],
                               k_store[row:row + 1, lp:seqused[i]],
                               v_store[row:row + 1, lp:seqused[i]])
