"""Summarise a `FLASH_CUDA_PTXAS_VERBOSE=1` build log: one line per forward kernel with its tile
config, variant, registers and spills. Usage: python bench/ptxas_table.py < build.log"""

import re
import sys

name = arch = None
spill = ("?", "?")
rows = []
for line in sys.stdin:
    m = re.search(r"Compiling entry function '(\S+)' for '(\S+)'", line)
    if m:
        name, arch = m.group(1), m.group(2)
        continue
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
        spill = (int(m.group(1)), int(m.group(2)))
        continue
    m = re.search(r"Used (\d+) registers", line)
    if m and name:
        t = re.search(r"FwdTraitsILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E", name)
        if t:
            flags = "".join(re.findall(r"Lb([01])E", name))
            dtype = "bf16" if "nv_bfloat16" in name else "fp16"
            rows.append((arch, int(t.group(1)), dtype, f"{t.group(2)}x{t.group(3)}",
                         int(t.group(4)), int(t.group(5)), flags, int(m.group(1)), *spill))
        name = None
rows.sort()
print("| arch | d | dtype | tile | warps | stages | causal/alibi/softcap | regs | spill st/ld (B) |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {r[7]} | {r[8]}/{r[9]} |")
