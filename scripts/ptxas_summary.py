#!/usr/bin/env python3
"""One-paragraph summary of the ptxas report in a build log (FLASH_CUDA_PTXAS_VERBOSE=1).

    python3 scripts/ptxas_summary.py build.log

Prints how many kernels were compiled, every function that spills (bytes spill stores or loads
!= 0) and every "wgmma ... serialized" warning (a silent large slowdown on Hopper). Exit 0 always:
the build's own exit status says whether it worked.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
PROPS = re.compile(r"Function properties for (\S+)")
SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
WARN_FN = re.compile(r"in function '([^']+)'")
REGS = re.compile(r"Used (\d+) registers")


def demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    try:
        out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True,
                             timeout=20).stdout.splitlines()
        return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}
    except Exception:  # noqa: BLE001
        return {n: n for n in names}


def summarize(lines) -> dict:
    entries, spills, serialized, max_regs = set(), {}, [], 0
    current = None
    for line in lines:
        if m := ENTRY.search(line):
            entries.add((m.group(1), m.group(2)))
        if m := PROPS.search(line):
            current = m.group(1)
        if m := REGS.search(line):
            max_regs = max(max_regs, int(m.group(1)))
        if m := SPILL.search(line):
            stores, loads = int(m.group(1)), int(m.group(2))
            if stores or loads:
                fn = WARN_FN.search(line)
                name = fn.group(1) if fn else (current or "?")
                spills[name] = (max(stores, spills.get(name, (0, 0))[0]),
                                max(loads, spills.get(name, (0, 0))[1]))
        if re.search(r"wgmma.*serializ", line, re.IGNORECASE):
            serialized.append(line.strip())
    return {"entries": len(entries), "spills": spills, "serialized": serialized,
            "max_regs": max_regs}


def main(path: str) -> int:
    with open(path, errors="replace") as f:
        s = summarize(f)
    names = demangle(sorted(s["spills"]))
    print(f"ptxas: {s['entries']} kernel entries, max {s['max_regs']} registers; "
          f"spills: {'YES' if s['spills'] else 'none'}; wgmma serialization warnings: "
          f"{len(s['serialized']) or 'none'}")
    for name, (stores, loads) in sorted(s["spills"].items()):
        print(f"  spill {stores} B stores / {loads} B loads: {names[name][:160]}")
    for line in list(dict.fromkeys(s["serialized"]))[:10]:
        print(f"  {line[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else 2)
