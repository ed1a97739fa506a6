"""kernels/fast_divisor.h, the multiply-shift division the sm80 forward kernel's index math uses
(grid coordinates, GQA-packed rows, split shares, KV heads): tests/host/fast_divisor_check.cpp,
built with the host compiler (the header's host path is the device path's arithmetic with a
64-bit product for __umulhi), against plain integer division. No GPU."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def test_fast_divisor_matches_division(tmp_path):
    exe = tmp_path / "fast_divisor_check"
    subprocess.run(["g++", "-std=c++17", "-O2", f"-I{ROOT / 'csrc'}",
                    str(ROOT / "tests" / "host" / "fast_divisor_check.cpp"), "-o", str(exe)],
                   check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert " 0 failure(s)" in run.stdout
