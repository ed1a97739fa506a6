"""Shared by the sm90 GPU tests (test_fwd_sm90_gpu.py, test_bwd_sm90_gpu.py): the skip marker and
the check, with the profiler, that the sm90 kernel under test ran (a silent fallback to the sm80
kernels would otherwise pass)."""

from __future__ import annotations

import contextlib
import os
import re

import pytest
import torch

from api_utils import built_head_dims

SM90_GPU = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU (H100 / H200)")


def skip_unbuilt_head_dim(request) -> None:
    """Skips a test whose head dim (its `d` parameter, or a grid case's second field) has no
    kernels in this build: calls there run the reference, so "the sm90 kernel ran" cannot hold."""
    params = getattr(request.node, "callspec", None)
    params = params.params if params is not None else {}
    d = params.get("d", params["case"][1] if "case" in params else None)
    if d is not None and d not in built_head_dims():
        pytest.skip(f"head dim {d} not built (FLASH_CUDA_HEADDIMS)")


# The key block, the pingpong flag and the staged-O flag of the sm90 forward's traits
# (kernels/sm90/fwd_sm90.cuh FwdSm90Traits<HeadDim, BlockN, Stages, Pingpong, StoreOByTma>) in a
# kernel name, demangled or mangled.
_FWD_TRAITS = re.compile(r"FwdSm90Traits<\d+, (\d+), \d+, (true|false), (true|false)>|"
                         r"FwdSm90TraitsILi\d+ELi(\d+)ELi\d+ELb([01])ELb([01])E")
# The head dim and the pingpong flag of the sm90 backward's traits (kernels/sm90/bwd_sm90.cuh
# BwdSm90Traits<HeadDim, Pingpong, BlockM, BlockN>), demangled or mangled.
_BWD_TRAITS = re.compile(r"BwdSm90Traits<(\d+), (true|false)|BwdSm90TraitsILi(\d+)ELb([01])")


@contextlib.contextmanager
def sm90_kernel_runs(monkeypatch, kernel_name: str, mode: str = "1", fwd_key_block=None,
                     fwd_staged_o=None):
    """FLASH_CUDA_SM90=mode inside the block (flash_api.cpp reads it per call); afterwards a CUDA
    kernel whose name contains `kernel_name` must have been launched in it. With mode "pingpong"
    every sm90 forward kernel launched must be the pingpong variant, with "1" none may be; with
    fwd_key_block, every one must have key blocks of that many rows; with fwd_staged_o (a bool),
    every one must (not) store O through shared memory and the TMA. Every sm90 backward kernel
    launched must be without pingpong where FLASH_CUDA_SM90_BWD_PINGPONG=0 (read at the end of the
    block) or the head dim is 256."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setenv("FLASH_CUDA_SM90", mode)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield
        torch.cuda.synchronize()
    names = {event.name for event in prof.events()}
    assert any(kernel_name in n for n in names), \
        f"{kernel_name} did not run (was the extension built with FLASH_CUDA_ARCHS=90a?)"
    for name in names:
        if "mha_fwd_sm90_kernel" not in name:
            continue
        match = _FWD_TRAITS.search(name)
        assert match, f"no FwdSm90Traits in the kernel name {name!r}"
        pingpong = match.group(2) == "true" or match.group(5) == "1"
        assert pingpong == (mode == "pingpong"), f"FLASH_CUDA_SM90={mode} launched {name!r}"
        block_n = int(match.group(1) or match.group(4))
        assert fwd_key_block in (None, block_n), \
            f"key blocks of {block_n}, not {fwd_key_block}, in {name!r}"
        staged_o = match.group(3) == "true" or match.group(6) == "1"
        assert fwd_staged_o in (None, staged_o), \
            f"O {'not ' if fwd_staged_o else ''}through shared memory expected, got {name!r}"
    no_bwd_pingpong = os.environ.get("FLASH_CUDA_SM90_BWD_PINGPONG") == "0"
    for name in names:
        if "mha_bwd_sm90_kernel" not in name:
            continue
        match = _BWD_TRAITS.search(name)
        assert match, f"no BwdSm90Traits in the kernel name {name!r}"
        head_dim = int(match.group(1) or match.group(3))
        pingpong = match.group(2) == "true" or match.group(4) == "1"
        assert not (pingpong and (no_bwd_pingpong or head_dim > 128)), \
            f"FLASH_CUDA_SM90_BWD_PINGPONG={os.environ.get('FLASH_CUDA_SM90_BWD_PINGPONG')} " \
            f"launched {name!r}"
