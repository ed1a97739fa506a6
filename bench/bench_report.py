"""Markdown tables from a bench_attention.py results file (pure Python: no torch needed).

    python3 bench/bench_report.py bench/results/bench.json [--compact]

The results file holds `meta`, `ceilings` and `rows`; one row is one measurement:
  section  grid | gqa | decode | decode_grid | memory
  case_id  the cell, e.g. "d128 s4096 b4 h16/16 causal"; `case` holds its numbers
  mode     fwd | fwdbwd | decode
  impl     flash_cuda | flash_cuda_det | flash_cuda_sm80 | flash_cuda_sm90 | flash_cuda_sm90fwd |
           flash_cuda_sm90pp | flash_cuda_cwarp | flash_cuda_nopdl | flash_cuda_p<page> |
           flash_cuda_po<page> (pages in order) |
           flash_cuda_s<num_splits> | flash_cuda_p<page>s<num_splits> | cudnn | fa2 | efficient |
           math
  status   ok | error | oom | skip | unavailable   (`note` says why)
  figures  ms, tflops (prefill), tbps / tbps_graph (decode), extra_bytes (memory), check
"""

from __future__ import annotations

import json
import re
import sys

from bench_plan import kv_bytes

LABELS = {
    "flash_cuda": "flash_cuda",
    "flash_cuda_det": "flash_cuda det",
    "flash_cuda_sm80": "flash_cuda sm80",
    "flash_cuda_sm90": "flash_cuda sm90",
    "flash_cuda_sm90fwd": "flash_cuda sm90 fwd",
    "flash_cuda_sm90plain": "flash_cuda sm90 plain",  # runs 32-33
    "flash_cuda_sm90pp": "flash_cuda sm90 pingpong",
    "flash_cuda_crow": "flash_cuda row combine",  # session 7 runs (FLASH_CUDA_COMBINE_ROW=1)
    "flash_cuda_cwarp": "flash_cuda warp combine",
    "flash_cuda_nopdl": "flash_cuda no PDL",
    "read_floor": "read floor",
    "cudnn": "cuDNN",
    "fa2": "FA2",
    "efficient": "xformers",
    "math": "standard",
}
IMPL_ORDER = ["flash_cuda", "flash_cuda_det", "flash_cuda_sm80", "flash_cuda_sm90",
              "flash_cuda_sm90fwd", "flash_cuda_sm90plain", "flash_cuda_sm90pp", "flash_cuda_crow",
              "flash_cuda_cwarp", "flash_cuda_nopdl", "read_floor", "cudnn", "fa2", "efficient",
              "math"]
STATUS_MARK = {"error": "err", "oom": "oom", "skip": "-", "unavailable": "n/a"}


def label(impl: str) -> str:
    if impl in LABELS:
        return LABELS[impl]
    paged = paged_impl_spec(impl)
    if paged is not None:
        page, in_order, splits = paged
        return (f"flash_cuda paged {page}" + (" in order" if in_order else "") +
                (f" splits {splits}" if split_impl_spec(impl) else ""))
    split = split_impl_spec(impl)
    if split is not None:
        return f"flash_cuda splits {split[1]}"
    return impl


def impl_rank(impl: str) -> tuple:
    # flash_cuda_p<page> / flash_cuda_po<page> / flash_cuda_p<page>s<splits> /
    # flash_cuda_s<splits> after flash_cuda, numerically.
    paged = paged_impl_spec(impl)
    if paged is not None:
        page, in_order, splits = paged
        kind = "flash_cuda_po" if in_order else ("flash_cuda_ps" if split_impl_spec(impl) else
                                                 "flash_cuda_p")
        return (1, kind, page, splits)
    split = split_impl_spec(impl)
    if split is not None:
        return (1, "flash_cuda_s", split[1], 0)
    return (IMPL_ORDER.index(impl) if impl in IMPL_ORDER else 1, impl, 0, 0)


def split_impl_spec(impl: str):
    """(the default call's impl, num_splits) of flash_cuda with an explicit num_splits (bench
    --decode-splits): flash_cuda_s<n> -> ("flash_cuda", n), flash_cuda_p<page>s<n> ->
    ("flash_cuda_p<page>", n); None for any other impl."""
    m = re.fullmatch(r"flash_cuda_(p\d+)?s(\d+)", impl)
    if m is None:
        return None
    return ("flash_cuda_" + m.group(1) if m.group(1) else "flash_cuda"), int(m.group(2))


