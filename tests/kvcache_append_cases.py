"""Cases and oracles of the KV-cache append step (csrc/kernels/kvcache_append.cuh), shared by
the GPU test (tests/test_kvcache_append_gpu.py) and the CPU emulation of the kernel
(tests/test_kvcache_append_emulated.py).

A case is a dict of the fwd_kvcache arguments (CPU tensors; `to_device` moves them) plus its
description. `reference_call` runs the CPU op (csrc/reference/kvcache.cpp, the oracle) on
copies; `rotary_ref` is that reference's rotary, op for op (bitwise the same on CPU), used for
the rotated q, which the op does not return.
"""

from __future__ import annotations

import itertools
import math
import random

import torch

import flash_cuda  # noqa: F401  (registers torch.ops.flash_cuda)

BATCHES = (1, 3, 17)
CACHE_LENS = (1, 63, 1000)
NEW_TOKENS = (0, 1, 5)
HEAD_DIMS = (64, 80, 128, 256)
GQA = (1, 4, 8)
LAYOUTS = ("contiguous", 16, 32, 64, 128, 256)  # int: paged with that page size
ROTARY = ("off", "interleaved", "half")
EXTRAS = ("none", "leftpad", "batch_idx", "strided")  # leftpad / batch_idx: contiguous only
MASKS = ("none", "causal", "window")

ARG_ORDER = ("q", "k_cache", "v_cache", "k", "v", "cache_seqlens", "rotary_cos", "rotary_sin",
             "cache_batch_idx", "cache_leftpad", "block_table", "alibi_slopes")


def sampled_grid(n: int, seed: int = 0):
    """n cases sampled from the cross product, each a tuple
    (b, cache_len, s_new, d, ratio, layout, rotary, extra, mask, dtype)."""
    grid = list(itertools.product(BATCHES, CACHE_LENS, NEW_TOKENS, HEAD_DIMS, GQA, LAYOUTS,
                                  ROTARY, EXTRAS, MASKS))
    rng = random.Random(seed)
    picked = rng.sample(grid, n)
    return [c + (rng.choice((torch.float16, torch.bfloat16)),) for c in picked]


def case_id(c) -> str:
    b, cache_len, s_new, d, ratio, layout, rotary, extra, mask, dtype = c
    lay = "contig" if layout == "contiguous" else f"page{layout}"
    return (f"b{b}-len{cache_len}-new{s_new}-d{d}-gqa{ratio}-{lay}-rot_{rotary}-{extra}-{mask}-"
            f"{str(dtype).split('.')[-1]}")


