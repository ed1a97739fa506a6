"""The sm90 kernels called as the first CUDA work of a thread with no CUDA context current.

The sm90 launchers encode TMA tensor maps with the driver (cuTensorMapEncodeTiled), which fails
with CUDA_ERROR_INVALID_CONTEXT on a thread that no runtime call has bound to the device's
context. The autograd engine's device thread is such a thread at its first backward when every
allocation of that backward is a hit in PyTorch's caching allocator (no cudaMalloc): the
benchmark met it (bench/NOTES.md session 38) once the backward stopped launching fills before its
main kernel. Each case runs in a fresh interpreter, so its threads are new."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from sm90_utils import SM90_GPU, skip_unbuilt_head_dim

pytestmark = [pytest.mark.gpu, SM90_GPU]
ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = r"""
import sys, threading
import torch
import flash_cuda

d = int(sys.argv[1])
# 1 GiB into the caching allocator and back: the allocations below are then cache hits.
torch.empty(1 << 28, device="cuda")
q, k, v, dout = (torch.randn(2, 256, 4, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
torch.cuda.synchronize()
# The forward here; the backward on the autograd engine's device thread, its first work.
out = flash_cuda.flash_attn_func(qg, kg, vg, causal=True)
grads = torch.autograd.grad(out, (qg, kg, vg), dout)
# The forward first thing on a new thread.
result = {}
thread = threading.Thread(target=lambda: result.update(
    out=flash_cuda.flash_attn_func(q, k, v, causal=True)))
thread.start()
thread.join()
torch.cuda.synchronize()
assert "out" in result, "the forward on a new thread raised"
assert all(bool(torch.isfinite(g).all()) for g in grads), "non-finite gradients"
assert torch.equal(result["out"], out.detach()), "the new thread's forward differs"
print("OK")
"""


@pytest.mark.parametrize("d", (64, 128, 192, 256))
def test_first_calls_on_new_threads(d, request):
    skip_unbuilt_head_dim(request)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(d)], capture_output=True, text=True,
                         timeout=120, env=env, cwd=ROOT)
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stderr[-3000:]
