#!/usr/bin/env python3
"""flash_cuda against standard attention: same random inputs, error, time and peak memory.

    python examples/demo.py                 # CUDA GPU if there is one, else the CPU path
    python examples/demo.py --device cpu --seqlen 2048 --causal

Standard attention is what the FlashAttention papers compare with: it materialises the
(batch, heads, seqlen, seqlen) score matrix softmax(Q K^T / sqrt(d)) in the input dtype and
multiplies it by V. flash_cuda computes the same function exactly, tile by tile, never holding
that matrix: its extra memory is the output plus one float per query row (the log-sum-exp).
Both are checked against a reference in higher precision (fp32 on the GPU, fp64 on the CPU);
flash_cuda passes when its error is at most twice standard attention's (+1e-5).
Exit status 1 if flash_cuda fails or misses that bound.
"""

from __future__ import annotations

import argparse
import gc
import math
import pathlib
import re
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: use its flash_cuda (built in place)
    sys.path.insert(0, str(ROOT))


def standard_attention(q, k, v, causal: bool):
    """q, k, v (b, s, h, d) -> (b, s, h, d), through the full score matrix, in q's dtype."""
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))  # (b, h, s, d)
    scores = (qh @ kh.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (b, h, s, s)
    if causal:
        s = scores.shape[-1]
        above = torch.ones(s, s, dtype=torch.bool, device=q.device).triu_(1)
        scores.masked_fill_(above, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).transpose(1, 2)


def flash_attention_fn():
    """flash_cuda's forward, through the public API (or the registered op before it exists)."""
    import flash_cuda

    if hasattr(flash_cuda, "flash_attn_func"):
        return lambda q, k, v, causal: flash_cuda.flash_attn_func(q, k, v, causal=causal)
    return lambda q, k, v, causal: torch.ops.flash_cuda.fwd(
        q, k, v, None, 0.0, q.shape[-1] ** -0.5, causal, -1, -1, 0.0, False)[0]


def proc_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))
    except (OSError, AttributeError):
        return None


def peak_extra_bytes(fn, device) -> tuple[float | None, object]:
    """Bytes of memory fn() needs on top of what is allocated already, and fn()'s result.

    CUDA: the caching allocator's peak. CPU (Linux): growth of the peak resident set size after
    resetting it through /proc/self/clear_refs; None where that is not possible.
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, out
    base = proc_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak RSS, to the current RSS
    except OSError:
        base = None
    out = fn()
    peak = proc_kib("VmHWM")
    return (None if base is None or peak is None else (peak - base) * 1024.0), out


def median_ms(fn, device, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="default: cuda if a GPU is visible, else cpu")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--seqlen", type=int, default=None)
    p.add_argument("--headdim", type=int, default=64)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="default: bfloat16 on the GPU, float32 on the CPU")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="timed calls (median)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    gpu = torch.cuda.is_available()
    if args.device is None:
        args.device = "cuda" if gpu else "cpu"
    if args.device == "cuda" and not gpu:
        print("No CUDA GPU is visible: use --device cpu (or leave --device out).")
        return 2
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    if not on_gpu:
        print("No CUDA GPU" + (" requested" if gpu else " found") + ": running the CPU path "
              "(flash_cuda's exact blockwise CPU implementation, written to be the reference, "
              "not to be fast) on a laptop-size problem.")
    # GPU: 1 GiB of bf16 scores for standard attention; CPU: 64 MiB of fp32 scores.
    b = args.batch or 2
    h = args.heads or (16 if on_gpu else 8)
    s = args.seqlen or (4096 if on_gpu else 1024)
    d = args.headdim
    dtype = getattr(torch, args.dtype or ("bfloat16" if on_gpu else "float32"))
    reps = args.reps or (10 if on_gpu else 3)
    ref_dtype = torch.float32 if on_gpu else torch.float64

    torch.manual_seed(args.seed)
    q, k, v = (torch.randn(b, s, h, d, device=device, dtype=dtype) for _ in range(3))
    name = torch.cuda.get_device_name(device) if on_gpu else "CPU"
    print(f"device: {name} | q, k, v: (batch {b}, seqlen {s}, heads {h}, head dim {d}) "
          f"{str(dtype).replace('torch.', '')}, causal={args.causal}")
    ref = standard_attention(*(x.to(ref_dtype) for x in (q, k, v)), args.causal)

    impls = [("standard attention", lambda: standard_attention(q, k, v, args.causal))]
    try:
        flash = flash_attention_fn()
        impls.insert(0, ("flash_cuda", lambda: flash(q, k, v, args.causal)))
    except Exception as e:  # noqa: BLE001 - shown in the table
        impls.insert(0, ("flash_cuda", e))

    rows = {}
    # flash_cuda first: on the CPU the peak-RSS reading then never sees standard's larger peak.
    for label, fn in impls:
        if isinstance(fn, Exception):
            rows[label] = fn
            continue
        try:
            mem, out = peak_extra_bytes(fn, device)
            err = (out.to(ref_dtype) - ref).abs().max().item()
            del out
            rows[label] = (err, median_ms(fn, device, reps), mem)
        except Exception as e:  # noqa: BLE001
            rows[label] = e

    ref_name = "fp32" if on_gpu else "fp64"
    print(f"\n{'':22s}{'max |error| vs ' + ref_name:>22s}{'time (ms)':>12s}"
          f"{'peak extra memory (MiB)':>26s}")
    for label, r in rows.items():
        if isinstance(r, Exception):
            msg = str(r).strip().splitlines()[0] if str(r).strip() else ""
            print(f"{label:22s}failed: {type(r).__name__}: {msg[:120]}")
            continue
        err, ms, mem = r
        mem_s = "n/a" if mem is None else f"{mem / 2**20:.1f}"
        print(f"{label:22s}{err:>22.2e}{ms:>12.3f}{mem_s:>26s}")

    elem = torch.empty((), dtype=dtype).element_size()
    scores_mib = b * h * s * s * elem / 2**20
    floor_mib = (b * s * h * d * elem + b * h * s * 4) / 2**20
    print(f"\nstandard attention materialises the score matrix: {b}x{h}x{s}x{s} = "
          f"{scores_mib:.0f} MiB (and its softmax as much again); flash_cuda needs the output "
          f"and the log-sum-exp only: {floor_mib:.1f} MiB.")
    fc, std = rows.get("flash_cuda"), rows.get("standard attention")
    if isinstance(fc, Exception):
        print("flash_cuda did not run (see above).")
        return 1
    if not isinstance(std, Exception):
        bound = 2 * std[0] + 1e-5
        verdict = "OK" if fc[0] <= bound else "FAILED"
        print(f"check: flash_cuda error {fc[0]:.2e} <= 2 x standard's {std[0]:.2e} + 1e-5: "
              f"{verdict}")
        faster = std[1] / fc[1] if fc[1] > 0 else float("inf")
        line = f"flash_cuda: {faster:.2g}x the speed of standard attention"
        if fc[2] and std[2]:
            line += (f"; extra memory {fc[2] / 2**20:.1f} vs {std[2] / 2**20:.1f} MiB "
                     f"({std[2] / fc[2]:.2g}x less)")
        print(line + ".")
        if verdict != "OK":
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
