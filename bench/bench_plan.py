"""What bench_attention.py measures: the ANCHORS.md grid, the GQA/decode/memory cases, the CLI.

Pure Python (no torch), so the plan can be built and printed anywhere (--dry-run).
A case is a dict of numbers; a plan item is {section, case, case_id, modes: {mode: [impl]}}.
"""

from __future__ import annotations

import argparse
import math

DEFAULT_IMPLS = ["flash_cuda", "cudnn", "fa2", "efficient", "math"]
# flash_cuda_det: fwd+bwd with deterministic=True (issue 4's cost); flash_cuda_sm80 /
# flash_cuda_sm90 / flash_cuda_sm90fwd / flash_cuda_sm90pp: with FLASH_CUDA_SM90=0 / =1 / =fwd
# / =pingpong (bench_attention.py SM90_MODES).
# Decode-only variants of flash_cuda, each the default call with one environment switch:
# flash_cuda_cwarp the split combine with a warp per row everywhere (the default takes a CTA per
# row at >= 8 splits; combine.cuh), flash_cuda_nopdl the combine launched without programmatic
# dependent launch (params.h combine_pdl), flash_cuda_ring0 / _ring1 the d128 key-split steps
# never / always on the warp-specialised ring tiles (FLASH_CUDA_DECODE_RING, kernels/decode.h
# plan_decode_tile; read per call), flash_cuda_hg1 the one-token steps without head groups,
# flash_cuda_hg2 / _hg4 / _hg8 / _hg16 with head groups of the largest possible G <= 2 / 4 / 8 /
# 16 wherever possible (FLASH_CUDA_DECODE_HGROUP, kernels/decode.h plan_packing; read per call).
# Each value: (VAR, VALUE, VAR, VALUE, ...).
# flash_cuda_hmajor: flash_cuda on caches held head-major, (b, h_kv, s, d) in memory as SDPA's
# peers get them, passed as (b, s, h_kv, d) views (decode only).
# flash_cuda_full: flash_cuda without cache_seqlens (every sequence the whole cache), the call
# the SDPA peers make: no per-sequence key count to load before the first K/V copies.
DECODE_ENV_IMPLS = {"flash_cuda_cwarp": ("FLASH_CUDA_COMBINE_ROW", "0"),
                    "flash_cuda_nopdl": ("FLASH_CUDA_PDL", "0"),
                    "flash_cuda_ring0": ("FLASH_CUDA_DECODE_RING", "0"),
                    "flash_cuda_ring1": ("FLASH_CUDA_DECODE_RING", "1"),
                    # head groups (kernels/decode.h plan_packing): off (hg1), G forced, at most N
                    "flash_cuda_hg1": ("FLASH_CUDA_DECODE_HGROUP", "1"),
                    "flash_cuda_hg2": ("FLASH_CUDA_DECODE_HGROUP", "2"),
                    "flash_cuda_hg4": ("FLASH_CUDA_DECODE_HGROUP", "4"),
                    "flash_cuda_hg8": ("FLASH_CUDA_DECODE_HGROUP", "8"),
                    "flash_cuda_hg16": ("FLASH_CUDA_DECODE_HGROUP", "16")}
# Prefill variants of flash_cuda, the default call with one environment switch: flash_cuda_bwd256
# runs head dims 129-192 on the sm90 d256 backward kernel, zero-padded (FLASH_CUDA_SM90_BWD192=0,
# kernels/sm90/bwd_sm90_host.h bwd_call_head_dim; what they ran before session 46's d192 kernel;
# fwd+bwd only: BWD_ENV_IMPLS); flash_cuda_chunk0 walks a causal persistent forward's level order
# over all (batch, head) pairs at once (FLASH_CUDA_SM90_CHUNK=0, kernels/sm90/fwd_sm90_host.h
# fwd_sm90_tile_chunk; the walk before session 47); flash_cuda_persist runs every sm90 forward
# persistent (FLASH_CUDA_SM90_PERSIST=1, fwd_sm90_persistent; e.g. d192 / d256 causal calls
# under 4096 query rows, which the rule gives one CTA per tile), flash_cuda_tile never
# (FLASH_CUDA_SM90_PERSIST=0: one CTA per tile); flash_cuda_fixed walks a persistent forward's
# tiles in a fixed order (FLASH_CUDA_SM90_DYNAMIC=0, fwd_sm90_dynamic_tiles; causal persistent
# calls before session 48 took their tiles that way); flash_cuda_chunk1 walks a causal persistent
# call's pairs one at a time (FLASH_CUDA_SM90_CHUNK=1: with dynamic tiles, the grid's order);
# flash_cuda_tail0 takes no level-order tail with dynamic tiles (FLASH_CUDA_SM90_TAIL=0,
# fwd_sm90_tail_pairs: the grid's order to the end, the walk of session 48), flash_cuda_tail33 a
# tail of 33 pairs at every length (the A/B of s512 in run 234, where the rule then took none;
# it now takes 33 there too).
PREFILL_ENV_IMPLS = {"flash_cuda_bwd256": ("FLASH_CUDA_SM90_BWD192", "0"),
                     "flash_cuda_chunk0": ("FLASH_CUDA_SM90_CHUNK", "0"),
                     "flash_cuda_fixed": ("FLASH_CUDA_SM90_DYNAMIC", "0"),
                     "flash_cuda_chunk1": ("FLASH_CUDA_SM90_CHUNK", "1"),
                     "flash_cuda_tail0": ("FLASH_CUDA_SM90_TAIL", "0"),
                     "flash_cuda_tail33": ("FLASH_CUDA_SM90_TAIL", "33"),
                     "flash_cuda_persist": ("FLASH_CUDA_SM90_PERSIST", "1"),
                     "flash_cuda_tile": ("FLASH_CUDA_SM90_PERSIST", "0")}
BWD_ENV_IMPLS = ("flash_cuda_bwd256",)
# flash_cuda_append: decode steps that also append their query tokens' k / v to the cache (at
# cache_seqlens = cache length - query tokens, so the attention covers the same keys): the
# append kernel plus the attention, flash_attn_with_kvcache's serving step. No peer does that.
# read_floor: no attention, a kernel that only reads the step's K and V once (read_floor.cu),
# timed like the steps: the fastest any decode step of that cell could be (to within the ~3% by
# which flash_cuda's kernels outstream it on the largest cells, bench/NOTES.md run 129).
OPTIONAL_IMPLS = ["flash_cuda_det", "flash_cuda_sm80", "flash_cuda_sm90", "flash_cuda_sm90fwd",
                  "flash_cuda_sm90pp", *PREFILL_ENV_IMPLS, *DECODE_ENV_IMPLS,
                  "flash_cuda_append", "flash_cuda_hmajor", "flash_cuda_full", "read_floor"]
# EFFICIENT is no decode peer here
DECODE_IMPLS = ("flash_cuda", *DECODE_ENV_IMPLS, "flash_cuda_append", "flash_cuda_hmajor",
                "flash_cuda_full", "read_floor",
                "cudnn", "fa2", "math")


def csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def csv_strs(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def csv_pairs(text: str) -> list[tuple[int, int]]:
    return [tuple(csv_ints(x)) for x in text.split(";") if x.strip()]

# ---------------------------------------------------------------------------------------------
# The grid (ANCHORS.md) and the other cases
TOKENS, HIDDEN = 16384, 2048
HEAD_DIMS = [64, 128, 256]
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
GQA_CASES = [(4, 4096), (2, 8192)]              # (batch, seqlen), causal, GQA_SHAPE
GQA_SHAPE = (32, 8, 128)                          # query heads, K/V heads, head dim
DECODE_CASES = [(1, 32768), (32, 8192), (128, 4096)]  # (batch, kv_len), DECODE_SHAPE
DECODE_SHAPE = (32, 8, 128)
DECODE_GRID_HEADS = [(32, 8), (32, 32), (32, 1)]
DECODE_GRID_BATCHES = [1, 8, 32, 128]
DECODE_GRID_CACHES = [1024, 8192, 32768, 131072]
DECODE_GRID_MAX_GB = 40.0                         # K+V bytes above this: cell skipped
MEMORY_SEQLENS = [1024, 2048, 4096, 8192, 16384]  # b=1, h=16, d=64, not causal
MEMORY_SHAPE = (1, 16, 64)


# ---------------------------------------------------------------------------------------------
# Cases
def prefill_case(b, s, hq, hkv, d, causal):
    return {"b": b, "sq": s, "sk": s, "hq": hq, "hkv": hkv, "d": d, "causal": causal}


def prefill_id(c) -> str:
    return (f"d{c['d']} s{c['sq']} b{c['b']} h{c['hq']}/{c['hkv']} "
            f"{'causal' if c['causal'] else 'full'}")


def decode_case(b, kv_len, hq, hkv, d, sq=1):
    return {"b": b, "sq": sq, "kv_len": kv_len, "hq": hq, "hkv": hkv, "d": d, "causal": sq > 1}


def decode_id(c) -> str:
    q = f" q{c['sq']}" if c["sq"] > 1 else ""
    return f"b{c['b']} kv{c['kv_len']} h{c['hq']}/{c['hkv']} d{c['d']}{q}"


def kv_bytes(c, elem=2) -> int:
    return 2 * c["b"] * c["hkv"] * c["kv_len"] * c["d"] * elem


def prefill_flops(c, mode) -> float:
    f = 4.0 * c["b"] * c["hq"] * c["sq"] * c["sk"] * c["d"]
    if c["causal"]:
        f /= 2
    return f * (3.5 if mode == "fwdbwd" else 1.0)


def build_plan(args) -> list[dict]:
    """Everything the run will measure, in order: [{section, case, case_id, modes, impls}]."""
    quick = args.quick
    head_dims = args.heads_dims or ([128] if quick else HEAD_DIMS)
    seqlens = args.seqlens or ([4096] if quick else SEQLENS)
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    impls = args.impls
    plan = []
    prefill_modes = [m for m in ("fwd", "fwdbwd") if m in args.modes]

    def modes_impls(modes):  # det, BWD_ENV_IMPLS: fwd+bwd only; DECODE_ENV_IMPLS: decode only
        bwd_only = ("flash_cuda_det", *BWD_ENV_IMPLS)
        return {m: [i for i in impls if not (m == "fwd" and i in bwd_only)
                    and i not in DECODE_ENV_IMPLS] for m in modes}

    if prefill_modes:
        for d in head_dims:
            h = args.hidden // d
            for causal in causals:
                for s in seqlens:
                    if args.tokens % s or h < 1:
                        continue
                    c = prefill_case(args.tokens // s, s, h, h, d, causal)
                    plan.append({"section": "grid", "case": c, "case_id": prefill_id(c),
                                 "modes": modes_impls(prefill_modes)})
        if not args.no_gqa:
            for b, s in (args.gqa_cases or (GQA_CASES[:1] if quick else GQA_CASES)):
                c = prefill_case(b, s, *args.gqa_shape, True)
                plan.append({"section": "gqa", "case": c, "case_id": prefill_id(c),
                             "modes": modes_impls(prefill_modes)})
    if "decode" in args.modes or args.decode_grid:
        dec_impls = [i for i in impls if i in DECODE_IMPLS]
        dec_impls += [f"flash_cuda_p{p}" for p in args.paged if "flash_cuda" in impls]
        if args.paged_in_order:
            dec_impls += [f"flash_cuda_po{p}" for p in args.paged if "flash_cuda" in impls]
        dec_impls += [f"flash_cuda_s{s}" for s in args.decode_splits if "flash_cuda" in impls]
        dec_impls += [f"flash_cuda_p{p}s{s}" for p in args.paged for s in args.decode_splits
                      if "flash_cuda" in impls]
        cases = [("decode", decode_case(b, kv, *args.decode_shape, sq))
                 for b, kv in (args.decode_cases or (DECODE_CASES[:1] if quick else DECODE_CASES))
                 for sq in args.decode_q]
        if args.decode_grid:
            cases += [("decode_grid", decode_case(b, kv, hq, hkv, args.decode_grid_dim, sq))
                      for hq, hkv in DECODE_GRID_HEADS for b in DECODE_GRID_BATCHES
                      for kv in DECODE_GRID_CACHES for sq in args.decode_q]
        for section, c in cases:
            plan.append({"section": section, "case": c, "case_id": decode_id(c),
                         "modes": {"decode": dec_impls}})
    if "memory" in args.modes:
        b, h, d = args.memory_shape
        for s in (args.memory_seqlens or ([2048, 8192] if quick else MEMORY_SEQLENS)):
            c = prefill_case(b, s, h, h, d, False)
            act = b * s * h * d * 2
            c["floor_fwd"] = act + b * h * s * 4            # out + lse (fp32)
            c["floor_fwdbwd"] = c["floor_fwd"] + 3 * act    # + dq, dk, dv
            # Both modes unless the prefill modes were restricted (--modes memory alone: both);
            # deterministic=True only changes the backward: no fwd row for it.
            plan.append({"section": "memory", "case": c, "case_id": f"s{s}",
                         "modes": modes_impls(prefill_modes or ["fwd", "fwdbwd"])})
    return plan


# Rough rates (TFLOP/s, TB/s) for the --dry-run time estimate only; ANCHORS-like.
EST_TFLOPS = {"flash_cuda": 400, "flash_cuda_det": 250, "flash_cuda_sm80": 300,
              "flash_cuda_sm90": 400, "flash_cuda_sm90fwd": 350, "flash_cuda_sm90pp": 450,
              "cudnn": 450, "fa2": 280, "efficient": 130, "math": 15}


def estimate_seconds(plan, args) -> float:
    total = 0.0
    for item in plan:
        c = item["case"]
        for mode, impls in item["modes"].items():
            for impl in impls:
                if item["section"] in ("decode", "decode_grid"):
                    if kv_bytes(c) > DECODE_GRID_MAX_GB * 1e9:
                        continue
                    rate = 0.08 / (c["hq"] // c["hkv"]) if impl == "math" else 2.0
                    t = kv_bytes(c) / rate / 1e12
                    n = 2 * (args.repeats + 4)  # eager + graph
                else:
                    flops = prefill_flops(dict(c, causal=False) if impl == "math" else c, mode)
                    rate = EST_TFLOPS.get(impl, 300) * (0.8 if mode == "fwdbwd" else 1)
                    t = flops / (rate * 1e12)
                    n = 2 if item["section"] == "memory" else reps_for(args, mode) + 4
                total += min(n * t, args.measure_budget + 4 * t) + 0.05
    return total


def reps_for(args, mode) -> int:
    return args.repeats if mode in ("fwd", "decode") else max(1, math.ceil(args.repeats / 2))



# ---------------------------------------------------------------------------------------------
def parse_args(argv=None, default_out="bench/results"):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="d128 s4096 causal/full, one GQA and one decode case, 2 memory points")
    size.add_argument("--full", action="store_true", help="the whole grid (the default)")
    p.add_argument("--modes", type=csv_strs, default=["fwd", "fwdbwd", "decode", "memory"],
                   help="comma list of fwd, fwdbwd, decode, memory (default: all)")
    p.add_argument("--heads-dims", type=csv_ints, default=None, help="e.g. 64,128,256")
    p.add_argument("--seqlens", type=csv_ints, default=None, help="e.g. 512,1024,...,16384")
    p.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    p.add_argument("--impls", type=csv_strs, default=DEFAULT_IMPLS,
                   help="comma list of flash_cuda, flash_cuda_det (fwd+bwd with "
                        "deterministic=True), flash_cuda_sm80 / flash_cuda_sm90 / "
                        "flash_cuda_sm90fwd / flash_cuda_sm90pp (FLASH_CUDA_SM90=0 / 1 / fwd "
                        "/ pingpong), cudnn, fa2, "
                        "efficient, math")
    p.add_argument("--repeats", type=int, default=20,
                   help="timed calls per measurement (fwd and decode; fwd+bwd: half)")
    p.add_argument("--warmup", type=int, default=0,
                   help="untimed calls before timing (default 3 fwd/decode, 2 fwd+bwd)")
    p.add_argument("--rounds", type=int, default=1,
                   help="prefill cells: measure the implementations this many times each, in "
                        "alternating order (as listed, then reversed, ...), and report the "
                        "median over all rounds' calls (on an H100 the same call measured third "
                        "in a cell read up to 10%% slower than first on long cells: "
                        "bench/NOTES.md run 228)")
    p.add_argument("--measure-budget", type=float, default=3.0,
                   help="seconds one measurement may take before its repeats are cut")
    p.add_argument("--max-call-s", type=float, default=2.0,
                   help="skip an implementation on a cell where one call would take longer than "
                        "this, judged by its rate on an earlier cell (a slow fallback must not "
                        "eat the run)")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds for the whole run; later measurements are skipped (0: none)")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout_p of every prefill call (fwd, fwd+bwd), each implementation "
                        "its own mask (outputs not compared)")
    p.add_argument("--no-gqa", action="store_true", help="leave out the GQA prefill cases")
    p.add_argument("--gqa-cases", type=csv_pairs,
                   default=None, help="'b,s;b,s' (32/8 heads, d=128, causal)")
    p.add_argument("--decode-cases", type=csv_pairs,
                   default=None, help="'b,kv_len;...' (heads and head dim: --decode-shape)")
    p.add_argument("--decode-shape", type=csv_ints, default=None,
                   help="query heads, KV heads, head dim of --decode-cases (default 32,8,128)")
    p.add_argument("--decode-grid", action="store_true",
                   help="issue 5's grid: heads 32/8, 32/32, 32/1 x batch 1,8,32,128 x cache "
                        "1k,8k,32k,128k (cells over 40 GB of K+V skipped)")
    p.add_argument("--decode-grid-dim", type=int, default=128,
                   help="head dim of the --decode-grid cells (issue 5's grid: 128)")
    p.add_argument("--decode-q", type=csv_ints, default=[1],
                   help="query tokens per decode step, e.g. 1,4,8 (speculative decoding)")
    p.add_argument("--paged", type=csv_ints, default=[],
                   help="also time flash_cuda with paged caches of these page sizes, e.g. 16,256 "
                        "(impl flash_cuda_p<page>; the pages in a random order, as a serving "
                        "cache's are after a while)")
    p.add_argument("--paged-in-order", action="store_true",
                   help="with --paged: also time the same paged caches with their pages in cache "
                        "order (impl flash_cuda_po<page>): what scattering the pages costs")
    p.add_argument("--decode-splits", type=csv_ints, default=[],
                   help="also time flash_cuda decode with each of these explicit num_splits, "
                        "e.g. 0,1,8,32 (impl flash_cuda_s<n>; 0 = the heuristic, asked for "
                        "explicitly; counts are clamped to the key blocks); with --paged also "
                        "each paged cache (impl flash_cuda_p<page>s<n>)")
    p.add_argument("--no-graphs", action="store_true", help="decode: eager timing only")
    p.add_argument("--no-flush", action="store_true", help="decode: keep L2 warm between calls")
    p.add_argument("--l2-flush", choices=["memset", "read"], default="memset",
                   help="decode: how L2 is flushed before each call: a 256 MiB memset (the L2 is "
                        "left dirty: the call writes up to ~50 MB back as it evicts it) or a "
                        "256 MiB read (clean lines)")
    p.add_argument("--decode-settle-ms", type=float, default=200.0,
                   help="decode: idle this long (ms) after a cell's inputs are made, before its "
                        "first measurement (run 45: the first ~0.1 s after a 17 GB cell ran the "
                        "next cell's first implementation 10%% slow, whichever it was)")
    p.add_argument("--memory-seqlens", type=csv_ints, default=None)
    p.add_argument("--memory-shape", type=csv_ints, default=list(MEMORY_SHAPE),
                   help="b,h,d of the memory table (default 1,16,64)")
    p.add_argument("--math-mem-gb", type=float, default=90.0,
                   help="skip standard attention where its estimate exceeds this")
    p.add_argument("--no-ceilings", action="store_true")
    p.add_argument("--out", default=default_out, help="results directory")
    p.add_argument("--dry-run", action="store_true", help="print the plan; no GPU needed")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes on any device (CPU included): tests the harness itself")
    p.add_argument("--device", default=None, help="default: cuda (cpu with --smoke and no GPU)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--tokens", type=int, default=TOKENS, help=argparse.SUPPRESS)
    p.add_argument("--hidden", type=int, default=HIDDEN, help=argparse.SUPPRESS)
    p.add_argument("--resume", default=None, help=argparse.SUPPRESS)
    p.add_argument("--resume-count", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--exclude", type=csv_strs, default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = set(args.modes) - {"fwd", "fwdbwd", "decode", "memory"}
    if bad:
        p.error(f"--modes: unknown {sorted(bad)}")
    bad = set(args.impls) - set(DEFAULT_IMPLS) - set(OPTIONAL_IMPLS)
    if bad:
        p.error(f"--impls: unknown {sorted(bad)}")
    if any(s < 0 for s in args.decode_splits):
        p.error("--decode-splits: counts must be >= 0")
    if args.smoke:
        args.tokens, args.hidden = 512, 128
        args.heads_dims = args.heads_dims or [64]
        args.seqlens = args.seqlens or [128, 256]
        args.gqa_cases = args.gqa_cases or [(2, 128)]
        args.decode_cases = args.decode_cases or [(2, 256)]
        args.memory_seqlens = args.memory_seqlens or [128]
        args.repeats = min(args.repeats, 3)
        args.warmup = 1
        args.no_ceilings = True
    args.gqa_shape = (4, 2, 32) if args.smoke else GQA_SHAPE
    if args.decode_shape is not None and len(args.decode_shape) != 3:
        p.error("--decode-shape: hq,hkv,d")
    args.decode_shape = (4, 2, 32) if args.smoke else tuple(args.decode_shape or DECODE_SHAPE)
    return args
