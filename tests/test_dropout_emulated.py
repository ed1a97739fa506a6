"""Dropout in the sm80 kernels on the CPU emulator (tests/emulation/check_dropout.py): the
kernels' mask bitwise against the reference's, forward values and lse, and the backward's
gradients (fixed length, varlen, deterministic dq slices) against the fp64 reference ops with the
same rng_state, by the rules of DESIGN.md section 9. Each case asserts its check passed.

By default (CI: 2 slow cores) the backward cases of head dims 64 and 96 and the Hopper forward's
cases at head dim 128 (one emulator binary each, 15-45 s to build); every case of
check_dropout.py with FLASH_CUDA_EMULATE_ALL=1."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "emulation"))

import check_dropout  # noqa: E402
from driver import CUDA_INCLUDE  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("g++") is None or not (CUDA_INCLUDE / "cuda_fp16.h").exists(),
                       reason="needs g++ and the CUDA headers"),
]

BACKWARD = (check_dropout.check_bwd, check_dropout.check_varlen_bwd)
CASES = check_dropout.CASES
if os.environ.get("FLASH_CUDA_EMULATE_ALL") != "1":
    CASES = [c for c in CASES if (c[0] in BACKWARD and c[1][1] in (64, 96)) or
             (c[2].get("sm90") and c[1][1] == 128)]


def case_id(case):
    fn, args, kw = case
    dtype, d = args[0], args[1]
    extra = "-".join(f"{k}" for k, v in kw.items() if k != "seed" and v is not False)
    return f"{fn.__name__}-{str(dtype).split('.')[-1]}-d{d}-seed{kw.get('seed')}" + \
        (f"-{extra}" if extra else "")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_dropout_emulated(case):
    fn, args, kw = case
    ok, msg = fn(*args, **kw)
    assert ok, msg
