"""torch.compile(fullgraph=True), torch.export and torch.library.opcheck over every op.

Tracing tests use 'meta' tensors (the ops' fakes run, nothing is computed) so they show that
the public functions trace without graph breaks, the KV-cache update (a mutating op) included.
The value tests compare compiled and eager results on CPU (the reference).
"""

from __future__ import annotations

import pytest
import torch

import flash_cuda
from api_utils import cu_seqlens, rand

ops = torch.ops.flash_cuda


def _attn_gqa(q, k, v):
    return flash_cuda.flash_attn_func(q, k, v, causal=True)


def _varlen(q, k, v, cq, ck):
    return flash_cuda.flash_attn_varlen_func(q, k, v, cq, ck, 7, 9, causal=True,
                                             window_size=(4, 0))


def _decode_step(q, k_cache, v_cache, k, v, cache_seqlens, cos, sin):
    out = flash_cuda.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cos, sin,
                                             cache_seqlens=cache_seqlens, causal=True)
    return out * 2


def _inputs_gqa(device, dtype, requires_grad=False):
    torch.manual_seed(0)
    kw = dict(device=device, dtype=dtype, requires_grad=requires_grad)
    return rand(2, 7, 4, 16, **kw), rand(2, 9, 2, 16, **kw), rand(2, 9, 2, 16, **kw)


def _inputs_varlen(device, dtype, requires_grad=False):
    torch.manual_seed(1)
    kw = dict(device=device, dtype=dtype, requires_grad=requires_grad)
    return (rand(12, 4, 16, **kw), rand(15, 2, 16, **kw), rand(15, 2, 16, **kw),
            cu_seqlens([5, 7]).to(device), cu_seqlens([9, 6]).to(device))


def _inputs_decode(device, dtype):
    torch.manual_seed(2)
    kw = dict(device=device, dtype=dtype)
    return (rand(2, 1, 4, 16, **kw), rand(2, 12, 2, 16, **kw), rand(2, 12, 2, 16, **kw),
            rand(2, 1, 2, 16, **kw), rand(2, 1, 2, 16, **kw),
            torch.tensor([3, 7], dtype=torch.int32, device=device),
            rand(12, 4, **kw), rand(12, 4, **kw))


# ----------------------------------------------------------------------------------------------
# Tracing: no graph breaks (fullgraph=True raises on one), forward and backward.


def test_compile_traces_attention_fwd_bwd_meta():
    fn = torch.compile(_attn_gqa, fullgraph=True, backend="aot_eager")
    q, k, v = _inputs_gqa("meta", torch.float16, requires_grad=True)
    fn(q, k, v).sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_compile_traces_varlen_fwd_bwd_meta():
    fn = torch.compile(_varlen, fullgraph=True, backend="aot_eager")
    q, k, v, cq, ck = _inputs_varlen("meta", torch.float16, requires_grad=True)
    fn(q, k, v, cq, ck).sum().backward()
    assert v.grad.shape == v.shape


def test_compile_traces_kvcache_meta():
    fn = torch.compile(_decode_step, fullgraph=True, backend="aot_eager")
    args = _inputs_decode("meta", torch.float16)
    assert fn(*args).shape == args[0].shape


def test_compile_traces_int_cache_seqlens_and_sdpa_meta():
    def f(q, k_cache, v_cache, k, v, x):
        out = flash_cuda.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=3)
        return out, flash_cuda.scaled_dot_product_attention(x, x[:, :, :5], x[:, :, :5],
                                                            is_causal=True)

    fn = torch.compile(f, fullgraph=True, backend="aot_eager")
    q, kc, vc, k, v = _inputs_decode("meta", torch.float16)[:5]
    x = rand(2, 4, 9, 16, dtype=torch.float16, device="meta")
    out, y = fn(q, kc, vc, k, v, x)
    assert out.shape == q.shape and y.shape == x.shape


