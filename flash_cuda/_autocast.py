"""torch.autocast rules of the attention ops (fwd, varlen_fwd, fwd_kvcache), on CPU and CUDA.

flash_attn 2.x registers no autocast rule: under torch.autocast its ops see the inputs as they
come, and fp32 q/k/v raise "FlashAttention only support fp16 and bf16 data type". flash_cuda
keeps every call that works with flash_attn unchanged and makes the failing one work the way
torch's own scaled_dot_product_attention does under autocast:

  * fwd / varlen_fwd: inside an autocast region of the inputs' device, fp32 q, k, v are cast to
    that region's dtype (torch.get_autocast_dtype); fp16/bf16 inputs pass through as they are
    (no fp16 <-> bf16 conversion, so outputs keep the dtype they have with flash_attn) and
    alibi_slopes stays fp32. The casts are ordinary autograd ops: the gradients reach fp32
    leaves (master weights, fp32 activations) in fp32.
  * fwd_kvcache: the caches are updated in place and cannot be cast, so fp32 q, new k/v and
    rotary cos/sin follow the caches' dtype when the caches are fp16/bf16; an fp32 cache on
    CUDA still gets the dtype error.
  * bwd / varlen_bwd / combine_splits: no rule (autograd feeds the backward the dtypes of the
    forward).

The rule is a kernel at the AutocastCPU / AutocastCUDA dispatch keys (what
torch.library.register_autocast does, with a per-argument cast instead of its "every floating
tensor to one fixed dtype", which would also cast alibi_slopes and fp16 inputs).
"""

from __future__ import annotations

import torch

_AUTOCAST_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}
_lib = torch.library.Library("flash_cuda", "IMPL")  # kept alive: owns the registrations


def _to(t, dtype, device_type):
    """t cast to dtype when it is an fp32 tensor on device_type; otherwise t itself."""
    if (isinstance(t, torch.Tensor) and t.dtype == torch.float32
            and t.device.type == device_type):
        return t.to(dtype)
    return t


def _cast_qkv(args, device_type):
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(_to(a, dtype, device_type) if i < 3 else a for i, a in enumerate(args))


# fwd_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, rotary_cos, rotary_sin, ...)
_KVCACHE_CAST = (0, 3, 4, 6, 7)


def _cast_kvcache(args, device_type):
    cache_dtype = args[1].dtype
    if cache_dtype not in (torch.float16, torch.bfloat16):
        return args
    return tuple(_to(a, cache_dtype, device_type) if i in _KVCACHE_CAST else a
                 for i, a in enumerate(args))


def _register(name, cast):
    op = getattr(torch.ops.flash_cuda, name).default
    for device_type, key_name in _AUTOCAST_KEYS.items():
        key = getattr(torch._C.DispatchKey, key_name)

        def run(*args, _key=key, _device_type=device_type):
            # Below this autocast key from here on: the op's autograd and device kernels.
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_key)):
                return op(*cast(args, _device_type))

        def kernel(_keyset, *args, _run=run):
            return _run(*args)

        _lib.impl(name, kernel, key_name, with_keyset=True)
        # The same rule where the Python dispatcher resolves kernels (torch.compile tracing).
        op.py_kernels.pop(key, None)
        op.py_impl(key)(run)


_register("fwd", _cast_qkv)
_register("varlen_fwd", _cast_qkv)
_register("fwd_kvcache", _cast_kvcache)
