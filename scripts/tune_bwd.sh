#!/usr/bin/env bash
# Backward v2 tile tuning on the GPU machine, one device call: a tuning build
# (FLASH_CUDA_BWD_TUNING=1: every variant of csrc/kernels/sm80/bwd_tune_configs.h compiled in,
# plus bwd.cuh's kernels at every head dim), then the fwd+bwd grid once per FLASH_CUDA_BWD_TILE
# value (each bench run is its own process: the variant is read once per process), FA2 in the
# same process as each. Variant 0 = BwdV2Config, 1..3 (d64: 1..6) = bwd_tune_configs.h, 9 = bwd.cuh.
# TUNE_TESTS=1 also runs tests/test_bwd_gpu.py under each variant (TUNE_TEST_ARGS: extra
# pytest arguments, e.g. -k "hdim256"). Needs $OUT. Head dims / seqlens via TUNE_BENCH_ARGS.
# If the build and all five bench runs do not fit one 600 s device call, split it:
#   OUT=$OUT TUNE_VARIANTS="0 9" bash scripts/tune_bwd.sh                 (build, v2 vs bwd.cuh)
#   OUT=$OUT SKIP_BUILD=1 TUNE_VARIANTS="1 2 3" bash scripts/tune_bwd.sh  (same warm machine)
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
ARGS=${TUNE_BENCH_ARGS:---modes fwdbwd --heads-dims 64,128,256 --seqlens 1024,4096,16384 --causal both --no-gqa}
if [ "${SKIP_BUILD:-0}" != 1 ]; then  # SKIP_BUILD=1: a second call on the same warm machine
    FLASH_CUDA_BWD_TUNING=1 FLASH_CUDA_HEADDIMS=${FLASH_CUDA_HEADDIMS:-64,128,256} SKIP_BENCH=1 \
        SKIP_TESTS=${SKIP_TESTS:-1} DEADLINE=${BUILD_DEADLINE:-420} bash scripts/gpu_check.sh \
        > "$OUT/check.log" 2>&1
    tail -n 12 "$OUT/check.log"
fi
eval "targs=(${TUNE_TEST_ARGS:-})"
for v in ${TUNE_VARIANTS:-0 1 2 3 9}; do
    if [ "${TUNE_TESTS:-0}" = 1 ]; then
        echo "== variant $v: tests"
        FLASH_CUDA_BWD_TILE=$v timeout 120 python3 -m pytest tests/test_bwd_gpu.py -m gpu -q \
            -p no:cacheprovider --maxfail=5 "${targs[@]}" 2>&1 | tail -n 3
    fi
    mkdir -p "$OUT/v$v"
    FLASH_CUDA_BWD_TILE=$v timeout ${TUNE_BENCH_TIMEOUT:-120} python3 bench/bench_attention.py \
        $ARGS --impls flash_cuda,fa2 --no-ceilings --out "$OUT/v$v" > "$OUT/v$v/log" 2>&1 \
        || echo "variant $v bench rc $?"
done
for v in ${TUNE_VARIANTS:-0 1 2 3 9}; do
    echo "== FLASH_CUDA_BWD_TILE=$v"
    python3 bench/bench_report.py "$OUT/v$v/bench.json" --compact 2>&1 | grep -E '^\|' | cut -c1-110
    rm -f "$OUT/v$v/bench.md"
done
