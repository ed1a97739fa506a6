#!/usr/bin/env bash
# The one script for the H200 machine: build in place, GPU tests, benchmark, short table last.
# Run from the repository root; $OUT is the folder whose files come back (logs, bench.json/.md).
#
#   OUT=/tmp/out bash scripts/gpu_check.sh
#   SKIP_BUILD=1 SKIP_TESTS=1 BENCH_ARGS="--heads-dims 128 --modes fwd" bash scripts/gpu_check.sh
#
# Environment (all optional):
#   FLASH_CUDA_HEADDIMS  kernel head dims to build ("64,128"; default all)   FLASH_CUDA_ARCHS (90a)
#   SKIP_BUILD=1  SKIP_TESTS=1  SKIP_BENCH=1     leave a step out
#   FIRST_TESTS   a pytest selection run before the others with its own short timeout
#                 (FIRST_TIMEOUT, 150 s), e.g. new kernels' tests: a hang there costs little (and
#                 the other test steps are then skipped)
#   GPU_TESTS     pytest selection, e.g. "tests/test_fwd_gpu.py -k hdim128" (default: tests)
#   SM80_TESTS    a pytest selection run again after the tests with FLASH_CUDA_SM90=0: the sm80
#                 kernels (what an A100 runs) on the calls the sm90 ones take by default here,
#                 e.g. "tests -k 'not sm90'"
#   SANITIZE      compute-sanitizer tools to run scripts/sanitize_kernels.py under (small ragged
#                 calls of every kernel family), e.g. "memcheck" or "memcheck racecheck"; each
#                 runs with the default kernels and with FLASH_CUDA_SM90=0 (SANITIZE_TIMEOUT, 240 s
#                 per run); SANITIZE_MODES ("default 0") picks those, SANITIZE_ARGS are the
#                 script's arguments, e.g. "--only dropout_calls"
#   PYTEST_MAXFAIL (1)  stop after this many failing tests
#   PYTEST_TIMEOUT (420)  BUILD_TIMEOUT (480)  BENCH_TIMEOUT (540)   seconds per step
#   BENCH_ARGS    arguments of bench/bench_attention.py (default: --quick; --full: the grid)
#   DEADLINE      seconds from the start by which everything must be done (default 585: one
#                 device call may run 600 s); later steps get what is left.
#   PACK_LOGS=1   pack the logs into $OUT/logs.tgz at the end (a caller that brings back only a
#                 few files then still gets every log: the build, the tests, the sanitizers)
# The summary also goes to $OUT/summary.txt.
# Exit status: non-zero if the build or the tests failed (the bench only reports).
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
if [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda ]; then export CUDA_HOME=/usr/local/cuda; fi
# The H200 image sets CXX=/opt/gcc/bin/g++, a GCC with only libstdc++.a, which setup.py refuses
# (an extension with its own libstdc++ crashes on error messages): use the system g++ there.
if [ -n "${CXX:-}" ] && ! [ -e "$("$CXX" -print-file-name=libstdc++.so 2>/dev/null)" ]; then
    echo "CXX=$CXX has no shared libstdc++; building with CXX=g++"
    export CXX=g++
fi
DEADLINE=${DEADLINE:-585}
SUMMARY=()
status=0

# want SKIP NAME LIMIT: false when the step is skipped; else sets $t, the step's timeout: its
# LIMIT or what is left before DEADLINE (15 s kept for the summary); under 20 s it is not started.
want() {
    [ "$1" = 1 ] && return 1
    t=$(( DEADLINE - SECONDS - 15 ))
    [ "$t" -gt "$3" ] && t=$3
    [ "$t" -ge 20 ] && return 0
    SUMMARY+=("$2: not run, no time left before DEADLINE=${DEADLINE}s"); echo "${SUMMARY[-1]}"
    return 1
}

