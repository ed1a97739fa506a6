"""Build configuration: the generated instantiations are up to date, and the source selection of
setup.py (csrc/build_config.py) follows FLASH_CUDA_HEADDIMS / FLASH_CUDA_ARCHS."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
sys.path.insert(0, str(CSRC))

import build_config  # noqa: E402
import generate_kernels  # noqa: E402

INSTANTIATIONS = CSRC / "instantiations"


def test_instantiations_match_generator(tmp_path):
    """csrc/instantiations/ is exactly what `python csrc/generate_kernels.py` writes."""
    out = tmp_path / "instantiations"
    subprocess.run(
        [sys.executable, str(CSRC / "generate_kernels.py"), "--out", str(out)],
        check=True, capture_output=True, text=True,
    )
    generated = {p.name: p.read_text() for p in out.iterdir()}
    committed = {p.name: p.read_text() for p in INSTANTIATIONS.iterdir() if p.is_file()}
    missing = sorted(set(generated) - set(committed))
    stale = sorted(set(committed) - set(generated))
    differ = sorted(n for n in set(generated) & set(committed) if generated[n] != committed[n])
    assert not (missing or stale or differ), (
        f"csrc/instantiations is out of date (run `python csrc/generate_kernels.py`): "
        f"missing {missing}, stale {stale}, differing {differ}"
    )


def test_every_instantiation_names_a_known_head_dim():
    for inst in generate_kernels.all_instantiations():
        assert generate_kernels.head_dim_of(inst.filename) == inst.head_dim
        assert inst.head_dim in generate_kernels.HEAD_DIMS


def _instantiation_dims(srcs: list[str]) -> set[int]:
    return {
        generate_kernels.head_dim_of(pathlib.Path(s).name)
        for s in srcs if s.startswith("csrc/instantiations/")
    }


@pytest.mark.parametrize(
    "env, expected",
    [
        ("", set(generate_kernels.HEAD_DIMS)),
        ("none", set()),
        ("64", {64}),
        ("64,128", {64, 128}),
        (" 128 , 64 ,", {64, 128}),
    ],
)
def test_headdims_select_sources(monkeypatch, env, expected):
    monkeypatch.setenv("FLASH_CUDA_HEADDIMS", env)
    dims = build_config.head_dims()
    assert set(dims) == expected
    srcs = build_config.sources(dims)
    assert _instantiation_dims(srcs) == expected
    # Every instantiation of a selected dim is built, nothing else.
    want = sorted(
        f"csrc/instantiations/{p.name}" for p in INSTANTIATIONS.glob("*.cu")
        if generate_kernels.head_dim_of(p.name) in expected
    )
    assert sorted(s for s in srcs if s.startswith("csrc/instantiations/")) == want
    # The non-kernel sources are always there, and every listed file exists.
    for always in ("csrc/torch_bindings.cpp", "csrc/flash_api.cpp", "csrc/checks.cpp",
                   "csrc/rng.cpp", "csrc/kernels/combine.cu"):
        assert always in srcs
    assert all((ROOT / s).is_file() for s in srcs)
    assert len(srcs) == len(set(srcs))


def test_headdims_unset_means_all(monkeypatch):
    monkeypatch.delenv("FLASH_CUDA_HEADDIMS", raising=False)
    assert build_config.head_dims() == list(generate_kernels.HEAD_DIMS)


def test_unknown_headdim_is_rejected(monkeypatch):
    monkeypatch.setenv("FLASH_CUDA_HEADDIMS", "64,100")
    with pytest.raises(SystemExit, match="100"):
        build_config.head_dims()


@pytest.mark.parametrize(
    "env, archs",
    [("80", ["80"]), ("80;90a", ["80", "90a"]), ("80,90a", ["80", "90a"]), (" 90a ;", ["90a"])],
)
def test_archs_from_env(monkeypatch, env, archs):
    monkeypatch.setenv("FLASH_CUDA_ARCHS", env)
    assert build_config.cuda_archs() == archs
    assert build_config.gencode_flags(archs) == [
        f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs
    ]


def test_setup_py_uses_build_config():
    """setup.py takes its source list and flags from build_config (no second copy to drift)."""
    text = (ROOT / "setup.py").read_text()
    assert "from build_config import" in text
    for helper in ("cuda_archs", "head_dims", "gencode_flags", "sources"):
        assert f"def {helper}(" not in text


def _fake_compiler(tmp_path, prints: str) -> str:
    """A stand-in compiler driver that answers -print-file-name with `prints`."""
    path = tmp_path / "fake-g++"
    path.write_text(f"#!/bin/sh\necho '{prints}'\n")
    path.chmod(0o755)
    return str(path)


def test_compiler_with_only_static_libstdcxx_is_refused(tmp_path, monkeypatch):
    """A GCC without libstdc++.so (it prints the bare name) would copy libstdc++.a into the
    extension, and a second libstdc++ crashes on the first number formatted into an error
    message (seen on the H200 image's /opt/gcc): setup.py must refuse it by name."""
    cxx = _fake_compiler(tmp_path, "libstdc++.so")
    assert build_config.links_libstdcxx_statically(cxx)
    monkeypatch.setenv("CXX", cxx)
    with pytest.raises(SystemExit, match="has no shared libstdc"):
        build_config.check_cxx_compiler()


def test_compiler_with_shared_libstdcxx_is_accepted(tmp_path, monkeypatch):
    lib = tmp_path / "libstdc++.so"
    lib.write_text("")
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, str(lib)))
    build_config.check_cxx_compiler()
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    build_config.check_cxx_compiler()  # not runnable: nothing to tell, the build says why


