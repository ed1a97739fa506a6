"""Build flash_cuda's extension (flash_cuda/_C.abi3.so) with torch.utils.cpp_extension.

Environment:
  FLASH_CUDA_ARCHS     ';'-separated architectures, e.g. "80;90a" (default: the visible GPU's,
                       else "80;90a"). "90a" is needed for the Hopper-only instructions.
  FLASH_CUDA_HEADDIMS  ','-separated kernel head dims to build, e.g. "64,128" (default: all;
                       "none" builds no attention kernels: CPU path and small CUDA kernels only).
  FLASH_CUDA_PTXAS_VERBOSE=1   print the register/shared-memory/spill report of every kernel.
  FLASH_CUDA_FWD_TUNING=1      also compile the forward tile variants (kernels/sm80/tune_configs.h),
                               chosen at run time with FLASH_CUDA_FWD_TILE=<n> (developers).
  FLASH_CUDA_BWD_TUNING=1      also compile the backward v2 tile variants
                               (kernels/sm80/bwd_tune_configs.h), chosen at run time with
                               FLASH_CUDA_BWD_TILE=<n> (developers).
  MAX_JOBS             parallel compile jobs (ninja).
  CXX                  the C++ compiler (torch's rule; default c++). It must link libstdc++
                       dynamically: one with only libstdc++.a is refused (build_config.py).
  CUDA_HOME            the CUDA toolkit (on a machine without a GPU: /usr/local/cuda).
The rules that read them live in csrc/build_config.py (shared with tests/test_build.py).
"""

from __future__ import annotations

import os
import pathlib
import sys

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "csrc"))
from build_config import check_cxx_compiler, cuda_archs, gencode_flags, head_dims, sources  # noqa: E402

from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402


def extensions():
    archs = cuda_archs()
    dims = head_dims()
    defines = [f"-DFLASH_CUDA_HAS_HDIM_{d}" for d in dims]
    if "90a" in archs:
        defines.append("-DFLASH_CUDA_HAS_SM90")  # the sm90 kernels have bodies (sm_90a cubins)
    cxx = ["-O3", "-std=c++20"] + defines
    nvcc = [
        "-O3",
        "-std=c++20",
        "-lineinfo",
        "--use_fast_math",
        "--expt-relaxed-constexpr",
        "-DNDEBUG",
        # torch adds these to every nvcc call; our kernels use the half/bf16 operators.
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
    ] + gencode_flags(archs) + defines
    if os.environ.get("FLASH_CUDA_PTXAS_VERBOSE") == "1":
        nvcc += ["-Xptxas=-v", "-Xptxas=-warn-spills"]
    if os.environ.get("FLASH_CUDA_FWD_TUNING") == "1":
        nvcc += ["-DFLASH_CUDA_FWD_TUNING"]  # tile variants of kernels/sm80/tune_configs.h
    if os.environ.get("FLASH_CUDA_BWD_TUNING") == "1":
        nvcc += ["-DFLASH_CUDA_BWD_TUNING"]  # v2 tile variants of kernels/sm80/bwd_tune_configs.h
    print(f"flash_cuda: archs {archs}, head dims {dims or 'none'}", file=sys.stderr)
    return [
        CUDAExtension(
            name="flash_cuda._C",
            sources=sources(dims),
            include_dirs=[str(ROOT / "csrc"), str(ROOT / "csrc" / "include")],
            extra_compile_args={"cxx": cxx, "nvcc": nvcc},
            py_limited_api=True,
        )
    ]


class BuildExtensionChecked(BuildExtension):
    """BuildExtension that first refuses a C++ compiler which would link libstdc++ statically."""

    def build_extensions(self):
        check_cxx_compiler()
        super().build_extensions()


setup(
    packages=find_packages(include=["flash_cuda", "flash_cuda.*"]),
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtensionChecked.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
