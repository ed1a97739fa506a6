"""Kernel launches for a profiler (ncu) to compare. Not a benchmark: no timing here.

Prefill (default): one call of flash_cuda and one of SDPA's FLASH backend (FlashAttention-2) on
the same inputs, forward or forward+backward; --cudnn adds one through SDPA's cuDNN backend.

    PYTHONPATH=. ncu --clock-control none -k regex:"mha_bwd_sm80_kernel|flash_bwd_dq_dk_dv" -c 2 \
        python3 bench/profile_attention.py --d 128 --seqlen 4096 --bwd

Decode (--decode): one flash_attn_with_kvcache step (one query token, d128 bf16) over the same
cache held contiguously, then paged with its pages in cache order (the same addresses as the
contiguous cache), then paged with the pages shuffled, each --page size in turn; all with
--num-splits, so every launch has the same grid and only the paged address path differs.
--env-variants repeats the contiguous step once per set of environment switches.
--cudnn adds the step through SDPA's cuDNN backend (its kernel is named after cuDNN's engine:
profile without -k, or with a regex that also matches it).

    PYTHONPATH=. ncu --clock-control none -k regex:mha_fwd_sm80_kernel -c 5 \
        python3 bench/profile_attention.py --decode --batch 16 --kv 32768 --pages 16,256
"""

import argparse
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_cuda


def prefill(args) -> None:
    h = 2048 // args.d
    b = 16384 // args.seqlen
    q, k, v = (torch.randn(b, args.seqlen, h, args.d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=args.bwd) for _ in range(3))
    out = flash_cuda.flash_attn_func(q, k, v, dropout_p=args.dropout, causal=args.causal)
    if args.bwd:
        out.backward(torch.randn_like(out))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p=args.dropout,
            is_causal=args.causal)
        if args.bwd:
            out.backward(torch.randn_like(out))
    if args.cudnn:  # the same call through SDPA's cuDNN backend, on (b, h, s, d) copies as in
        # bench_attention.py
        qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(args.bwd)
                      for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(
                qt, kt, vt, dropout_p=args.dropout, is_causal=args.causal)
            if args.bwd:
                out.backward(torch.randn_like(out))


def decode(args) -> None:
    b, kv, hq, hkv, d = args.batch, args.kv, args.heads, args.kv_heads, 128
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache = (torch.randn(b, kv, hkv, d, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
    seqlens = torch.full((b,), kv, dtype=torch.int32, device="cuda")

    def step(k, v, block_table=None):
        flash_cuda.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens,
                                           block_table=block_table, num_splits=args.num_splits)

    for variant in args.env_variants or [""]:
        # flash_cuda reads its decode switches per call: one contiguous step per variant
        for pair in filter(None, variant.split(",")):
            name, value = pair.split("=", 1)
            os.environ[name] = value
        step(k_cache, v_cache)
    if args.cudnn:  # the same step through SDPA's cuDNN backend, layout (b, h, s, d)
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k_cache, v_cache))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hq != hkv)
        del qt, kt, vt
    for page in args.pages:
        n_pages = b * (kv // page)
        for order in (torch.arange(n_pages, device="cuda"),
                      torch.randperm(n_pages, device="cuda")):
            pages = []
            for x in (k_cache, v_cache):
                p = torch.empty(n_pages, page, hkv, d, dtype=x.dtype, device=x.device)
                p[order] = x.reshape(n_pages, page, hkv, d)
                pages.append(p)
            step(*pages, order.to(torch.int32).reshape(b, kv // page))
            del pages


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--bwd", action="store_true", help="forward + backward")
    p.add_argument("--dropout", type=float, default=0.0, help="prefill: dropout_p of every call")
    p.add_argument("--decode", action="store_true", help="decode steps (see the docstring)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--kv", type=int, default=32768, help="decode: cache length")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--pages", type=lambda s: [int(x) for x in s.split(",") if x],
                   default=[16, 256], help="decode: page sizes of the paged steps (\"\": none)")
    p.add_argument("--num-splits", type=int, default=1)
    p.add_argument("--env-variants", type=lambda s: s.split(";"), default=None,
                   help="decode: one contiguous step per ';'-separated variant, each "
                        "'VAR=VALUE,VAR=VALUE' set before its step (flash_cuda's switches, read "
                        "per call), e.g. 'FLASH_CUDA_DECODE_RING=0;FLASH_CUDA_DECODE_RING=1'")
    p.add_argument("--cudnn", action="store_true",
                   help="also SDPA's cuDNN backend: prefill, the same call after FA2's; decode, "
                        "the step after the contiguous flash_cuda step")
    args = p.parse_args()
    if args.decode:
        decode(args)
    else:
        prefill(args)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
