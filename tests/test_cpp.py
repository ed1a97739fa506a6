"""The C++ side: CMakeLists.txt builds libflash_cuda.so against libtorch from the sources
setup.py uses, and examples/cpp/forward_check (public header -> dispatcher -> the registered
op) agrees with naive fp64 attention.

Needs cmake (and preferably ninja) and the CUDA compiler; no GPU. The build uses
FLASH_CUDA_HEADDIMS=none and one architecture (the GPU's, else sm_80), so only the
torch-facing C++ and the small CUDA kernels compile (about a minute on 2 cores). The build
folder is build/cmake-test in the repository (kept between runs, so a rerun only rebuilds what
changed); set FLASH_CUDA_CMAKE_BUILD_DIR to put it elsewhere.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "csrc"))

import build_config  # noqa: E402

pytestmark = pytest.mark.slow


def _tool(name: str) -> str | None:
    # The venv's bin (pip's cmake / ninja) first, then PATH.
    local = pathlib.Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    return shutil.which(name)


def _cuda_compiler() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    nvcc = pathlib.Path(home) / "bin" / "nvcc"
    return str(nvcc) if nvcc.exists() else shutil.which("nvcc")


CMAKE = _tool("cmake")
NINJA = _tool("ninja")
NVCC = _cuda_compiler()

requires_toolchain = pytest.mark.skipif(
    CMAKE is None or NVCC is None, reason="needs cmake and nvcc"
)


def _one_arch() -> str:
    """The visible GPU's architecture (its kernels must load there), else sm_80."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}{minor}"
        return arch + "a" if arch == "90" else arch
    return "80"


def _configure(build: pathlib.Path, headdims: str, archs: str) -> None:
    args = [
        CMAKE, "-S", str(ROOT), "-B", str(build),
        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        f"-DTorch_DIR={pathlib.Path(torch.utils.cmake_prefix_path) / 'Torch'}",
        f"-DCMAKE_CUDA_COMPILER={NVCC}",
        f"-DFLASH_CUDA_HEADDIMS={headdims}",
        f"-DFLASH_CUDA_ARCHS={archs}",
        "-DCMAKE_BUILD_TYPE=Release",
    ]
    if NINJA and not (build / "CMakeCache.txt").exists():
        args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={NINJA}"]
    env = dict(os.environ)
    env.setdefault("CUDA_HOME", str(pathlib.Path(NVCC).parent.parent))
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"cmake configure failed:\n{proc.stdout}\n{proc.stderr}"


def _compile_commands(build: pathlib.Path) -> dict[str, str]:
    entries = json.loads((build / "compile_commands.json").read_text())
    return {
        str(pathlib.Path(e["file"]).resolve().relative_to(ROOT)): e.get("command", "")
        or " ".join(e.get("arguments", []))
        for e in entries
    }


@requires_toolchain
def test_cmake_sources_and_flags_match_setup_py(tmp_path, monkeypatch):
    """Configure only: the library's sources are setup.py's for the same FLASH_CUDA_HEADDIMS,
    with its defines and gencode flags."""
    build = tmp_path / "configure-only"
    _configure(build, headdims="64,128", archs="80;90a")
    commands = _compile_commands(build)
    lib_sources = {f for f in commands if not f.startswith("examples/")}
    monkeypatch.setenv("FLASH_CUDA_HEADDIMS", "64,128")
    assert lib_sources == set(build_config.sources(build_config.head_dims()))
    for src, cmd in commands.items():
        if src.startswith("examples/"):
            continue
        assert "-DFLASH_CUDA_HAS_HDIM_64" in cmd and "-DFLASH_CUDA_HAS_HDIM_128" in cmd, cmd
        assert "-DFLASH_CUDA_HAS_HDIM_96" not in cmd
        assert "-DFLASH_CUDA_NO_PYTHON" in cmd
        if src.endswith(".cu"):
            for flag in build_config.gencode_flags(["80", "90a"]) + [
                "--use_fast_math", "--expt-relaxed-constexpr", "-lineinfo",
                "-U__CUDA_NO_HALF_OPERATORS__",
            ]:
                assert flag in cmd, (flag, cmd)
            # C++20 must be the last -std (nvcc takes the last one).
            assert cmd.split().index("-std=c++20") == max(
                i for i, a in enumerate(cmd.split()) if a.startswith("-std=")
            ), cmd
        else:
            assert "-std=c++20" in cmd


@requires_toolchain
def test_cmake_build_and_forward_check():
    build = pathlib.Path(
        os.environ.get("FLASH_CUDA_CMAKE_BUILD_DIR", ROOT / "build" / "cmake-test")
    )
    _configure(build, headdims="none", archs=_one_arch())
    jobs = os.environ.get("MAX_JOBS", "2")
    proc = subprocess.run(
        [CMAKE, "--build", str(build), "--parallel", jobs],
        capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, f"cmake build failed:\n{proc.stdout[-8000:]}\n{proc.stderr[-8000:]}"
    assert (build / "compile_commands.json").exists()

    exe = build / "forward_check"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    print(run.stdout)
    if run.returncode != 0 and "exception: not yet" in run.stdout:
        # The CPU reference ops are still the skeleton's stubs (the `ref` branch not merged).
        pytest.xfail("CPU reference ops not implemented yet (stubs raise 'not yet')")
    assert run.returncode == 0, f"forward_check failed:\n{run.stdout}\n{run.stderr}"
    assert "forward_check: OK" in run.stdout
    assert run.stdout.count("PASS") >= 2