def paged_impl_spec(impl: str):
    """(page, in_order, num_splits) of a paged decode impl: flash_cuda_p<page>,
    flash_cuda_po<page> (pages in cache order), flash_cuda_p<page>s<n> (explicit num_splits);
    None for any other impl."""
    m = re.fullmatch(r"flash_cuda_p(o?)(\d+)(?:s(\d+))?", impl)
    if m is None:
        return None
    return int(m.group(2)), m.group(1) == "o", int(m.group(3) or 0)


def is_split_impl(impl: str) -> bool:
    return split_impl_spec(impl) is not None


class Table:
    """Rows indexed by (section, case_id, mode, impl), cases kept in the order they ran."""

    def __init__(self, results: dict):
        self.results = results
        self.rows = results.get("rows", [])
        self.index = {(r["section"], r["case_id"], r["mode"], r["impl"]): r for r in self.rows}

    def cases(self, section: str) -> list[str]:
        seen = []
        for r in self.rows:
            if r["section"] == section and r["case_id"] not in seen:
                seen.append(r["case_id"])
        return seen

    def impls(self, section: str, mode: str | None = None) -> list[str]:
        found = {r["impl"] for r in self.rows
                 if r["section"] == section and (mode is None or r["mode"] == mode)}
        return sorted(found, key=impl_rank)

    def get(self, section, case_id, mode, impl):
        return self.index.get((section, case_id, mode, impl))

    def case(self, section, case_id) -> dict:
        for r in self.rows:
            if r["section"] == section and r["case_id"] == case_id:
                return r["case"]
        return {}


def value(row, key: str):
    if row is None or row.get("status") != "ok":
        return None
    return row.get(key)


def cell(row, key: str, fmt: str = "{:.0f}") -> str:
    if row is None:
        return ""
    if row.get("status") != "ok":
        return STATUS_MARK.get(row.get("status"), "?")
    v = row.get(key)
    return "?" if v is None else fmt.format(v)


def ratio(a, b) -> str:
    if a is None or b is None or b == 0:
        return ""
    return f"{a / b:.2f}"


def fmt_err(x) -> str:
    return "" if x is None else f"{x:.1e}"


def md_table(header: list[str], body: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in body]
    return out


def prefill_label(case: dict) -> list[str]:
    return [str(case.get("d")), "yes" if case.get("causal") else "no",
            f"{case.get('sq')} ({case.get('b')})"]


# Our implementations with ratio columns against the peers in the prefill tables.
RATIO_IMPLS = (("flash_cuda", "fc"), ("flash_cuda_sm80", "sm80"), ("flash_cuda_sm90", "sm90"),
               ("flash_cuda_sm90fwd", "sm90fwd"), ("flash_cuda_sm90plain", "plain"),
               ("flash_cuda_sm90pp", "pp"))
COMPACT_IMPLS = ("flash_cuda", "flash_cuda_sm80", "flash_cuda_sm90", "flash_cuda_sm90fwd",
                 "flash_cuda_sm90plain", "flash_cuda_sm90pp", "cudnn", "fa2")


