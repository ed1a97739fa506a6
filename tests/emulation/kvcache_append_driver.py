"""Python side of the CPU emulation of the KV-cache append kernel
(csrc/kernels/kvcache_append.cuh; harness kvcache_append_emulated.cpp).

`run_append_emulated(case, grid=0)` writes a case's tensors (raw storage + strides, so views run
as they are), runs the kernel on the CPU and returns (k_cache, v_cache, q_rot) after the append:
the caches as tensors shaped like the case's, q_rot (b, sq, h, d) or None without rotary.
The binary is built with AddressSanitizer (reads out of bounds abort the run).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile

import numpy as np
import torch

from driver import CUDA_INCLUDE, HERE, ROOT, build_dir

SOURCES = [HERE / "kvcache_append_emulated.cpp", HERE / "prelude.h", HERE / "host_io.h",
           ROOT / "csrc" / "kernels" / "kvcache_append.cuh", ROOT / "csrc" / "kernels" / "convert.cuh",
           ROOT / "csrc" / "kernels" / "kvcache_append.h"]


def append_binary() -> pathlib.Path:
    exe = build_dir() / "kvcache_append_emulated"
    newest = max(p.stat().st_mtime for p in SOURCES)
    if exe.exists() and exe.stat().st_mtime >= newest:
        return exe
    cmd = [
        os.environ.get("CXX", "g++"), "-std=c++20", "-O1", "-g", "-pthread",
        "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
        "-include", str(HERE / "prelude.h"), f"-I{HERE}", f"-I{ROOT / 'csrc'}", f"-I{CUDA_INCLUDE}",
        str(HERE / "kvcache_append_emulated.cpp"), "-o", str(exe) + ".tmp",
    ]
    subprocess.run(cmd, check=True)
    os.replace(str(exe) + ".tmp", exe)
    return exe


def _storage_bytes(t: torch.Tensor) -> bytes:
    """The elements a view can reach, from its storage offset on (16-bit elements)."""
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    return flat[t.storage_offset():t.storage_offset() + span].view(torch.int16).numpy().tobytes()


def _from_storage(raw: bytes, like: torch.Tensor) -> torch.Tensor:
    flat = torch.from_numpy(np.frombuffer(raw, dtype=np.int16).copy()).view(like.dtype)
    return flat.as_strided(like.shape, like.stride())


# The kernel's seqlens_out (cache_seqlens + new tokens, int32 (b)) of the last run, or None when
# the run had no new tokens or no cache_seqlens.
LAST_SEQLENS = None


def run_append_emulated(case, grid: int = 0):
    a = case["args"]
    q, kc, vc = a["q"], a["k_cache"], a["v_cache"]
    b, sq, h, d = q.shape
    s_new = 0 if a["k"] is None else a["k"].shape[1]
    rotary = a["rotary_cos"] is not None
    from kvcache_append_cases import q_positions_per_row

    params = dict(
        b=b, seqlen_new=s_new, h_k=kc.shape[2], d=d, cache_batch=kc.shape[0],
        capacity=case["capacity"], grid=grid, is_bf16=int(q.dtype == torch.bfloat16),
        rotary_dim=2 * a["rotary_cos"].shape[1] if rotary else 0,
        seqlen_ro=a["rotary_cos"].shape[0] if rotary else 0,
        rotary_interleaved=int(case["interleaved"]), q_positions_per_row=int(q_positions_per_row(case)),
        seqlen_q=sq, h=h, block_table_batch_stride=0, max_blocks=0, page_size=0,
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for name, t in (("knew", a["k"]), ("vnew", a["v"]), ("kcache", kc), ("vcache", vc), ("q", q)):
            if t is not None and t.numel() > 0:
                (tmp / f"{name}.bin").write_bytes(_storage_bytes(t))
            strides = t.stride() if t is not None else (0, 0, 0, 0)
            params[f"{name}_offset"] = 0
            params[f"{name}_batch_stride"], params[f"{name}_row_stride"], \
                params[f"{name}_head_stride"] = strides[:3]
        if rotary:
            (tmp / "cos.bin").write_bytes(a["rotary_cos"].contiguous().view(torch.int16).numpy().tobytes())
            (tmp / "sin.bin").write_bytes(a["rotary_sin"].contiguous().view(torch.int16).numpy().tobytes())
        for name in ("cache_seqlens", "cache_batch_idx", "block_table"):
            if a[name] is not None:
                (tmp / f"{name}.bin").write_bytes(a[name].contiguous().numpy().tobytes())
        if a["block_table"] is not None:
            params.update(block_table_batch_stride=a["block_table"].shape[1],
                          max_blocks=a["block_table"].shape[1], page_size=kc.shape[1])
        (tmp / "params.txt").write_text("".join(f"{k} {v}\n" for k, v in params.items()))
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
        subprocess.run([str(append_binary()), str(tmp)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        k_out = _from_storage((tmp / "kcache.out.bin").read_bytes(), kc)
        v_out = _from_storage((tmp / "vcache.out.bin").read_bytes(), vc)
        global LAST_SEQLENS
        seqlens_file = tmp / "seqlens.out.bin"
        LAST_SEQLENS = (torch.from_numpy(np.frombuffer(seqlens_file.read_bytes(), dtype=np.int32)
                                         .copy()) if seqlens_file.exists() else None)
        q_rot = None
        if rotary and q.numel() > 0:
            q_rot = torch.from_numpy(np.frombuffer((tmp / "qrot.bin").read_bytes(), dtype=np.int16)
                                     .copy()).view(q.dtype).view(b, sq, h, d)
    return k_out, v_out, q_rot
