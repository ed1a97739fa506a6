#!/usr/bin/env bash
# Wheel check: build ONE abi3 wheel of flash_cuda, install it into a fresh venv that has nothing
# but torch, and run a small CPU forward and backward through the public API against naive
# attention.
#
#   FLASH_CUDA_HEADDIMS=none bash scripts/test_wheel.sh
#
# Environment: PYTHON (the build interpreter, which needs torch, setuptools, wheel and ninja;
# default: python), FLASH_CUDA_HEADDIMS / FLASH_CUDA_ARCHS / MAX_JOBS (passed to setup.py),
# TORCH_SPEC (what the fresh venv installs; default torch==2.14.1), DIST (wheel folder; default
# dist/), KEEP_VENV=1 keeps the temporary venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1}"
DIST="${DIST:-$ROOT/dist}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export MAX_JOBS="${MAX_JOBS:-2}"

echo "== building the wheel (FLASH_CUDA_HEADDIMS='${FLASH_CUDA_HEADDIMS-}'," \
     "FLASH_CUDA_ARCHS='${FLASH_CUDA_ARCHS-}')"
mkdir -p "$DIST"
rm -f "$DIST"/flash_cuda-*.whl
"$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$DIST" .

shopt -s nullglob
wheels=("$DIST"/flash_cuda-*.whl)
shopt -u nullglob
if [ "${#wheels[@]}" -ne 1 ]; then
    echo "FAIL: expected exactly one flash_cuda wheel in $DIST, found ${#wheels[@]}: ${wheels[*]-}" >&2
    exit 1
fi
WHEEL="${wheels[0]}"
case "$(basename "$WHEEL")" in
    *-abi3-*) ;;
    *) echo "FAIL: $(basename "$WHEEL") is not an abi3 wheel" >&2; exit 1 ;;
esac
echo "== wheel: $(basename "$WHEEL")"
"$PYTHON" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
ext = [n for n in names if n.startswith("flash_cuda/_C") and n.endswith(".so")]
assert ext == ["flash_cuda/_C.abi3.so"], f"extension in the wheel: {ext}"
assert "flash_cuda/__init__.py" in names, names
print(f"   {len(names)} files, extension {ext[0]}")
EOF

WORK="$(mktemp -d "${TMPDIR:-/tmp}/flash_cuda_wheel.XXXXXX")"
cleanup() { if [ "${KEEP_VENV:-0}" != 1 ]; then rm -rf "$WORK"; fi; }
trap cleanup EXIT
echo "== fresh venv in $WORK/venv: $TORCH_SPEC + the wheel"
# A plain venv of the base interpreter (no --system-site-packages): only what we install.
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q "$TORCH_SPEC"
"$VPY" -m pip install -q --no-deps "$WHEEL"

echo "== CPU forward through the installed package"
cd "$WORK"  # not the source tree: `import flash_cuda` must find the installed one
"$VPY" - <<'EOF'
import math
import pathlib

import torch
import flash_cuda

where = pathlib.Path(flash_cuda.__file__).resolve()
assert "site-packages" in where.parts, f"imported flash_cuda from {where}, not the venv"
print(f"   flash_cuda {flash_cuda.__version__} from {where.parent}, torch {torch.__version__}")


def naive(q, k, v, scale, causal):
    """softmax(q k^T * scale) v in fp64, (b, s, h, d), GQA, bottom-right causal."""
    sq, sk, h, hk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    qd = q.double().transpose(1, 2)
    kd = k.double().repeat_interleave(h // hk, dim=2).transpose(1, 2)
    vd = v.double().repeat_interleave(h // hk, dim=2).transpose(1, 2)
    s = qd @ kd.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + sk - sq, -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ vd).transpose(1, 2)


torch.manual_seed(0)
worst = 0.0
for (b, sq, sk, h, hk, d, causal) in [(2, 33, 47, 4, 4, 64, False), (1, 40, 40, 6, 2, 32, True)]:
    q, k, v = (torch.randn(b, s, n, d, requires_grad=True)
               for s, n in ((sq, h), (sk, hk), (sk, hk)))
    dout = torch.randn(b, sq, h, d)
    scale = d ** -0.5
    out = flash_cuda.flash_attn_func(q, k, v, causal=causal)
    ref = naive(q, k, v, scale, causal)
    err = (out.double() - ref).abs().max().item()
    # The backward through the package's autograd (the extension's C++ Functions).
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout.double())
    grad_err = max((g.double() - r).abs().max().item() for g, r in zip(grads, ref_grads))
    worst = max(worst, err, grad_err)
    print(f"   flash_cuda.flash_attn_func b={b} sq={sq} sk={sk} h={h} hk={hk} d={d} "
          f"causal={causal}: max |out - naive| = {err:.2e}, max |grad - naive's| = "
          f"{grad_err:.2e}")
assert worst < 1e-4, f"max error {worst:.2e} >= 1e-4"
print("   OK")
EOF
echo "== PASS: $(basename "$WHEEL") installs into a fresh venv and matches naive attention"
