"""The sm90 forward (csrc/kernels/sm90/fwd_sm90.cuh: TMA, mbarrier pipeline, wgmma) on an sm_90 GPU:
the forward GPU tests of test_fwd_gpu.py that it covers (more than 64 query rows, no dropout or KV
cache; head dims 64, 128, 192, 256, and the others zero-padded up to the next of those), run with
FLASH_CUDA_SM90=1 and =pingpong, same oracle and rules.
Every test also checks with the profiler that the sm90 kernel of that variant ran (a silent
fallback to the sm80 kernels would otherwise pass)."""

from __future__ import annotations

import pytest
import torch

import test_fwd_gpu as base
from sm90_utils import SM90_GPU, skip_unbuilt_head_dim, sm90_forward_covers_head_dim, \
    sm90_kernel_runs

pytestmark = [pytest.mark.gpu, SM90_GPU]


# Every test runs both variants of the kernel: the default and the pingpong one
# (FLASH_CUDA_SM90=pingpong: the consumer warpgroups take turns at the tensor cores).
# A test marked sm90_wide_keys expects d64's key blocks of 192 in the default variant (the
# pingpong one keeps 128); a test with an `ostore` parameter (FLASH_CUDA_SM90_OSTORE) expects the
# d128 kernel with O through shared memory where it is "1" in the default variant, else not; one
# with a `carried` parameter the default variant's traits with (True) or without the first-S carry.
@pytest.fixture(autouse=True, params=("1", "pingpong"), ids=("default", "pingpong"))
def sm90_forward(monkeypatch, request):
    skip_unbuilt_head_dim(request)
    wide = request.node.get_closest_marker("sm90_wide_keys") is not None
    key_block = (192 if request.param == "1" else 128) if wide else None
    callspec = getattr(request.node, "callspec", None)
    ostore = callspec.params.get("ostore") if callspec is not None else None
    staged_o = None if ostore is None else (ostore == "1" and request.param == "1")
    carried = callspec.params.get("carried") if callspec is not None else None
    with sm90_kernel_runs(monkeypatch, "mha_fwd_sm90_kernel", request.param, key_block,
                          staged_o, fwd_carry=carried if request.param == "1" else None):
        yield


HEAD_DIMS = (64, 128, 192, 256)  # the kernels'; the grid has the padded head dims too
GRID = [c for c in base.sampled_cases() if c[2][0] > 64 and sm90_forward_covers_head_dim(c[1])]
DTYPE_IDS = {"ids": lambda t: str(t)[6:]}


@pytest.mark.parametrize("case", GRID, ids=base.case_id)
def test_fwd_grid_sm90(case):
    base.test_fwd_grid(case)