def render_prefill(t: Table, section: str, compact: bool) -> list[str]:
    cases = t.cases(section)
    if not cases:
        return []
    modes = [m for m in ("fwd", "fwdbwd") if t.impls(section, m)]
    name = {"fwd": "fwd", "fwdbwd": "fwd+bwd"}
    header = ["head dim", "causal", "seqlen (batch)"] if section == "grid" else ["case"]
    shown = {}
    for m in modes:
        impls = t.impls(section, m)
        if compact:
            impls = [i for i in impls if i in COMPACT_IMPLS]
        shown[m] = impls
        header += [f"{name[m]}: {label(i)}" for i in impls]
        for ours, short in RATIO_IMPLS:
            if ours in impls:
                header += [f"{name[m]}: {short}/cuDNN", f"{name[m]}: {short}/FA2"]
    if not compact and section == "grid":
        header += ["fwd max err: fc / FA2 (vs cuDNN)"]
    body = []
    for cid in cases:
        case = t.case(section, cid)
        line = prefill_label(case) if section == "grid" else [cid]
        for m in modes:
            for i in shown[m]:
                line.append(cell(t.get(section, cid, m, i), "tflops"))
            for ours, _ in RATIO_IMPLS:
                if ours in shown[m]:
                    fc = value(t.get(section, cid, m, ours), "tflops")
                    line.append(ratio(fc, value(t.get(section, cid, m, "cudnn"), "tflops")))
                    line.append(ratio(fc, value(t.get(section, cid, m, "fa2"), "tflops")))
        if not compact and section == "grid":
            fc = t.get(section, cid, "fwd", "flash_cuda") or {}
            fa = t.get(section, cid, "fwd", "fa2") or {}
            e1, e2 = (fc.get("check") or {}).get("max_abs"), (fa.get("check") or {}).get("max_abs")
            line.append("" if e1 is None and e2 is None else f"{fmt_err(e1)} / {fmt_err(e2)}")
        body.append(line)
    meta = t.results.get("meta", {})
    dropout = f", dropout_p {meta['dropout_p']:g}" if meta.get("dropout_p") else ""
    title = {"grid": f"Prefill grid, {meta.get('dtype', '?')}{dropout}, TFLOP/s (batch x seqlen = "
                     f"{meta.get('tokens', '?')} tokens, hidden {meta.get('hidden', '?')})",
             "gqa": "GQA prefill, TFLOP/s"}[section]
    return [f"### {title}", ""] + md_table(header, body) + [""]


def render_gqa_times(t: Table) -> list[str]:
    cases = t.cases("gqa")
    if not cases:
        return []
    header = ["case", "impl", "fwd ms", "fwd TF/s", "fwd+bwd ms", "fwd+bwd TF/s", "note"]
    body = []
    for cid in cases:
        for i in t.impls("gqa"):
            f, fb = t.get("gqa", cid, "fwd", i), t.get("gqa", cid, "fwdbwd", i)
            notes = "; ".join(sorted({r["note"] for r in (f, fb) if r and r.get("note")}))
            body.append([cid, label(i), cell(f, "ms", "{:.3f}"), cell(f, "tflops"),
                         cell(fb, "ms", "{:.3f}"), cell(fb, "tflops"), notes[:80]])
    return ["### GQA prefill, times", ""] + md_table(header, body) + [""]


def render_decode(t: Table, section: str, compact: bool) -> list[str]:
    cases = t.cases(section)
    if not cases:
        return []
    impls = [i for i in t.impls(section) if not is_split_impl(i)]  # own table below
    if compact:
        impls = [i for i in impls if i in ("flash_cuda", "flash_cuda_cwarp", "flash_cuda_nopdl",
                                           "cudnn", "fa2")]
    header = ["case"]
    for i in impls:
        header += ([f"{label(i)} TB/s"] if compact else
                   [f"{label(i)} ms", f"{label(i)} TB/s", f"{label(i)} eager TB/s"])
    if "flash_cuda" in impls:
        header += ["fc/cuDNN", "fc/FA2"]
    body, eager_only = [], False
    for cid in cases:
        line = [cid]
        for i in impls:
            r = t.get(section, cid, "decode", i)
            mark = ""
            if value(r, "timing") == "eager" and "CUDA graph" in (r.get("note") or ""):
                mark, eager_only = "*", True
            if not compact:
                line.append(cell(r, "ms_best", "{:.3f}"))
            line.append(cell(r, "tbps_best", "{:.2f}") + mark)
            if not compact:
                line.append(cell(r, "tbps", "{:.2f}"))
        if "flash_cuda" in impls:
            fc = best_decode(t.get(section, cid, "decode", "flash_cuda"))
            line.append(ratio(fc, best_decode(t.get(section, cid, "decode", "cudnn"))))
            line.append(ratio(fc, best_decode(t.get(section, cid, "decode", "fa2"))))
        body.append(line)
    title = {"decode": "Decode, TB/s of K+V read",
             "decode_grid": "Decode grid (issue 5), TB/s of K+V read"}[section]
    how = ("One query token unless the case says qN. TB/s and ms from CUDA-graph replay (eager: "
           "launched one by one); L2 flushed before each call unless --no-flush; ratios from "
           "the graph figures." + (" * graph capture failed, eager figure." if eager_only else ""))
    return [f"### {title}", "", how, ""] + md_table(header, body) + [""] + \
        render_split_sweep(t, section)