def make_case(c, seed: int, *, sq: int | None = None, rotary_dim: int | None = None):
    """The fwd_kvcache arguments of grid point `c` (CPU tensors), random but reproducible."""
    b, cache_len, s_new, d, ratio, layout, rotary, extra, mask, dtype = c
    if layout != "contiguous" and extra in ("leftpad", "batch_idx"):
        extra = "none"  # the checks reject them with a paged cache
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    hk = max(1, 8 // ratio) if ratio > 1 else 2
    h = hk * ratio
    sq = max(s_new, 1) if sq is None else sq
    capacity = cache_len + s_new + rng.randint(0, 3)
    seqlens = [rng.randint(0, cache_len) for _ in range(b)]
    if rng.random() < 0.3:
        seqlens[rng.randrange(b)] = cache_len  # the longest allowed: the append ends near capacity

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    args = dict(q=randn(b, sq, h, d))
    if extra == "strided":  # new k/v views of a packed kv tensor, q with a padded head stride
        kv = randn(b, s_new, 2, hk, d)
        args["k"], args["v"] = kv[:, :, 0], kv[:, :, 1]
        args["q"] = randn(b, sq, h, d + 8)[..., :d]
    else:
        args["k"], args["v"] = randn(b, s_new, hk, d), randn(b, s_new, hk, d)
    if s_new == 0 and rng.random() < 0.5:
        args["k"] = args["v"] = None

    if layout == "contiguous":
        b_cache = b + (rng.randint(1, 3) if extra == "batch_idx" else 0)
        if extra == "strided":  # caches with padded head and row strides
            args["k_cache"] = randn(b_cache, capacity, hk, d + 8)[..., :d]
            args["v_cache"] = randn(b_cache, capacity + 1, hk, d)[:, :capacity]
        else:
            args["k_cache"] = randn(b_cache, capacity, hk, d)
            args["v_cache"] = randn(b_cache, capacity, hk, d)
        args["block_table"] = None
        if extra == "batch_idx":
            args["cache_batch_idx"] = torch.tensor(rng.sample(range(b_cache), b), dtype=torch.int32)
    else:
        page = layout
        max_blocks = -(-capacity // page)
        num_blocks = b * max_blocks + rng.randint(0, 3)
        perm = torch.randperm(num_blocks, generator=gen)[: b * max_blocks]
        args["block_table"] = perm.view(b, max_blocks).to(torch.int32).contiguous()
        args["k_cache"] = randn(num_blocks, page, hk, d)
        args["v_cache"] = randn(num_blocks, page, hk, d)
        capacity = max_blocks * page
    args["cache_seqlens"] = torch.tensor(seqlens, dtype=torch.int32)
    if extra == "leftpad":
        args["cache_leftpad"] = torch.tensor([rng.randint(0, s) for s in seqlens], dtype=torch.int32)

    causal = mask == "causal"
    window = (rng.randint(0, 50), rng.randint(0, 4)) if mask == "window" else (-1, -1)
    interleaved = rotary == "interleaved"
    if rotary != "off":
        if rotary_dim is None:
            rotary_dim = rng.choice([r for r in (d, d // 2, 16, 2 * (d // 3) // 2 * 2, 6) if r >= 2])
        seqlen_ro = max(seqlens) + max(s_new, sq) + rng.randint(0, 7)
        angle = torch.rand(seqlen_ro, rotary_dim // 2, generator=gen) * 2 * math.pi
        args["rotary_cos"], args["rotary_sin"] = angle.cos().to(dtype), angle.sin().to(dtype)
    for name in ARG_ORDER:
        args.setdefault(name, None)
    return dict(args=args, causal=causal, window=window, softcap=0.0, interleaved=interleaved,
                scale=1.0 / math.sqrt(d), num_splits=0, capacity=capacity)


def rotary_without_seqlens_case():
    """No cache_seqlens and no new tokens: every query sits at the cache length (CPU case)."""
    c = (3, 63, 0, 128, 1, "contiguous", "half", "none", "none", torch.float16)
    case = make_case(c, seed=4)
    a = case["args"]
    a["k"] = a["v"] = a["cache_seqlens"] = None
    a["rotary_cos"] = torch.cat([a["rotary_cos"]] * 2)[: case["capacity"] + 1]
    a["rotary_sin"] = torch.cat([a["rotary_sin"]] * 2)[: case["capacity"] + 1]
    return case


def to_device(case, device):
    out = dict(case)
    out["args"] = {k: (None if t is None else t.to(device)) for k, t in case["args"].items()}
    # Keep the strided views strided on the device too.
    for name, t in case["args"].items():
        if t is not None and not t.is_contiguous():
            base = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
            base.copy_(t)
            out["args"][name] = base
    return out


def call_op(case):
    """torch.ops.flash_cuda.fwd_kvcache on the case's tensors (caches updated in place)."""
    a = case["args"]
    return torch.ops.flash_cuda.fwd_kvcache(
        *(a[name] for name in ARG_ORDER), case["scale"], case["causal"], case["window"][0],
        case["window"][1], case["softcap"], case["interleaved"], case["num_splits"])


def clone_case(case):
    out = dict(case)
    out["args"] = {k: (None if t is None else t.clone()) for k, t in case["args"].items()}
    return out


def reference_call(case):
    """The CPU op (the oracle) on copies of the case: (k_cache, v_cache, out, lse) on the CPU."""
    ref = clone_case(to_device(case, "cpu"))
    out, lse = call_op(ref)
    return ref["args"]["k_cache"], ref["args"]["v_cache"], out, lse


def q_positions_per_row(case) -> bool:
    """The reference's rule, on the normalised mask: causal or any window side bounded."""
    left, right = case["window"]
    cap = case["capacity"]
    left = -1 if left >= cap else left
    right = -1 if right >= cap else right
    return case["causal"] or left >= 0 or right >= 0


def rotary_ref(x, positions, cos, sin, interleaved: bool):
    """csrc/reference/kvcache.cpp apply_rotary, op for op: x (n, heads, d) at positions (n)."""
    half = cos.shape[1]
    rotary_dim = 2 * half
    n, heads, d = x.shape
    xf = x.float()
    c = cos.index_select(0, positions).float().unsqueeze(1)
    s = sin.index_select(0, positions).float().unsqueeze(1)
    if interleaved:
        pairs = xf.narrow(2, 0, rotary_dim).reshape(n, heads, half, 2)
        a, b = pairs.select(3, 0), pairs.select(3, 1)
    else:
        a, b = xf.narrow(2, 0, half), xf.narrow(2, half, half)
    ra = a * c - b * s
    rb = b * c + a * s
    rotated = torch.stack([ra, rb], 3).reshape(n, heads, rotary_dim) if interleaved \
        else torch.cat([ra, rb], 2)
    return torch.cat([rotated, xf.narrow(2, rotary_dim, d - rotary_dim)], 2).to(x.dtype)


def expected_q(case):
    """q as the attention sees it (rotated at the reference's positions), on the CPU."""
    a = case["args"]
    q = a["q"].cpu()
    if a["rotary_cos"] is None or q.shape[1] == 0:
        return q.contiguous()
    cos, sin = a["rotary_cos"].cpu(), a["rotary_sin"].cpu()
    per_row = q_positions_per_row(case)
    rows = []
    for i in range(q.shape[0]):
        start = int(a["cache_seqlens"][i]) if a["cache_seqlens"] is not None else case["capacity"]
        pos = torch.arange(start, start + q.shape[1]) if per_row else torch.full((q.shape[1],), start)
        rows.append(rotary_ref(q[i], pos, cos, sin, case["interleaved"]))
    return torch.stack(rows)


def sequence_kv(case, k_cache, v_cache, i: int):
    """Keys/values sequence i attends to, (1, n, hk, d), from an (updated) cache."""
    a = case["args"]
    s_new = 0 if a["k"] is None else a["k"].shape[1]
    end = (int(a["cache_seqlens"][i]) if a["cache_seqlens"] is not None
           else case["capacity"] - s_new) + s_new
    start = int(a["cache_leftpad"][i]) if a["cache_leftpad"] is not None else 0
    if a["block_table"] is not None:
        page = k_cache.shape[1]
        pos = torch.arange(start, end)
        blocks = a["block_table"].cpu()[i].long()[pos // page]
        return (k_cache[blocks, pos % page].unsqueeze(0), v_cache[blocks, pos % page].unsqueeze(0))
    row = int(a["cache_batch_idx"][i]) if a["cache_batch_idx"] is not None else i
    return k_cache[row:row + 1, start:end], v_cache[row:row + 1, start:end]