def test_this_machines_compiler_links_libstdcxx_dynamically():
    """The compiler a plain build uses here links the shared libstdc++ (and the built
    extension, where there is one, depends on libstdc++.so.6 rather than carrying a copy)."""
    assert not build_config.links_libstdcxx_statically(build_config.cxx_compiler())


def ptxas_report(name: str, arch: str, tmp_path: pathlib.Path) -> str:
    """nvcc -Xptxas=-v of one instantiation unit for one architecture (e.g. "90a"): the report."""
    import os
    import shutil

    nvcc = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    nvcc = str(nvcc) if nvcc.exists() else shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    run = subprocess.run(
        [nvcc, "-std=c++20", "-O3", "--use_fast_math", "--expt-relaxed-constexpr", "-DNDEBUG",
         f"-I{CSRC}", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas=-v",
         "-c", str(INSTANTIATIONS / name), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout + run.stderr


def spill_bytes(report: str) -> list[tuple[int, int]]:
    """(spill stores, spill loads) in bytes of every kernel in a ptxas report."""
    return [(int(st), int(ld)) for st, ld in
            re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)]


def kernel_spill_bytes(report: str) -> dict[str, tuple[int, int]]:
    """{mangled kernel name: (spill stores, spill loads)} of a ptxas report."""
    found = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores, "
                       r"(\d+) bytes spill loads", report, flags=re.S)
    return {name: (int(st), int(ld)) for name, st, ld in found}


# (file, most spill bytes allowed, the same for the backward's dropout kernels). None may spill
# but those: the d128 backward spilled 4 bytes from session 34 and its pingpong kernel 28-64
# (session 35) until its wgmma descriptors were built once per GEMM batch and advanced by adds in
# uniform registers (session 36, bench/NOTES.md runs 181-185). The d128 pingpong kernel's dropout
# variant spilled 16 bytes (session 40) until its P^T was dropped on the packed fragments
# (written in session 42, merged in session 44 after runs 205-207). The causal forward kernels
# with dynamic tiles (session 48) spilled 4-24 bytes in their producer at 24 registers: the causal
# d128 / d256 units are here for that.
@pytest.mark.parametrize("name,max_spill,max_spill_dropout", (
    ("fwd_hdim128_bf16_sm90.cu", 0, 0),
    ("fwd_hdim64_fp16_causal_sm90.cu", 0, 0),
    ("fwd_hdim256_bf16_sm90.cu", 0, 0),
    ("fwd_hdim192_bf16_sm90.cu", 0, 0),
    ("fwd_hdim128_bf16_causal_sm90.cu", 0, 0),
    ("fwd_hdim256_bf16_causal_sm90.cu", 0, 0),
    ("bwd_hdim128_bf16_sm90.cu", 0, 0),
    ("bwd_hdim64_fp16_causal_sm90.cu", 0, 0),
    ("bwd_hdim256_fp16_causal_sm90.cu", 0, 0),
    ("bwd_hdim192_bf16_sm90.cu", 0, 0)))
def test_sm90_kernels_compile_unserialized(name, max_spill, max_spill_dropout, tmp_path):
    """The sm90 kernels compile for sm_90a with wgmma pipelined (no ptxas C7514-style "wgmma ...
    serialized" report, a silent large slowdown) and without spills (the backward's dropout
    variants: at most max_spill_dropout bytes)."""
    report = ptxas_report(name, "90a", tmp_path)
    assert re.search(r"mha_(fwd|bwd)_sm90_\w*kernel", report), "no sm90 kernel in the ptxas report"
    assert "serialized" not in report, [l for l in report.splitlines() if "serialized" in l][:3]
    spills = kernel_spill_bytes(report)
    assert spills and len(spills) == len(spill_bytes(report)), "unparsed kernels in the report"
    from sm90_utils import bwd_kernel_dropout  # (imports the extension: here, not at the top)

    allowed = {kernel: max_spill_dropout if bwd_kernel_dropout(kernel) else max_spill
               for kernel in spills}
    too_many = {kernel: (st, ld) for kernel, (st, ld) in spills.items()
                if st > allowed[kernel] or ld > 2 * allowed[kernel]}
    assert not too_many, too_many


@pytest.mark.parametrize("name,arch", (
    ("fwd_hdim128_bf16_sm80.cu", "80"), ("fwd_hdim128_fp16_causal_sm80.cu", "80"),
    ("fwd_hdim64_bf16_sm80.cu", "80"), ("fwd_hdim64_bf16_sm80.cu", "90a")))
def test_sm80_forward_compiles_without_spills(name, arch, tmp_path):
    """The sm80 forward kernels (the 128-row tiles at up to 255 registers, the decode tiles, the
    dropout tiles with their unrolled draws) have no spill: in their sm_80 build, what an A100
    runs, and at d64 in the sm_90a build too, where the H200 runs dropout with softcap / ALiBi
    on them. The H200 runs build sm_90a only, so no device run reports the sm_80 pass (the
    softcap kernels spilled 8-12 B in it unseen from 34f9c7f to 0b5dc9a; the d64 dropout
    kernels with softcap 16-48 B in sm_90a until session 44's merge)."""
    report = ptxas_report(name, arch, tmp_path)
    assert f"for 'sm_{arch}'" in report, f"no sm_{arch} kernel in the ptxas report"
    spills = spill_bytes(report)
    assert spills and all(st == 0 and ld == 0 for st, ld in spills), [
        line for line in report.splitlines() if "spill" in line and " 0 bytes spill st" not in line]
