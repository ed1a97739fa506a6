"""sm90_utils.fwd_traits, which the sm90 GPU tests use to tell which forward variant the profiler
saw, on kernel names in both forms (demangled as the profiler reports them on the H200, mangled
as ptxas prints them). CPU only."""

from __future__ import annotations

import pytest

from sm90_utils import bwd_kernel_dropout, fwd_traits

KERNEL = "void flash_cuda::sm90::mha_fwd_sm90_kernel<__nv_bfloat16, flash_cuda::sm90::{}, true, "\
         "false, false>(flash_cuda::FwdParams, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, "\
         "CUtensorMap_st)"
MANGLED = "_ZN10flash_cuda4sm9019mha_fwd_sm90_kernelI13__nv_bfloat16NS0_13{}EELb0ELb0ELb1EEEvNS_"\
          "9FwdParamsE14CUtensorMap_stS6_S6_S6_"


@pytest.mark.parametrize("name, want", [
    (KERNEL.format("FwdSm90Traits<128, 128, 2, false, false, true, true>"),
     dict(block_n=128, pingpong=False, staged_o=False, dropout=True, carry=True)),
    (KERNEL.format("FwdSm90Traits<64, 192, 3, true, false, false, true>"),
     dict(block_n=192, pingpong=True, staged_o=False, dropout=False, carry=True)),
    (KERNEL.format("FwdSm90Traits<64, 128, 3, false, false, false, false>"),
     dict(block_n=128, pingpong=False, staged_o=False, dropout=False, carry=False)),
    (MANGLED.format("FwdSm90TraitsILi256ELi80ELi2ELb0ELb1ELb0ELb1E"),
     dict(block_n=80, pingpong=False, staged_o=True, dropout=False, carry=True)),
    (MANGLED.format("FwdSm90TraitsILi128ELi128ELi2ELb0ELb0ELb1ELb1E"),
     dict(block_n=128, pingpong=False, staged_o=False, dropout=True, carry=True)),
    (MANGLED.format("FwdSm90TraitsILi64ELi128ELi3ELb0ELb0ELb0ELb0E"),
     dict(block_n=128, pingpong=False, staged_o=False, dropout=False, carry=False)),
])
def test_fwd_traits(name, want):
    assert fwd_traits(name) == want


def test_fwd_traits_without_dropout_or_carry_flag():
    """Names of the five-flag traits (before session 40) and of the six-flag ones (before session
    55) still parse, as not dropout and as carry."""
    assert fwd_traits(KERNEL.format("FwdSm90Traits<128, 80, 2, false, true>")) == \
        dict(block_n=80, pingpong=False, staged_o=True, dropout=False, carry=True)
    assert fwd_traits(MANGLED.format("FwdSm90TraitsILi64ELi128ELi3ELb1ELb0E")) == \
        dict(block_n=128, pingpong=True, staged_o=False, dropout=False, carry=True)
    assert fwd_traits(KERNEL.format("FwdSm90Traits<64, 128, 3, false, false, true>")) == \
        dict(block_n=128, pingpong=False, staged_o=False, dropout=True, carry=True)
    assert fwd_traits(MANGLED.format("FwdSm90TraitsILi256ELi80ELi2ELb0ELb1ELb0E")) == \
        dict(block_n=80, pingpong=False, staged_o=True, dropout=False, carry=True)


def test_fwd_traits_other_kernels():
    assert fwd_traits("void flash_cuda::sm80::mha_fwd_sm80_kernel<__half>(FwdParams)") is None


BWD = "void flash_cuda::sm90::mha_bwd_sm90_kernel<__half, flash_cuda::sm90::BwdSm90Traits<128, "\
      "true, 64, 128>, true, false, {}>(flash_cuda::BwdParams, CUtensorMap_st, CUtensorMap_st, "\
      "CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)"
BWD_MANGLED = "_ZN10flash_cuda4sm9024mha_bwd_sm90_wide_kernelI13__nv_bfloat16NS0_13BwdSm90Traits"\
              "ILi256ELb0ELi64ELi64EEELb1ELb0ELb{}EEEvNS_9BwdParamsE14CUtensorMap_stS6_S6_S6_S6_"


@pytest.mark.parametrize("flag", (False, True))
def test_bwd_kernel_dropout(flag):
    assert bwd_kernel_dropout(BWD.format("true" if flag else "false")) is flag
    assert bwd_kernel_dropout(BWD_MANGLED.format(int(flag))) is flag
    assert bwd_kernel_dropout("void flash_cuda::sm80::mha_bwd_sm80_kernel<__half>()") is None
