# Sourced by the scripts: a project venv with everything the build and tests need.
# A fresh machine has nothing; this installs it (torch 2.14.1 comes from the local disk here).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLASH_CUDA_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
# No pip cache: the venv alone is ~5.5 GB (torch's CUDA build), and a cache would double what a
# download costs on disk (a CI run once failed with "No space left on device").
export PIP_NO_CACHE_DIR=1
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q "torch==2.14.1" numpy pytest ninja pybind11 setuptools wheel cmake
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$CUDA_HOME/bin:$PATH"
cd "$ROOT"