echo "== machine"
timeout 20 nvidia-smi --format=csv,noheader --query-gpu=name,driver_version,memory.used,\
memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw 2>&1 | head -2
timeout 60 python3 -c "import sys, torch
from torch.backends import cudnn
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cudnn', cudnn.version())"

# (a) build in place, with the ptxas resource report
if want "${SKIP_BUILD:-0}" build "${BUILD_TIMEOUT:-480}"; then
    echo "== build (timeout ${t}s, head dims ${FLASH_CUDA_HEADDIMS:-all})"
    start=$SECONDS
    MAX_JOBS=16 FLASH_CUDA_ARCHS="${FLASH_CUDA_ARCHS:-90a}" FLASH_CUDA_PTXAS_VERBOSE=1 \
        timeout "$t" python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
    rc=$?
    ptxas=$(timeout 60 python3 scripts/ptxas_summary.py "$OUT/build.log")
    if [ $rc -eq 0 ]; then
        SUMMARY+=("build: ok in $(( SECONDS - start )) s; $ptxas")
    else
        status=1
        SUMMARY+=("build: FAILED (rc $rc$([ $rc -eq 124 ] && echo ', timeout'))"\
" after $(( SECONDS - start )) s; $ptxas")
        errors=$(grep -m 12 -E 'error:|error |FAILED:' "$OUT/build.log")
        SUMMARY+=("${errors:-$(tail -5 "$OUT/build.log")}")
    fi
    echo "${SUMMARY[-1]}"
fi

# run_tests LABEL LOG [VAR=VALUE ...] -- PYTEST_ARGS...: a pytest run of the tests marked gpu,
# with those environment variables, under timeout $t; its outcome goes to SUMMARY (and status).
run_tests() {
    local label=$1 log=$2 envs=() rc line
    shift 2
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    echo "== $label: $* (timeout ${t}s)"
    env "${envs[@]}" timeout "$t" python3 -m pytest "$@" -m gpu -q -p no:cacheprovider \
        > "$OUT/$log" 2>&1
    rc=$?
    line=$(grep -E 'passed|failed|error|skipped|deselected|no tests ran' "$OUT/$log" | tail -1)
    case $rc in
        0) SUMMARY+=("$label: ok: $line") ;;
        5) SUMMARY+=("$label: none selected: $line") ;;
        124) status=1; SUMMARY+=("$label: TIMEOUT after ${t}s (a hang?): $line") ;;
        *) status=1; SUMMARY+=("$label: FAILED (rc $rc): $line")
           SUMMARY+=("$(grep -m 8 -E '^(FAILED|ERROR)|^E ' "$OUT/$log")") ;;
    esac
    echo "${SUMMARY[-1]}"
    return $rc
}

# (b0) the FIRST_TESTS selection, short timeout
if [ -n "${FIRST_TESTS:-}" ] && want "${SKIP_TESTS:-0}" first-tests "${FIRST_TIMEOUT:-150}"; then
    eval "first=(${FIRST_TESTS})"
    first_rc=0
    run_tests "first tests" first_tests.log -- "${first[@]}" -o faulthandler_timeout=60 ||
        first_rc=$?
    if [ "$first_rc" -eq 124 ]; then
        SKIP_TESTS=1  # a hang there would hang the whole selection again
        SUMMARY+=("tests: not run (the first selection timed out)")
    fi
fi

# (b) GPU tests, stop after PYTEST_MAXFAIL failures
if want "${SKIP_TESTS:-0}" tests "${PYTEST_TIMEOUT:-420}"; then
    eval "selection=(${GPU_TESTS:-tests})"
    run_tests tests tests.log -- "${selection[@]}" --maxfail="${PYTEST_MAXFAIL:-1}" \
        -o faulthandler_timeout=120
fi

# (b2) the SM80_TESTS selection with the sm90 kernels switched off
if [ -n "${SM80_TESTS:-}" ] && want "${SKIP_TESTS:-0}" sm80-tests "${PYTEST_TIMEOUT:-420}"; then
    eval "selection=(${SM80_TESTS})"
    run_tests "sm80 tests (FLASH_CUDA_SM90=0)" sm80_tests.log FLASH_CUDA_SM90=0 -- \
        "${selection[@]}" --maxfail="${PYTEST_MAXFAIL:-1}" -o faulthandler_timeout=120
