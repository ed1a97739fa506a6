#!/usr/bin/env bash
# A/B of builds on the GPU machine in one call: every tree is built once (in parallel, the jobs
# shared), AB_TESTS run in the first variant's tree, then bench/bench_attention.py runs once per
# variant, each in its own process (cuDNN in each, so every variant has a same-process ratio),
# and bench/compare_runs.py tables them. Everything lands packed in $OUT/ab.tgz plus $OUT/ab.md
# and $OUT/summary.txt (three files back).
#
#   AB_VARIANTS="new:. main:ab_main kv64:.:FLASH_CUDA_DECODE_KV128=0" \
#   AB_BENCH_ARGS="--modes decode --decode-grid --impls flash_cuda,cudnn" \
#   AB_TESTS="tests/test_kvcache_gpu.py tests/test_paged_gpu.py" FLASH_CUDA_HEADDIMS=128 \
#   OUT=$OUT bash scripts/ab_bench.sh
#
# A variant is NAME:DIR[:VAR=VALUE,VAR=VALUE...]: DIR (relative to the repository root) is a tree
# with setup.py, built in place; the variables are set for its bench process only. The first
# variant is the reference of the ratios. A reference tree is made on the CPU machine before the
# call, e.g. `git archive main | tar -x -C ab_main` (an untracked folder travels with the call).
# Also: AB_SKIP_BUILD=1 (trees already built), AB_BENCH_TIMEOUT (150 s per variant), DEADLINE
# (560 s: variants not started by then are skipped), AB_COMPARE_ARGS (e.g. --section
# decode_grid), FLASH_CUDA_HEADDIMS / FLASH_CUDA_ARCHS (90a) for the builds.
set -uo pipefail
: "${OUT:?set OUT to the output folder}"
: "${AB_VARIANTS:?set AB_VARIANTS to NAME:DIR[:VAR=VALUE,...] ...}"
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONUNBUFFERED=1 FLASH_CUDA_ARCHS="${FLASH_CUDA_ARCHS:-90a}"
if [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda ]; then export CUDA_HOME=/usr/local/cuda; fi
# As gpu_check.sh: a CXX without a shared libstdc++ is refused by setup.py; use the system g++.
if [ -n "${CXX:-}" ] && ! [ -e "$("$CXX" -print-file-name=libstdc++.so 2>/dev/null)" ]; then
    export CXX=g++
fi
DEADLINE=${DEADLINE:-560}
R=$OUT/ab
mkdir -p "$R"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }

read -r -a variants <<< "$AB_VARIANTS"
dirs=()
for v in "${variants[@]}"; do
    dir=$(cut -d: -f2 <<< "$v")
    [[ " ${dirs[*]} " == *" $dir "* ]] || dirs+=("$dir")
done

# Builds, in parallel; MAX_JOBS split between them.
if [ "${AB_SKIP_BUILD:-0}" != 1 ]; then
    jobs=$(( ${MAX_JOBS:-16} / ${#dirs[@]} ))
    [ "$jobs" -lt 1 ] && jobs=1
    i=0
    for dir in "${dirs[@]}"; do
        log="$R/build_$i.log"
        (cd "$ROOT/$dir" && MAX_JOBS=$jobs FLASH_CUDA_PTXAS_VERBOSE=1 timeout 330 \
            python3 setup.py build_ext --inplace > "$log" 2>&1
         echo "build $dir: rc $? at ${SECONDS}s; $(python3 "$ROOT/scripts/ptxas_summary.py" "$log" \
             | head -1)" >> "$OUT/summary.txt") &
        i=$(( i + 1 ))
    done
    wait
    cat "$OUT/summary.txt"
fi

# Tests in the first variant's tree (its environment too).
first_dir=$(cut -d: -f2 <<< "${variants[0]}")
first_env=$(cut -s -d: -f3 <<< "${variants[0]}" | tr ',' ' ')
if [ -n "${AB_TESTS:-}" ]; then
    eval "selection=(${AB_TESTS})"
    (cd "$ROOT/$first_dir" && env PYTHONPATH="$PWD" $first_env timeout 240 python3 -m pytest \
        "${selection[@]}" -m gpu -q -p no:cacheprovider -x -o faulthandler_timeout=100 \
        > "$R/tests.log" 2>&1)
    say "tests (${variants[0]}): rc $? $(tail -1 "$R/tests.log") at ${SECONDS}s"
fi

# One bench process per variant.
args=()
for v in "${variants[@]}"; do
    name=$(cut -d: -f1 <<< "$v")
    dir=$(cut -d: -f2 <<< "$v")
    envs=$(cut -s -d: -f3 <<< "$v" | tr ',' ' ')
    if [ "$SECONDS" -gt "$DEADLINE" ]; then
        say "bench $name: skipped at ${SECONDS}s (DEADLINE ${DEADLINE}s)"
        continue
    fi
    # shellcheck disable=SC2086  # AB_BENCH_ARGS is a list of arguments; envs VAR=VALUE words
    (cd "$ROOT/$dir" && env PYTHONPATH="$PWD" $envs timeout "${AB_BENCH_TIMEOUT:-150}" \
        python3 bench/bench_attention.py ${AB_BENCH_ARGS:-} --no-ceilings --out "$R/$name" \
        > "$R/bench_$name.log" 2>&1)
    say "bench $name ($dir ${envs:-}): rc $? at ${SECONDS}s"
    [ -f "$R/$name/bench.json" ] && args+=("$name=$R/$name/bench.json")
done

if [ "${#args[@]}" -gt 0 ]; then
    # shellcheck disable=SC2086
    python3 bench/compare_runs.py "${args[@]}" ${AB_COMPARE_ARGS:-} > "$OUT/ab.md" 2>&1
    tail -n "$(( ${#args[@]} * 2 + 1 ))" "$OUT/ab.md"
fi
(cd "$OUT" && tar czf ab.tgz ab && rm -rf ab)
cat "$OUT/summary.txt"
