"""Shared by the sm90 GPU tests (test_fwd_sm90_gpu.py, test_bwd_sm90_gpu.py): the skip marker and
the check, with the profiler, that the sm90 kernel under test ran (a silent fallback to the sm80
kernels would otherwise pass)."""

from __future__ import annotations

import contextlib

import pytest
import torch

SM90_GPU = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU (H100 / H200)")


@contextlib.contextmanager
def sm90_kernel_runs(monkeypatch, kernel_name: str):
    """FLASH_CUDA_SM90=1 inside the block (flash_api.cpp reads it per call); afterwards a CUDA
    kernel whose name contains `kernel_name` must have been launched in it."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setenv("FLASH_CUDA_SM90", "1")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield
        torch.cuda.synchronize()
    names = {event.name for event in prof.events()}
    assert any(kernel_name in n for n in names), \
        f"{kernel_name} did not run (was the extension built with FLASH_CUDA_ARCHS=90a?)"