fi

# (b3) compute-sanitizer over scripts/sanitize_kernels.py
for tool in ${SANITIZE:-}; do
    for sm90 in ${SANITIZE_MODES:-default 0}; do
        want "${SKIP_TESTS:-0}" "sanitize $tool" "${SANITIZE_TIMEOUT:-240}" || continue
        log="sanitize_${tool}_sm90${sm90}.log"
        echo "== compute-sanitizer --tool $tool (FLASH_CUDA_SM90=$sm90, timeout ${t}s)"
        if [ "$sm90" = default ]; then envs=(); else envs=(FLASH_CUDA_SM90="$sm90"); fi
        env "${envs[@]}" timeout "$t" compute-sanitizer --tool "$tool" --error-exitcode 7 \
            python3 scripts/sanitize_kernels.py ${SANITIZE_ARGS:-} > "$OUT/$log" 2>&1
        rc=$?
        line=$(grep -m 1 -E "(ERROR|RACECHECK) SUMMARY" "$OUT/$log")
        if [ $rc -eq 0 ] && grep -q '^ok$' "$OUT/$log"; then
            SUMMARY+=("sanitize $tool (FLASH_CUDA_SM90=$sm90): ok ${line}")
        else
            status=1
            SUMMARY+=("sanitize $tool (FLASH_CUDA_SM90=$sm90): FAILED (rc $rc) ${line}")
            SUMMARY+=("$(grep -m 6 -E 'Invalid|ERROR|Error|error' "$OUT/$log")")
        fi
        echo "${SUMMARY[-1]}"
    done
done

# (c) benchmark (it writes $OUT/bench.json after every measurement, $OUT/bench.md at the end)
if want "${SKIP_BENCH:-0}" bench "${BENCH_TIMEOUT:-540}"; then
    rm -f "$OUT/bench.json" "$OUT/bench.md"
    echo "== bench ${BENCH_ARGS---quick} (timeout ${t}s)"
    start=$SECONDS
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
    timeout "$t" python3 bench/bench_attention.py ${BENCH_ARGS---quick} --out "$OUT" \
        --time-budget $(( t > 40 ? t - 30 : t )) > "$OUT/bench.log" 2>&1
    rc=$?
    rm -f "$OUT/bench.json.tmp"
    SUMMARY+=("bench: rc $rc$([ $rc -eq 124 ] && echo ' (timeout: partial results)')"\
" in $(( SECONDS - start )) s")
    if [ $rc -ne 0 ]; then  # the end of the log, without the per-measurement lines
        SUMMARY+=("$(grep -v -E '^(\[|\||$)' "$OUT/bench.log" | tail -6)")
    else
        SUMMARY+=("$(grep -E '^(bench|ceilings):' "$OUT/bench.log")")
    fi
    if [ -f "$OUT/bench.json" ] && [ ! -f "$OUT/bench.md" ]; then
        timeout 60 python3 bench/bench_report.py "$OUT/bench.json" > "$OUT/bench.md" 2>&1
    fi
fi

# (d) the short table, last
printf '%s\n' "${SUMMARY[@]}" > "$OUT/summary.txt"
if [ "${PACK_LOGS:-0}" = 1 ] && ls "$OUT"/*.log > /dev/null 2>&1; then
    (cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log)
fi
echo
echo "================================ summary ================================"
cat "$OUT/summary.txt"
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -f "$OUT/bench.json" ]; then
    echo
    timeout 60 python3 bench/bench_report.py "$OUT/bench.json" --compact
fi
echo "gpu_check: exit $status (full logs and tables in \$OUT: $(cd "$OUT" && ls | tr '\n' ' '))"
exit $status
