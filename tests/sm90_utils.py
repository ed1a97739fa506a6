"""Shared by the sm90 GPU tests (test_fwd_sm90_gpu.py, test_bwd_sm90_gpu.py): the skip marker and
the check, with the profiler, that the sm90 kernel under test ran (a silent fallback to the sm80
kernels would otherwise pass)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import sys

import pytest
import torch

from api_utils import built_head_dims

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "emulation"))
# The host's head-dim rules, mirrored for the emulator (flash_api.cpp kernel_head_dim,
# kernels/sm90/*_host.h fwd_kernel_head_dim / bwd_kernel_head_dim).
from driver import kernel_head_dim, sm90_bwd_kernel_head_dim, sm90_fwd_kernel_head_dim  # noqa: E402

SM90_GPU = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU (H100 / H200)")


def kernels_for_head_dim(d: int, backward: bool = False) -> set[int]:
    """The kernel head dims a call of head dim d (first padded to a multiple of 8) needs built to
    run its sm90 kernel: the sm80 one (the op takes the kernel path only where it is built) and
    the sm90 forward's or, backward, the sm90 backward's."""
    d += -d % 8
    sm90 = sm90_bwd_kernel_head_dim(d) if backward else sm90_fwd_kernel_head_dim(d)
    return {kernel_head_dim(d), sm90} - {0}


def sm90_forward_covers_head_dim(d: int) -> bool:
    """Whether the sm90 forward takes head dim d (padded to a multiple of 8) at all."""
    return sm90_fwd_kernel_head_dim(d + -d % 8) > 0


def head_dim_param(request) -> int | None:
    """A test's head dim: its `d` parameter, or a grid case's second field (None: neither)."""
    params = getattr(request.node, "callspec", None)
    params = params.params if params is not None else {}
    return params.get("d", params["case"][1] if "case" in params else None)


def skip_unbuilt_head_dim(request, backward: bool = False) -> None:
    """Skips a test whose head dim (head_dim_param) lacks a kernel it needs in this build
    (kernels_for_head_dim; backward: the sm90 backward's): calls there run the reference or the
    sm80 kernels, so "the sm90 kernel ran" cannot hold."""
    d = head_dim_param(request)
    needed = kernels_for_head_dim(d, backward) if d is not None else set()
    if not needed <= built_head_dims():
        pytest.skip(f"head dim {d}: kernels {sorted(needed)} not all built (FLASH_CUDA_HEADDIMS)")


# The key block and the pingpong, staged-O, dropout and carry flags of the sm90 forward's traits
# (kernels/sm90/fwd_sm90.cuh FwdSm90Traits<HeadDim, BlockN, Stages, Pingpong, StoreOByTma,
# Dropout, Carry>) in a kernel name, demangled (group names) or mangled (the same names + "_m"); a
# name without the Dropout flag (before session 40) reads as not dropout, one without the Carry
# flag (before session 55) as carry.
_FWD_TRAITS = re.compile(
    r"FwdSm90Traits<\d+, (?P<block_n>\d+), \d+, (?P<pingpong>true|false), "
    r"(?P<staged_o>true|false)(?:, (?P<dropout>true|false))?(?:, (?P<carry>true|false))?>|"
    r"FwdSm90TraitsILi\d+ELi(?P<block_n_m>\d+)ELi\d+ELb(?P<pingpong_m>[01])ELb(?P<staged_o_m>[01])"
    r"E(?:Lb(?P<dropout_m>[01])E)?(?:Lb(?P<carry_m>[01])E)?")


def fwd_traits(name: str) -> dict | None:
    """{"block_n": int, "pingpong" / "staged_o" / "dropout" / "carry": bool} of an sm90 forward
    kernel's name, or None when it holds no FwdSm90Traits. ("carry" is the traits' Carry flag:
    whether a kernel built to carry a tile's first S into the tile before does so; d64's.)"""
    match = _FWD_TRAITS.search(name)
    if match is None:
        return None
    g = match.groupdict()
    flags = {k: g[k] == "true" or g[k + "_m"] == "1" for k in ("pingpong", "staged_o", "dropout")}
    carry = g["carry"] != "false" and g["carry_m"] != "0"
    return {"block_n": int(g["block_n"] or g["block_n_m"]), **flags, "carry": carry}
# The head dim and the pingpong flag of the sm90 backward's traits (kernels/sm90/bwd_sm90.cuh
# BwdSm90Traits<HeadDim, Pingpong, BlockM, BlockN>), demangled or mangled.
_BWD_TRAITS = re.compile(r"BwdSm90Traits<(\d+), (true|false)|BwdSm90TraitsILi(\d+)ELb([01])")
# The backward kernel's last template flag, IsDropout (after Causal and HasAlibi), demangled or
# mangled.
_BWD_DROPOUT = re.compile(r"BwdSm90Traits<[^<>]*>, (?:true|false), (?:true|false), (true|false)>|"
                          r"BwdSm90TraitsI\w*?EEELb[01]ELb[01]ELb([01])EEEv")


def bwd_kernel_dropout(name: str) -> bool | None:
    """Whether an sm90 backward kernel's name is its dropout variant (None: not recognised)."""
    match = _BWD_DROPOUT.search(name)
    return None if match is None else (match.group(1) or match.group(2)) in ("true", "1")


