"""Where the GPU time of one attention call goes, kernel by kernel: flash_cuda against SDPA's
FLASH (FlashAttention-2) and cuDNN backends on the same inputs, from torch.profiler's CUDA
activity (kernel durations, no launch gaps). Not the benchmark (bench_attention.py is): this
explains its ratios.

    PYTHONPATH=. python3 bench/kernel_times.py --prefill 128,1024,causal --prefill 128,16384
    PYTHONPATH=. python3 bench/kernel_times.py --decode 1,1024 --decode 8,8192
    PYTHONPATH=. python3 bench/kernel_times.py --decode 1,32768 --flush read
    PYTHONPATH=. python3 bench/kernel_times.py --eager 1,1024
    PYTHONPATH=. python3 bench/kernel_times.py --eager-prefill 128,512,causal
    PYTHONPATH=. python3 bench/kernel_times.py --host-parts 128,causal

--prefill d,seqlen[,causal]: bf16, batch x seqlen = 16384 tokens, hidden 2048 (ANCHORS grid),
forward + backward. --decode b,kv_len[,kv_heads]: one query token, 32 query heads (8 KV heads
unless given), d128, bf16 KV cache; the SDPA peers get the cache head-major and contiguous, as
in bench_attention.py. --flush memset|read: the L2 flushed before every profiled call as the
decode benchmark does (256 MiB; the flush's own launches are subtracted from the tables).
Per case and implementation: each kernel's mean time per call (us), calls per call, and the sum.
flash_cuda's split-KV combine kernel is launched with programmatic dependent launch on sm_90: it
starts while the attention kernel runs and waits for it, so its time here includes that wait and
the sum counts the overlap twice (the attention kernel's own time is exact).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_cuda
from bench_attention import make_l2_flush  # the decode benchmark's flush

REPS = 10
PEERS = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


FLUSH = None  # --flush: a function that evicts L2 before each profiled call, or None
FLUSH_KIND = None


def profile_kernels(fn, reps):
    """{kernel name: (total us, launches)} over `reps` profiled calls of fn (FLUSH before each)."""
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            if FLUSH is not None:
                FLUSH()
            fn()
        torch.cuda.synchronize()
    times, counts = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            times[e.name] += e.device_time
            counts[e.name] += 1
    return times, counts


def kernel_table(fn, reps=REPS):
    """{kernel name: (total us per call, launches per call)} over `reps` profiled calls; with
    --flush, the flush's own kernels are left out."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times, counts = profile_kernels(fn, reps)
    if FLUSH is not None:  # take the flush's own launches out (a kernel fn shares keeps its own)
        flush_times, flush_counts = profile_kernels(lambda: None, reps)
        for name, n in flush_counts.items():
            counts[name] -= n
            times[name] -= flush_times[name]
            if counts[name] <= 0:
                del counts[name], times[name]
    return {k: (times[k] / reps, counts[k] / reps) for k in times}


def short(name: str, width: int = 90) -> str:
    name = name.replace("flash_cuda::", "").replace("void ", "")
    return name if len(name) <= width else name[: width - 3] + "..."


def show(title, tables):
    print(f"\n### {title}")
    for impl, table in tables.items():
        total = sum(t for t, _ in table.values())
        print(f"{impl}: {total:.1f} us of kernels per call")
        for name, (t, n) in sorted(table.items(), key=lambda kv: -kv[1][0]):
            print(f"    {t:9.1f} us  x{n:g}  {short(name)}")


def prefill(d, seqlen, causal):
    h, b = 2048 // d, 16384 // seqlen
    q, k, v = (torch.randn(b, seqlen, h, d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    dout = torch.randn(b, seqlen, h, d, device="cuda", dtype=torch.bfloat16)

    def fc():
        flash_cuda.flash_attn_func(q, k, v, causal=causal).backward(dout)

    def peer(backend):
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
        dt = dout.transpose(1, 2)

        def run():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).backward(dt)
        return run

    tables = {"flash_cuda": kernel_table(fc)}
    for name, backend in PEERS.items():
        with contextlib.suppress(RuntimeError):
            tables[name] = kernel_table(peer(backend))
    show(f"fwd+bwd d{d} s{seqlen} b{b} h{h}{' causal' if causal else ''}", tables)


def decode(b, kv, hkv=8):
    hq, d = 32, 128
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(b, kv, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((b,), kv, dtype=torch.int32, device="cuda")
    tables = {"flash_cuda": kernel_table(
        lambda: flash_cuda.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens))}
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, kc, vc))
    for name, backend in PEERS.items():
        def run(backend=backend):
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        with contextlib.suppress(RuntimeError):
            tables[name] = kernel_table(run)
    flush = "" if FLUSH is None else f", L2 flushed ({FLUSH_KIND}) before each call"
    show(f"decode b{b} kv{kv} h{hq}/{hkv} d{d}{flush}", tables)