def render_split_sweep(t: Table, section: str) -> list[str]:
    """flash_cuda decode with explicit num_splits (--decode-splits) next to the default call and
    cuDNN: graph-replay TB/s, the best count per case; one table for the contiguous cache and
    one per paged cache."""
    bases = {}  # the default call's impl -> [(num_splits, impl)]
    for i in t.impls(section):
        split = split_impl_spec(i)
        if split is not None:
            bases.setdefault(split[0], []).append((split[1], i))
    out = []
    for base, splits in bases.items():
        header = (["case", "default"] + [f"s{n}" for n, _ in splits] +
                  ["best", "best/default", "best/cuDNN"])
        body = []
        for cid in t.cases(section):
            default = best_decode(t.get(section, cid, "decode", base))
            figs = [best_decode(t.get(section, cid, "decode", i)) for _, i in splits]
            line = [cid, "" if default is None else f"{default:.2f}"]
            line += ["" if f is None else f"{f:.2f}" for f in figs]
            ok = [(f, n) for f, (n, _) in zip(figs, splits) if f is not None]
            if ok:
                f, n = max(ok)
                line += [f"s{n}", ratio(f, default),
                         ratio(f, best_decode(t.get(section, cid, "decode", "cudnn")))]
            else:
                line += ["", "", ""]
            body.append(line)
        name = {"decode": "Decode", "decode_grid": "Decode grid"}[section]
        cache = "contiguous cache" if base == "flash_cuda" else label(base)
        title = f"### {name}: num_splits sweep" + ("" if base == "flash_cuda" else f", {cache}")
        how = (f"flash_cuda, {cache}, with num_splits forced (s0: the heuristic asked for "
               "explicitly, the same call as default); TB/s of K+V, graph replay where it ran.")
        out += [title, "", how, ""] + md_table(header, body) + [""]
    return out


# Issue 5's decode targets: >= 1.0x cuDNN and >= 1.5x FA2 at every cell, >= 3.8 TB/s of K+V
# wherever K+V is >= 64 MiB, page 16 and 256 within 10% of the contiguous cache.
TARGET_TBPS, TARGET_MIN_BYTES, TARGET_FA2, TARGET_PAGED = 3.8, 64 * 2**20, 1.5, 0.9


