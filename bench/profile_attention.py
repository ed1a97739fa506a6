"""One call of flash_cuda and one of SDPA's FLASH backend (FlashAttention-2) on the same inputs,
forward or forward+backward, for a profiler (ncu) to compare the kernels. Not a benchmark: no
timing here.

    PYTHONPATH=. ncu --clock-control none -k regex:"mha_bwd_sm80_kernel|flash_bwd_dq_dk_dv" -c 2 \
        python3 bench/profile_attention.py --d 128 --seqlen 4096 --bwd
"""

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_cuda


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--bwd", action="store_true", help="forward + backward")
    args = p.parse_args()
    h = 2048 // args.d
    b = 16384 // args.seqlen
    q, k, v = (torch.randn(b, args.seqlen, h, args.d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=args.bwd) for _ in range(3))
    out = flash_cuda.flash_attn_func(q, k, v, causal=args.causal)
    if args.bwd:
        out.backward(torch.randn_like(out))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=args.causal)
        if args.bwd:
            out.backward(torch.randn_like(out))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