def per_call_us(fn, calls, sync_each=False, device="cuda"):
    """Wall time per call of `calls` back-to-back calls (no sync between them unless sync_each):
    the host cost where it exceeds the GPU's. On "meta" tensors nothing is launched (no sync)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(10):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
        if sync_each:
            sync()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def eager(b, kv, calls=200):
    """Host cost of an eager decode call: wall time per call for back-to-back calls (no sync
    between), flash_cuda with and without the value checks (FLASH_CUDA_CHECK_VALUES), then the
    CPU-side operators of one flash_cuda call."""
    import os
    hq, hkv, d = 32, 8, 128
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(b, kv, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((b,), kv, dtype=torch.int32, device="cuda")
    qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)

    def fc():
        flash_cuda.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens)

    print(f"\n### eager decode b{b} kv{kv} h{hq}/{hkv} d{d}: wall us per call, {calls} calls")
    for checks in ("1", "0"):
        os.environ["FLASH_CUDA_CHECK_VALUES"] = checks
        print(f"flash_cuda FLASH_CUDA_CHECK_VALUES={checks}: {per_call_us(fc, calls):.1f}")
    os.environ["FLASH_CUDA_CHECK_VALUES"] = "1"
    for name, backend in PEERS.items():
        def run(backend=backend):
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        with contextlib.suppress(RuntimeError):
            print(f"{name}: {per_call_us(run, calls):.1f}")
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(20):
            fc()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=14, max_name_column_width=60))


def peer_calls(q, k, v, dout, causal):
    """{peer: (fwd, fwd+bwd)}: SDPA calls of each PEERS backend on (b, h, s, d) copies of the
    (b, s, h, d) inputs, the fwd+bwd through torch.autograd.grad."""
    qt, kt, vt, dt = (x.transpose(1, 2).contiguous() for x in (q, k, v, dout))
    qtg, ktg, vtg = (x.detach().requires_grad_() for x in (qt, kt, vt))
    calls = {}
    for name, backend in PEERS.items():
        def fwd(backend=backend):
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        def fwdbwd(backend=backend):
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(qtg, ktg, vtg, is_causal=causal)
            torch.autograd.grad(out, (qtg, ktg, vtg), dt)
        calls[name] = (fwd, fwdbwd)
    return calls


def eager_prefill(d, seqlen, causal, calls=100):
    """Host cost of eager prefill calls: wall us per call, back to back, of the forward and of
    forward + backward (torch.autograd.grad, as bench_attention.py), flash_cuda against the SDPA
    peers (and flash_cuda's fwd+bwd through the op's registered autograd, the route the public
    functions leave to torch.compile and autocast), at the ANCHORS cell (d, seqlen) and at batch
    1, 1 head of 128 tokens (whose GPU time is a few us: wall = host cost); then the CPU-side
    operators of one flash_cuda fwd+bwd."""
    h, b = 2048 // d, 16384 // seqlen
    print(f"\n### eager prefill d{d}{' causal' if causal else ''}: wall us per call, {calls} calls")
    for (bb, hh, ss) in ((b, h, seqlen), (1, 1, 128)):
        q, k, v, dout = (torch.randn(bb, ss, hh, d, device="cuda", dtype=torch.bfloat16)
                         for _ in range(4))
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

        def fc_fwdbwd():
            out = flash_cuda.flash_attn_func(qg, kg, vg, causal=causal)
            torch.autograd.grad(out, (qg, kg, vg), dout)

        def op_fwdbwd():  # the op's registered autograd (torch.library), not the public route
            out = torch.ops.flash_cuda.fwd(qg, kg, vg, None, 0.0, d ** -0.5, causal, -1, -1, 0.0,
                                           False, None, False)[0]
            torch.autograd.grad(out, (qg, kg, vg), dout)
        rows = {"flash_cuda": (per_call_us(lambda: flash_cuda.flash_attn_func(
            q, k, v, causal=causal), calls), per_call_us(fc_fwdbwd, calls)),
            "flash_cuda via op autograd": (float("nan"), per_call_us(op_fwdbwd, calls))}
        for name, (fwd, fwdbwd) in peer_calls(q, k, v, dout, causal).items():
            with contextlib.suppress(RuntimeError):
                rows[name] = (per_call_us(fwd, calls), per_call_us(fwdbwd, calls))
        print(f"b{bb} s{ss} h{hh}: " + "; ".join(
            f"{n} fwd {f:.1f} fwd+bwd {fb:.1f}" for n, (f, fb) in rows.items()))
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(20):
            fc_fwdbwd()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=24,
                                    max_name_column_width=60))


def host_parts(d, causal, calls=300, device="cuda"):
    """The pieces of an eager fwd+bwd's host cost at batch 1, 1 head, 128 tokens (GPU time a few
    us): flash_cuda's ops called directly (no autograd), the public forward recorded for
    autograd, the whole fwd+bwd (also with a sync after each call), the autograd engine's round
    trip for a trivial op, and the SDPA peers' forward and fwd+bwd; wall us per call. With
    device "meta" the ops run their fake implementations (no GPU needed, nothing launched): the
    dispatch and autograd share of the cost alone, on this machine's CPU."""
    q, k, v, dout = (torch.randn(1, 128, 1, d, device=device, dtype=torch.bfloat16)
                     for _ in range(4))
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    scale = d ** -0.5
    fwd_args = (None, 0.0, scale, causal, -1, -1, 0.0, False, None, False)
    out, lse, _, rng = torch.ops.flash_cuda.fwd(q, k, v, *fwd_args)

    def bwd_op():
        torch.ops.flash_cuda.bwd(dout, q, k, v, out, lse, None, 0.0, scale, causal, -1, -1, 0.0,
                                 False, rng)

    def fc_fwdbwd():
        o = flash_cuda.flash_attn_func(qg, kg, vg, causal=causal)
        torch.autograd.grad(o, (qg, kg, vg), dout)

    def trivial():
        torch.autograd.grad(qg * 2.0, (qg,), dout)

    def us(fn, sync_each=False):
        return per_call_us(fn, calls, sync_each, device)
    rows = {"flash_cuda fwd op": us(lambda: torch.ops.flash_cuda.fwd(q, k, v, *fwd_args)),
            "flash_cuda bwd op": us(bwd_op),
            "flash_cuda public fwd (recorded)": us(
                lambda: flash_cuda.flash_attn_func(qg, kg, vg, causal=causal)),
            "flash_cuda fwd+bwd": us(fc_fwdbwd),
            "trivial op + autograd.grad": us(trivial)}
    if device == "cuda":
        rows["flash_cuda bwd op, sync each"] = us(bwd_op, sync_each=True)
        rows["flash_cuda fwd+bwd, sync each"] = us(fc_fwdbwd, sync_each=True)
    # The peers' SDPA backends take only CUDA tensors (meta runs the math fallback).
    peers = peer_calls(q, k, v, dout, causal) if device == "cuda" else {}
    for name, (fwd, fwdbwd) in peers.items():
        with contextlib.suppress(RuntimeError):
            rows[f"{name} fwd"] = us(fwd)
            rows[f"{name} fwd+bwd"] = us(fwdbwd)
    print(f"\n### host cost by part, b1 s128 h1 d{d}{' causal' if causal else ''}, {device} "
          f"tensors: wall us per call, {calls} calls")
    for name, wall_us in rows.items():
        print(f"{name}: {wall_us:.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefill", action="append", default=[], help="d,seqlen[,causal]")
    p.add_argument("--decode", action="append", default=[], help="batch,kv_len[,kv_heads (8)]")
    p.add_argument("--eager", action="append", default=[], help="batch,kv_len (host cost)")
    p.add_argument("--eager-prefill", action="append", default=[],
                   help="d,seqlen[,causal] (host cost of fwd and fwd+bwd)")
    p.add_argument("--host-parts", action="append", default=[],
                   help="d[,causal] (the pieces of a small fwd+bwd's host cost)")
    p.add_argument("--host-device", choices=["cuda", "meta"], default="cuda",
                   help="tensors of --host-parts: meta runs the ops' fake implementations "
                        "(no GPU: the dispatch and autograd share alone)")
    p.add_argument("--flush", choices=["memset", "read"], default=None,
                   help="flush L2 before every profiled call (decode and prefill tables)")
    args = p.parse_args()
    global FLUSH, FLUSH_KIND
    FLUSH_KIND = args.flush
    FLUSH = make_l2_flush(args.flush, "cuda") if args.flush else None
    for spec in args.prefill:
        parts = spec.split(",")
        prefill(int(parts[0]), int(parts[1]), len(parts) > 2 and parts[2] == "causal")
    for spec in args.decode:
        decode(*(int(x) for x in spec.split(",")))
    for spec in args.eager:
        b, kv = (int(x) for x in spec.split(","))
        eager(b, kv)
    for spec in args.eager_prefill:
        parts = spec.split(",")
        eager_prefill(int(parts[0]), int(parts[1]), len(parts) > 2 and parts[2] == "causal")
    for spec in args.host_parts:
        parts = spec.split(",")
        host_parts(int(parts[0]), len(parts) > 1 and parts[1] == "causal",
                   device=args.host_device)


if __name__ == "__main__":
    main()
