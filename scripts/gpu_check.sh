#!/usr/bin/env bash
# The GPU machine's checks, one phase a call (each fits the device tool's 10-minute command limit).
#
#   scripts/gpu_check.sh install   TorchRec + FBGEMM (CUDA build if /tmp/fbg holds its parts, else the
#                                  CPU build) into /tmp/site from the carried .whl/ folder
#   scripts/gpu_check.sh test      build the extension, then every CUDA test (pytest -m gpu)
#   scripts/gpu_check.sh sanitize  compute-sanitizer memcheck + racecheck over the CUDA table tests
#   scripts/gpu_check.sh modes     build, then the CUDA tests of MODE_TESTS (default: table, storage,
#                                  lookup) under both insert engines: DEMB_DETERMINISM_MODE=0 and =1
#   scripts/gpu_check.sh bench_table     the CUDA table benchmark (vs index_select and HKV's figures)
#   scripts/gpu_check.sh bench_training  the training step vs FBGEMM TBE (needs FBGEMM's CUDA build)
#   scripts/gpu_check.sh serving   the CUDA AOTInductor package test, then bench_serving (one after
#                                  the other: each compiles packages, a few minutes in all)
#
# Logs go to $OUT (the device tool brings them back). Several phases may be named in one call.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
OUT="${OUT:-/tmp/gpu_out}"
mkdir -p "$OUT"
export PYTHONPATH="$repo:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export DYNAMICEMB_CACHE_DIR="${DYNAMICEMB_CACHE_DIR:-/tmp/demb_build}"
# keep NVLink multicast off (the lending workplace's rule for its shared hosts)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
status=0

