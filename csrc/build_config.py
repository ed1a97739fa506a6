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
            csrc / "op_prologue.cpp"]
    srcs += sorted((csrc / "reference").glob("*.cpp"))
    srcs += sorted((csrc / "kernels").glob("*.cu"))
    srcs += [
        p for p in sorted((csrc / "instantiations").glob("*.cu"))
        if generate_kernels.head_dim_of(p.name) in dims
    ]
    return [str(p.relative_to(root)) for p in srcs]
