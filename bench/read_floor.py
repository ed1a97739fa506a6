"""The decode benchmark's speed-of-light probe (impl `read_floor`; the kernel: read_floor.cu).

A kernel that only reads a decode step's K and V caches, once, timed the same way as the step
(same L2 flush, CUDA-graph replay): no attention step can be faster on that cell, so the probe
says which of issue 5's bandwidth targets a cell can reach at all. With nothing to read it is
the floor of one launch (`launch_floor_us` in the run's ceilings).

Built on first use with torch's nvcc (cpp_extension.CUDA_HOME) into a shared library in a build
folder the bench names (under the temp folder), called through ctypes on torch's current stream.
"""

from __future__ import annotations

import ctypes
import pathlib
import subprocess

import torch
from torch.utils import cpp_extension

SOURCE = pathlib.Path(__file__).with_name("read_floor.cu")


def nvcc() -> str:
    """torch's CUDA toolkit (CUDA_HOME, else the nvcc on PATH, else /usr/local/cuda)."""
    home = cpp_extension.CUDA_HOME
    path = pathlib.Path(home) / "bin" / "nvcc" if home else None
    if path is None or not path.exists():
        raise RuntimeError("read_floor: nvcc not found (set CUDA_HOME)")
    return str(path)


class ReadFloor:
    """probe.bind(a, b)(): launches the read of tensors a and b on the current stream."""

    def __init__(self, device: torch.device, build_dir: pathlib.Path):
        major, minor = torch.cuda.get_device_capability(device)
        build_dir.mkdir(parents=True, exist_ok=True)
        lib = build_dir / f"libread_floor_sm{major}{minor}.so"
        if not lib.exists():
            subprocess.run([nvcc(), "-O3", "-shared", "-Xcompiler", "-fPIC",
                            f"-arch=sm_{major}{minor}", str(SOURCE), "-o", str(lib)],
                           check=True, capture_output=True, text=True, timeout=300)
        self.lib = ctypes.CDLL(str(lib))
        self.lib.read_floor_launch.restype = ctypes.c_int
        self.lib.read_floor_launch.argtypes = [ctypes.c_void_p, ctypes.c_longlong,
                                               ctypes.c_void_p, ctypes.c_longlong,
                                               ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.ctas = 4 * sms  # 4 CTAs of 512 threads per SM (read_floor.cu)
        self.sink = torch.zeros(4, dtype=torch.int32, device=device)

    @staticmethod
    def span(x: torch.Tensor) -> tuple[int, int]:
        if not x.is_contiguous():
            raise ValueError("read_floor: the tensors must be contiguous")
        nbytes = x.numel() * x.element_size()
        if nbytes % 16 or x.data_ptr() % 16:
            raise ValueError("read_floor: sizes and addresses must be multiples of 16 bytes")
        return x.data_ptr(), nbytes

    def bind(self, a: torch.Tensor | None = None, b: torch.Tensor | None = None):
        """A launcher of the read of a and b (None: nothing), their addresses checked once."""
        (pa, na), (pb, nb) = (self.span(x) if x is not None else (0, 0) for x in (a, b))
        sink, launch = self.sink.data_ptr(), self.lib.read_floor_launch

        def run():
            err = launch(pa, na, pb, nb, sink, self.ctas, torch.cuda.current_stream().cuda_stream)
            if err:
                raise RuntimeError(f"read_floor: launch failed (cudaError {err})")
        return run
