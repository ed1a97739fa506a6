"""Python side of the CPU emulation of the sm80 backward kernels (bwd_emulated.cpp).

`run_bwd_emulated(dout, q, k, v, out, lse, ...)` pads the head dim to a multiple of 8, writes the
inputs (raw storage + strides), runs the emulator binary for the kernel head dim and returns
(dq, dk, dv) like torch.ops.flash_cuda.bwd (fixed length, no softcap / ALiBi; dropout with
dropout_p and the forward's rng_state = (seed, offset)).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import tempfile

import torch

from driver import _write_storage, emulator_binary, normalize_mask, pad8

BWD_HEAD_DIMS = (64, 128)


def run_bwd_emulated(dout, q, k, v, out, lse, *, softmax_scale=None, causal=False, window=(-1, -1),
                     dropout_p=0.0, rng_state=None, philox_on_device=False, timeout=1800):
    d = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = d ** -0.5
    q, k, v, out, dout = pad8(q), pad8(k), pad8(v), pad8(out), pad8(dout)
    dp = q.shape[-1]
    hd = next(h for h in BWD_HEAD_DIMS if dp <= h)
    b, sq, h = q.shape[0], q.shape[1], q.shape[2]
    sk, hk = k.shape[1], k.shape[2]
    causal, left, right = normalize_mask(causal, window[0], window[1], sk)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="flash_emu_bwd_"))
    try:
        params = {
            "dtype": "bf16" if q.dtype == torch.bfloat16 else "fp16", "hdim": hd, "b": b, "h": h,
            "hk": hk, "sq": sq, "sk": sk, "d": dp, "scale": repr(float(softmax_scale)),
            "window_left": left, "window_right": right, "causal": int(causal),
        }
        if dropout_p > 0:
            seed, offset = (int(x) & ((1 << 64) - 1) for x in rng_state)
            params.update(dropout_p=repr(float(dropout_p)), philox_seed=seed, philox_offset=offset,
                          philox_on_device=int(philox_on_device))
        for name, t in (("q", q), ("k", k), ("v", v), ("o", out), ("do", dout)):
            offset, strides = _write_storage(tmp / f"{name}.bin", t)
            params[f"{name}_offset"] = offset
            (params[f"{name}_batch_stride"], params[f"{name}_row_stride"],
             params[f"{name}_head_stride"]) = strides[0], strides[1], strides[2]
        lse.float().contiguous().numpy().tofile(tmp / "lse.bin")
        (tmp / "params.txt").write_text("".join(f"{k_} {v_}\n" for k_, v_ in params.items()))
        subprocess.run([str(emulator_binary(hd, "bwd_emulated")), str(tmp)], check=True,
                       timeout=timeout)

        def load(name, shape):
            raw = torch.from_file(str(tmp / f"{name}.bin"), size=(tmp / f"{name}.bin").stat().st_size // 2,
                                  dtype=torch.int16).clone().view(q.dtype)
            return raw.view(*shape)[..., :d]

        return load("dq", (b, sq, h, dp)), load("dk", (b, sk, hk, dp)), load("dv", (b, sk, hk, dp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