@contextlib.contextmanager
def sm90_kernel_runs(monkeypatch, kernel_name: str, mode: str = "1", fwd_key_block=None,
                     fwd_staged_o=None, fwd_dropout=False, bwd_dropout=False,
                     call_head_dim=None, fwd_carry=None):
    """FLASH_CUDA_SM90=mode inside the block (flash_api.cpp reads it per call); afterwards a CUDA
    kernel whose name contains `kernel_name` must have been launched in it. With mode "pingpong"
    every sm90 forward kernel launched must be the pingpong variant, with "1" none may be; with
    fwd_key_block, every one must have key blocks of that many rows; with fwd_staged_o (a bool),
    every one must (not) store O through shared memory and the TMA; with fwd_carry (a bool), every
    one must (not) have the traits' Carry flag; every one must (fwd_dropout
    True: must; the default: must not) be the dropout variant, which has no pingpong (the mode
    is not checked then). Every sm90 backward kernel must (bwd_dropout) or must not be the
    dropout variant. Every sm90 backward kernel
    launched must be without pingpong where FLASH_CUDA_SM90_BWD_PINGPONG=0 (read at the end of the
    block) or the head dim is above 128, and (call_head_dim: the calls' head dim) be the kernel
    of the host's rule for it (sm90_bwd_kernel_head_dim, FLASH_CUDA_SM90_BWD192 read at the end
    of the block)."""
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
        traits = fwd_traits(name)
        assert traits, f"no FwdSm90Traits in the kernel name {name!r}"
        assert traits["dropout"] == fwd_dropout, \
            f"{'the' if fwd_dropout else 'no'} dropout variant expected, got {name!r}"
        assert fwd_dropout or traits["pingpong"] == (mode == "pingpong"), \
            f"FLASH_CUDA_SM90={mode} launched {name!r}"
        assert fwd_key_block in (None, traits["block_n"]), \
            f"key blocks of {traits['block_n']}, not {fwd_key_block}, in {name!r}"
        assert fwd_staged_o in (None, traits["staged_o"]), \
            f"O {'not ' if fwd_staged_o else ''}through shared memory expected, got {name!r}"
        assert fwd_carry in (None, traits["carry"]), \
            f"Carry {fwd_carry} expected in the traits, got {name!r}"
    no_bwd_pingpong = os.environ.get("FLASH_CUDA_SM90_BWD_PINGPONG") == "0"
    bwd_head_dim = None if call_head_dim is None else sm90_bwd_kernel_head_dim(
        call_head_dim + -call_head_dim % 8, os.environ.get("FLASH_CUDA_SM90_BWD192") != "0")
    for name in names:
        if "mha_bwd_sm90_kernel" not in name and "mha_bwd_sm90_wide_kernel" not in name:
            continue
        match = _BWD_TRAITS.search(name)
        assert match, f"no BwdSm90Traits in the kernel name {name!r}"
        # (an unrecognised name fails only where the dropout variant is expected)
        assert bwd_kernel_dropout(name) is True if bwd_dropout else \
            bwd_kernel_dropout(name) is not True, \
            f"{'the' if bwd_dropout else 'no'} dropout variant expected, got {name!r}"
        head_dim = int(match.group(1) or match.group(3))
        pingpong = match.group(2) == "true" or match.group(4) == "1"
        assert not (pingpong and (no_bwd_pingpong or head_dim > 128)), \
            f"FLASH_CUDA_SM90_BWD_PINGPONG={os.environ.get('FLASH_CUDA_SM90_BWD_PINGPONG')} " \
            f"launched {name!r}"
        assert bwd_head_dim in (None, head_dim), \
            f"the backward kernel of head dim {bwd_head_dim} expected, got {name!r}"