install() {
  local wheels
  wheels=$(ls .whl/*.whl)
  if ls /tmp/fbg/part* >/dev/null 2>&1; then
    local fbg=/tmp/fbgemm_gpu-1.6.0-cp312-cp312-manylinux_2_28_x86_64.whl
    cat /tmp/fbg/part* >"$fbg"
    wheels="$(echo "$wheels" | grep -v fbgemm_gpu_cpu) $fbg"
  fi
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $wheels
  python3 -c 'import torch, torchrec, fbgemm_gpu; print("torch", torch.__version__, "torchrec", torchrec.__version__, "cuda", torch.cuda.get_device_name())'
}

run_tests() {
  python3 -m dynamicemb_core build 2>&1 | tail -2
  # One process per test file, four at a time: a CUDA fault poisons only its own file's process
  # (an illegal address is sticky for the whole CUDA context), so one bug cannot hide the others.
  local logs=/tmp/gpu_test_logs files rc=0
  rm -rf "$logs" && mkdir -p "$logs"
  files=$(python3 -m pytest -p no:cacheprovider -m "gpu and not slow" --collect-only -q tests "$@" 2>/dev/null |
    grep '::' | cut -d: -f1 | sort -u)
  echo "$files" | xargs -P 4 -I{} sh -c \
    'timeout 420 python3 -m pytest -p no:cacheprovider -m "gpu and not slow" -q -rfE --timeout 240 "$0" >"$1/$(echo "$0" | tr / _).log" 2>&1' \
    {} "$logs" || rc=1
  for f in "$logs"/*.log; do
    echo "== $(basename "$f" .log): $(tail -1 "$f")"
  done | tee "$OUT/gpu_summary.txt"
  cat "$logs"/*.log >"$OUT/gpu_tests.log"
  grep -h "^FAILED\|^ERROR" "$logs"/*.log | head -40
  return "$rc"
}

# Both CUDA insert engines over the same tests: one process per (mode, file), MODE_JOBS at a time, each
# under MODE_TIMEOUT seconds (a hang costs that, not the call). Each finished file appends its last
# line to $OUT/modes_summary.txt and its FAILED/ERROR lines to $OUT/modes_failures.txt at once, so a
# call cut off early still brings back what finished (the device tool returns a few files only; the
# per-file logs stay in /tmp and are joined into $OUT/modes_tests.log at the end). The slow tests
# stay out, as in run_tests: `-m gpu` alone selects them too (test_random_ops_match_reference_model_long
# [cuda], a 1500-example state machine, runs for minutes and looks like a hang).
modes() {
  python3 -m dynamicemb_core build 2>&1 | tail -1
  local logs=/tmp/gpu_mode_logs files rc=0
  rm -rf "$logs" && mkdir -p "$logs"
  : >"$OUT/modes_summary.txt"
  : >"$OUT/modes_failures.txt"
  # shellcheck disable=SC2086
  files=$(python3 -m pytest -p no:cacheprovider -m "gpu and not slow" --collect-only -q \
    ${MODE_TESTS:-tests/table tests/storage tests/lookup} 2>/dev/null | grep '::' | cut -d: -f1 | sort -u)
  export MODE_LOGS="$logs" MODE_OUT="$OUT"
  for m in ${MODES:-0 1}; do for f in $files; do echo "$m $f"; done; done |
    xargs -P "${MODE_JOBS:-6}" -L 1 sh -c '
      log="$MODE_LOGS/mode$0_$(echo "$1" | tr / _).log"
      DEMB_DETERMINISM_MODE=$0 timeout "${MODE_TIMEOUT:-120}" python3 -m pytest -p no:cacheprovider \
        -m "gpu and not slow" -q -rfE "$1" >"$log" 2>&1
      rc=$?
      echo "== DEMB_DETERMINISM_MODE=$0 $1: $(tail -1 "$log") (rc $rc)" >>"$MODE_OUT/modes_summary.txt"
      grep "^FAILED\|^ERROR" "$log" | sed "s/^/mode$0 /" >>"$MODE_OUT/modes_failures.txt"
      exit $rc' ||
    rc=1
  cat "$logs"/*.log >"$OUT/modes_tests.log"
  sort "$OUT/modes_summary.txt"
  head -40 "$OUT/modes_failures.txt"
  return "$rc"
}

sanitize() {
  local t
  for t in memcheck racecheck; do
    compute-sanitizer --tool "$t" --report-api-errors no --print-limit 20 \
      python3 -m pytest -p no:cacheprovider -q -x tests/table/test_cuda_ops.py \
      tests/table/test_parallel_engine.py -k "not matches_reference and not engines_agree" \
      >"$OUT/sanitize_$t.log" 2>&1
    echo "$t: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/sanitize_$t.log" | tr '\n' ' ')"
  done
}

bench_table() {
  python3 benchmarks/bench_table_cuda.py 2>&1 | tee "$OUT/bench_table_cuda.md" | tail -3
}

bench_training() {
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_training.py --device cuda --ids 1048576 --num-ids 1000000 --batch 4096 \
    2>&1 | tee "$OUT/bench_training_cuda.md" | tail -8
}

serving() {
  python3 -m dynamicemb_core build 2>&1 | tail -1
  timeout "${SERVING_TEST_TIMEOUT:-300}" python3 -X faulthandler -m pytest -p no:cacheprovider -q -rfE \
    -m gpu tests/inference/test_export.py >"$OUT/serving_tests.log" 2>&1
  echo "serving tests: rc $? $(tail -1 "$OUT/serving_tests.log")"
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_serving.py --device cuda \
    >"$OUT/bench_serving_cuda.md" 2>"$OUT/bench_serving_cuda.err"
  echo "bench_serving: rc $?"
  cat "$OUT/bench_serving_cuda.md"
}

for phase in "$@"; do
  case "$phase" in
    install) install || status=1 ;;
    test) run_tests || status=1 ;;
    sanitize) sanitize || status=1 ;;
    modes) modes || status=1 ;;
    bench_table) bench_table || status=1 ;;
    bench_training) bench_training || status=1 ;;
    serving) serving || status=1 ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
exit "$status"
