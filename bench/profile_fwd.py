"""One forward call of flash_cuda and one of SDPA's FLASH backend (FlashAttention-2) on the same
inputs, for a profiler (ncu) to compare the two kernels. Not a benchmark: no timing here.

    ncu --clock-control none -k regex:"mha_fwd_sm80|flash_fwd_kernel" -c 2 \
        python3 bench/profile_fwd.py --d 256 --seqlen 4096
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
    args = p.parse_args()
    h = 2048 // args.d
    b = 16384 // args.seqlen
    q, k, v = (torch.randn(b, args.seqlen, h, args.d, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    flash_cuda.flash_attn_func(q, k, v, causal=args.causal)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=args.causal)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
