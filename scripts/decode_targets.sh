#!/usr/bin/env bash
# Issue 5's decode measurements beyond the default one-token grid, in one device call (d128
# build, no tests): each run is a scripts/gpu_check.sh bench in its own folder, all packed into
# $OUT/all.tgz (a device call brings back at most 8 files), with the targets' counts printed last.
#   - the one-token grid under the read flush (clean L2) with FA2, paged 16 / 256 and read_floor;
#   - the 4 and 8 query-token grid (memset flush), the same implementations;
#   - explicit num_splits sweeps on the 128 MiB cells, under both flushes.
# The memset-flush one-token grid is gpu_check.sh's own BENCH_ARGS run (bench/NOTES.md).
#
#   OUT=/tmp/out bash scripts/decode_targets.sh        (SKIP_BUILD=1: the extension is built)
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
cd "$(dirname "$0")/.."
R=$OUT
common="--no-gqa --modes decode"
grid="$common --decode-grid --paged 16,256 --impls flash_cuda,cudnn,fa2,read_floor"

FLASH_CUDA_HEADDIMS=${FLASH_CUDA_HEADDIMS:-128} SKIP_TESTS=1 DEADLINE=200 OUT=$R/read \
    BENCH_ARGS="$grid --l2-flush read" bash scripts/gpu_check.sh > "$R/read.out" 2>&1
SKIP_BUILD=1 SKIP_TESTS=1 DEADLINE=170 OUT=$R/q48 \
    BENCH_ARGS="$grid --decode-q 4,8" bash scripts/gpu_check.sh > "$R/q48.out" 2>&1

# The 128 MiB cells (K+V), two per head shape: query heads, KV heads, head dim : b,kv;b,kv
for flush in memset read; do
    for shape in "32,8,128:1,32768;32,1024" "32,32,128:1,8192;8,1024" "32,1,128:8,32768;32,8192"
    do
        heads=${shape%%:*}
        SKIP_BUILD=1 SKIP_TESTS=1 DEADLINE=60 OUT="$R/sweep_${flush}_${heads//,/_}" \
            BENCH_ARGS="$common --decode-cases ${shape#*:} --decode-shape $heads \
--decode-splits 1,2,4,8,16,24,33,48,64 --impls flash_cuda,cudnn,read_floor --l2-flush $flush" \
            bash scripts/gpu_check.sh > /dev/null 2>&1
    done
done

cd "$R" && tar czf /tmp/decode_targets.tgz . && find . -mindepth 1 -delete &&
    mv /tmp/decode_targets.tgz all.tgz
for run in read q48; do
    echo "== $run"
    tar xzf all.tgz "./$run/summary.txt" -O
    tar xzf all.tgz "./$run/bench.md" -O | sed -n "/Issue 5's targets/,\$p" | grep -E '^- |^####'
done
