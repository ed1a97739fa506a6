"""Python side of the CPU emulation of the sm80 backward kernels (bwd_emulated.cpp).

`run_bwd_emulated(dout, q, k, v, out, lse, ...)` pads the head dim to a multiple of 8, writes the
inputs (raw storage + strides), runs the emulator binary for the kernel head dim and returns
(dq, dk, dv) like torch.ops.flash_cuda.bwd, or like varlen_bwd when cu_seqlens_q / cu_seqlens_k
are given (q, out, dout (total_q, h, d), k, v (total_k, hk, d), lse (h, total_q)). Softcap,
ALiBi slopes ((h) or (b, h) fp32) and deterministic mode (`splits` dq slices) as the host passes
them; dropout (fixed length, no softcap / ALiBi) with dropout_p and the forward's rng_state =
(seed, offset).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

import torch

from driver import (_write_storage, emulator_binary, kernel_head_dim, normalize_mask, pad8,
                    sm90_bwd_kernel_head_dim)


LAST_STDOUT = ""


def run_bwd_emulated(dout, q, k, v, out, lse, *, softmax_scale=None, causal=False, window=(-1, -1),
                     softcap=0.0, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
                     max_seqlen_q=None, max_seqlen_k=None, deterministic=False, splits=1,
                     dropout_p=0.0, rng_state=None, philox_on_device=False, timeout=1800,
                     sm90=False):
    varlen = cu_seqlens_q is not None
    d = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = d ** -0.5
    q, k, v, out, dout = pad8(q), pad8(k), pad8(v), pad8(out), pad8(dout)
    dp = q.shape[-1]
    # The binary of the kernel head dim that runs the call: with sm90, that of the sm90 backward
    # (bwd_sm90_host.h bwd_kernel_head_dim: d padded up to 64 / 128 / 192 / 256; its sm80 kernels
    # then run the calls it does not cover, with the columns past d predicated off).
    hd = sm90_bwd_kernel_head_dim(dp) if sm90 else kernel_head_dim(dp)
    if varlen:
        b = cu_seqlens_q.numel() - 1
        sq, sk = int(max_seqlen_q), int(max_seqlen_k)
        total_q, h = q.shape[0], q.shape[1]
        total_k, hk = k.shape[0], k.shape[1]
    else:
        b, sq, h = q.shape[0], q.shape[1], q.shape[2]
        sk, hk = k.shape[1], k.shape[2]
        total_q = total_k = 0
    causal, left, right = normalize_mask(causal, window[0], window[1], sk)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="flash_emu_bwd_"))
    try:
        params = {
            "dtype": "bf16" if q.dtype == torch.bfloat16 else "fp16", "hdim": hd, "b": b, "h": h,
            "hk": hk, "sq": sq, "sk": sk, "d": dp, "scale": repr(float(softmax_scale)),
            "softcap": repr(float(softcap)), "window_left": left, "window_right": right,
            "causal": int(causal), "total_q": total_q, "total_k": total_k,
            "deterministic": int(deterministic), "splits": int(splits),
        }
        if dropout_p > 0:
            seed, offset = (int(x) & ((1 << 64) - 1) for x in rng_state)
            params.update(dropout_p=repr(float(dropout_p)), philox_seed=seed, philox_offset=offset,
                          philox_on_device=int(philox_on_device))
        for name, t in (("q", q), ("k", k), ("v", v), ("o", out), ("do", dout)):
            offset, strides = _write_storage(tmp / f"{name}.bin", t)
            params[f"{name}_offset"] = offset
            if varlen:
                params[f"{name}_batch_stride"] = 0
                params[f"{name}_row_stride"], params[f"{name}_head_stride"] = strides[0], strides[1]
            else:
                (params[f"{name}_batch_stride"], params[f"{name}_row_stride"],
                 params[f"{name}_head_stride"]) = strides[0], strides[1], strides[2]
        lse.float().contiguous().numpy().tofile(tmp / "lse.bin")
        if alibi_slopes is not None:
            slopes = alibi_slopes.float().contiguous()
            slopes.numpy().tofile(tmp / "alibi.bin")
            params["alibi_batch_stride"] = slopes.stride(0) if slopes.dim() == 2 else 0
        if varlen:
            cu_seqlens_q.int().numpy().tofile(tmp / "cu_seqlens_q.bin")
            cu_seqlens_k.int().numpy().tofile(tmp / "cu_seqlens_k.bin")
        (tmp / "params.txt").write_text("".join(f"{k_} {v_}\n" for k_, v_ in params.items()))
        # FLASH_CUDA_EMU_BWD_TILE=n: the v2 tuning variant n (bwd_tune_configs.h) where the head
        # dim has one, as FLASH_CUDA_BWD_TILE=n does in a tuning build.
        tile = int(os.environ.get("FLASH_CUDA_EMU_BWD_TILE", "0") or 0)
        defines = (f"FLASH_CUDA_EMU_BWD_TILE={tile}",) if tile and hd in (64, 128, 256) else ()
        # sm90: the sm90 backward (kernels/sm90/bwd_sm90.cuh) where it covers the call
        # (EMU_SM90=1); the emulator prints "sm90 backward" when it ran (LAST_STDOUT).
        global LAST_STDOUT
        run = subprocess.run([str(emulator_binary(hd, "bwd_emulated", defines)), str(tmp)],
                             check=True, timeout=timeout, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, EMU_SM90="1" if sm90 else "0"))
        LAST_STDOUT = run.stdout

        def load(name, shape):
            raw = torch.from_file(str(tmp / f"{name}.bin"), size=(tmp / f"{name}.bin").stat().st_size // 2,
                                  dtype=torch.int16).clone().view(q.dtype)
            return raw.view(*shape)[..., :d]

        if varlen:
            return (load("dq", (total_q, h, dp)), load("dk", (total_k, hk, dp)),
                    load("dv", (total_k, hk, dp)))
        return load("dq", (b, sq, h, dp)), load("dk", (b, sk, hk, dp)), load("dv", (b, sk, hk, dp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
