#!/usr/bin/env python3
"""Time flash_cuda beside torch SDPA's backends, in one process, on the ANCHORS.md grid.

    python3 bench/bench_attention.py --quick               # a few cells (meant for < 2 min)
    python3 bench/bench_attention.py                       # the whole grid (meant for < 8 min)
    python3 bench/bench_attention.py --modes decode --decode-grid     # issue 5's decode grid
    python3 bench/bench_attention.py --modes fwdbwd --impls flash_cuda,flash_cuda_det,fa2,cudnn
                                         # + the cost of deterministic=True (its own table)
    python3 bench/bench_attention.py --modes memory --impls flash_cuda,flash_cuda_det,math
                                         # peak memory, fwd and fwd+bwd, seqlen 1k-16k
    python3 bench/bench_attention.py --dry-run [...]       # print the plan; needs no GPU
    python3 bench/bench_report.py bench/results/bench.json [--compact]  # tables from a results file

Peers (torch.nn.attention.sdpa_kernel with one backend forced): cudnn = CUDNN_ATTENTION,
fa2 = FLASH_ATTENTION (FlashAttention-2 in PyTorch), efficient = EFFICIENT_ATTENTION
("xformers"), math = MATH ("standard": materialises the scores; fp32 inside for bf16 inputs).
flash_cuda is called as flash_cuda.flash_attn_func / flash_attn_with_kvcache; without the Python
layer the forward falls back to torch.ops.flash_cuda.fwd and fwd+bwd is "unavailable".

Grid (ANCHORS.md): bf16, batch x seqlen = 16384 tokens, hidden 2048, nheads = 2048 / head_dim,
head dims 64/128/256, seqlen 512..16384, causal no/yes. FLOPs forward = 4*b*h*sq*sk*d, halved
when causal; fwd+bwd = 3.5 x forward. Decode figure: K+V bytes read once (2*b*hkv*kv_len*d*2)
over the time. Timing: CUDA events per call after warm-up, median (20 fwd, 10 fwd+bwd by
default); random normal inputs, allocated once per cell. A measurement that would take more
than --measure-budget seconds gets fewer repeats, and an implementation whose rate on an earlier
cell predicts more than --max-call-s a call is skipped (the row says so in both cases).

Every measurement becomes one row of <out>/bench.json, written after each row, so a run cut
short by a timeout still leaves its numbers. Errors are recorded in the row, never raised. If an
implementation breaks the CUDA context (illegal address, ...), the script re-executes itself
with --resume and that implementation excluded, so the remaining peers still get measured.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):  # this tree's flash_cuda (built in place), and bench_report.py
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bench_report as report  # noqa: E402
from bench_plan import (DECODE_ENV_IMPLS, DECODE_GRID_MAX_GB, PREFILL_ENV_IMPLS,  # noqa: E402
                        build_plan, estimate_seconds, kv_bytes, parse_args, prefill_flops,
                        reps_for)

SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "fa2": "FLASH_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
# flash_cuda with FLASH_CUDA_SM90 set (flash_cuda alone: the default, the sm90 kernels on sm_90
# where they cover the call): flash_cuda_sm80 =0 (the sm80 kernels, as on an A100),
# flash_cuda_sm90 =1 (the default, named), flash_cuda_sm90fwd =fwd (the sm90 forward, the sm80
# backward), flash_cuda_sm90pp =pingpong (the sm90 kernels, the forward's warpgroups taking turns).
SM90_MODES = {"flash_cuda_sm80": "0", "flash_cuda_sm90": "1", "flash_cuda_sm90fwd": "fwd",
              "flash_cuda_sm90pp": "pingpong"}
FLASH_IMPLS = ("flash_cuda", "flash_cuda_det", *SM90_MODES, *PREFILL_ENV_IMPLS)
STICKY_ERRORS = ("illegal memory access", "unspecified launch failure", "misaligned address",
                 "illegal instruction", "device-side assert", "launch timed out",
                 "uncorrectable ECC", "CUDA error: unknown error", "context is destroyed")


@contextlib.contextmanager
def env_set(*names_values):
    """The environment variables name0 = value0, name1 = value1, ... set inside the block
    (flash_cuda reads its switches per call)."""
    pairs = list(zip(names_values[::2], names_values[1::2]))
    old = {name: os.environ.get(name) for name, _ in pairs}
    os.environ.update(dict(pairs))
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


class Skip(Exception):
    """Not measured on purpose (memory, time budget, ...)."""


class Unavailable(Exception):
    """The implementation cannot run this case (missing API, CPU, ...)."""


# ---------------------------------------------------------------------------------------------
# flash_cuda, whichever layer of it exists
class FlashCuda:
    def __init__(self):
        self.error, self.version, self.func, self.kvcache, self.api = None, None, None, None, None
        try:
            import flash_cuda
        except Exception as e:  # noqa: BLE001 - recorded, the peers still run
            self.error = f"import flash_cuda failed: {type(e).__name__}: {e}"
            return
        self.version = getattr(flash_cuda, "__version__", "?")
        self.func = getattr(flash_cuda, "flash_attn_func", None)
        self.kvcache = getattr(flash_cuda, "flash_attn_with_kvcache", None)
        self.api = ("flash_attn_func" if self.func else "torch.ops.flash_cuda (no Python layer)")

    def need(self):
        if self.error:
            raise Unavailable(self.error)

    def fwd(self, q, k, v, causal, dropout_p=0.0):
        if self.func is not None:
            return self.func(q, k, v, dropout_p, causal=causal)
        return torch.ops.flash_cuda.fwd(q, k, v, None, dropout_p, q.shape[-1] ** -0.5, causal,
                                        -1, -1, 0.0, False)[0]

    def decode(self, q, k_cache, v_cache, cache_seqlens, causal, block_table=None,
               num_splits=0, k=None, v=None):
        if self.kvcache is not None:
            return self.kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                                causal=causal, block_table=block_table, num_splits=num_splits)
        return torch.ops.flash_cuda.fwd_kvcache(
            q, k_cache, v_cache, k, v, cache_seqlens, None, None, None, None, block_table,
            None, q.shape[-1] ** -0.5, causal, -1, -1, 0.0, True, num_splits)[0]


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def merge_rounds(first: dict, later: dict) -> dict:
    """One row from two rounds' rows of a timed measurement (--rounds): the calls of both, the
    median and the figure over all of them; a later round that did not run ("ok" lost) wins, so
    the failure shows."""
    if first["status"] != "ok" or later["status"] != "ok":
        return later if first["status"] == "ok" else first
    merged = dict(first)
    merged["times_ms"] = first["times_ms"] + later["times_ms"]
    merged["reps"] = first["reps"] + later["reps"]
    merged["capped"] = first["capped"] or later["capped"]
    merged["ms"] = statistics.median(merged["times_ms"])
    merged["rounds"] = first.get("rounds", 1) + 1
    if "tflops" in first:  # figure = amount / ms: rescaled to the merged median
        merged["tflops"] = first["tflops"] * first["ms"] / merged["ms"]
    return merged


def short(e: BaseException, warns=()) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    msg = f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]
    extra = list(dict.fromkeys(str(w.message).strip().splitlines()[0][:200] for w in warns))
    return msg + ("" if not extra else " [warnings: " + " | ".join(extra[:3]) + "]")


# ---------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.dtype = getattr(torch, args.dtype)
        self.elem = torch.empty((), dtype=self.dtype).element_size()
        self.fc = FlashCuda()
        self.out_dir = pathlib.Path(args.out)
        self.json_path = self.out_dir / "bench.json"
        self.excluded = set(args.exclude)
        self.l2_flush = None  # make_l2_flush's function, made on first use
        self.read_floor = None  # read_floor.ReadFloor, built on first use
        self.rates = {}  # (impl, mode, figure) -> best work per ms seen (for --max-call-s)
        self.done = {}
        self.results = None
        if args.resume:
            with open(args.resume) as f:
                self.results = json.load(f)
            self.done = {self.key(r): r for r in self.results["rows"]}
            self.results["meta"]["resumed"] = args.resume_count
        else:
            self.results = {"meta": self.meta(), "ceilings": {}, "rows": [], "status": "running"}
        self.t_start = self.results["meta"].setdefault("t_start", time.time())
        self.n_done = 0

    # -- bookkeeping ---------------------------------------------------------------------------
    @staticmethod
    def key(row):
        return (row["section"], row["case_id"], row["mode"], row["impl"])

    def meta(self) -> dict:
        m = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name() if self.cuda else platform.processor() or "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if self.cuda else None,
            "python": platform.python_version(), "dtype": self.args.dtype,
            "dropout_p": self.args.dropout,
            "argv": getattr(self.args, "argv", sys.argv[1:]),
            "math_fp32_inside": math_upcasts(),
            "tokens": self.args.tokens, "hidden": self.args.hidden,
            "flash_cuda": {"version": self.fc.version, "api": self.fc.api, "error": self.fc.error,
                           "kvcache_api": self.fc.kvcache is not None},
            "git": git_commit(),
        }
        if self.cuda:
            p = torch.cuda.get_device_properties(self.device)
            m["sm_count"] = p.multi_processor_count
            m["memory_gib"] = round(p.total_memory / 2**30, 1)
        return m

    def save(self):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.json_path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(self.results, f, indent=1)
        os.replace(tmp, self.json_path)

    def add(self, row):
        self.results["rows"].append(row)
        self.done[self.key(row)] = row
        self.save()
        fig = ""
        if row["status"] == "ok":
            fig = " ".join(f"{k}={row[k]:.3f}" for k in ("ms", "tflops", "tbps_best", "extra_mib")
                           if row.get(k) is not None)
        self.n_done += 1
        print(f"[{self.n_done}] {row['section']} {row['case_id']} {row['mode']} {row['impl']}: "
              f"{row['status']} {fig} {row.get('note', '')[:200]}", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.time() - self.t_start

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def free(self):
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def randn(self, *shape):
        return torch.randn(*shape, device=self.device, dtype=self.dtype)

    def impl_context(self, impl):
        if impl in SDPA_BACKENDS:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[impl])])
        if impl in SM90_MODES:
            return env_set("FLASH_CUDA_SM90", SM90_MODES[impl])
        if impl in PREFILL_ENV_IMPLS:
            return env_set(*PREFILL_ENV_IMPLS[impl])
        if impl in DECODE_ENV_IMPLS:
            return env_set(*DECODE_ENV_IMPLS[impl])
        return contextlib.nullcontext()

    def flush_l2(self):
        """Evicts the L2 before a timed call (make_l2_flush, --l2-flush)."""
        if self.l2_flush is None:
            self.l2_flush = make_l2_flush(self.args.l2_flush, self.device)
        self.l2_flush()

    # -- timing --------------------------------------------------------------------------------
    def time_calls(self, fn, reps, warmup, flush=False) -> dict:
        """Median of `reps` calls, each between two CUDA events (host clock on the CPU)."""
        t0 = time.perf_counter()
        fn()
        self.sync()
        first = time.perf_counter() - t0
        for _ in range(warmup - 1 if first < 0.5 else 0):
            fn()
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        probe = time.perf_counter() - t0
        n, capped = reps, False
        if probe * reps > self.args.measure_budget:
            n, capped = max(1, int(self.args.measure_budget / probe)), True
        times = []
        if self.cuda:
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(n)]
            for start, end in events:
                if flush:  # evicts the 50 MB L2 (--l2-flush)
                    self.flush_l2()
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in events]
        else:
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return {"ms": statistics.median(times), "times_ms": [round(t, 5) for t in times],
                "reps": n, "capped": capped}

    def graph_of(self, fn):
        """fn captured into a CUDA graph (warmed up on a side stream first); returns replay."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        return graph.replay

    # -- one measurement -----------------------------------------------------------------------
    def measure(self, section, case, case_id, mode, impl, make_fn, *, kind="time", work=None,
                keep=None, graph=False, flush=False):
        """Runs one measurement and returns its row (not yet added).

        make_fn() -> (fn, note); work = (figure name, amount): the row gets
        figure = amount / ms / 1e9 (FLOPs -> TFLOP/s, bytes -> TB/s).
        """
        row = {"section": section, "case_id": case_id, "case": case, "mode": mode, "impl": impl,
               "status": "ok", "note": ""}
        base_impl = "flash_cuda" if impl.startswith("flash_cuda") else impl
        if impl in self.excluded or base_impl in self.excluded:
            row.update(status="skip", note="excluded (it broke the CUDA context earlier)")
            return row
        if self.args.time_budget and self.elapsed() > self.args.time_budget:
            row.update(status="skip", note="time budget spent")
            return row
        rate = self.rates.get((impl, mode, work[0] if work else None))
        if rate and work[1] / rate > self.args.max_call_s * 1e3:
            row.update(status="skip", note=f"too slow: ~{work[1] / rate / 1e3:.1f} s a call at "
                                           f"the rate it had on an earlier cell")
            return row
        figure = None if work is None else (lambda ms: {work[0]: work[1] / ms / 1e9})
        with warnings.catch_warnings(record=True) as warns:
            warnings.simplefilter("always")
            try:
                with self.impl_context(impl):
                    fn, note = make_fn()
                    row["note"] = note or ""
                    if kind == "memory":
                        row.update(self.peak_extra(fn))
                    else:
                        warmup = self.args.warmup or (2 if mode == "fwdbwd" else 3)
                        row.update(self.time_calls(fn, reps_for(self.args, mode), warmup,
                                                   flush=flush))
                        row.update(figure(row["ms"]))
                        key = (impl, mode, work[0])
                        self.rates[key] = max(self.rates.get(key, 0.0), work[1] / row["ms"])
                        if row["capped"]:
                            row["note"] = (row["note"] + f"; only {row['reps']} repeats "
                                           f"(--measure-budget)").lstrip("; ")
                        if graph and self.cuda:
                            self.graph_timing(row, fn, figure, flush)
                        if keep is not None and (base_impl == "flash_cuda"
                                                 or impl in ("cudnn", "fa2")):
                            keep[impl] = fn()
                            self.sync()
            except Skip as e:
                row.update(status="skip", note=str(e))
            except Unavailable as e:
                row.update(status="unavailable", note=str(e))
            except Exception as e:  # noqa: BLE001 - every failure is data
                row.update(status="oom" if is_oom(e) else "error", note=short(e, warns))
                self.after_failure(e, row)
        return row

    def graph_timing(self, row, fn, figure, flush):
        try:
            replay = self.graph_of(fn)
            g = self.time_calls(replay, reps_for(self.args, row["mode"]), self.args.warmup or 2,
                                flush=flush)
            row["ms_graph"], row["times_ms_graph"] = g["ms"], g["times_ms"]
            row.update({k + "_graph": v for k, v in figure(g["ms"]).items()})
            del replay
        except Exception as e:  # noqa: BLE001 - eager numbers stand; the note says why
            row["note"] = (row["note"] + "; CUDA graph capture failed: " + short(e)).lstrip("; ")
            if self.context_lost(e):
                raise

    def peak_extra(self, fn) -> dict:
        if not self.cuda:
            raise Unavailable("peak memory needs CUDA")
        out = fn()  # warm-up: plans, workspaces
        del out
        self.sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        self.sync()
        peak = torch.cuda.max_memory_allocated()
        retained = torch.cuda.memory_allocated() - base
        del out
        return {"extra_bytes": peak - base, "extra_mib": (peak - base) / 2**20,
                "retained_bytes": retained}

    def context_lost(self, e) -> bool:
        if not self.cuda or is_oom(e):
            return False
        if any(s.lower() in str(e).lower() for s in STICKY_ERRORS):
            return True
        try:
            torch.cuda.synchronize()
            torch.empty(1, device=self.device).add_(1)
            torch.cuda.synchronize()
            return False
        except Exception:  # noqa: BLE001
            return True

    def after_failure(self, e, row):
        if not self.context_lost(e):
            self.free()
            return
        row["note"] += " — CUDA context lost; the run restarts without this implementation"
        self.add(row)
        self.results["status"] = "restarting"
        self.save()
        impl = "flash_cuda" if row["impl"].startswith("flash_cuda") else row["impl"]
        excluded = sorted(self.excluded | {impl})
        if self.args.resume_count >= 3:
            print("bench: CUDA context lost three times; giving up", file=sys.stderr)
            self.finish("context-lost")
            sys.exit(3)
        argv = [sys.executable, str(pathlib.Path(__file__).resolve())] + self.args.argv + [
            "--resume", str(self.json_path), "--exclude", ",".join(excluded),
            "--resume-count", str(self.args.resume_count + 1), "--out", str(self.out_dir)]
        print(f"bench: CUDA context lost in {row['impl']}; re-running without {impl}",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os.execv(sys.executable, argv)

    def read_floor_probe(self):
        """The read_floor impl's kernel (bench/read_floor.py), compiled on first use."""
        if self.read_floor is None:
            from read_floor import ReadFloor
            build = pathlib.Path(tempfile.gettempdir()) / "flash_cuda_bench_read_floor"
            self.read_floor = ReadFloor(self.device, build)
        return self.read_floor

    # -- ceilings ------------------------------------------------------------------------------
    def ceilings(self):
        """The machine's ceilings, measured in this run: bf16 GEMM and device copy; with the
        read_floor impl also the floor of one launch (the probe reading nothing, timed like a
        decode step)."""
        if not self.cuda or self.results["ceilings"] or self.args.no_ceilings:
            return
        try:
            self.results["ceilings"] = {**self.matmul_ceiling(), **self.copy_ceiling()}
            if "read_floor" in self.args.impls:
                self.results["ceilings"].update(self.launch_floor())
            print(f"ceilings: bf16 8192^3 matmul {self.results['ceilings']['matmul_tflops']:.0f} "
                  f"TFLOP/s, copy {self.results['ceilings']['copy_tbps']:.2f} TB/s",
                  file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001
            self.results["ceilings"] = {"error": short(e)}
            print(f"ceilings: {short(e)}", file=sys.stderr, flush=True)
        self.free()
        self.save()

    def matmul_ceiling(self, n=8192) -> dict:
        a, b = (torch.randn(n, n, device=self.device, dtype=torch.bfloat16) for _ in range(2))
        c = torch.empty_like(a)
        mm = self.time_calls(lambda: torch.matmul(a, b, out=c), 20, 5)
        return {"matmul_tflops": 2 * n**3 / mm["ms"] / 1e9, "matmul_ms": mm["ms"]}

    def launch_floor(self) -> dict:
        """One launch of the read probe with nothing to read, L2 flushed before each call as in
        the decode steps: eager and graph-replayed, in microseconds."""
        probe = self.read_floor_probe().bind()
        flush = not self.args.no_flush
        eager = self.time_calls(probe, 20, 3, flush=flush)
        graph = self.time_calls(self.graph_of(probe), 20, 3, flush=flush)
        return {"launch_floor_us": eager["ms"] * 1e3, "launch_floor_graph_us": graph["ms"] * 1e3}

    def copy_ceiling(self, nbytes=2**30) -> dict:
        src = torch.randn(nbytes // 2, device=self.device, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        cp = self.time_calls(lambda: dst.copy_(src), 20, 5)
        return {"copy_tbps": 2 * nbytes / cp["ms"] / 1e9, "copy_ms": cp["ms"],
                "copy_bytes_moved": 2 * nbytes}

    # -- prefill (grid, GQA, memory) -----------------------------------------------------------
    def math_bytes(self, c, mode) -> float:
        """Rough peak of the MATH backend: fp32 (or input-dtype) score matrices, 3 (fwd) or 4
        (fwd+bwd) of them alive at once."""
        elem = 4 if self.results["meta"].get("math_fp32_inside", True) else self.elem
        return c["b"] * c["hq"] * c["sq"] * c["sk"] * elem * (3 if mode == "fwd" else 4)

    def prefill_fn(self, section, impl, mode, c, t):
        """(fn, note) for one implementation; t holds the cell's tensors."""
        causal, p = c["causal"], self.args.dropout
        if impl in FLASH_IMPLS:
            self.fc.need()
            if mode == "fwd":
                return (lambda: self.fc.fwd(t["q"], t["k"], t["v"], causal, p)), ""
            if self.fc.func is None:
                raise Unavailable("flash_cuda.flash_attn_func does not exist yet (no Python "
                                  "layer): fwd+bwd not measured")
            det = impl == "flash_cuda_det"
            q, k, v = (t[n].detach().requires_grad_() for n in ("q", "k", "v"))

            def fwdbwd():
                out = self.fc.func(q, k, v, p, causal=causal, deterministic=det)
                return torch.autograd.grad(out, (q, k, v), t["dout"])
            return fwdbwd, ""
        if impl not in SDPA_BACKENDS:
            raise Unavailable(f"unknown implementation {impl}")
        if impl == "math":
            if section != "memory" and c["sq"] >= 16384:
                raise Skip("standard attention not run at seqlen 16384 (as ANCHORS.md)")
            need = self.math_bytes(c, mode)
            if need > self.args.math_mem_gb * 1e9:
                raise Skip(f"standard attention would need ~{need / 1e9:.0f} GB "
                           f"(> --math-mem-gb {self.args.math_mem_gb:g})")
        note, gqa = "", c["hq"] != c["hkv"]
        kt, vt = t["kt"], t["vt"]
        if gqa and (impl == "efficient" or t.get("force_repeat")):
            rep = c["hq"] // c["hkv"]
            kt, vt = (x.repeat_interleave(rep, dim=1) for x in (kt, vt))
            note, gqa = "K/V heads repeated (no enable_gqa)", False
        if mode == "fwd":
            qt = t["qt"]
            return (lambda: F.scaled_dot_product_attention(qt, kt, vt, dropout_p=p,
                                                           is_causal=causal,
                                                           enable_gqa=gqa).transpose(1, 2)), note
        qt, kt, vt = (x.detach().requires_grad_() for x in (t["qt"], kt, vt))

        def fwdbwd():
            out = F.scaled_dot_product_attention(qt, kt, vt, dropout_p=p, is_causal=causal,
                                                 enable_gqa=gqa)
            return tuple(g.transpose(1, 2) for g in
                         torch.autograd.grad(out, (qt, kt, vt), t["doutt"]))
        return fwdbwd, note

    def prefill_tensors(self, c) -> dict:
        b, s, hq, hkv, d = c["b"], c["sq"], c["hq"], c["hkv"], c["d"]
        t = {"q": self.randn(b, s, hq, d), "k": self.randn(b, s, hkv, d),
             "v": self.randn(b, s, hkv, d), "dout": self.randn(b, s, hq, d)}
        for n in ("q", "k", "v", "dout"):  # SDPA's (b, h, s, d), made outside the timed region
            t[n + "t"] = t[n].transpose(1, 2).contiguous()
        return t

    def run_prefill(self, item):
        self.prefill_cell(item)
        self.free()  # after the cell's tensors went out of scope

    def prefill_cell(self, item):
        section, c, cid = item["section"], item["case"], item["case_id"]
        todo = [(m, i) for m, impls in item["modes"].items() for i in impls
                if (section, cid, m, i) not in self.done]
        if not todo:
            return
        try:
            t = self.prefill_tensors(c)
        except Exception as e:  # noqa: BLE001
            for m, i in todo:
                self.add({"section": section, "case_id": cid, "case": c, "mode": m, "impl": i,
                          "status": "oom" if is_oom(e) else "error", "note": "inputs: " + short(e)})
            self.free()
            return
        for mode, impls in item["modes"].items():
            keep = {}
            order = [i for i in impls if (section, cid, mode, i) not in self.done]
            rounds = 1 if section == "memory" else max(1, self.args.rounds)
            rows = {}
            for r in range(rounds):  # --rounds: the order reversed every other round
                for impl in order if r % 2 == 0 else order[::-1]:
                    row = self.prefill_measure(section, c, cid, mode, impl, t, keep)
                    rows[impl] = row if impl not in rows else merge_rounds(rows[impl], row)
            for impl in order:
                self.add(rows[impl])
            if keep:
                self.check(section, cid, mode, keep)
            keep.clear()

    def prefill_measure(self, section, c, cid, mode, impl, t, keep):
        """One prefill measurement's row (memory or time; GQA peers retried on repeated heads)."""
        if section == "memory":
            return self.measure(section, c, cid, mode, impl,
                                lambda: self.prefill_fn(section, impl, mode, c, t), kind="memory")
        work = ("tflops", prefill_flops(c, mode))
        row = self.measure(section, c, cid, mode, impl,
                           lambda: self.prefill_fn(section, impl, mode, c, t),
                           work=work, keep=keep)
        if row["status"] == "error" and c["hq"] != c["hkv"] and impl in ("cudnn", "fa2", "math"):
            # enable_gqa refused: measure the MHA-equivalent with repeated K/V heads.
            t["force_repeat"] = True
            retry = self.measure(section, c, cid, mode, impl,
                                 lambda: self.prefill_fn(section, impl, mode, c, t),
                                 work=work, keep=keep)
            t.pop("force_repeat")
            if retry["status"] == "ok":
                retry["note"] += f"; enable_gqa failed: {row['note'][:200]}"
                row = retry
        return row

    def check(self, section, cid, mode, outs):
        """Max |difference| against cuDNN (else FA2), in the row of each other implementation."""
        ref_impl = next((i for i in ("cudnn", "fa2") if i in outs), None)
        if ref_impl is None or self.args.dropout > 0:  # masks differ
            return
        ref = outs[ref_impl]
        ref = ref if isinstance(ref, (tuple, list)) else (ref,)
        for impl, out in outs.items():
            if impl == ref_impl:
                continue
            out = out if isinstance(out, (tuple, list)) else (out,)
            try:
                errs = [(a.float() - r.float()).abs().max().item() for a, r in zip(out, ref)]
                finite = all(bool(torch.isfinite(a).all()) for a in out)
                row = self.done[(section, cid, mode, impl)]
                row["check"] = {"vs": ref_impl, "max_abs": max(errs), "each": errs,
                                "finite": finite}
            except Exception as e:  # noqa: BLE001
                self.done[(section, cid, mode, impl)]["check"] = {"error": short(e)}
        self.save()

    # -- decode --------------------------------------------------------------------------------
    def run_decode(self, item):
        self.decode_cell(item)
        self.free()

    def decode_cell(self, item):
        section, c, cid = item["section"], item["case"], item["case_id"]
        impls = item["modes"]["decode"]
        todo = [i for i in impls if (section, cid, "decode", i) not in self.done]
        if not todo:
            return
        nbytes = kv_bytes(c, self.elem)

        def add_all(status, note):
            for i in todo:
                self.add({"section": section, "case_id": cid, "case": c, "mode": "decode",
                          "impl": i, "status": status, "note": note})

        if nbytes > DECODE_GRID_MAX_GB * 1e9:
            return add_all("skip", f"K+V {nbytes / 1e9:.0f} GB > {DECODE_GRID_MAX_GB:g} GB")
        b, sq, kv, hq, hkv, d = c["b"], c["sq"], c["kv_len"], c["hq"], c["hkv"], c["d"]
        try:
            q = self.randn(b, sq, hq, d)
            kc, vc = self.randn(b, kv, hkv, d), self.randn(b, kv, hkv, d)
            seqlens = torch.full((b,), kv, dtype=torch.int32, device=self.device)
        except Exception as e:  # noqa: BLE001
            return add_all("oom" if is_oom(e) else "error", "inputs: " + short(e))
        keep = {}
        graph = self.cuda and not self.args.no_graphs
        flush = self.cuda and not self.args.no_flush
        if self.cuda and self.args.decode_settle_ms > 0:
            self.sync()
            time.sleep(self.args.decode_settle_ms / 1e3)

        def timed(impl, make_fn, retry_fn=None):
            if (section, cid, "decode", impl) in self.done:
                return
            row = self.measure(section, c, cid, "decode", impl, make_fn, work=("tbps", nbytes),
                               keep=keep, graph=graph, flush=flush)
            if row["status"] == "error" and retry_fn is not None:
                retry = self.measure(section, c, cid, "decode", impl, retry_fn,
                                     work=("tbps", nbytes), keep=keep, graph=graph, flush=flush)
                if retry["status"] == "ok":
                    retry["note"] += f"; enable_gqa failed: {row['note'][:200]}"
                    row = retry
            if row["status"] == "ok":
                use_graph = row.get("ms_graph") is not None
                row["timing"] = "graph" if use_graph else "eager"
                row["ms_best"] = row["ms_graph"] if use_graph else row["ms"]
                row["tbps_best"] = row["tbps_graph"] if use_graph else row["tbps"]
            self.add(row)

        def flash(block_table=None, caches=None, num_splits=0, lens=seqlens):
            def make():
                self.fc.need()
                k_, v_ = caches or (kc, vc)
                return (lambda: self.fc.decode(q, k_, v_, lens, c["causal"], block_table,
                                               num_splits)), ""
            return make

        def flash_append():
            # The step's sq tokens appended at cache_seqlens = kv - sq (the same positions every
            # call), then attention over the same kv keys as the plain step. The tokens are the
            # cache's own last rows, so the cache (which the other implementations read after
            # this one) keeps its values and every output stays comparable.
            def make():
                self.fc.need()
                k_new, v_new = kc[:, kv - sq:].clone(), vc[:, kv - sq:].clone()
                before = seqlens - sq
                return (lambda: self.fc.decode(q, kc, vc, before, c["causal"], k=k_new,
                                               v=v_new)), "appends the step's k / v"
            return make

        for impl in impls:  # flash_cuda and its variants, in the order of --impls
            if impl == "flash_cuda" or impl in DECODE_ENV_IMPLS:
                timed(impl, flash())
            elif impl == "read_floor":
                timed(impl, lambda: (self.read_floor_probe().bind(kc, vc),
                                     "no attention: reads K and V once"))
            elif impl == "flash_cuda_append":
                timed(impl, flash_append())
            elif impl == "flash_cuda_full":  # the peers' call: no per-sequence key counts
                timed(impl, flash(lens=None))
        # --paged (flash_cuda_p<page>), --paged-in-order (flash_cuda_po<page>), --paged with
        # --decode-splits (flash_cuda_p<page>s<num_splits>): one paged copy per page spec.
        paged_impls = {}
        for impl in impls:
            spec = report.paged_impl_spec(impl)
            if spec is not None:
                paged_impls.setdefault(spec[:2], []).append((impl, spec[2]))
        for (page, in_order), group in paged_impls.items():
            paged = self.paged_cache(kc, vc, page, shuffle=not in_order)
            for impl, splits in group:
                timed(impl, flash(*paged, num_splits=splits) if isinstance(paged, tuple)
                      else self.raiser(paged))
            del paged
        for impl in impls:  # --decode-splits: explicit num_splits (0: the heuristic)
            split = report.split_impl_spec(impl)
            if split is not None and split[0] == "flash_cuda":
                timed(impl, flash(num_splits=split[1]))
        # SDPA's layout (b, h, s, d); the flash layout caches are freed first.
        peers = [i for i in impls if i in SDPA_BACKENDS]
        if peers:
            qt = q.transpose(1, 2).contiguous()
            kt = kc.transpose(1, 2).contiguous()
            del kc
            vt = vc.transpose(1, 2).contiguous()
            del vc
            for impl in peers:
                retry = self.decode_peer(impl, c, qt, kt, vt, nbytes, repeat=True) if hq != hkv \
                    else None
                timed(impl, self.decode_peer(impl, c, qt, kt, vt, nbytes), retry)
            if "flash_cuda_hmajor" in impls:  # the peers' memory layout, flash_cuda's API view
                timed("flash_cuda_hmajor", flash(caches=(kt.transpose(1, 2), vt.transpose(1, 2))))
        if keep:
            self.check(section, cid, "decode", keep)

    @staticmethod
    def raiser(exc):
        def make():
            raise exc
        return make

    def paged_cache(self, kc, vc, page, shuffle=True):
        """(block_table, (k_pages, v_pages)) holding the same cache in pages of `page` rows,
        placed in a random order (shuffle) or in cache order."""
        b, kv, hkv, d = kc.shape
        if kv % page:
            return Skip(f"cache length {kv} is not a multiple of page {page}")
        if 2 * kc.numel() * kc.element_size() > 20e9:
            return Skip("paged copy of a cache over 10 GB not made")
        nb = b * (kv // page)
        perm = torch.randperm(nb, device=kc.device) if shuffle else \
            torch.arange(nb, device=kc.device)
        pages = []
        for x in (kc, vc):
            p = torch.empty(nb, page, hkv, d, dtype=x.dtype, device=x.device)
            p[perm] = x.reshape(nb, page, hkv, d)
            pages.append(p)
        return perm.to(torch.int32).reshape(b, kv // page), tuple(pages)

    def decode_peer(self, impl, c, qt, kt, vt, nbytes, repeat=False):
        """make_fn for an SDPA decode peer; repeat=True: K/V heads repeated instead of
        enable_gqa (the figure still counts the hkv heads' bytes, the useful ones)."""
        rep = c["hq"] // c["hkv"]

        def make():
            if impl == "math":
                elem = 4 if self.results["meta"].get("math_fp32_inside", True) else self.elem
                need = nbytes * (elem / self.elem) * (1 + rep)
                if need > self.args.math_mem_gb * 1e9:
                    raise Skip(f"standard attention would need ~{need / 1e9:.0f} GB")
            k, v, note = kt, vt, ""
            if repeat:
                if nbytes * rep > 20e9:
                    raise Skip("K/V heads not repeated beyond 20 GB")
                k, v = (x.repeat_interleave(rep, dim=1) for x in (kt, vt))
                note = "K/V heads repeated (no enable_gqa)"
            # One query token: no mask (SDPA's is_causal is top-left aligned). For sq > 1 the
            # peers run unmasked; the mask over the last sq keys is < 0.1% of the work.
            return (lambda: F.scaled_dot_product_attention(
                qt, k, v, enable_gqa=rep > 1 and not repeat).transpose(1, 2)), note
        return make

    # -- run -----------------------------------------------------------------------------------
    def run(self, plan):
        torch.manual_seed(0)
        self.ceilings()
        for item in plan:
            if item["section"] in ("decode", "decode_grid"):
                self.run_decode(item)
            else:
                self.run_prefill(item)
        self.finish("complete")

    def finish(self, status):
        over = self.args.time_budget and self.elapsed() > self.args.time_budget
        self.results["status"] = "time budget spent" if over and status == "complete" else status
        self.results["meta"]["seconds"] = round(self.elapsed(), 1)
        self.save()
        try:
            md = report.render(self.results)
        except Exception as e:  # noqa: BLE001 - the JSON is saved; bench_report.py can retry
            print(f"bench: rendering the tables failed: {short(e)}", file=sys.stderr)
            raise
        (self.out_dir / "bench.md").write_text(md)
        print(md, end="", flush=True)


def make_l2_flush(kind: str, device):
    """A function that evicts the 50 MB L2 through a 256 MiB buffer. memset: the L2 is left full
    of dirty lines, which the next call writes back to HBM as it evicts them (up to ~50 MB of
    writes during it); read: the buffer is read, leaving clean lines."""
    buf = torch.zeros(256 * 2**20, dtype=torch.uint8, device=device)
    if kind == "read":
        return lambda: buf.view(torch.int64).sum()
    return buf.zero_


def math_upcasts() -> bool:
    """True when SDPA's MATH backend computes half/bf16 inputs in fp32 (torch's default)."""
    allowed = getattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed", None)
    return True if allowed is None else not allowed()


def git_commit():
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=5).stdout.strip() or None
    except Exception:  # noqa: BLE001 - the device copy of the tree may have no .git
        return None

def main(argv=None) -> int:
    args = parse_args(argv, default_out=str(HERE / "results"))
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.device is None:
        args.device = "cpu" if args.smoke and not torch.cuda.is_available() else "cuda"
    plan = build_plan(args)
    n = sum(len(i) for item in plan for i in item["modes"].values())
    if args.dry_run:
        for item in plan:
            modes = "; ".join(f"{m}: {','.join(i)}" for m, i in item["modes"].items())
            print(f"{item['section']:12s} {item['case_id']:32s} {modes}")
        print(f"{len(plan)} cells, {n} measurements; estimated device time ~"
              f"{estimate_seconds(plan, args):.0f} s (rough, from ANCHORS-like rates)")
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench: no CUDA device (use --dry-run or --smoke on a machine without a GPU)",
              file=sys.stderr)
        return 2
    bench = Bench(args)
    print(f"bench: {len(plan)} cells, {n} measurements on {bench.results['meta']['device']}; "
          f"flash_cuda API: {bench.fc.api or bench.fc.error}", file=sys.stderr, flush=True)
    threads = torch.get_num_threads()
    if args.smoke and not bench.cuda:
        torch.set_num_threads(1)  # tiny shapes: threads only contend
    try:
        bench.run(plan)
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
