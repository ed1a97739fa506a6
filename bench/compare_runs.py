"""A/B comparison of bench_attention.py results: one bench.json per variant (each variant timed
in its own process of the same device call, with cuDNN in every process), case by case.

    python3 bench/compare_runs.py main=a/bench.json branch=b/bench.json [--impl flash_cuda]
        [--section decode_grid] [--peer cudnn] [--threshold 1.0]

For every case all files have, prints each variant's figure of `--impl` (TB/s for decode, TFLOP/s
for prefill: graph-replay timing where there is one), its ratio to the same process's `--peer`,
and its ratio to the first variant; then per variant the geometric means and how many cases
reach the threshold (1.0x) and 0.97x of it. Ratios to the first variant are what an A/B
measures; the ratios to the peer show how much the machine moved between processes. With
repeats of one variant (the same build in several processes), the line "median over the runs"
gives each case's median ratio to the peer: the cases below it in most processes, not in one.
`--threshold` is the ratio the counts are made against (1.0: as fast as the peer); e.g. paged
within 10% of contiguous: `--impl flash_cuda_p16 --peer flash_cuda --threshold 0.9`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import bench_report as report


def figure(row: dict | None) -> float | None:
    """A row's figure: decode TB/s (graph replay where timed, else eager), else prefill TFLOP/s;
    None unless the row is ok."""
    value = report.value(row, "tbps_best")
    return value if value is not None else report.value(row, "tflops")


def load(path: str) -> report.Table:
    with open(path) as f:
        return report.Table(json.load(f))


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def compare(runs: dict[str, report.Table], impl: str, peer: str,
            section: str | None = None, threshold: float = 1.0) -> list[str]:
    names = list(runs)
    first = runs[names[0]]
    # (section, case_id, mode) of the first run's `impl` rows that every run has a figure for.
    keys = [k[:3] for k, row in first.index.items()
            if k[3] == impl and (section is None or k[0] == section)
            and all(figure(t.get(*k[:3], impl)) for t in runs.values())]
    header = ["case"] + [h for n in names for h in (n, f"{n}/{peer}")] + \
        [f"{n}/{names[0]}" for n in names[1:]]
    body = []
    to_peer = {n: [] for n in names}
    per_case = []  # (case, [impl/peer of each run that has the peer])
    to_first = {n: [] for n in names[1:]}
    for key in keys:
        cells = [key[1] if key[2] in ("decode", "fwd") else f"{key[1]} {key[2]}"]
        per_case.append((cells[0], []))
        for n in names:
            value, ref = figure(runs[n].get(*key, impl)), figure(runs[n].get(*key, peer))
            cells += [f"{value:.3f}", f"{value / ref:.3f}" if ref else "-"]
            if ref:
                to_peer[n].append(value / ref)
                per_case[-1][1].append(value / ref)
        base = figure(first.get(*key, impl))
        for n in names[1:]:
            to_first[n].append(figure(runs[n].get(*key, impl)) / base)
            cells.append(f"{to_first[n][-1]:.3f}")
        body.append(cells)
    lines = report.md_table(header, body) + [""]
    for n in names:
        r = to_peer[n]
        lines.append(f"{n}: {impl}/{peer} geometric mean {geomean(r):.4f}, >= {threshold} on "
                     f"{sum(x >= threshold for x in r)} of {len(r)}, >= {0.97 * threshold:.3g} "
                     f"on {sum(x >= 0.97 * threshold for x in r)}")
    if len(names) > 1:
        # Repeats of one variant (separate processes): the median ratio of each case, so that a
        # case is called below the peer only when most runs put it there.
        medians = [(case, statistics.median(r), r) for case, r in per_case if r]
        below = [f"{case} {m:.3f} ({min(r):.3f}-{max(r):.3f})" for case, m, r in medians
                 if m < threshold]
        lines.append(f"median over the runs: {impl}/{peer} >= {threshold} on "
                     f"{sum(m >= threshold for _, m, _ in medians)} of {len(medians)}"
                     + (f"; below: {'; '.join(below)}" if below else ""))
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
    parser.add_argument("--threshold", type=float, default=1.0,
                        help="the ratio to the peer the counts are made against (default 1.0)")
    args = parser.parse_args(argv)
    runs = {}
    for spec in args.runs:
        name, sep, path = spec.partition("=")
        if not sep:
            parser.error(f"expected NAME=path, got {spec!r}")
        runs[name] = load(path)
    print("\n".join(compare(runs, args.impl, args.peer, args.section, args.threshold)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
