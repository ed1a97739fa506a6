"""A small causal GQA transformer and its training loop, for the training tests.

The same model trains with flash_cuda.flash_attn_func or with torch SDPA (MATH backend) as its
attention, from the same initial weights on the same batches, so two loss curves can be
compared step by step (tests/test_training_gpu.py on an H200, tests/test_training.py on the CPU
with the reference ops).

Task (synthetic, fixed by a seed): each sequence draws `set_size` distinct tokens out of
`vocab` and is `seq_len + 1` uniform samples from that set; the model predicts the next token.
Without attention the best loss is about ln(vocab) - (a little, from the current token); with
causal attention over the prefix it falls towards ln(set_size). The curve is smooth (no
phase change as with copying tasks), so two runs that differ only by rounding stay close, and a
wrong attention (mask, GQA head mapping, gradients) shows as a different curve.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class Config:
    n_layers: int = 2
    n_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 64
    vocab: int = 64
    set_size: int = 8
    seq_len: int = 255   # tokens the model sees (odd: partial kernel blocks)
    batch: int = 8
    steps: int = 200
    lr: float = 1e-3
    warmup: int = 10

    @property
    def d_model(self) -> int:
        return self.n_heads * self.head_dim


# ---------------------------------------------------------------------------------------------
# Attention functions: (b, s, h, d) q and (b, s, hk, d) k, v -> (b, s, h, d), causal.


def flash_attention(dropout_p: float = 0.0, deterministic: bool = False):
    import flash_cuda

    def attn(q, k, v):
        return flash_cuda.flash_attn_func(q, k, v, dropout_p=dropout_p, causal=True,
                                          deterministic=deterministic)
    return attn


def sdpa_math_attention(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rep = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = (t.repeat_interleave(rep, dim=1) for t in (k, v))
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2)


# ---------------------------------------------------------------------------------------------
# Model


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.cfg = cfg
        self.norm1 = nn.LayerNorm(d)
        self.wq = nn.Linear(d, cfg.n_heads * hd, bias=False)
        self.wkv = nn.Linear(d, 2 * cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, d, bias=False)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, attn):
        b, s, _ = x.shape
        cfg = self.cfg
        h = self.norm1(x)
        q = self.wq(h).view(b, s, cfg.n_heads, cfg.head_dim)
        # k, v: views into one projection (strided heads, unit last stride), as models do.
        k, v = self.wkv(h).view(b, s, 2, cfg.n_kv_heads, cfg.head_dim).unbind(2)
        x = x + self.wo(attn(q, k, v).reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(cfg.seq_len, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens, attn):
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, attn)
        return self.head(self.norm(x))


def make_model(cfg: Config, seed: int = 0) -> TinyTransformer:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyTransformer(cfg)


def make_data(cfg: Config, seed: int = 1234, steps: int | None = None) -> torch.Tensor:
    """(steps, batch, seq_len + 1) int64 tokens on the CPU."""
    steps = cfg.steps if steps is None else steps
    gen = torch.Generator().manual_seed(seed)
    n = steps * cfg.batch
    sets = torch.rand(n, cfg.vocab, generator=gen).argsort(dim=1)[:, : cfg.set_size]
    picks = torch.randint(cfg.set_size, (n, cfg.seq_len + 1), generator=gen)
    return sets.gather(1, picks).view(steps, cfg.batch, cfg.seq_len + 1)


def loss_of(model, attn, batch, vocab):
    logits = model(batch[:, :-1], attn)
    return F.cross_entropy(logits.float().reshape(-1, vocab), batch[:, 1:].reshape(-1))


def lr_at(cfg: Config, step: int) -> float:
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup)


def train(model, attn, data, cfg: Config, *, device, autocast_dtype=None, steps=None):
    """Trains `model` in place (AdamW, warm-up, clipping); returns the fp32 losses (CPU)."""
    steps = data.shape[0] if steps is None else steps
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                            weight_decay=0.0)
    ctx = (torch.autocast(device_type=torch.device(device).type, dtype=autocast_dtype)
           if autocast_dtype is not None else contextlib.nullcontext())
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        batch = data[step].to(device, non_blocking=True)
        with ctx:
            loss = loss_of(model, attn, batch, cfg.vocab)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return torch.stack(losses).float().cpu()


def train_pair(cfg: Config, attn_a, attn_b, *, device, autocast_dtype=None, seed=0, data=None):
    """Two runs from the same initial weights on the same batches -> (losses_a, losses_b)."""
    data = make_data(cfg) if data is None else data
    model = make_model(cfg, seed)
    curves = []
    for attn in (attn_a, attn_b):
        curves.append(train(copy.deepcopy(model), attn, data, cfg, device=device,
                            autocast_dtype=autocast_dtype))
    return tuple(curves)


def max_relative_gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    """max_i |a_i - b_i| / |b_i| and the step where it is."""
    rel = (a - b).abs() / b.abs()
    i = int(rel.argmax())
    return float(rel[i]), i


def no_attention_floor(cfg: Config) -> float:
    """The best loss without looking back further than the current token (it is in the set)."""
    p_same = 1.0 / cfg.set_size
    p_other = (1.0 - p_same) / (cfg.vocab - 1)
    return -(p_same * math.log(p_same) + (1.0 - p_same) * math.log(p_other))


# ---------------------------------------------------------------------------------------------
# torch.compile of the training step


def _autocast(device, dtype):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def compiled_fwd_bwd_curve(cfg: Config, data, attn, *, device, backend, autocast_dtype=None):
    """Forward + loss under torch.compile(fullgraph=True) (AOTAutograd compiles the backward
    from the same graph), eager AdamW as in train(). -> (losses, frames compiled)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = make_model(cfg).to(device)
    counter = CompileCounterWithBackend(backend)

    def loss_fn(batch):
        with _autocast(device, autocast_dtype):
            return loss_of(model, attn, batch, cfg.vocab)

    compiled = torch.compile(loss_fn, fullgraph=True, backend=counter)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    losses = []
    for step in range(data.shape[0]):
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        loss = compiled(data[step].to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return torch.stack(losses).float().cpu(), counter.frame_count


def can_compile_backward() -> bool:
    """torch can trace Tensor.backward() into a graph (newer than 2.11)."""
    return hasattr(torch._dynamo.config, "trace_autograd_ops")


def compiled_whole_step_curves(cfg: Config, data, attn, *, device, backend,
                               autocast_dtype=None, lr=0.05, momentum=0.9):
    """Forward, Tensor.backward() and the optimizer update (SGD with momentum, written out:
    torch.optim's step() breaks the graph on purpose) in one torch.compile(fullgraph=True).
    -> (compiled losses, eager losses of the same step function from the same weights)."""

    def make_step(model):
        params = list(model.parameters())
        bufs = [torch.zeros_like(p) for p in params]

        def step(batch):
            with _autocast(device, autocast_dtype):
                loss = loss_of(model, attn, batch, cfg.vocab)
            loss.backward()
            with torch.no_grad():
                for p, buf in zip(params, bufs):
                    buf.mul_(momentum).add_(p.grad)
                    p.sub_(lr * buf)
                    p.grad = None
            return loss.detach()
        return step

    torch._dynamo.reset()
    model = make_model(cfg).to(device)
    eager_step = make_step(copy.deepcopy(model))
    old = torch._dynamo.config.trace_autograd_ops
    torch._dynamo.config.trace_autograd_ops = True
    try:
        compiled_step = torch.compile(make_step(model), fullgraph=True, backend=backend)
        compiled = [compiled_step(data[i].to(device)) for i in range(data.shape[0])]
    finally:
        torch._dynamo.config.trace_autograd_ops = old
    eager = [eager_step(data[i].to(device)) for i in range(data.shape[0])]
    return torch.stack(compiled).float().cpu(), torch.stack(eager).float().cpu()
