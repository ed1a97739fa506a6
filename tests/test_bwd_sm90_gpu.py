"""The sm90 backward (csrc/kernels/sm90/bwd_sm90.cuh and, d192 / d256, bwd_sm90_wide.cuh: TMA,
mbarriers, wgmma) on an sm_90 GPU: the backward GPU tests of test_bwd_gpu.py that it covers (head
dims 64, 128, 192 and 256, and the others zero-padded up to the next of those; no softcap;
deterministic too; the dropout variant: test_dropout_gpu.py), run with FLASH_CUDA_SM90=1 (which
also runs the sm90 forward where it covers the call), same oracle and 3x rule. Every test also
checks with the profiler that an sm90 backward kernel ran, of the head dim the host's rule
(bwd_sm90_host.h bwd_kernel_head_dim) gives the test's."""

from __future__ import annotations

import pytest
import torch

import test_bwd_gpu as base
from api_utils import built_head_dims
from sm90_utils import SM90_GPU, head_dim_param, skip_unbuilt_head_dim, sm90_kernel_runs

pytestmark = [pytest.mark.gpu, SM90_GPU]
HEAD_DIMS = (64, 128, 192, 256)


@pytest.fixture(autouse=True)
def sm90_backward(monkeypatch, request):
    skip_unbuilt_head_dim(request, backward=True)
    with sm90_kernel_runs(monkeypatch, "mha_bwd_sm90_", call_head_dim=head_dim_param(request)):
        yield


@pytest.mark.parametrize("ratio", base.GQA_RATIOS)
@pytest.mark.parametrize("mask", tuple(base.MASKS))
@pytest.mark.parametrize("sq,sk", base.SEQLENS)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", base.DTYPES)
def test_bwd_matches_oracle_sm90(dtype, d, sq, sk, mask, ratio):
    base.run_case(dtype, d, sq, sk, mask, ratio)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_bwd_non_contiguous_dout_sm90(d):
    base.test_bwd_non_contiguous_dout(d)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_bwd_strided_qkv_sm90(d):
    base.test_bwd_strided_qkv(d)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_bwd_rows_without_keys_sm90(d):
    base.test_bwd_rows_without_keys(d)


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("ratio", base.GQA_RATIOS)
def test_bwd_dk_dv_bitwise_reproducible_sm90(d, ratio):
    base.test_bwd_dk_dv_bitwise_reproducible(d, ratio)


FEATURE_CASES = [c for c in base.FEATURE_CASES if c[0] in HEAD_DIMS and "softcap" not in c[1]]


@pytest.mark.parametrize("d,feature,dtype,seqlens,ratio,transposed", FEATURE_CASES,
                         ids=lambda x: str(x))
def test_bwd_features_sm90(d, feature, dtype, seqlens, ratio, transposed):
    base.test_bwd_features(d, feature, dtype, seqlens, ratio, transposed)


VARLEN_CASES = [(d, f, dtype, ratio) for d in HEAD_DIMS for f in ("plain", "causal", "window",
                                                                    "alibi")
                for dtype, ratio in ((torch.float16, 1), (torch.bfloat16, 4))]


@pytest.mark.parametrize("d,feature,dtype,ratio", VARLEN_CASES, ids=lambda x: str(x))
def test_varlen_bwd_sm90(d, feature, dtype, ratio):
    base.run_varlen_case(dtype, d, feature, ratio, seed=d * 10 + base.FEATURES.index(feature))


# The kernels without pingpong (deterministic=True's) on calls that are not deterministic:
# FLASH_CUDA_SM90_BWD_PINGPONG=0.
@pytest.mark.parametrize("d,mask,ratio", [(64, "causal", 4), (128, "plain", 1),
                                          (128, "window", 4)])
def test_bwd_without_pingpong_sm90(d, mask, ratio, monkeypatch):
    monkeypatch.setenv("FLASH_CUDA_SM90_BWD_PINGPONG", "0")
    base.run_case(torch.bfloat16, d, 113, 203, mask, ratio)


