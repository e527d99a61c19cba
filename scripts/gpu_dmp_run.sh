#!/usr/bin/env bash
# Issue 31 on the GPU machine in one call: bench_dmp (the DMP step, dynamic vs TorchRec's static
# fused tables, EC and EBC, SGD and ADAM, 1/10/26 tables, ~1M ids a step, NCCL world 1, every
# dynamic row in HBM), bench_churn (full tables, 0/5/20 % new ids a step), and the tests of the
# issue's changes (CUDA memory freed on del, NVTX op ranges, zero-budget warning, op counts, the
# NCCL DMP oracle). Needs FBGEMM's CUDA build in /tmp/fbg and the carried .whl/ folder, like
# scripts/gpu_final_run.sh (the install is skipped when /tmp/site already has TorchRec: a warm
# machine after gpu_final_run.sh). A bench row that crashed, ran out of memory or timed out is a
# failure in the summary and the exit status.
# Usage: DEMB_COMMIT=<hash> bash scripts/gpu_dmp_run.sh [dmp] [tests] [churn]   (default: all three;
# logs: one tarball, $OUT/dmp.tgz). ~1 min setup on a cold machine (+ the build), then at most
# 300 s bench_dmp, 150 s tests, 90 s bench_churn.
set -u
export DEMB_COMMIT=${DEMB_COMMIT:-unknown} L=/tmp/LD
OUT=${OUT:-/tmp/gpu_out}
mkdir -p $L $OUT
t0=$(date +%s)
fail=0
phases="${*:-dmp tests churn}"
pack() { tar czf $OUT/dmp.tgz -C /tmp LD; }
[ -d /tmp/site/torchrec ] || { scripts/gpu_check.sh install > $L/install.log 2>&1; tail -1 $L/install.log; }
export PYTHONPATH=$PWD:/tmp/site DYNAMICEMB_CACHE_DIR=/tmp/demb_build PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m dynamicemb_core build > $L/build.log 2>&1; tail -1 $L/build.log
echo "commit $DEMB_COMMIT, phases: $phases"
for phase in $phases; do
  case "$phase" in
  dmp)
    # 12 rows: EC/EBC x SGD/ADAM x 1/10/26 tables; 500k rows a table (both models of 26 ADAM tables fit)
    timeout 300 python3 benchmarks/bench_dmp.py --device cuda --warmup 3 --repeats 9 > $L/bench_dmp.md 2> $L/bench_dmp.err
    rc=$?
    grep -E "^#|^\| (EC|EBC)" $L/bench_dmp.md
    rows=$(grep -cE '^\| (EC|EBC) .* [0-9.]+x \|' $L/bench_dmp.md)
    if [ "$rc" != 0 ] || [ "$rows" -lt 12 ]; then
      echo "FAILED: bench_dmp rc $rc, $rows of 12 rows with both times (a missing row crashed, ran out of memory or timed out; see bench_dmp.err)"
      tail -5 $L/bench_dmp.err; fail=1
    fi ;;
  tests)
    timeout 150 python3 -m pytest -p no:cacheprovider -q -rfE -m "not slow" tests/lookup/test_release.py \
      tests/lookup/test_zero_budget.py tests/shard/test_nvtx.py tests/shard/test_step_ops.py \
      tests/shard/test_rw_input_dist.py tests/shard/test_nccl_cuda.py > $L/tests.log 2>&1
    rc=$?; tail -3 $L/tests.log
    [ "$rc" = 0 ] || { echo "FAILED: tests rc $rc"; grep -E "^FAILED|^ERROR" $L/tests.log | head; fail=1; } ;;
  churn)
    timeout 90 python3 benchmarks/bench_churn.py --device cuda --warmup 3 --repeats 9 > $L/bench_churn.md 2> $L/bench_churn.err
    rc=$?; cat $L/bench_churn.md
    [ "$rc" = 0 ] || { echo "FAILED: bench_churn rc $rc"; tail -5 $L/bench_churn.err; fail=1; } ;;
  *) echo "unknown phase $phase"; fail=1 ;;
  esac
  pack
done
echo "summary: $([ $fail = 0 ] && echo ok || echo FAILED) at $(( $(date +%s) - t0 )) s"; pack
exit $fail
