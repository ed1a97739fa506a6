#!/usr/bin/env bash
# Forward tile tuning on the GPU machine, one device call: a tuning build (every variant of
# csrc/kernels/sm80/tune_configs.h compiled in), the forward GPU tests under each variant, and
# the forward grid for each variant (flash_cuda alone), then once with the peers (variant 0).
# TUNE_TEST_ARGS: extra pytest arguments for the per-variant test runs (e.g. -k).
# Prints one compact table per variant. Needs $OUT. Head dims/seqlens via TUNE_BENCH_ARGS.
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
ARGS=${TUNE_BENCH_ARGS:---modes fwd --heads-dims 64,128,256 --seqlens 1024,4096,16384 --no-gqa}
FLASH_CUDA_FWD_TUNING=1 SKIP_BENCH=1 PYTEST_MAXFAIL=${PYTEST_MAXFAIL:-30} DEADLINE=300 \
    GPU_TESTS="${GPU_TESTS:-tests/test_fwd_gpu.py tests/test_combine_gpu.py tests/test_ptx_wrappers.py}" \
    bash scripts/gpu_check.sh > "$OUT/check.log" 2>&1
tail -n 12 "$OUT/check.log"
eval "targs=(${TUNE_TEST_ARGS:-})"
for v in ${TUNE_VARIANTS:-1 2 3}; do
    echo "== variant $v: tests"
    FLASH_CUDA_FWD_TILE=$v timeout 90 python3 -m pytest tests/test_fwd_gpu.py -m gpu -q \
        -p no:cacheprovider --maxfail=5 "${targs[@]}" 2>&1 | tail -n 3
    mkdir -p "$OUT/v$v"
    FLASH_CUDA_FWD_TILE=$v timeout 120 python3 bench/bench_attention.py $ARGS --impls flash_cuda \
        --no-ceilings --out "$OUT/v$v" > "$OUT/v$v/log" 2>&1 || echo "variant $v bench rc $?"
done
mkdir -p "$OUT/v0"
timeout 150 python3 bench/bench_attention.py $ARGS --impls flash_cuda,cudnn,fa2 --out "$OUT/v0" \
    > "$OUT/v0/log" 2>&1 || echo "variant 0 bench rc $?"
for v in 0 ${TUNE_VARIANTS:-1 2 3}; do
    echo "== variant $v"
    python3 bench/bench_report.py "$OUT/v$v/bench.json" --compact 2>&1 | grep -E '^\|' | cut -c1-100
    rm -f "$OUT/v$v/bench.md"
done
