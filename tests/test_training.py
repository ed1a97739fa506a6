"""Training, torch.autocast and compiled training steps on the CPU (the reference ops).

The GPU versions (the issue's 200-step comparison on the H200): tests/test_training_gpu.py.
Here a tiny configuration of the same model (tests/training_utils.py) checks the harness and
the Python layer: the flash_cuda curve follows SDPA MATH's, dropout trains, the autocast rules
of flash_cuda/_autocast.py (fp32 q/k/v -> the autocast dtype, gradients back to fp32 in fp32,
fp16/bf16 and alibi_slopes untouched, the KV cache's dtype wins), and torch.compile of the
training step without graph breaks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import flash_cuda
import training_utils as tu
from api_utils import cu_seqlens

TINY = tu.Config(n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, vocab=32, set_size=4,
                 seq_len=33, batch=4, steps=20, lr=3e-3, warmup=5)
BF16 = torch.bfloat16


def test_training_matches_sdpa_math_fp32():
    flash, math = tu.train_pair(TINY, tu.flash_attention(), tu.sdpa_math_attention,
                                device="cpu")
    assert torch.isfinite(flash).all()
    gap, step = tu.max_relative_gap(flash, math)
    assert gap < 1e-4, (gap, step, flash, math)
    assert float(flash[-5:].mean()) < float(flash[:5].mean()) - 0.2, flash


def test_training_under_bf16_autocast():
    flash, math = tu.train_pair(dataclasses.replace(TINY, steps=10), tu.flash_attention(),
                                tu.sdpa_math_attention, device="cpu", autocast_dtype=BF16)
    assert torch.isfinite(flash).all()
    gap, step = tu.max_relative_gap(flash, math)
    assert gap < 0.01, (gap, step, flash, math)


def test_autocast_gradients_reach_fp32_weights():
    model = tu.make_model(TINY)
    batch = tu.make_data(TINY, steps=1)[0]
    with torch.autocast(device_type="cpu", dtype=BF16):
        loss = tu.loss_of(model, tu.flash_attention(), batch, TINY.vocab)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad is not None, name
        assert p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all(), name
    # Only the attention backward feeds these.
    assert model.blocks[0].wq.weight.grad.abs().sum() > 0
    assert model.blocks[0].wkv.weight.grad.abs().sum() > 0


def test_dropout_trains():
    cfg = dataclasses.replace(TINY, steps=20)
    data = tu.make_data(cfg)
    torch.manual_seed(0)
    drop = tu.train(tu.make_model(cfg), tu.flash_attention(dropout_p=0.1), data, cfg,
                    device="cpu")
    plain = tu.train(tu.make_model(cfg), tu.flash_attention(), data, cfg, device="cpu",
                     steps=1)
    assert torch.isfinite(drop).all()
    assert float(drop[-5:].mean()) < float(drop[:5].mean()) - 0.2, drop
    assert drop[0] != plain[0]  # same weights and batch: only the dropout differs


# ---------------------------------------------------------------------------------------------
# torch.autocast rules (flash_cuda/_autocast.py)


def _qkv(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, dtype=dtype, generator=gen).requires_grad_()
            for s in ((2, 7, 4, 16), (2, 9, 2, 16), (2, 9, 2, 16))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_casts_fp32_inputs(dtype):
    q, k, v = _qkv()
    dout = torch.randn(2, 7, 4, 16).to(dtype)
    with torch.autocast(device_type="cpu", dtype=dtype):
        out = flash_cuda.flash_attn_func(q, k, v, causal=True)
    assert out.dtype == dtype
    out.backward(dout)
    q2, k2, v2 = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    ref = flash_cuda.flash_attn_func(q2, k2, v2, causal=True)
    ref.backward(dout)
    assert torch.equal(out, ref)
    for t, t2 in ((q, q2), (k, k2), (v, v2)):
        assert t.grad.dtype == torch.float32 and torch.equal(t.grad, t2.grad.float())


def test_autocast_leaves_other_inputs_alone():
    q, k, v = (t.detach() for t in _qkv())
    slopes = torch.rand(4)
    with torch.autocast(device_type="cpu", dtype=BF16):
        half = flash_cuda.flash_attn_func(q.half(), k.half(), v.half(), alibi_slopes=slopes)
        mixed = flash_cuda.flash_attn_func(q, k.to(BF16), v, alibi_slopes=slopes)
        f64 = flash_cuda.flash_attn_func(q.double(), k.double(), v.double())
    assert half.dtype == torch.float16  # no fp16 -> bf16 conversion (flash_attn's output)
    assert mixed.dtype == BF16 and f64.dtype == torch.float64
    assert torch.equal(half, flash_cuda.flash_attn_func(q.half(), k.half(), v.half(),
                                                        alibi_slopes=slopes))
    assert flash_cuda.flash_attn_func(q, k, v).dtype == torch.float32  # outside autocast


def test_autocast_varlen_and_kvcache():
    q, k, v = (t.detach() for t in _qkv())
    flat = [t.flatten(0, 1) for t in (q, k, v)]
    cq, ck = cu_seqlens([7, 7]), cu_seqlens([9, 9])
    with torch.autocast(device_type="cpu", dtype=BF16):
        out = flash_cuda.flash_attn_varlen_func(*flat, cq, ck, 7, 9, causal=True)
    ref = flash_cuda.flash_attn_varlen_func(*(t.to(BF16) for t in flat), cq, ck, 7, 9,
                                            causal=True)
    assert out.dtype == BF16 and torch.equal(out, ref)

    # The caches (fp16 here) are updated in place: q, new k/v and rotary cos/sin follow them.
    caches = [torch.zeros(2, 12, 2, 16, dtype=torch.float16) for _ in range(4)]
    seqlens = torch.tensor([0, 5], dtype=torch.int32)
    cos, sin = torch.rand(12, 4), torch.rand(12, 4)
    with torch.autocast(device_type="cpu", dtype=BF16):
        out = flash_cuda.flash_attn_with_kvcache(q[:, :2], caches[0], caches[1], k[:, :2],
                                                 v[:, :2], cos, sin, cache_seqlens=seqlens,
                                                 causal=True)
    ref = flash_cuda.flash_attn_with_kvcache(*(t.half() for t in (q[:, :2],)), caches[2],
                                             caches[3], k[:, :2].half(), v[:, :2].half(),
                                             cos.half(), sin.half(), cache_seqlens=seqlens,
                                             causal=True)
    assert out.dtype == torch.float16 and torch.equal(out, ref)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_autocast_rules_registered_for_cuda():
    for op in ("fwd", "varlen_fwd", "fwd_kvcache"):
        for key in ("AutocastCPU", "AutocastCUDA"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"flash_cuda::{op}", key)
    for op in ("bwd", "varlen_bwd", "combine_splits"):
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"flash_cuda::{op}",
                                                                  "AutocastCUDA")


def test_autocast_inside_compiled_function():
    q, k, v = _qkv()

    def f(q, k, v):
        with torch.autocast(device_type="cpu", dtype=BF16):
            return flash_cuda.flash_attn_func(q, k, v, causal=True)

    out = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    assert out.dtype == BF16 and torch.equal(out, f(q, k, v))
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and torch.isfinite(q.grad).all()


# ---------------------------------------------------------------------------------------------
# torch.compile of the training step


COMPILE_CFG = dataclasses.replace(TINY, steps=6, warmup=2)


def test_compiled_forward_backward_training():
    data = tu.make_data(COMPILE_CFG)
    losses, frames = tu.compiled_fwd_bwd_curve(COMPILE_CFG, data, tu.flash_attention(),
                                               device="cpu", backend="aot_eager")
    assert frames == 1, frames
    eager = tu.train(tu.make_model(COMPILE_CFG), tu.flash_attention(), data, COMPILE_CFG,
                     device="cpu")
    gap, step = tu.max_relative_gap(losses, eager)
    assert gap < 1e-4, (gap, step, losses, eager)


@pytest.mark.skipif(not tu.can_compile_backward(),
                    reason="this torch cannot trace Tensor.backward() into a graph")
def test_compiled_whole_training_step():
    data = tu.make_data(COMPILE_CFG)
    compiled, eager = tu.compiled_whole_step_curves(COMPILE_CFG, data, tu.flash_attention(),
                                                    device="cpu", backend="aot_eager")
    assert torch.isfinite(compiled).all() and float(compiled[-1]) < float(compiled[0])
    gap, step = tu.max_relative_gap(compiled, eager)
    assert gap < 1e-4, (gap, step, compiled, eager)