def test_compile_dynamic_shapes_meta():
    """Symbolic sequence lengths and max_seqlen (one graph serves every length)."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    fn = torch.compile(_attn_gqa, fullgraph=True, backend=counter, dynamic=True)
    for s in (5, 9, 13):
        q = rand(2, s, 4, 16, dtype=torch.float16, device="meta", requires_grad=True)
        k = rand(2, s + 3, 2, 16, dtype=torch.float16, device="meta", requires_grad=True)
        fn(q, k, k).sum().backward()
        assert q.grad.shape == q.shape
    assert counter.frame_count == 1

    def varlen(q, cu, max_seqlen):
        return flash_cuda.flash_attn_varlen_func(q, q, q, cu, cu, max_seqlen, max_seqlen)

    fn = torch.compile(varlen, fullgraph=True, backend="aot_eager", dynamic=True)
    for total in (10, 20):
        q = rand(total, 4, 16, dtype=torch.float16, device="meta")
        cu = torch.zeros(3, dtype=torch.int32, device="meta")
        assert fn(q, cu, total).shape == q.shape


class _Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _exported_targets(fn, args):
    ep = torch.export.export(_Wrap(fn), args)
    return ep, {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}


def test_export_attention():
    _, targets = _exported_targets(_attn_gqa, _inputs_gqa("cpu", torch.float32))
    assert "flash_cuda.fwd.default" in targets


def test_export_varlen():
    _, targets = _exported_targets(_varlen, _inputs_varlen("cpu", torch.float32))
    assert "flash_cuda.varlen_fwd.default" in targets


def test_export_kvcache_records_cache_mutation():
    ep, targets = _exported_targets(_decode_step, _inputs_decode("cpu", torch.float32))
    assert any("fwd_kvcache" in t for t in targets)
    # The in-place cache update is part of the program: once functionalized, k_cache and
    # v_cache (the 2nd and 3rd inputs) are recorded as mutated inputs.
    ep = ep.run_decompositions()
    user_inputs = ep.graph_signature.user_inputs
    mutated = set(ep.graph_signature.user_inputs_to_mutate.values())
    assert mutated == {user_inputs[1], user_inputs[2]}


def test_export_packed_and_sdpa():
    def f(qkv, kv, q):
        a = flash_cuda.flash_attn_qkvpacked_func(qkv, causal=True)
        b = flash_cuda.flash_attn_kvpacked_func(q, kv)
        c = flash_cuda.scaled_dot_product_attention(q.transpose(1, 2), q.transpose(1, 2),
                                                    q.transpose(1, 2), is_causal=True)
        return a, b, c

    args = (rand(2, 5, 3, 4, 16), rand(2, 6, 2, 2, 16), rand(2, 5, 4, 16))
    _, targets = _exported_targets(f, args)
    assert "flash_cuda.fwd.default" in targets


# ----------------------------------------------------------------------------------------------
# Compiled == eager on CPU.


def _grads(fn, inputs):
    out = fn(*inputs)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, [t for t in inputs if t.requires_grad], dout)
    return out, grads


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_compiled_attention_equals_eager(backend):
    torch._dynamo.reset()
    inputs = _inputs_gqa("cpu", torch.float32, requires_grad=True)
    torch.manual_seed(10)
    out, grads = _grads(_attn_gqa, inputs)
    torch.manual_seed(10)
    out_c, grads_c = _grads(torch.compile(_attn_gqa, fullgraph=True, backend=backend), inputs)
    torch.testing.assert_close(out_c, out)
    for g_c, g in zip(grads_c, grads):
        torch.testing.assert_close(g_c, g)


def test_compiled_varlen_equals_eager():
    inputs = _inputs_varlen("cpu", torch.float32, requires_grad=True)
    torch.manual_seed(11)
    out, grads = _grads(_varlen, inputs)
    torch.manual_seed(11)
    out_c, grads_c = _grads(torch.compile(_varlen, fullgraph=True, backend="aot_eager"), inputs)
    torch.testing.assert_close(out_c, out)
    for g_c, g in zip(grads_c, grads):
        torch.testing.assert_close(g_c, g)


def test_compiled_decode_step_equals_eager():
    args = _inputs_decode("cpu", torch.float32)
    eager_args = [a.clone() for a in args]
    out = _decode_step(*eager_args)
    out_c = torch.compile(_decode_step, fullgraph=True, backend="aot_eager")(*args)
    torch.testing.assert_close(out_c, out)
    # The compiled step updated the caches in place like eager did.
    torch.testing.assert_close(args[1], eager_args[1])
    torch.testing.assert_close(args[2], eager_args[2])


# ----------------------------------------------------------------------------------------------
# opcheck: schema, fake vs real, autograd registration, AOT dispatch, for every op.


def _fwd_args(dropout_p=0.0, return_softmax=False):
    q, k, v = _inputs_gqa("cpu", torch.float32, requires_grad=True)
    return (q, k, v, torch.rand(4), dropout_p, 0.25, True, -1, -1, 1.5, return_softmax)


def _varlen_fwd_args():
    q, k, v, cq, ck = _inputs_varlen("cpu", torch.float32, requires_grad=True)
    return (q, k, v, cq, ck, None, None, None, 7, 9, 0.0, 0.25, False, 3, 2, 0.0, False)


def _opcheck(op, args):
    torch.library.opcheck(op, args)


def test_opcheck_fwd():
    _opcheck(ops.fwd.default, _fwd_args())
    _opcheck(ops.fwd.default, _fwd_args(return_softmax=True))


def test_opcheck_varlen_fwd():
    _opcheck(ops.varlen_fwd.default, _varlen_fwd_args())


def test_opcheck_bwd():
    args = _fwd_args()
    with torch.no_grad():
        out, lse, _, rng = ops.fwd(*args)
    q, k, v, alibi, p, scale, causal, left, right, softcap, _ = args
    dout = torch.randn_like(out)
    _opcheck(ops.bwd.default, (dout, q.detach(), k.detach(), v.detach(), out, lse, alibi, p,
                               scale, causal, left, right, softcap, False, rng))


def test_opcheck_varlen_bwd():
    args = _varlen_fwd_args()
    with torch.no_grad():
        out, lse, _, rng = ops.varlen_fwd(*args)
    q, k, v, cq, ck, _, _, alibi, mq, mk, p, scale, causal, left, right, softcap, _ = args
    dout = torch.randn_like(out)
    _opcheck(ops.varlen_bwd.default, (dout, q.detach(), k.detach(), v.detach(), out, lse, cq,
                                      ck, alibi, mq, mk, p, scale, causal, left, right, softcap,
                                      False, rng))


@pytest.mark.parametrize("paged", [False, True])
def test_opcheck_fwd_kvcache(paged):
    q, k_cache, v_cache, k, v, seqlens, cos, sin = _inputs_decode("cpu", torch.float32)
    table = None
    if paged:  # 2 sequences x 3 pages of 4 keys = the same capacity, pages shuffled
        k_cache = k_cache.reshape(6, 4, 2, 16)
        v_cache = v_cache.reshape(6, 4, 2, 16)
        table = torch.tensor([[5, 0, 3], [1, 4, 2]], dtype=torch.int32)
    _opcheck(ops.fwd_kvcache.default,
             (q, k_cache, v_cache, k, v, seqlens, cos, sin, None, None, table, None, 0.25, True,
              -1, -1, 0.0, False, 0))


def test_opcheck_combine_splits():
    out_partial = torch.randn(3, 2, 4, 5, 16)
    lse_partial = torch.randn(3, 2, 4, 5)
    _opcheck(ops.combine_splits.default, (out_partial, lse_partial, torch.float32))