def render_targets(t: Table, section: str = "decode_grid") -> list[str]:
    """Issue 5's targets over the decode grid, per query length: each cell's figures and ratios,
    then how many cells meet each target. With the read_floor impl, a miss is also checked
    against the cell's floor (the K+V read alone): 'unreachable' where even the floor misses."""
    cases = [c for c in t.cases(section)
             if t.get(section, c, "decode", "flash_cuda") is not None]
    if not cases:
        return []
    fig = lambda cid, impl: best_decode(t.get(section, cid, "decode", impl))  # noqa: E731
    floor = "read_floor" in t.impls(section)
    pages = [p for p in (16, 256) if f"flash_cuda_p{p}" in t.impls(section)]
    out = ["### Issue 5's targets", "",
           "Graph-replay TB/s of K+V; fc = flash_cuda; floor = read_floor (a kernel that only "
           "reads K and V once, timed the same way: the fastest a step can be, to within the few "
           "% by which a tuned kernel streams faster than it); pN = paged, page N.", ""]
    for sq in sorted({t.case(section, c).get("sq", 1) for c in cases}):
        mine = [c for c in cases if t.case(section, c).get("sq", 1) == sq]
        header = ["cell", "MiB", "fc TB/s", "fc us", "cuDNN", "FA2"] + (["floor"] if floor else [])
        header += ["fc/cuDNN", "fc/FA2"] + (["fc/floor"] if floor else [])
        header += [f"p{p}/fc" for p in pages]
        body = []
        n = {"cudnn": [0, 0], "fa2": [0, 0], "tbps": [0, 0], **{p: [0, 0] for p in pages}}
        below = {"cudnn": [], "fa2": [], "tbps": []}
        unreachable = {"fa2": 0, "tbps": 0}
        for cid in mine:
            c = t.case(section, cid)
            nbytes = kv_bytes(c)
            fc, cu, fa, fl = (fig(cid, i) for i in ("flash_cuda", "cudnn", "fa2", "read_floor"))
            row = t.get(section, cid, "decode", "flash_cuda")
            us = value(row, "ms_best")
            line = [cid, f"{nbytes / 2**20:.0f}", num(fc), num(us and us * 1e3, "{:.1f}"),
                    num(cu), num(fa)] + ([num(fl)] if floor else [])
            line += [ratio3(fc, cu), ratio3(fc, fa)] + ([ratio3(fc, fl)] if floor else [])
            for p in pages:
                pf = fig(cid, f"flash_cuda_p{p}")
                line.append(ratio3(pf, fc))
                if pf is not None and fc:
                    n[p][1] += 1
                    n[p][0] += pf >= TARGET_PAGED * fc
            body.append(line)
            if fc is None:
                continue
            if cu:
                n["cudnn"][1] += 1
                n["cudnn"][0] += fc >= cu
                if fc < cu:
                    below["cudnn"].append(f"{cid} {fc / cu:.3f}")
            if fa:
                n["fa2"][1] += 1
                n["fa2"][0] += fc >= TARGET_FA2 * fa
                if fc < TARGET_FA2 * fa:
                    below["fa2"].append(f"{cid} {fc / fa:.2f}")
                    unreachable["fa2"] += fl is not None and fl < TARGET_FA2 * fa
            if nbytes >= TARGET_MIN_BYTES:
                n["tbps"][1] += 1
                n["tbps"][0] += fc >= TARGET_TBPS
                if fc < TARGET_TBPS:
                    below["tbps"].append(f"{cid} {fc:.2f}")
                    unreachable["tbps"] += fl is not None and fl < TARGET_TBPS
        title = "one query token" if sq == 1 else f"{sq} query tokens"
        out += [f"#### {title}", ""] + md_table(header, body) + [""]
        out.append(f"- >= 1.0x cuDNN: {n['cudnn'][0]} of {n['cudnn'][1]}"
                   + (f" (below: {'; '.join(below['cudnn'])})" if below["cudnn"] else ""))
        out.append(f"- >= {TARGET_TBPS} TB/s where K+V >= 64 MiB: {n['tbps'][0]} of {n['tbps'][1]}"
                   + (f" (below: {'; '.join(below['tbps'])}"
                      + (f"; the floor itself below {TARGET_TBPS} on {unreachable['tbps']} of "
                         "them" if floor else "") + ")" if below["tbps"] else ""))
        out.append(f"- >= {TARGET_FA2}x FA2: {n['fa2'][0]} of {n['fa2'][1]}"
                   + (f"; of the {len(below['fa2'])} below, the floor itself under "
                      f"{TARGET_FA2}x FA2 on {unreachable['fa2']}" if floor and below["fa2"]
                      else ""))
        for p in pages:
            out.append(f"- page {p} within 10% of contiguous: {n[p][0]} of {n[p][1]}")
        out.append("")
    return out


def num(x, fmt: str = "{:.2f}") -> str:
    return "" if x is None else fmt.format(x)


def ratio3(a, b) -> str:
    return "" if a is None or not b else f"{a / b:.3f}"


def best_decode(row):
    """The figure a decode row is judged by: graph replay where it was timed, else eager."""
    return value(row, "tbps_best")


def render_memory(t: Table, compact: bool) -> list[str]:
    cases = t.cases("memory")
    if not cases:
        return []
    header, cols = ["seqlen"], []
    for m in ("fwd", "fwdbwd"):
        impls = t.impls("memory", m)
        if compact:
            impls = [i for i in impls if i in ("flash_cuda", "math")]
        cols += [(m, i) for i in impls]
        header += [f"{'fwd' if m == 'fwd' else 'fwd+bwd'}: {label(i)}" for i in impls]
        if impls:
            header.append(f"{'fwd' if m == 'fwd' else 'fwd+bwd'}: floor")
            cols.append((m, "floor"))
    body = []
    for cid in cases:
        case = t.case("memory", cid)
        line = [str(case.get("sq"))]
        for m, i in cols:
            if i == "floor":
                line.append(f"{case.get('floor_' + m, 0) / 2**20:.0f}")
            else:
                line.append(cell(t.get("memory", cid, m, i), "extra_mib", "{:.0f}"))
        body.append(line)
    c0 = t.case("memory", cases[0])
    title = (f"### Peak extra device memory, MiB (b={c0.get('b')}, h={c0.get('hq')}, "
             f"d={c0.get('d')}, not causal)")
    note = ("peak allocated during one call minus what was allocated before it (inputs); "
            "floor = out + lse (fwd), + dq, dk, dv (fwd+bwd)")
    return [title, "", note, ""] + md_table(header, body) + [""]