@pytest.mark.parametrize("dtype", base.DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_deterministic_sm90(dtype, d):
    base.test_deterministic(dtype, d)


@pytest.mark.parametrize("dtype", base.DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_large_magnitude_sm90(dtype, causal, d):
    base.test_large_magnitude(dtype, causal, d)


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_short_rows_lse_bf16_sm90(causal, d):
    base.test_short_rows_lse_bf16(causal, d)


@pytest.mark.parametrize("layout", ("packed_qkv", "transposed", "misaligned"))
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_non_contiguous_sm90(layout, d):
    base.test_non_contiguous(layout, d)


@pytest.mark.parametrize("dtype", base.DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("d", (128,))  # the base test's head dim (for skip_unbuilt_head_dim)
def test_no_visible_key_rows_sm90(dtype, d):
    base.test_no_visible_key_rows(dtype)


@pytest.mark.parametrize("dtype", base.DTYPES, **DTYPE_IDS)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("feature", base.FEATURES)
def test_varlen_sm90(dtype, d, feature):
    base.test_varlen(dtype, d, feature)


@pytest.mark.parametrize("sk", ((1 << 14) + 4099,))
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_many_key_blocks_sm90(sk, d):
    """Hundreds of key blocks through the two K / V buffers (every barrier through many phases),
    causal, against the oracle."""
    q, k, v = base.make_qkv(1, 300, sk, 2, 1, d, torch.bfloat16)
    out, lse = base.fwd(q, k, v, causal=True)
    base.assert_close_to_oracle(out, lse, q, k, v, causal=True)


def tile_options(feature: str, h: int) -> dict:
    """The softcap / ALiBi / window options of the tile tests below (none for other features)."""
    if feature == "softcap":
        return {"softcap": 10.0}
    if feature == "alibi":
        return {"alibi_slopes": torch.rand(h, device="cuda") * 0.3}
    if feature == "window":
        return {"window": (100, 20)}
    return {}


@pytest.mark.parametrize("feature,walk", [
    *[(f, "fixed") for f in ("plain", "softcap", "alibi", "window")],
    *[(f, w) for f in ("causal", "causal_odd") for w in ("fixed", "dynamic")]])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_persistent_tiles_sm90(feature, d, walk, monkeypatch):
    """More query tiles than the GPU has SMs: the persistent CTAs each walk several tiles (Q, the
    K / V stages and their barrier phases handed on from tile to tile; the last tile of every
    sequence ends mid-tile), GQA, against the oracle. Causal: the level order in a snake, "causal"
    with a last round of tiles in the plain direction, "causal_odd" with a mirrored last round and
    fewer keys than queries (the first tile of every sequence sees no key: out 0, lse +inf).
    Causal and window calls run persistent here by FLASH_CUDA_SM90_PERSIST=1 (the launcher's rule
    keeps some causal calls, d192 / d256 at these lengths, and every window call on one CTA per
    tile). "fixed": each CTA walks blockIdx.x + r gridDim.x (causal: the level order);
    "dynamic" (causal only: the kernels with it): the CTAs take their tiles from a counter
    (fwd_sm90.cuh TileRing; the launcher's rule for causal calls), forced either way by
    FLASH_CUDA_SM90_DYNAMIC."""
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    b, sq, sk, hk = 2, 300, 333, 2  # 3 tiles per (batch, head), the last one ragged
    rounds = 1 if feature == "causal_odd" else 2  # full rounds of n_sms tiles, then a partial one
    h = 8 * (rounds * n_sms // (3 * b * 8) + 1)  # GQA 4+
    assert rounds * n_sms < 3 * b * h <= rounds * n_sms + 3 * b * 8
    if feature == "causal_odd":
        sk = 133
    q, k, v = base.make_qkv(b, sq, sk, h, hk, d, torch.bfloat16)
    opts = tile_options(feature, h)
    if feature.startswith("causal"):
        opts["causal"] = True
    if feature.startswith("causal") or feature == "window":
        monkeypatch.setenv("FLASH_CUDA_SM90_PERSIST", "1")
    monkeypatch.setenv("FLASH_CUDA_SM90_DYNAMIC", "1" if walk == "dynamic" else "0")
    base.poison_allocator(q.numel() * 2 + b * sq * h * 4)  # out and lse start as NaN
    out, lse = base.fwd(q, k, v, **opts)
    base.assert_close_to_oracle(out, lse, q, k, v, **opts)


@pytest.mark.sm90_wide_keys
@pytest.mark.parametrize("feature", ("long", "long_fp16", "ragged", "softcap", "alibi", "window",
                                     "varlen"))
@pytest.mark.parametrize("d", (64,))
def test_wide_key_blocks_sm90(feature, d, monkeypatch):
    """d64's key blocks of 192 (FwdSm90Config<64>::WideTraits, 3 stages): "long" and "long_fp16"
    by the launcher's rule (non-causal, >= 4096 keys; 4096 + 99: a ragged last block), the others
    forced by FLASH_CUDA_SM90_KEYS192=1 at 500 keys (two whole blocks and a ragged one), GQA,
    against the oracle; the fixture checks the key block of every forward kernel launched."""
    long = feature.startswith("long")
    if not long:
        monkeypatch.setenv("FLASH_CUDA_SM90_KEYS192", "1")
    if feature == "varlen":
        base.test_varlen(torch.bfloat16, d, "plain")
        return
    dtype = torch.float16 if feature == "long_fp16" else torch.bfloat16
    sk = 4096 + 99 if long else 500
    q, k, v = base.make_qkv(2, 300, sk, 8, 2, d, dtype)
    opts = tile_options(feature, 8)
    out, lse = base.fwd(q, k, v, **opts)
    base.assert_close_to_oracle(out, lse, q, k, v, **opts)


@pytest.mark.parametrize("carry,shape,carried", [
    (None, "1024x1024", True), (None, "400x520", False), (None, "200x700", True),
    (None, "1024x1024_window", False), ("1", "400x520", True), ("1", "1024x1024_window", True),
    ("1", "600x200", False), ("0", "1024x1024", False)])
@pytest.mark.parametrize("d", (64,))
def test_first_s_carry_sm90(carry, shape, carried, d, monkeypatch):
    """d64's causal kernel with a tile's first S issued at the end of the tile before, or its twin
    without it (FwdSm90Config::UncarriedTraits; the fixture checks which ran): by the rule
    (fwd_sm90_carry_first_s: where every tile has work and a row sees 512 keys or more on
    average: 1024 x 1024 and 200 x 700 do, 400 x 520 and a window of 300 keys do not), forced by
    FLASH_CUDA_SM90_CARRY=1 wherever every tile has work (not with fewer keys than queries), off
    with =0; GQA, bf16, against the oracle."""
    if carry is not None:
        monkeypatch.setenv("FLASH_CUDA_SM90_CARRY", carry)
    sq, sk = (int(n) for n in shape.split("_")[0].split("x"))
    q, k, v = base.make_qkv(2, sq, sk, 8, 2, d, torch.bfloat16)
    opts = {"causal": True, **({"window": (300, 0)} if shape.endswith("window") else {})}
    base.poison_allocator(q.numel() * 2 + 2 * sq * 8 * 4)  # out and lse start as NaN
    out, lse = base.fwd(q, k, v, **opts)
    base.assert_close_to_oracle(out, lse, q, k, v, **opts)


@pytest.mark.parametrize("ostore", ("0", "1"), ids=("registers", "tma"))
@pytest.mark.parametrize("shape", ("ragged", "warpgroup_past_end", "causal_many_tiles", "long"))
@pytest.mark.parametrize("d", (128, 192, 256))
def test_o_store_sm90(shape, ostore, d, monkeypatch):
    """O out of the d128 / d192 / d256 kernels both ways, forced by FLASH_CUDA_SM90_OSTORE (the
    launcher's rule takes the staged-O kernel for short fixed-length d128 calls and every
    fixed-length d192 / d256 one): from the registers ("0") and through shared memory and TMA
    stores ("1"; d128 a buffer of its own, d192 / d256 the last key block's K and V buffers,
    d192 two of O's three slabs in K and one in V; the pingpong variant has registers only),
    against the oracle; the fixture checks which kernel ran. "ragged": the last tile's second
    warpgroup has 8 of its 64 rows (the TMA clips the rest at seqlen_q); "warpgroup_past_end":
    the last tile has 2 rows, its second warpgroup's box lies wholly past seqlen_q (not stored);
    "causal_many_tiles": persistent CTAs walking several tiles each, so every warpgroup reuses
    its buffer after waiting for its previous store (d192 / d256: the K / V buffers go back to
    the producer only after the stores); "long": 4099 keys."""
    monkeypatch.setenv("FLASH_CUDA_SM90_OSTORE", ostore)
    b, sq, sk, h, hk, causal = {"ragged": (3, 200, 333, 4, 2, False),
                                "warpgroup_past_end": (2, 130, 250, 4, 4, False),
                                "causal_many_tiles": (2, 1000, 1000, 24, 8, True),
                                "long": (1, 300, 4099, 4, 1, False)}[shape]
    q, k, v = base.make_qkv(b, sq, sk, h, hk, d, torch.bfloat16)
    base.poison_allocator(q.numel() * 2 + b * sq * h * 4)  # out and lse start as NaN
    out, lse = base.fwd(q, k, v, causal=causal)
    base.assert_close_to_oracle(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("walk", ("fixed", "dynamic"))
@pytest.mark.parametrize("chunk", ("1", "7", "0", None), ids=("1", "7", "all", "rule"))
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_level_order_chunks_sm90(chunk, d, walk, monkeypatch):
    """The causal persistent walk in chunks of (batch, head) pairs (FLASH_CUDA_SM90_CHUNK; None:
    the launcher's rule, by the L2's size): 2 x 24 pairs (GQA 3) of 8 query tiles, more tiles
    than SMs, chunks of 1, of 7 (the last one of 6 pairs), one of all; persistent at every head
    dim (FLASH_CUDA_SM90_PERSIST=1), both walks: "fixed" (FLASH_CUDA_SM90_DYNAMIC=0, the snake
    over rounds of CTAs) and "dynamic" (the default for causal calls: the same order, the tiles
    taken from a counter). Against the oracle, out and lse poisoned first."""
    if chunk is not None:
        monkeypatch.setenv("FLASH_CUDA_SM90_CHUNK", chunk)
    monkeypatch.setenv("FLASH_CUDA_SM90_PERSIST", "1")
    monkeypatch.setenv("FLASH_CUDA_SM90_DYNAMIC", "0" if walk == "fixed" else "1")
    q, k, v = base.make_qkv(2, 1000, 1000, 24, 8, d, torch.bfloat16)
    base.poison_allocator(q.numel() * 2 + 2 * 1000 * 24 * 4)
    out, lse = base.fwd(q, k, v, causal=True)
    base.assert_close_to_oracle(out, lse, q, k, v, causal=True)


@pytest.mark.parametrize("tail,rows", [("0", 1000), ("5", 1000), ("48", 1000), (None, 1000),
                                       (None, 500)], ids=("none", "5", "all", "rule", "rule500"))
@pytest.mark.parametrize("chunk", ("1", "7"))
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_tail_pairs_sm90(tail, rows, chunk, d, monkeypatch):
    """Dynamic tiles whose last (batch, head) pairs form a level-order chunk of their own
    (FLASH_CUDA_SM90_TAIL; None: the launcher's rule, fwd_sm90_tail_pairs, here 33 pairs at 132
    SMs): 2 x 24 pairs (GQA 3) of 8 query tiles (4 at 500 rows), more tiles than SMs, a tail of
    none, of 5 (the chunks of 7 before it: six and one of 1), or of all 48; persistent at every
    head dim. Against the oracle, out and lse poisoned first."""
    if tail is not None:
        monkeypatch.setenv("FLASH_CUDA_SM90_TAIL", tail)
    monkeypatch.setenv("FLASH_CUDA_SM90_CHUNK", chunk)
    monkeypatch.setenv("FLASH_CUDA_SM90_PERSIST", "1")
    q, k, v = base.make_qkv(2, rows, rows, 24, 8, d, torch.bfloat16)
    base.poison_allocator(q.numel() * 2 + 2 * rows * 24 * 4)
    out, lse = base.fwd(q, k, v, causal=True)
    base.assert_close_to_oracle(out, lse, q, k, v, causal=True)


PADDED = [(40, "0"), (48, "0"), *[(d, o) for d in (80, 96, 112, 160, 224) for o in ("0", "1")]]


@pytest.mark.parametrize("d,ostore", PADDED)
def test_padded_head_dims_sm90(d, ostore, monkeypatch):
    """Head dims below 64 / 128 / 192 / 256 on the next kernel up (fwd_kernel_head_dim: Q, K, V
    zero-filled past d by the TMA), O stored with d columns from the registers ("0") or by TMA
    stores ("1"; kernels of d >= 128), against the oracle. One head first: a store past column d
    would write the next row's first columns, which the same warp stores earlier (the oracle
    sees it); then GQA 4 / 1, causal."""
    monkeypatch.setenv("FLASH_CUDA_SM90_OSTORE", ostore)
    for b, h, hk, causal in ((2, 1, 1, False), (1, 4, 1, True)):
        q, k, v = base.make_qkv(b, 300, 333, h, hk, d, torch.bfloat16)
        base.poison_allocator(q.numel() * 2 + b * 300 * h * 4)  # out and lse start as NaN
        out, lse = base.fwd(q, k, v, causal=causal)
        base.assert_close_to_oracle(out, lse, q, k, v, causal=causal)
