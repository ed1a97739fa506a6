"""Training on the GPU: flash_cuda as the attention of a small causal GQA transformer.

Issue 4's training checks (the model and the task: tests/training_utils.py):
  * 200 steps with flash_cuda.flash_attn_func and with torch SDPA forced to MATH, from the same
    initial weights on the same batches, fp32 master weights under bf16 autocast (the linear
    layers run in bf16 and feed bf16 q/k/v to the attention), dropout 0: the loss curves agree
    within 1% (relative) at every step, and the model learned what only attention can give;
  * the first step's gradients of every weight agree with MATH's (the q/k/v projections get
    theirs only through the attention backward);
  * dropout_p = 0.1 trains (finite, decreasing loss) and really drops (another curve);
  * torch.autocast: fp32 q/k/v are cast to the autocast dtype (flash_attn raises on them), the
    gradients reach the fp32 tensors in fp32; fp16/bf16 inputs pass through unchanged;
  * torch.compile(fullgraph=True) of the training step: forward + backward (one graph, no
    recompilation over the steps) with eager AdamW, and, where torch can trace
    Tensor.backward() (torch._dynamo.config.trace_autograd_ops), forward + backward +
    optimizer update as one graph; both follow the eager loss curve.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import training_utils as tu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CFG = tu.Config()  # 2 layers, 8 query / 2 KV heads of 64, seq 255, batch 8, 200 steps
BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def curves():
    """(flash_cuda, SDPA MATH) loss curves, 200 steps each, bf16 autocast."""
    flash, math = tu.train_pair(CFG, tu.flash_attention(), tu.sdpa_math_attention,
                                device="cuda", autocast_dtype=BF16)
    return flash, math


def _fmt(curve, every=20):
    return " ".join(f"{i}:{curve[i]:.4f}" for i in range(0, len(curve), every))


def test_loss_curve_matches_sdpa_math(curves):
    flash, math = curves
    assert flash.shape == (CFG.steps,) and torch.isfinite(flash).all(), _fmt(flash)
    gap, step = tu.max_relative_gap(flash, math)
    assert gap <= 0.01, (f"loss curves differ by {gap:.2%} at step {step}: flash_cuda "
                         f"{flash[step]:.5f}, MATH {math[step]:.5f}\nflash_cuda {_fmt(flash)}"
                         f"\nMATH       {_fmt(math)}")
    # The model learned the in-context part of the task: only attention over the prefix gets
    # the loss below the best loss that ignores it (4.00 here; ln 8 = 2.08 is the limit).
    floor = tu.no_attention_floor(CFG)
    assert float(flash[-10:].mean()) < floor - 0.25, (floor, _fmt(flash))


def _first_step_grads(attn):
    model = tu.make_model(CFG).cuda()
    batch = tu.make_data(CFG, steps=1)[0].cuda()
    with torch.autocast(device_type="cuda", dtype=BF16):
        loss = tu.loss_of(model, attn, batch, CFG.vocab)
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_first_step_gradients_match_sdpa_math():
    flash = _first_step_grads(tu.flash_attention())
    math = _first_step_grads(tu.sdpa_math_attention)
    for name, g in flash.items():
        ref = math[name]
        assert g is not None and g.dtype == torch.float32, name  # fp32 master weights
        assert torch.isfinite(g).all(), name
        cos = torch.nn.functional.cosine_similarity(g.flatten(), ref.flatten(), dim=0)
        rel = (g - ref).norm() / ref.norm()
        # bf16 rounding moves a gradient by ~1% of its norm; a wrong one by ~100%.
        assert cos > 0.99 and rel < 0.1, (name, float(cos), float(rel))


def test_dropout_trains(curves):
    steps = 100
    cfg = dataclasses.replace(CFG, steps=steps)
    torch.manual_seed(0)
    drop = tu.train(tu.make_model(cfg), tu.flash_attention(dropout_p=0.1),
                    tu.make_data(CFG)[:steps], cfg, device="cuda", autocast_dtype=BF16)
    assert torch.isfinite(drop).all(), _fmt(drop, 10)
    assert float(drop[-10:].mean()) < float(drop[:10].mean()) - 0.3, _fmt(drop, 10)
    no_drop = curves[0][:steps]
    # Same weights and batch at step 0: only the dropped attention probabilities differ.
    assert drop[0] != no_drop[0] and not torch.equal(drop, no_drop)


# ---------------------------------------------------------------------------------------------
# torch.autocast


def _qkv(dtype=torch.float32, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shapes = ((2, 131, 8, 64), (2, 173, 2, 64), (2, 173, 2, 64))
    return [torch.randn(s, device="cuda", dtype=dtype, generator=gen).requires_grad_()
            for s in shapes]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_casts_fp32_inputs(dtype):
    import flash_cuda

    q, k, v = _qkv()
    dout = torch.randn(2, 131, 8, 64, device="cuda", dtype=dtype)
    with torch.autocast(device_type="cuda", dtype=dtype):
        out = flash_cuda.flash_attn_func(q, k, v, causal=True, deterministic=True)
    assert out.dtype == dtype
    out.backward(dout)
    # The same as casting by hand: bitwise (deterministic=True fixes dq's summation order).
    q2, k2, v2 = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    ref = flash_cuda.flash_attn_func(q2, k2, v2, causal=True, deterministic=True)
    ref.backward(dout)
    assert torch.equal(out, ref)
    for t, t2 in ((q, q2), (k, k2), (v, v2)):
        assert t.grad.dtype == torch.float32
        assert torch.equal(t.grad, t2.grad.float())


def test_autocast_leaves_half_inputs_and_alibi():
    import flash_cuda

    q, k, v = (t.detach().half() for t in _qkv())
    slopes = torch.rand(8, device="cuda")  # fp32, as the op requires
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        out = flash_cuda.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    assert out.dtype == torch.float16  # as with flash_attn: no fp16 -> bf16 conversion
    ref = flash_cuda.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    assert torch.equal(out, ref)
    with pytest.raises(TypeError, match="fp16 and bf16"):  # outside autocast: unchanged
        flash_cuda.flash_attn_func(q.float(), k.float(), v.float())


def test_autocast_varlen_and_kvcache():
    import flash_cuda

    q, k, v = (t.detach() for t in _qkv())
    cu_q = torch.tensor([0, 131, 262], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 173, 346], dtype=torch.int32, device="cuda")
    flat = [t.flatten(0, 1) for t in (q, k, v)]
    with torch.autocast(device_type="cuda", dtype=BF16):
        out = flash_cuda.flash_attn_varlen_func(*flat, cu_q, cu_k, 131, 173, causal=True)
    ref = flash_cuda.flash_attn_varlen_func(*(t.to(BF16) for t in flat), cu_q, cu_k, 131, 173,
                                            causal=True)
    assert out.dtype == BF16 and torch.equal(out, ref)

    # KV cache (bf16): fp32 query and new keys/values follow the cache's dtype.
    k_cache = torch.zeros(2, 256, 2, 64, device="cuda", dtype=BF16)
    v_cache = torch.zeros_like(k_cache)
    seqlens = torch.tensor([0, 17], dtype=torch.int32, device="cuda")
    kc2, vc2 = k_cache.clone(), v_cache.clone()
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        out = flash_cuda.flash_attn_with_kvcache(q[:, :3], k_cache, v_cache, k[:, :3], v[:, :3],
                                                 cache_seqlens=seqlens, causal=True)
    ref = flash_cuda.flash_attn_with_kvcache(q[:, :3].to(BF16), kc2, vc2, k[:, :3].to(BF16),
                                             v[:, :3].to(BF16), cache_seqlens=seqlens,
                                             causal=True)
    assert out.dtype == BF16 and torch.equal(out, ref)
    assert torch.equal(k_cache, kc2) and torch.equal(v_cache, vc2)


# ---------------------------------------------------------------------------------------------
# torch.compile of the training step


COMPILE_CFG = dataclasses.replace(CFG, n_layers=1, steps=12, warmup=4)  # short compiles


def test_compiled_forward_backward_training():
    """Forward + loss compiled with fullgraph=True, the backward compiled by AOTAutograd from
    the same graph, eager AdamW: one compilation serves every step, same curve as eager."""
    cfg, data = COMPILE_CFG, tu.make_data(COMPILE_CFG)
    losses, frames = tu.compiled_fwd_bwd_curve(cfg, data, tu.flash_attention(), device="cuda",
                                               backend="inductor", autocast_dtype=BF16)
    assert frames == 1, frames
    eager = tu.train(tu.make_model(cfg), tu.flash_attention(), data, cfg, device="cuda",
                     autocast_dtype=BF16)
    gap, step = tu.max_relative_gap(losses, eager)
    assert gap <= 0.01, (gap, step, losses, eager)


@pytest.mark.skipif(not tu.can_compile_backward(),
                    reason="this torch cannot trace Tensor.backward() into a graph")
def test_compiled_whole_training_step():
    """Forward, Tensor.backward() and the optimizer update in one fullgraph=True graph."""
    cfg, data = COMPILE_CFG, tu.make_data(COMPILE_CFG)
    compiled, eager = tu.compiled_whole_step_curves(cfg, data, tu.flash_attention(),
                                                    device="cuda", backend="inductor",
                                                    autocast_dtype=BF16)
    assert torch.isfinite(compiled).all() and float(compiled[-1]) < float(compiled[0])
    gap, step = tu.max_relative_gap(compiled, eager)
    assert gap <= 0.01, (gap, step, compiled, eager)
