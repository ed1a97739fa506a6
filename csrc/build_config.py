"""Build configuration shared by setup.py and the tests (tests/test_build.py).

Reads the environment the same way for every caller:
  FLASH_CUDA_ARCHS     ';'- or ','-separated architectures, e.g. "80;90a" (default: the visible
                       GPU's, else "80;90a").
  FLASH_CUDA_HEADDIMS  ','-separated kernel head dims (default: all; "none": no attention kernels).
CMakeLists.txt mirrors these rules for the C++ build.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import generate_kernels

ROOT = pathlib.Path(__file__).resolve().parent.parent


def cuda_archs() -> list[str]:
    env = os.environ.get("FLASH_CUDA_ARCHS")
    if env:
        return [a.strip() for a in env.replace(",", ";").split(";") if a.strip()]
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            arch = f"{major}{minor}"
            return [arch + "a" if arch == "90" else arch]
    except Exception:  # noqa: BLE001 - no driver on a build machine is normal
        pass
    return ["80", "90a"]


def head_dims() -> list[int]:
    env = os.environ.get("FLASH_CUDA_HEADDIMS", "").strip()
    if not env:
        return list(generate_kernels.HEAD_DIMS)
    if env == "none":
        return []
    dims = [int(x) for x in env.split(",") if x.strip()]
    unknown = sorted(set(dims) - set(generate_kernels.HEAD_DIMS))
    if unknown:
        raise SystemExit(
            f"FLASH_CUDA_HEADDIMS: no kernels for head dims {unknown}; "
            f"choose from {generate_kernels.HEAD_DIMS}"
        )
    return dims


def cxx_compiler() -> str:
    """The C++ compiler torch.utils.cpp_extension compiles and links the extension with."""
    return os.environ.get("CXX", "c++")


def links_libstdcxx_statically(cxx: str) -> bool:
    """True when `cxx` has no shared libstdc++ to link (it then copies libstdc++.a into the
    extension). That copy and the libstdc++.so torch loads keep separate locale facet ids, so
    the first number formatted into an error message (c10::str) crashes the process."""
    try:
        found = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True,
                               text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False  # not a GCC-like driver: nothing to tell
    # GCC and clang print the path when they find the file, the bare name when not.
    return not (os.path.isabs(found) and os.path.exists(found))


def check_cxx_compiler() -> None:
    cxx = cxx_compiler()
    if links_libstdcxx_statically(cxx):
        raise SystemExit(
            f"flash_cuda: the C++ compiler {cxx!r} (CXX) has no shared libstdc++ "
            f"('{cxx} -print-file-name=libstdc++.so' finds none), so the extension would carry "
            "a static copy beside the one torch loads, and every error message holding a number "
            "would crash the process. Set CXX to a compiler that links libstdc++ dynamically, "
            "e.g. CXX=g++."
        )


def gencode_flags(archs: list[str]) -> list[str]:
    flags = []
    for arch in archs:
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    return flags


def sources(dims: list[int], root: pathlib.Path = ROOT) -> list[str]:
    """Sources of the extension, relative to `root`: the torch-facing C++, the reference, the
    torch-free kernels, and the instantiations of the selected head dims."""
    csrc = root / "csrc"
    srcs = [csrc / "torch_bindings.cpp", csrc / "flash_api.cpp", csrc / "checks.cpp", csrc / "rng.cpp",
            csrc / "op_prologue.cpp", csrc / "autograd.cpp"]
    srcs += sorted((csrc / "reference").glob("*.cpp"))
    srcs += sorted((csrc / "kernels").glob("*.cu"))
    srcs += [
        p for p in sorted((csrc / "instantiations").glob("*.cu"))
        if generate_kernels.head_dim_of(p.name) in dims
    ]
    return [str(p.relative_to(root)) for p in srcs]
