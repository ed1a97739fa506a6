"""Autograd through the public functions (fwd -> bwd, varlen_fwd -> varlen_bwd; flash_cuda/_ops.py).

gradcheck in fp64 on tiny shapes over the features (causal, window, softcap, ALiBi, GQA,
dropout with a fixed rng_state), and gradients equal to autograd through the naive oracle.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

import flash_cuda
from api_utils import cu_seqlens, rand
from naive_attention import naive_attention

f64 = dict(dtype=torch.float64, requires_grad=True)

FEATURES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(window_size=(2, 1)),
    "causal_window": dict(causal=True, window_size=(1, 0)),
    "softcap": dict(softcap=0.7),
    "alibi": dict(alibi_slopes=torch.tensor([0.3, 0.7, 0.1, 0.9])),
    "alibi_batch": dict(alibi_slopes=torch.rand(2, 4)),
    "all": dict(causal=True, window_size=(3, 0), softcap=1.5,
                alibi_slopes=torch.tensor([0.3, 0.7, 0.1, 0.9]), softmax_scale=0.8),
}


def _naive_kwargs(kw):
    out = dict(kw)
    if "window_size" in out:
        out["window"] = out.pop("window_size")
    return out


@pytest.mark.parametrize("sq, sk", [(3, 5), (5, 3)])
@pytest.mark.parametrize("hk", [4, 2, 1])  # MHA, GQA, MQA
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_gradcheck_func(feature, hk, sq, sk):
    torch.manual_seed(0)
    kw = FEATURES[feature]
    q, k, v = rand(2, sq, 4, 4, **f64), rand(2, sk, hk, 4, **f64), rand(2, sk, hk, 4, **f64)
    fn = lambda q, k, v: flash_cuda.flash_attn_func(q, k, v, **kw)  # noqa: E731
    assert gradcheck(fn, (q, k, v), fast_mode=True)


@pytest.mark.parametrize("feature", ["plain", "causal", "window", "all"])
def test_gradcheck_varlen(feature):
    torch.manual_seed(1)
    kw = {k: v for k, v in FEATURES[feature].items()}
    lens_q, lens_k = [2, 4, 1], [3, 2, 5]
    cq, ck = cu_seqlens(lens_q), cu_seqlens(lens_k)
    if "alibi_slopes" in kw:
        kw["alibi_slopes"] = kw["alibi_slopes"][:2]
    q, k, v = rand(7, 2, 4, **f64), rand(10, 1, 4, **f64), rand(10, 1, 4, **f64)
    fn = lambda q, k, v: flash_cuda.flash_attn_varlen_func(q, k, v, cq, ck, 4, 5, **kw)  # noqa: E731
    assert gradcheck(fn, (q, k, v))


def test_gradcheck_qkvpacked():
    torch.manual_seed(2)
    qkv = rand(2, 4, 3, 2, 4, **f64)
    assert gradcheck(lambda x: flash_cuda.flash_attn_qkvpacked_func(x, causal=True), (qkv,))
    qkv = rand(6, 3, 2, 4, **f64)
    cu = cu_seqlens([2, 4])
    assert gradcheck(lambda x: flash_cuda.flash_attn_varlen_qkvpacked_func(
        x, cu, 4, window_size=(1, 1)), (qkv,))


def test_gradcheck_kvpacked():
    torch.manual_seed(3)
    q, kv = rand(2, 3, 4, 4, **f64), rand(2, 5, 2, 2, 4, **f64)
    assert gradcheck(lambda q, kv: flash_cuda.flash_attn_kvpacked_func(q, kv, causal=True),
                     (q, kv))


def test_gradcheck_dropout_fixed_rng_state():
    """With the rng_state given, the dropout mask is a fixed function: the forward and the
    backward must use the same one."""
    torch.manual_seed(4)
    q, k, v = rand(1, 3, 2, 4, **f64), rand(1, 4, 1, 4, **f64), rand(1, 4, 1, 4, **f64)
    state = torch.tensor([1234, 0], dtype=torch.int64)

    def fn(q, k, v):
        return torch.ops.flash_cuda.fwd(q, k, v, None, 0.3, 0.5, False, -1, -1, 0.0, False,
                                        state)[0]

    assert gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_grads_match_naive(feature):
    torch.manual_seed(5)
    kw = FEATURES[feature]
    q, k, v = rand(2, 6, 4, 8, **f64), rand(2, 9, 2, 8, **f64), rand(2, 9, 2, 8, **f64)
    dout = torch.randn(2, 6, 4, 8, dtype=torch.float64)
    out = flash_cuda.flash_attn_func(q, k, v, **kw)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref, _ = naive_attention(q, k, v, **_naive_kwargs(kw))
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_noncontiguous_dout():
    """dout reaches the bwd op with its own strides; a stride(-1) != 1 one is made contiguous."""
    torch.manual_seed(6)
    q, k, v = rand(2, 5, 4, 8, **f64), rand(2, 7, 2, 8, **f64), rand(2, 7, 2, 8, **f64)
    out = flash_cuda.flash_attn_func(q, k, v, causal=True)
    dout = torch.randn(2, 8, 4, 5, dtype=torch.float64).permute(0, 3, 2, 1)  # (2, 5, 4, 8)
    assert dout.stride(-1) != 1
    ref = torch.autograd.grad(out, (q, k, v), dout.contiguous(), retain_graph=True)
    for g, r in zip(torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), ref):
        torch.testing.assert_close(g, r)
    dout_rows = torch.randn(5, 2, 4, 8, dtype=torch.float64).transpose(0, 1)  # unit last stride
    ref = torch.autograd.grad(out, (q, k, v), dout_rows.contiguous(), retain_graph=True)
    for g, r in zip(torch.autograd.grad(out, (q, k, v), dout_rows, retain_graph=True), ref):
        torch.testing.assert_close(g, r)
    # out.sum() sends an expanded (all strides 0) gradient.
    ref = torch.autograd.grad(out, (q, k, v), torch.ones_like(out), retain_graph=True)
    out.sum().backward()
    torch.testing.assert_close(q.grad, ref[0])


def test_lse_output_has_no_gradient_effect():
    """Only `out` is differentiable; a loss on softmax_lse contributes nothing (flash_attn)."""
    torch.manual_seed(7)
    q, k, v = rand(1, 4, 2, 8, **f64), rand(1, 4, 2, 8, **f64), rand(1, 4, 2, 8, **f64)
    out, lse, _ = flash_cuda.flash_attn_func(q, k, v, return_attn_probs=True)
    g1 = torch.autograd.grad(out.sum(), (q,), retain_graph=True)[0]
    g2 = torch.autograd.grad(out.sum() + lse.sum(), (q,))[0]
    torch.testing.assert_close(g1, g2)


def test_varlen_paged_backward_unsupported():
    q = rand(4, 2, 8, **f64)
    k_pages = rand(2, 4, 2, 8, **f64)
    cu = cu_seqlens([2, 2])
    cuk = cu_seqlens([3, 4])
    table = torch.tensor([[0], [1]], dtype=torch.int32)
    out = flash_cuda.flash_attn_varlen_func(q, k_pages, k_pages, cu, cuk, 2, 4,
                                            block_table=table)
    with pytest.raises(NotImplementedError, match="block_table"):
        out.sum().backward()


@pytest.mark.parametrize("varlen", [False, True])
def test_public_function_and_op_record_the_cpp_node(varlen):
    """The public functions and direct torch.ops callers record the same graph node, the C++
    Function of csrc/autograd.cpp (no Python autograd.Function in between), with the same
    outputs and gradients."""
    torch.manual_seed(9)
    ops = torch.ops.flash_cuda
    if varlen:
        cu = cu_seqlens([3, 5])
        q, k, v = rand(8, 4, 8, **f64), rand(8, 2, 8, **f64), rand(8, 2, 8, **f64)
        args = (q, k, v, cu, cu, None, None, None, 5, 5, 0.0, 0.3, True, -1, -1, 0.0, False,
                None, False)
        public = flash_cuda.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, softmax_scale=0.3,
                                                   causal=True)
        direct = ops.varlen_fwd(*args)[0]
        name = "VarlenFwdFunction"
    else:
        q, k, v = rand(2, 5, 4, 8, **f64), rand(2, 7, 2, 8, **f64), rand(2, 7, 2, 8, **f64)
        args = (q, k, v, None, 0.0, 0.3, True, -1, -1, 0.0, False, None, False)
        public = flash_cuda.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True)
        direct = ops.fwd(*args)[0]
        name = "FwdFunction"
    for out in (public, direct):
        node = out.grad_fn.name()
        assert node.startswith("torch::autograd::CppNode<") and f"::{name}>" in node, node
    torch.testing.assert_close(public, direct, rtol=0, atol=0)
    dout = torch.randn_like(public)
    for g, r in zip(torch.autograd.grad(public, (q, k, v), dout),
                    torch.autograd.grad(direct, (q, k, v), dout)):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_no_graph_node_without_grad():
    """Inputs that do not require grad (or no_grad) record nothing: no node, no saved tensors."""
    q, k, v = (rand(1, 4, 2, 8, dtype=torch.float64) for _ in range(3))
    out = flash_cuda.flash_attn_func(q, k, v)
    assert out.grad_fn is None and not out.requires_grad
    with torch.no_grad():
        out = flash_cuda.flash_attn_func(*(x.requires_grad_() for x in (q, k, v)))
    assert out.grad_fn is None and not out.requires_grad
    out = flash_cuda.flash_attn_func(q, k, v)  # and the same call records where grad is on
    assert out.grad_fn is not None


def test_lse_and_rng_state_are_not_differentiable():
    q, k, v = (rand(1, 4, 2, 8, **f64) for _ in range(3))
    out, lse, _ = flash_cuda.flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad
