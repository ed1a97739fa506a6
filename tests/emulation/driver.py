"""Python side of the CPU emulation of the sm80 forward kernel (see README.md here).

`run_fwd_emulated(q, k, v, ...)` pads the head dim to a multiple of 8, writes the inputs (raw
storage + strides, so non-contiguous views are passed as they are), runs the emulator binary
for the kernel head dim, and returns (out, lse) like the fwd / varlen_fwd ops.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KERNEL_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)
LAST_STDOUT = ""  # stdout of the last emulator run (run_fwd_emulated)
CUDA_INCLUDE = pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


def kernel_head_dim(d: int) -> int:
    return next(hd for hd in KERNEL_HEAD_DIMS if d <= hd)


def sm90_fwd_kernel_head_dim(d: int) -> int:
    """The sm90 forward kernel that runs head dim d, a multiple of 8 (kernels/sm90/fwd_sm90_host.h
    fwd_kernel_head_dim): d zero-padded up to 64, 128, 192 or 256; 0 for d <= 32 (the sm80
    kernel of head dim 32 runs those)."""
    return 0 if d <= 32 else next(hd for hd in (64, 128, 192, 256) if d <= hd)


def sm90_bwd_kernel_head_dim(d: int, d192: bool = True) -> int:
    """The sm90 backward kernel that runs head dim d, a multiple of 8 (kernels/sm90/bwd_sm90_host.h
    bwd_kernel_head_dim): d zero-padded up to 64, 128, 192 or 256 (d192=False, the host's
    FLASH_CUDA_SM90_BWD192=0: d129-d192 on the d256 kernel)."""
    return next(hd for hd in (64, 128, 192, 256) if d <= hd and (d192 or hd != 192))


def sources() -> list[pathlib.Path]:
    return sorted(HERE.glob("*.cpp")) + sorted(HERE.glob("*.h")) + \
        sorted(HERE.glob("kernels/**/*")) + \
        sorted((ROOT / "csrc" / "kernels").rglob("*.cuh")) + sorted((ROOT / "csrc" / "kernels").rglob("*.h"))


def build_dir() -> pathlib.Path:
    d = pathlib.Path(os.environ.get("FLASH_CUDA_EMU_BUILD", ROOT / "build" / "emulation"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def emulator_binary(head_dim: int, program: str = "fwd_emulated", defines=()) -> pathlib.Path:
    """Builds (if stale) and returns an emulator program (fwd_emulated, bwd_emulated) for one
    kernel head dim; `defines` ("NAME=VALUE" strings) become -D flags and part of the name."""
    suffix = "".join("_" + d.replace("=", "") for d in defines)
    exe = build_dir() / f"{program}_hdim{head_dim}{suffix}"
    newest = max(p.stat().st_mtime for p in sources())
    if exe.exists() and exe.stat().st_mtime >= newest:
        return exe
    cmd = [
        os.environ.get("CXX", "g++"), "-std=c++20", "-O1", "-pthread", "-Wno-psabi",
        f"-DEMU_HEAD_DIM={head_dim}",
        "-include", str(HERE / "prelude.h"), f"-I{HERE}", f"-I{ROOT / 'csrc'}", f"-I{CUDA_INCLUDE}",
        *(f"-D{d}" for d in defines), str(HERE / f"{program}.cpp"), "-o", str(exe) + ".tmp",
    ]
    subprocess.run(cmd, check=True)
    os.replace(str(exe) + ".tmp", exe)
    return exe


def _write_storage(path: pathlib.Path, t: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())
    flat.view(torch.int16).numpy().tofile(path)
    return t.storage_offset(), t.stride()


def pad8(t: torch.Tensor) -> torch.Tensor:
    d = t.shape[-1]
    return t if d % 8 == 0 else torch.nn.functional.pad(t, (0, 8 - d % 8))


def normalize_mask(causal: bool, left: int, right: int, seqlen_k: int):
    """csrc/checks.cpp normalize_mask (flash_attn's host rule)."""
    if left >= seqlen_k:
        left = -1
    if right >= seqlen_k:
        right = -1
    if causal:
        right = 0
    if left < 0 and right == 0:
        causal = True
    return causal, left, right


def run_fwd_emulated(q, k, v, *, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0,
                     alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                     max_seqlen_k=None, seqused_k=None, block_table=None, cache_batch_idx=None,
                     cache_leftpad=None, num_splits=1, pack_gqa=False, dropout_p=0.0,
                     rng_state=None, philox_on_device=False, return_rng_state=False, timeout=1800,
                     keysplit=None, sm90=False, kvcache_op=False, num_sms=132, contig=None,
                     ring=None, head_group=None):
    """CPU tensors in; (out, lse) out, like torch.ops.flash_cuda.fwd / varlen_fwd.

    KV cache / decode extras (the kernel part of fwd_kvcache; no append): block_table (k, v
    paged (num_blocks, page, hk, d); seqlen_k = block_table columns x page), cache_batch_idx,
    cache_leftpad (int32 (b)), num_splits (0 = the host heuristic), pack_gqa (GQA packing where
    kernels/decode.h allows it).
    Dropout: dropout_p with rng_state = (seed, offset) (the mask of csrc/kernels/philox.cuh);
    philox_on_device passes them as device pointers (the CUDA-graph path), and the kernel writes
    the rng_state it used, returned third with return_rng_state.
    keysplit: True / False set FLASH_CUDA_DECODE_KEYSPLIT=1 / 0 for the run (the key-split decode
    tile, on by default, kernels/decode.h), None leaves the environment as it is. sm90: True or
    "pingpong" runs the sm90 forward (kernels/sm90/fwd_sm90.cuh; "pingpong": its variant whose
    warpgroups take turns at the tensor cores) where it covers the call (EMU_SM90; the emulator
    prints "sm90 forward" when it ran). The emulator's stdout (which says which tile ran) is kept
    in LAST_STDOUT. kvcache_op: the kvcache op's host choice of the 128-key tile for d128 16-row
    tiles (kernels/decode.h plan_key_blocks; flash_attn_func's calls do not make it). num_sms: the
    SM count the host's split count and tile choice assume. contig: True / False set
    FLASH_CUDA_DECODE_CONTIG=1 / 0 (the key-split tile's plain calls without a block table on its
    kernel without the paged path; the emulator then prints "no paged path"), None leaves it.
    ring: with kvcache_op, True / False make the host's tile choice that of an sm_90 GPU with
    FLASH_CUDA_DECODE_RING=1 / unset: the warp-specialised ring tiles (kernels/sm80/kv_ring.cuh)
    on every d128 key-split call / where decode.h plan_decode_tile's rule takes them (the
    emulator prints "ring" when they ran); None: a GPU without them. head_group: an int sets
    FLASH_CUDA_DECODE_HGROUP (with pack_gqa: 1 = no head groups, N caps their size; the emulator
    prints "head groups" when they ran), None leaves the environment as it is."""
    global LAST_STDOUT
    varlen = cu_seqlens_q is not None
    d = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = d ** -0.5
    q, k, v = pad8(q), pad8(k), pad8(v)
    dp = q.shape[-1]
    # The binary of the kernel head dim that runs the call: with sm90, that of the sm90 forward
    # where it takes d (its sm80 kernels then run the calls it does not cover, with the columns
    # past d predicated off as for any d below a kernel's head dim), else the sm80 kernel's.
    hd = (sm90_fwd_kernel_head_dim(dp) if sm90 else 0) or kernel_head_dim(dp)
    if varlen:
        b = cu_seqlens_q.numel() - 1
        sq, sk = int(max_seqlen_q), int(max_seqlen_k)
        total_q, h = q.shape[0], q.shape[1]
        hk = k.shape[-2]  # (total_k, hk, d), or paged (num_blocks, page, hk, d)
        total_k = k.shape[0] if block_table is None else 0
    else:
        b, sq, h = q.shape[0], q.shape[1], q.shape[2]
        sk, hk = k.shape[1], k.shape[2]
        total_q = total_k = 0
    if block_table is not None:
        sk = block_table.shape[1] * k.shape[1] if not varlen else int(max_seqlen_k)
    causal, left, right = normalize_mask(causal, window[0], window[1], sk)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="flash_emu_"))
    try:
        params = {
            "dtype": "bf16" if q.dtype == torch.bfloat16 else "fp16", "hdim": hd, "b": b, "h": h,
            "hk": hk, "sq": sq, "sk": sk, "d": dp, "total_q": total_q, "total_k": total_k,
            "scale": repr(float(softmax_scale)),
            "softcap": repr(float(softcap)), "window_left": left, "window_right": right,
            "causal": int(causal), "num_splits": int(num_splits), "pack_gqa": int(pack_gqa),
            "kvcache_op": int(kvcache_op), "num_sms": int(num_sms),
            "ring_device": int(ring is not None),
        }
        if dropout_p > 0:
            seed, offset = (int(x) & ((1 << 64) - 1) for x in rng_state)
            params.update(dropout_p=repr(float(dropout_p)), philox_seed=seed, philox_offset=offset,
                          philox_on_device=int(philox_on_device))
        for name, t in (("q", q), ("k", k), ("v", v)):
            offset, strides = _write_storage(tmp / f"{name}.bin", t)
            params[f"{name}_offset"] = offset
            if varlen:
                params[f"{name}_batch_stride"] = 0
                params[f"{name}_row_stride"], params[f"{name}_head_stride"] = strides[0], strides[1]
            else:
                (params[f"{name}_batch_stride"], params[f"{name}_row_stride"],
                 params[f"{name}_head_stride"]) = strides[0], strides[1], strides[2]
        if alibi_slopes is not None:
            slopes = alibi_slopes.float().contiguous()
            slopes.numpy().tofile(tmp / "alibi.bin")
            params["alibi_batch_stride"] = slopes.stride(0) if slopes.dim() == 2 else 0
        if varlen:
            cu_seqlens_q.int().numpy().tofile(tmp / "cu_seqlens_q.bin")
            cu_seqlens_k.int().numpy().tofile(tmp / "cu_seqlens_k.bin")
        if seqused_k is not None:
            seqused_k.int().numpy().tofile(tmp / "seqused_k.bin")
        if block_table is not None:
            block_table.int().contiguous().numpy().tofile(tmp / "block_table.bin")
            params["bt_cols"], params["page"] = block_table.shape[1], k.shape[1]
            params["num_pages"] = k.shape[0]  # the device-side bound of the table's entries
            if varlen:  # paged k/v are 4-d even with varlen q
                for name, t in (("k", k), ("v", v)):
                    params[f"{name}_batch_stride"] = t.stride(0)
                    params[f"{name}_row_stride"], params[f"{name}_head_stride"] = t.stride(1), t.stride(2)
        if cache_batch_idx is not None:
            cache_batch_idx.int().numpy().tofile(tmp / "cache_batch_idx.bin")
            params["kv_cache_rows"] = k.shape[0]  # the device-side bound of cache_batch_idx
        if cache_leftpad is not None:
            cache_leftpad.int().numpy().tofile(tmp / "leftpad.bin")
        (tmp / "params.txt").write_text("".join(f"{k_} {v_}\n" for k_, v_ in params.items()))
        env = dict(os.environ, EMU_SM90={False: "0", True: "1", "pingpong": "pingpong"}[sm90])
        if keysplit is not None:
            env["FLASH_CUDA_DECODE_KEYSPLIT"] = "1" if keysplit else "0"
        if contig is not None:
            env["FLASH_CUDA_DECODE_CONTIG"] = "1" if contig else "0"
        if head_group is not None:
            env["FLASH_CUDA_DECODE_HGROUP"] = str(int(head_group))
        if ring:
            env["FLASH_CUDA_DECODE_RING"] = "1"
        elif ring is not None:
            env.pop("FLASH_CUDA_DECODE_RING", None)
        run = subprocess.run([str(emulator_binary(hd)), str(tmp)], check=True, timeout=timeout,
                             env=env, stdout=subprocess.PIPE, text=True)
        LAST_STDOUT = run.stdout
        print(run.stdout, end="")
        out_raw = torch.from_file(str(tmp / "o.bin"), size=(tmp / "o.bin").stat().st_size // 2,
                                  dtype=torch.int16).clone().view(q.dtype)
        lse = torch.from_file(str(tmp / "lse.bin"), size=(tmp / "lse.bin").stat().st_size // 4,
                              dtype=torch.float32).clone()
        if varlen:
            out = out_raw.view(total_q, h, dp)[..., :d]
            lse = lse.view(h, total_q)
        else:
            out = out_raw.view(b, sq, h, dp)[..., :d]
            lse = lse.view(b, h, sq)
        if return_rng_state:
            written = torch.from_file(str(tmp / "rng_state.bin"), size=2, dtype=torch.int64).clone()
            return out, lse, written
        return out, lse
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
