"""Shared helpers of the Python-layer tests (test_api, test_bad_inputs, test_compile, ...)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import flash_cuda  # noqa: F401  (registers the ops, their fakes and autograd)


def built_head_dims() -> set[int]:
    """The kernel head dims the extension was built with (FLASH_CUDA_HEADDIMS at build time); the
    others run the exact reference."""
    return {int(d) for d in flash_cuda._C.built_head_dims.split(",") if d}


@contextlib.contextmanager
def fake_mode():
    """Fake tensors: shapes/dtypes/devices only, CUDA works without a GPU (the ops' fakes run)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False):
        yield


def rand(*shape, dtype=torch.float32, device="cpu", requires_grad=False):
    t = torch.randn(*shape, dtype=dtype, device=device)
    return t.requires_grad_(requires_grad)


def cu_seqlens(lengths, device="cpu"):
    """int32 (b + 1) cumulative lengths."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    out[1:] = torch.tensor(lengths, dtype=torch.int32, device=device).cumsum(0)
    return out


def round128(n: int) -> int:
    return (n + 127) // 128 * 128


def capture_cuda_graph(step, head_dim: int):
    """Runs step() once on a side stream (lazy initialisation stays out of the capture), then
    captures one call in a CUDA graph. Returns (graph, what the captured call returned): replaying
    the graph rewrites those tensors. Skips the calling test where the kernels of step's head_dim
    are not built (FLASH_CUDA_HEADDIMS): the reference path taken there copies to the host, which
    a capture refuses."""
    if head_dim not in built_head_dims():
        pytest.skip(f"head dim {head_dim} not built: a capture needs its kernels")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs
