"""The sm_90a PTX wrappers (csrc/kernels/sm90/ptx_sm90.cuh): mbarrier + bulk copy, TMA 2D with the
128-byte swizzle, wgmma m64n64k16 (tests/cuda/test_sm90_wrappers.cu). On an sm_90 GPU the
program runs (its waits are bounded, so a wrong barrier protocol fails instead of hanging);
anywhere with nvcc it is at least compiled, so the wrappers keep building before any kernel
uses them."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "cuda" / "test_sm90_wrappers.cu"


def nvcc_path():
    nvcc = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    return str(nvcc) if nvcc.exists() else shutil.which("nvcc")


def compile_cmd(nvcc, out, object_only=False):
    return [nvcc, "-std=c++20", "-O2", "--expt-relaxed-constexpr",
            "-gencode=arch=compute_90a,code=sm_90a", f"-I{ROOT / 'csrc'}", str(SOURCE),
            *(["-c"] if object_only else []), "-o", str(out)]


def test_sm90_wrappers_compile(tmp_path):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found")
    subprocess.run(compile_cmd(nvcc, tmp_path / "test_sm90_wrappers.o", object_only=True),
                   check=True, timeout=300)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm_90 GPU (H100 / H200)")
def test_sm90_wrappers(tmp_path):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found")
    exe = tmp_path / "test_sm90_wrappers"
    subprocess.run(compile_cmd(nvcc, exe), check=True, timeout=300)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failure(s)" in run.stdout
