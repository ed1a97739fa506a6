"""The sm90 backward (csrc/kernels/sm90/bwd_sm90.cuh, bwd_sm90_wide.cuh) on the CPU emulator's
Hopper instructions (tests/emulation/kernels/sm90), with the sm80 backward's preprocess and convert
kernels around it, against the fp64 oracle (tests/emulation/check_bwd.py: the 3x rule of DESIGN.md
section 9). Each case is one the kernels cover (no softcap; head dims 64 / 128 / 192 / 256, and the
others zero-padded up to the next of those: PADDED_CASES) and asserts it ran."""

from __future__ import annotations

import pathlib
import shutil
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "emulation"))

import bwd_driver  # noqa: E402
import check_bwd  # noqa: E402
from driver import CUDA_INCLUDE  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("g++") is None or not (CUDA_INCLUDE / "cuda_fp16.h").exists(),
                       reason="needs g++ and the CUDA headers"),
]

F16, BF16 = torch.float16, torch.bfloat16
# (args, kwargs) of check_bwd.check: odd lengths, several key and query blocks (the Q / dO
# buffers go through several phases), causal / window, GQA, ALiBi, rows without keys, varlen
# (sequences of 1 query or 1 key, seqlen_q > seqlen_k), strided dout.
CASES = [
    ((F16, 64, 113, 203, False, (-1, -1), 2, 2), {}),
    ((BF16, 128, 113, 203, True, (-1, -1), 4, 1), {}),
    ((F16, 64, 300, 600, True, (-1, -1), 2, 1), {}),
    ((BF16, 128, 300, 600, False, (-1, -1), 2, 1), {}),
    ((BF16, 128, 200, 300, False, (40, 7), 2, 2), {"b": 2}),
    ((F16, 64, 70, 40, False, (17, 5), 4, 1), {}),
    ((F16, 128, 203, 113, True, (-1, -1), 2, 1), {"alibi": True}),
    ((BF16, 64, 113, 203, True, (-1, -1), 2, 1), {"b": 2, "alibi": "h", "transpose": True}),
    ((BF16, 128, 1, 1, False, (-1, -1), 2, 2), {}),
    ((F16, 64, 0, 0, False, (-1, -1), 2, 1), {"varlen_lens": [(1, 1), (37, 90), (130, 70),
                                                                (5, 200)]}),
    ((BF16, 128, 0, 0, True, (-1, -1), 2, 2), {"varlen_lens": [(70, 20), (1, 150), (64, 64)]}),
    # d256: the wide kernel (bwd_sm90_wide.cuh), 64-key blocks.
    ((BF16, 256, 113, 203, False, (-1, -1), 2, 1), {}),
    ((F16, 256, 300, 200, True, (-1, -1), 4, 2), {}),
    ((BF16, 256, 150, 260, False, (50, 3), 2, 1), {"alibi": True, "transpose": True}),
    ((F16, 256, 0, 0, True, (-1, -1), 2, 1), {"varlen_lens": [(1, 70), (130, 65), (40, 1)]}),
    # d192: the wide kernel with 96 columns per warpgroup (its own slab and half the middle
    # one), dQ staged in a buffer of its own.
    ((BF16, 192, 113, 203, False, (-1, -1), 2, 1), {}),
    ((F16, 192, 300, 200, True, (-1, -1), 4, 2), {}),
    ((BF16, 192, 150, 260, False, (50, 3), 2, 1), {"alibi": True, "transpose": True}),
    ((F16, 192, 0, 0, True, (-1, -1), 2, 1), {"varlen_lens": [(1, 70), (130, 65), (40, 1)]}),
    ((BF16, 192, 200, 150, False, (40, 7), 2, 2), {"deterministic": True}),
    # deterministic: dQ turns through the semaphores; the emulator also checks that
    # every CTA passed every query block on (bwd_emulated.cpp).
    ((BF16, 128, 300, 600, True, (-1, -1), 2, 1), {"deterministic": True, "splits": 3}),
    ((F16, 256, 200, 150, False, (40, 7), 2, 2), {"deterministic": True}),
    ((BF16, 64, 203, 300, True, (-1, -1), 2, 1), {"deterministic": True, "alibi": True}),
    ((BF16, 128, 0, 0, True, (-1, -1), 2, 2), {"varlen_lens": [(70, 20), (1, 150), (130, 300)],
                                               "deterministic": True}),
]


