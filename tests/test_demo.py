"""examples/demo.py, the README's main job, on the CPU path (small shape)."""

import importlib.util
import pathlib

import pytest
import torch

import flash_cuda  # noqa: F401

DEMO = pathlib.Path(__file__).resolve().parents[1] / "examples" / "demo.py"


def load_demo():
    spec = importlib.util.spec_from_file_location("demo", DEMO)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_demo_cpu_path(capsys):
    q = torch.randn(1, 4, 1, 8)
    try:
        torch.ops.flash_cuda.fwd(q, q, q, None, 0.0, 8 ** -0.5, False, -1, -1, 0.0, False)
    except NotImplementedError:
        pytest.skip("the CPU reference is not in this build yet")
    demo = load_demo()
    rc = demo.main(["--device", "cpu", "--batch", "1", "--heads", "2", "--seqlen", "300",
                    "--headdim", "40", "--causal", "--reps", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "check: flash_cuda error" in out and ": OK" in out
    assert "standard attention materialises the score matrix: 1x2x300x300" in out


def test_standard_attention_matches_naive():
    from naive_attention import naive_attention

    demo = load_demo()
    q, k, v = (torch.randn(2, 33, 3, 16, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        ref = naive_attention(q, k, v, causal=causal)[0]
        torch.testing.assert_close(demo.standard_attention(q, k, v, causal), ref)
