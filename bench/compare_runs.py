"""A/B comparison of bench_attention.py results: one bench.json per variant (each variant timed
in its own process of the same device call, with cuDNN in every process), case by case.

    python3 bench/compare_runs.py main=a/bench.json branch=b/bench.json [--impl flash_cuda]
        [--section decode_grid] [--peer cudnn]

For every case all files have, prints each variant's figure of `--impl` (TB/s for decode, TFLOP/s
for prefill: graph-replay timing where there is one), its ratio to the same process's `--peer`,
and its ratio to the first variant; then per variant the geometric means and how many cases
reach 1.0x / 0.97x of the peer. Ratios to the first variant are what an A/B measures; the
ratios to the peer show how much the machine moved between processes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

# The figure of a row, best first: graph-replay decode TB/s, decode TB/s, prefill TFLOP/s.
METRICS = ("tbps_graph", "tbps_best", "tbps", "tflops")


def figure(row: dict) -> float | None:
    for key in METRICS:
        value = row.get(key)
        if value:
            return float(value)
    return None


def load(path: str, section: str | None) -> dict[tuple[str, str], float]:
    """(case_id, impl) -> figure of the rows with status ok (of `section`, if given)."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    out = {}
    for row in rows:
        if row.get("status") != "ok" or (section and row.get("section") != section):
            continue
        value = figure(row)
        if value is not None:
            out[(row["case_id"], row["impl"])] = value
    return out


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def compare(runs: dict[str, dict], impl: str, peer: str) -> list[str]:
    names = list(runs)
    first = runs[names[0]]
    cases = [c for (c, i) in first if i == impl and all((c, impl) in r for r in runs.values())]
    lines = ["| case | " + " | ".join(f"{n} | {n}/{peer}" for n in names) + " | " +
             " | ".join(f"{n}/{names[0]}" for n in names[1:]) + " |"]
    lines.append("|---" * (1 + 2 * len(names) + len(names) - 1) + "|")
    to_peer = {n: [] for n in names}
    to_first = {n: [] for n in names[1:]}
    for case in cases:
        cells = []
        for n in names:
            value, ref = runs[n][(case, impl)], runs[n].get((case, peer))
            cells += [f"{value:.3f}", f"{value / ref:.3f}" if ref else "-"]
            if ref:
                to_peer[n].append(value / ref)
        for n in names[1:]:
            ratio = runs[n][(case, impl)] / first[(case, impl)]
            to_first[n].append(ratio)
            cells.append(f"{ratio:.3f}")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    lines.append("")
    for n in names:
        r = to_peer[n]
        lines.append(f"{n}: {impl}/{peer} geometric mean {geomean(r):.4f}, >= 1.0 on "
                     f"{sum(x >= 1.0 for x in r)} of {len(r)}, >= 0.97 on "
                     f"{sum(x >= 0.97 for x in r)}")
    for n in names[1:]:
        r = to_first[n]
        lines.append(f"{n} / {names[0]}: geometric mean {geomean(r):.4f}, "
                     f"range {min(r, default=float('nan')):.3f}-{max(r, default=float('nan')):.3f}"
                     f" over {len(r)} cases")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=path/to/bench.json, the reference first")
    parser.add_argument("--impl", default="flash_cuda", help="implementation compared")
    parser.add_argument("--peer", default="cudnn", help="same-process reference of each run")
    parser.add_argument("--section", default=None, help="only rows of this section")
    args = parser.parse_args(argv)
    runs = {}
    for spec in args.runs:
        name, sep, path = spec.partition("=")
        if not sep:
            parser.error(f"expected NAME=path, got {spec!r}")
        runs[name] = load(path, args.section)
    print("\n".join(compare(runs, args.impl, args.peer)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