# Head dims below a kernel's on the next one up (bwd_sm90_host.h bwd_kernel_head_dim): Q, K, V,
# dO zero-filled past d by the TMA, dQ reductions clipped at d in a d_rounded-wide accumulator,
# dK / dV stored with d columns (MHA) or through workspaces of the kernel's width (GQA); d136 /
# d160 on the d192 kernel, d224 on the d256 one.
PADDED_CASES = [
    ((BF16, 136, 113, 203, True, (-1, -1), 4, 2), {}),
    ((F16, 40, 113, 203, True, (-1, -1), 2, 1), {}),
    ((BF16, 96, 150, 260, False, (-1, -1), 2, 2), {}),
    ((BF16, 112, 0, 0, True, (-1, -1), 2, 1), {"varlen_lens": [(70, 20), (1, 150), (130, 65)]}),
    ((F16, 160, 113, 203, False, (40, 7), 2, 1), {}),
    ((BF16, 224, 130, 90, True, (-1, -1), 2, 2), {"deterministic": True}),
    ((F16, 80, 203, 300, True, (-1, -1), 2, 1), {"deterministic": True, "alibi": True}),
    ((BF16, 16, 90, 70, False, (-1, -1), 2, 2), {"deterministic": True}),  # 16 of 64 columns
]


@pytest.mark.parametrize("args,kwargs", CASES + PADDED_CASES, ids=lambda x: str(x))
def test_bwd_emulated_sm90(args, kwargs):
    ok, msg = check_bwd.check(*args, sm90=True, **kwargs)
    assert "sm90 backward" in bwd_driver.LAST_STDOUT, "the sm90 backward kernel did not run"
    # pingpong on the d64 / d128 kernels unless deterministic (the ordered kernel); d256 never
    pingpong = args[1] <= 128 and not kwargs.get("deterministic", False)
    assert ("sm90 backward, pingpong" in bwd_driver.LAST_STDOUT) == pingpong, bwd_driver.LAST_STDOUT
    assert ok, msg


@pytest.mark.parametrize("args", [(F16, 64, 113, 203, True, (-1, -1), 2, 1),
                                  (BF16, 128, 300, 600, False, (40, 7), 2, 2)],
                         ids=lambda x: str(x))
def test_bwd_emulated_without_pingpong_sm90(args, monkeypatch):
    """FLASH_CUDA_SM90_BWD_PINGPONG=0: the kernels without pingpong (deterministic=True's,
    dQ right behind dV / dK with a barrier between the warpgroups) on calls that are not
    deterministic."""
    monkeypatch.setenv("FLASH_CUDA_SM90_BWD_PINGPONG", "0")
    ok, msg = check_bwd.check(*args, sm90=True)
    assert "sm90 backward\n" in bwd_driver.LAST_STDOUT, "the kernel without pingpong did not run"
    assert ok, msg


def test_bwd_deterministic_max_seqlen_q_too_small_sm90():
    """deterministic=True with a varlen max_seqlen_q below the longest sequence (an input the
    host's value checks reject; FLASH_CUDA_CHECK_VALUES=0 lets it through): the dQ semaphores of
    the sequence's head must not run into the next head's (DqTurns clamps), so no hang, and the
    gradients are still right (the blocks past the share are added unordered)."""
    ok, msg = check_bwd.check_varlen(BF16, 128, [(200, 150), (30, 80)], False, (-1, -1), 2, 1,
                                     deterministic=True, sm90=True, max_seqlen_q=64)
    assert "sm90 backward" in bwd_driver.LAST_STDOUT
    assert ok, msg
