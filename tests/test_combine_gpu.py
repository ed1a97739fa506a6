"""The split-KV combine kernel (csrc/kernels/combine.cu) against an fp64 evaluation of its formula.

combine: lse = logsumexp_i lse_i (+inf when every split is empty), out = sum_i exp(lse_i - lse) o_i.
"""

import pytest
import torch

import flash_cuda  # noqa: F401

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def combine_fp64(out_partial, lse_partial):
    lse_partial = lse_partial.double()
    lse = torch.logsumexp(lse_partial, dim=0)  # (b, h, sq); -inf where all splits are empty
    empty = torch.isneginf(lse)
    weights = torch.exp(lse_partial - lse.masked_fill(empty, 0.0)[None])
    weights = weights.masked_fill(empty[None], 0.0)
    out = (weights[..., None] * out_partial.double()).sum(0)  # (b, h, sq, d)
    return out.permute(0, 2, 1, 3), lse.masked_fill(empty, float("inf"))


@needs_cuda
@pytest.mark.parametrize("few", (True, False), ids=("few", "no_few"))
@pytest.mark.parametrize("row_kernel", (False, True), ids=("warp_per_row", "cta_per_row"))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("splits,b,h,sq,d", [(1, 1, 1, 1, 8), (3, 2, 5, 17, 64), (16, 1, 8, 3, 128),
                                             (128, 2, 2, 1, 256), (7, 3, 4, 113, 40),
                                             # scalar path (d % 4 != 0); float4 path with a
                                             # partial second column pass (d = 132)
                                             (29, 1, 3, 2, 13), (33, 2, 2, 1, 132),
                                             # row kernel CTAs of 8 and 16 warps (combine.cuh
                                             # row_warps)
                                             (64, 1, 32, 1, 128), (100, 1, 3, 2, 13),
                                             # the few-splits kernel's limits (8 splits, 128
                                             # columns), and past them (9 splits, 132 columns)
                                             (8, 2, 3, 5, 128), (9, 1, 4, 3, 128),
                                             (2, 1, 2, 3, 132)])
def test_combine_matches_formula(dtype, splits, b, h, sq, d, row_kernel, few, monkeypatch):
    """row_kernel: the default (combine.cuh launch_plan: the CTA-per-row kernel where splits >= 8
    and rows <= 4096; the warp per row elsewhere); else FLASH_CUDA_COMBINE_ROW=0 (warp per row
    everywhere). few: the default (combine_few_splits_kernel for at most 8 splits on the float4
    layout with at most 128 columns, whatever row_kernel says); else FLASH_CUDA_COMBINE_FEW=0."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setenv("FLASH_CUDA_COMBINE_ROW", "1" if row_kernel else "0")
    monkeypatch.setenv("FLASH_CUDA_COMBINE_FEW", "1" if few else "0")
    out_partial = torch.randn(splits, b, h, sq, d, device="cuda")
    lse_partial = torch.randn(splits, b, h, sq, device="cuda") * 3
    # Some splits saw no key (lse -inf), and one row saw none at all.
    lse_partial[torch.rand_like(lse_partial) < 0.2] = float("-inf")
    lse_partial[:, 0, 0, 0] = float("-inf")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out, lse = torch.ops.flash_cuda.combine_splits(out_partial, lse_partial, dtype)
        torch.cuda.synchronize()
    ran_row_kernel = any("combine_splits_row_kernel" in e.name for e in prof.events())
    ran_few = any("combine_few_splits_kernel" in e.name for e in prof.events())
    expect_few = few and splits <= 8 and d <= 128 and d % 4 == 0
    assert ran_few == expect_few
    assert ran_row_kernel == (not expect_few and row_kernel and splits >= 8 and b * h * sq <= 4096)
    ref_out, ref_lse = combine_fp64(out_partial, lse_partial)
    assert out.dtype == dtype and out.shape == (b, sq, h, d)
    assert lse.dtype == torch.float32 and lse.shape == (b, h, sq)
    assert torch.isfinite(out).all()
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], rtol=1e-5, atol=1e-5)
    # Output rounding to the input dtype dominates the error.
    tol = 2 * (ref_out.to(dtype).double() - ref_out).abs().max().item() + 1e-5
    assert (out.double() - ref_out).abs().max().item() <= tol
    assert (out[0, 0, 0] == 0).all()


@needs_cuda
def test_combine_matches_cpu_reference():
    out_partial = torch.randn(5, 2, 3, 9, 64, device="cuda")
    lse_partial = torch.randn(5, 2, 3, 9, device="cuda")
    out, lse = torch.ops.flash_cuda.combine_splits(out_partial, lse_partial, torch.bfloat16)
    out_cpu, lse_cpu = torch.ops.flash_cuda.combine_splits(out_partial.cpu(), lse_partial.cpu(),
                                                           torch.float32)
    torch.testing.assert_close(lse.cpu(), lse_cpu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.float().cpu(), out_cpu, rtol=1e-2, atol=1e-2)