# deterministic=True: the CTAs' dQ additions ordered by semaphores (DqTurns).
@pytest.mark.parametrize("d,feature", [(64, "plain"), (64, "window"), (128, "causal"),
                                       (128, "window"), (192, "causal"), (256, "plain"),
                                       (256, "alibi")])
def test_deterministic_bitwise_sm90(d, feature):
    base.test_deterministic_bitwise(d, feature)


@pytest.mark.parametrize("d", (64, 128, 192, 256))
def test_varlen_deterministic_bitwise_sm90(d):
    base.test_varlen_deterministic_bitwise(d)


@pytest.mark.parametrize("d,varlen", [(64, True), (128, False), (256, False)])
def test_global_deterministic_switch_sm90(d, varlen):
    base.test_global_deterministic_switch(d, varlen)


@pytest.mark.parametrize("d,causal", [(64, False), (128, True), (192, True), (256, False)])
def test_deterministic_many_ctas_sm90(d, causal):
    """Several waves of CTAs (b 2, h 16, 4096 keys: 1024 or 2048 CTAs on 132 SMs) wait on their
    predecessors' dQ turns: no hang, bitwise identical over 5 runs, and close to the
    non-deterministic result."""
    dtype = torch.bfloat16
    q, k, v, dout = base.make_inputs(dtype, d, 4096, 4096, 16, 16, b=2, seed=d)
    kw = dict(causal=causal, window=(-1, -1), scale=d ** -0.5)
    out, lse = base.fwd(q, k, v, **kw)
    first = base.bwd(dout, q, k, v, out, lse, deterministic=True, **kw)
    for _ in range(4):
        again = base.bwd(dout, q, k, v, out, lse, deterministic=True, **kw)
        for name, a, g in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, g), f"{name} differs between deterministic runs"
    plain = base.bwd(dout, q, k, v, out, lse, deterministic=False, **kw)
    assert torch.equal(first[1], plain[1]) and torch.equal(first[2], plain[2])  # dk, dv
    torch.testing.assert_close(first[0], plain[0], rtol=1.6e-2, atol=1e-3)  # 1 bf16 ulp


# Head dims below a kernel's on the next one up (bwd_sm90_host.h bwd_kernel_head_dim; d136 /
# d160 the d192 kernel, d224 the d256 one): the TMA zero-fills Q, K, V, dO past d, the dQ
# reductions clip at d in the d_rounded-wide accumulator, dK / dV leave with d columns (MHA) or
# through workspaces of the kernel's width (GQA).
PADDED_HEAD_DIMS = (16, 40, 80, 96, 112, 136, 160, 224)


@pytest.mark.parametrize("ratio", (1, 4))
@pytest.mark.parametrize("mask", ("plain", "causal", "window"))
@pytest.mark.parametrize("d", PADDED_HEAD_DIMS)
def test_bwd_padded_head_dims_sm90(d, mask, ratio):
    base.run_case(torch.bfloat16, d, 113, 203, mask, ratio)


@pytest.mark.parametrize("d", (96, 160))
def test_varlen_bwd_padded_head_dims_sm90(d):
    base.run_varlen_case(torch.float16, d, "causal", 4, seed=d)


@pytest.mark.parametrize("d", (80, 224))
def test_deterministic_bitwise_padded_head_dims_sm90(d):
    base.test_deterministic_bitwise(d, "plain")


@pytest.mark.parametrize("d", (160, 192))
def test_bwd_d192_kernel_switch_sm90(d, monkeypatch):
    """FLASH_CUDA_SM90_BWD192=0 (bwd_sm90_host.h bwd_call_head_dim, the benchmark's A/B switch):
    d129-d192 on the wide d256 kernel, zero-padded, as before the d192 kernel (the fixture
    checks that the d256 kernel ran)."""
    if 256 not in built_head_dims():
        pytest.skip("head dim 256 not built (FLASH_CUDA_HEADDIMS)")
    monkeypatch.setenv("FLASH_CUDA_SM90_BWD192", "0")
    base.run_case(torch.bfloat16, d, 113, 203, "causal", 2)
