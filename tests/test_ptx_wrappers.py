"""Single-warp GPU checks of the PTX wrappers (csrc/kernels/ptx.cuh): mma.m16n8k16 on known
matrices, ldmatrix / ldmatrix.trans lane patterns, the swizzled tile addressing, cp.async
zero-fill, f32x2 packing order, ex2 / tanh. Compiles tests/cuda/test_ptx_wrappers.cu with nvcc
for the visible GPU and runs it."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
NVCC = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_ptx_wrappers(tmp_path):
    nvcc = str(NVCC) if NVCC.exists() else shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
    exe = tmp_path / "test_ptx_wrappers"
    subprocess.run(
        [nvcc, "-std=c++20", "-O2", "--expt-relaxed-constexpr",
         f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-I{ROOT / 'csrc'}",
         str(ROOT / "tests" / "cuda" / "test_ptx_wrappers.cu"), "-o", str(exe)],
        check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failure(s)" in run.stdout
