"""The sm_90a PTX wrappers (csrc/kernels/sm90/ptx_sm90.cuh): mbarrier + bulk copy, TMA 2D with the
128-byte swizzle, wgmma m64n64k16 (SS, and RS with an MN-major B), stmatrix.x4. The checks' kernels
(tests/cuda/sm90_wrapper_kernels.cuh) run three ways:
- compiled for sm_90a with nvcc (wherever nvcc is), so the wrappers keep building;
- on the CPU emulator's Hopper instructions (tests/emulation/kernels/sm90/ptx_sm90.cuh,
  AddressSanitizer build): the kernels' barrier protocol and descriptors against the emulator's
  reading of the PTX ISA (a wait that would hang fails the run);
- on an sm_90 GPU (tests/cuda/test_sm90_wrappers.cu): the same kernels on the hardware, which
  pins the emulator's reading down. Its waits are bounded, so a wrong protocol fails, not hangs.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "cuda" / "test_sm90_wrappers.cu"
EMULATED = ROOT / "tests" / "emulation" / "sm90_wrappers_emulated.cpp"
CUDA_INCLUDE = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


def nvcc_path():
    nvcc = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    return str(nvcc) if nvcc.exists() else shutil.which("nvcc")


def compile_cmd(nvcc, out, object_only=False):
    return [nvcc, "-std=c++20", "-O2", "--expt-relaxed-constexpr",
            "-gencode=arch=compute_90a,code=sm_90a", f"-I{ROOT / 'csrc'}",
            f"-I{ROOT / 'tests' / 'cuda'}", str(SOURCE),
            *(["-c"] if object_only else []), "-o", str(out)]


def expect_all_passed(run):
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 failure(s)" in run.stdout
    assert run.stdout.count("PASS ") == 14, run.stdout


def test_sm90_wrappers_compile(tmp_path):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found")
    subprocess.run(compile_cmd(nvcc, tmp_path / "test_sm90_wrappers.o", object_only=True),
                   check=True, timeout=300)


@pytest.mark.skipif(shutil.which("g++") is None or not (CUDA_INCLUDE / "cuda_bf16.h").exists(),
                    reason="needs g++ and the CUDA headers")
def test_sm90_wrappers_emulated(tmp_path):
    exe = tmp_path / "sm90_wrappers_emulated"
    here = ROOT / "tests" / "emulation"
    subprocess.run([os.environ.get("CXX", "g++"), "-std=c++20", "-O1", "-g", "-pthread",
                    "-Wno-psabi", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                    "-include", str(here / "prelude.h"), f"-I{here}", f"-I{ROOT / 'csrc'}",
                    f"-I{ROOT / 'tests' / 'cuda'}", f"-I{CUDA_INCLUDE}", str(EMULATED), "-o",
                    str(exe)], check=True, timeout=300)
    expect_all_passed(subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                                     env={**os.environ, "EMU_WAIT_SECONDS": "20"}))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm_90 GPU (H100 / H200)")
def test_sm90_wrappers(tmp_path):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found")
    exe = tmp_path / "test_sm90_wrappers"
    subprocess.run(compile_cmd(nvcc, exe), check=True, timeout=300)
    expect_all_passed(subprocess.run([str(exe)], capture_output=True, text=True, timeout=120))
