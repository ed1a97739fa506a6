"""scripts/sanitize_kernels.py (the calls gpu_check.sh runs under compute-sanitizer) runs through
on the CPU reference path: its shapes, page tables and lengths are accepted by the API."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sanitize_script_runs_on_cpu():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sanitize_kernels.py"),
                           "--device", "cpu"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "ok"
    # (head dims + d128 again on the ring tiles and on the head-group tiles) x (heads, query
    # rows) x split counts x (contiguous + three page sizes)
    assert sum(line.startswith("decode") for line in lines) == (4 + 2) * 4 * 2 * 4
    assert sum(line.startswith("head groups") for line in lines) == 3