def render_det(t: Table) -> list[str]:
    """The cost of deterministic=True: fwd+bwd time with and without it, per prefill cell."""
    body = []
    for section in ("grid", "gqa"):
        for cid in t.cases(section):
            fc = t.get(section, cid, "fwdbwd", "flash_cuda")
            det = t.get(section, cid, "fwdbwd", "flash_cuda_det")
            if det is None:
                continue
            name = (" ".join(prefill_label(t.case(section, cid))) if section == "grid"
                    else f"GQA {cid}")
            body.append([name, cell(fc, "ms", "{:.3f}"), cell(det, "ms", "{:.3f}"),
                         ratio(value(det, "ms"), value(fc, "ms")),
                         cell(fc, "tflops"), cell(det, "tflops")])
    if not body:
        return []
    header = ["case (head dim, causal, seqlen (batch))", "fwd+bwd ms", "deterministic ms",
              "det / default time", "TFLOP/s", "det TFLOP/s"]
    return (["### Cost of deterministic=True (fwd+bwd)", ""] + md_table(header, body) + [""])


def render_problems(t: Table, limit: int = 12) -> list[str]:
    """Distinct error/oom messages with the first cells they hit."""
    seen: dict[str, list[str]] = {}
    for r in t.rows:
        if r.get("status") in ("error", "oom", "unavailable"):
            msg = (r.get("note") or r["status"]).strip().splitlines()[0][:160]
            seen.setdefault(f"{label(r['impl'])}: {msg}", []).append(
                f"{r['section']} {r['case_id']} {r['mode']}")
    if not seen:
        return []
    out = ["### Errors and unavailable measurements", ""]
    for i, (msg, where) in enumerate(seen.items()):
        if i == limit:
            out.append(f"- ... {len(seen) - limit} more distinct messages in the JSON")
            break
        more = f" (+{len(where) - 1} more)" if len(where) > 1 else ""
        out.append(f"- {msg} — {where[0]}{more}")
    return out + [""]


def render_header(results: dict) -> list[str]:
    meta, ceil = results.get("meta", {}), results.get("ceilings", {})
    fc = meta.get("flash_cuda", {})
    lines = [
        f"## flash_cuda benchmark — {meta.get('device', '?')}, {meta.get('date', '?')}",
        "",
        f"torch {meta.get('torch', '?')}, CUDA {meta.get('cuda', '?')}, "
        f"cuDNN {meta.get('cudnn', '?')}, "
        f"flash_cuda {fc.get('version', '?')} (API: {fc.get('api') or 'none'}"
        f"{'; ' + fc['error'] if fc.get('error') else ''}), git {meta.get('git', '?')}, "
        f"status {results.get('status', '?')}",
    ]
    if ceil:
        mm, cp = ceil.get("matmul_tflops"), ceil.get("copy_tbps")
        launch = ceil.get("launch_floor_graph_us")
        lines.append(
            f"Ceilings this run: bf16 8192³ matmul {'?' if mm is None else f'{mm:.0f}'} TFLOP/s; "
            f"device copy {'?' if cp is None else f'{cp:.2f}'} TB/s (read + write)"
            + ("" if launch is None else
               f"; one launch reading nothing {launch:.1f} us graph-replayed, "
               f"{ceil['launch_floor_us']:.1f} us eager (timed like the decode steps)"))
    lines.append("")
    return lines


def render(results: dict, compact: bool = False) -> str:
    t = Table(results)
    out = render_header(results)
    out += render_prefill(t, "grid", compact)
    if compact:
        out += render_prefill(t, "gqa", compact)
    else:
        out += render_gqa_times(t)
    out += render_decode(t, "decode", compact)
    out += render_decode(t, "decode_grid", compact)
    out += render_targets(t)
    out += render_det(t)
    out += render_memory(t, compact)
    out += render_problems(t, limit=6 if compact else 20)
    return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    compact = "--compact" in argv
    paths = [a for a in argv if not a.startswith("--")]
    if len(paths) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    with open(paths[0]) as f:
        print(render(json.load(f), compact=compact), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
