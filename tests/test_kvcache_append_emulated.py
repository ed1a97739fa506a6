"""The KV-cache append kernel (csrc/kernels/kvcache_append.cuh) run on the CPU (tests/emulation,
AddressSanitizer build) against the reference: the caches after the append equal the CPU op's
(csrc/reference/kvcache.cpp) bit for bit, the rotated q equals the reference's rotary, and the
key counts the kernel writes for the attention (seqlens_out) are cache_seqlens + new tokens.
Covers contiguous/paged caches, cache_batch_idx, strided views, rotary (interleaved, half,
rotary_dim < d), GQA, new tokens 0/1/5 and the grid-stride loop. Not the GPU's own rounding:
the device build's PTX (mul/add/sub.rn.f32 without .ftz) is covered by the GPU test.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import zlib

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "emulation"))

from driver import CUDA_INCLUDE  # noqa: E402
from kvcache_append_cases import (  # noqa: E402
    case_id, expected_q, make_case, reference_call, rotary_without_seqlens_case, sampled_grid)
import kvcache_append_driver  # noqa: E402
from kvcache_append_driver import run_append_emulated  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None or not (CUDA_INCLUDE / "cuda_fp16.h").exists(),
    reason="needs g++ and the CUDA headers")

# Small caches keep the storage round trips short; FLASH_CUDA_EMULATE_ALL=1 runs more.
N_CASES = 300 if os.environ.get("FLASH_CUDA_EMULATE_ALL") == "1" else 80
GRID = [c for c in sampled_grid(400, seed=5) if c[1] <= 63 or c[0] == 1][:N_CASES]


def check(case, grid=0):
    k_out, v_out, q_rot = run_append_emulated(case, grid=grid)
    k_ref, v_ref, _, _ = reference_call(case)
    assert torch.equal(k_out, k_ref), "k_cache differs from the reference append"
    assert torch.equal(v_out, v_ref), "v_cache differs from the reference append"
    if q_rot is not None:
        assert torch.equal(q_rot, expected_q(case)), "rotated q differs from the reference"
    # The attention's key counts, which the kernel writes when it appends (seqlens_out).
    a = case["args"]
    s_new = 0 if a["k"] is None else a["k"].shape[1]
    if s_new > 0 and a["cache_seqlens"] is not None and a["q"].shape[0] > 0:
        assert torch.equal(kvcache_append_driver.LAST_SEQLENS, a["cache_seqlens"].cpu() + s_new)
    else:
        assert kvcache_append_driver.LAST_SEQLENS is None


@pytest.mark.parametrize("c", GRID, ids=case_id)
def test_append_emulated(c):
    check(make_case(c, seed=zlib.crc32(case_id(c).encode())))


def test_append_emulated_grid_stride():
    """One block of 8 warps for 17 * 5 * 2 key rows + 17 * 5 * 8 query rows."""
    c = (17, 63, 5, 64, 4, 16, "half", "none", "causal", torch.bfloat16)
    check(make_case(c, seed=1), grid=1)


@pytest.mark.parametrize("interleaved", (True, False))
@pytest.mark.parametrize("rotary_dim", (2, 58))
def test_append_emulated_odd_head_dim(interleaved, rotary_dim):
    """Head dim 59 (no 16-byte rows), rotary_dim 2 and 58 < d."""
    c = (3, 63, 5, 59, 1, "contiguous", "interleaved" if interleaved else "half", "strided",
         "window", torch.float16)
    check(make_case(c, seed=2, rotary_dim=rotary_dim))


@pytest.mark.parametrize("causal", (True, False))
def test_append_emulated_more_queries_than_new_tokens(causal):
    """sq = 4 queries, no new tokens: q rows at cache_seqlens (+ row when causal)."""
    c = (3, 63, 0, 64, 4, 32, "interleaved", "none", "causal" if causal else "none",
         torch.bfloat16)
    check(make_case(c, seed=3, sq=4))


def test_append_emulated_rotary_without_cache_seqlens():
    """No cache_seqlens and no new tokens: every query sits at the cache length."""
    check(rotary_without_seqlens_case())


@pytest.mark.parametrize("layout", ("contiguous", 16))
def test_append_emulated_unchecked_bad_inputs_stay_in_bounds(layout):
    """What the host value checks reject (they are off under graph capture) must not make the
    kernel read or write out of bounds: positions past the cache and the rotary table, negative
    cache_seqlens, cache_batch_idx and block_table entries out of range. The run aborts on an
    out-of-bounds read (AddressSanitizer) or write (guard zones)."""
    c = (3, 63, 5, 64, 4, layout, "interleaved", "batch_idx", "causal", torch.float16)
    case = make_case(c, seed=6, sq=7)
    a = case["args"]
    a["cache_seqlens"] = torch.tensor([case["capacity"] - 2, -3, 10**6], dtype=torch.int32)
    a["rotary_cos"], a["rotary_sin"] = a["rotary_cos"][:3], a["rotary_sin"][:3]
    if a["cache_batch_idx"] is not None:
        a["cache_batch_idx"] = torch.tensor([0, a["k_cache"].shape[0], -1], dtype=torch.int32)
    if a["block_table"] is not None:
        a["block_table"][0, 0] = -1  # not used by sequence 0
        a["block_table"][1] = a["k_cache"].shape[0]  # used by keys 0, 1 of sequence 1
    k_before = a["k_cache"].clone()
    k_out, _, q_rot = run_append_emulated(case)
    assert q_rot is not None and not q_rot.isnan().any()
    # Sequence 0's first two new keys fit (capacity - 2, capacity - 1); nothing else moved there.
    assert not torch.equal(k_out, k_before)
