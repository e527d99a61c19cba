#!/usr/bin/env bash
# The release check on the GPU machine in one call (docs/benchmarks.md takes its GPU figures from it):
# install + build, bench_training (hbm 10/1/26 tables vs FBGEMM TBE, --split), bench_table_cuda,
# then both insert engines over every CUDA test dir and compute-sanitizer over the key-parallel
# engine. Needs FBGEMM's CUDA build in /tmp/fbg (see scripts/gpu_check.sh install). ~370 s.
# A bench_training row missing from its output (crashed, out of memory) prints FAILED.
# Usage: DEMB_COMMIT=<hash> bash scripts/gpu_final_run.sh   (logs: one tarball, $OUT/final.tgz)
set -u
export DEMB_COMMIT=${DEMB_COMMIT:-unknown} L=/tmp/L
mkdir -p $L
t0=$(date +%s)
pack() { tar czf $OUT/final.tgz -C /tmp L; }
scripts/gpu_check.sh install > $L/install.log 2>&1; tail -1 $L/install.log
export PYTHONPATH=$PWD:/tmp/site DYNAMICEMB_CACHE_DIR=/tmp/demb_build PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m dynamicemb_core build > $L/build.log 2>&1; tail -1 $L/build.log
B="python3 benchmarks/bench_training.py --device cuda --ids 1048576 --num-ids 1000000 --batch 4096 --pooling none"
timeout 100 $B --setups hbm --warmup 2 --repeats 7 --batches 2 --table-counts 10,1,26 > $L/bench_train.md 2>&1
grep "^| hbm" $L/bench_train.md | sort -u
# every (tables, optimizer) row must be there: a row that crashed or ran out of memory is a failure
missing=""
for n in 10 1 26; do for o in SGD ADAM; do
  grep -q "^| hbm | $n | $o |" $L/bench_train.md || missing="$missing $n/$o"
done; done
[ -z "$missing" ] || { echo "FAILED: bench_training rows missing (tables/optimizer):$missing"; tail -3 $L/bench_train.md; }
pack
timeout 30 $B --setups hbm --warmup 2 --repeats 5 --batches 1 --table-counts 10 --optimizers sgd --split > $L/bench_split.md 2>&1
grep -i "sync" $L/bench_split.md | tail -2
# (the bench runs each (dim, λ) in a process of its own)
timeout 90 python3 benchmarks/bench_table_cuda.py --dims 64 32 8 --load-factors 0.5 --engines parallel unique --repeats 5 > $L/bench_table.md 2>&1
timeout 30 python3 benchmarks/bench_table_cuda.py --dims 32 --load-factors 1.0 --engines parallel unique --repeats 5 > $L/bench_table_lf1.md 2>&1
timeout 30 python3 benchmarks/bench_table_cuda.py --dims 32 --load-factors 0.5 --engines deterministic --repeats 3 > $L/bench_table_det.md 2>&1
echo "benches done at $(( $(date +%s) - t0 )) s"; pack
( compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -p no:cacheprovider -q tests/table/test_parallel_engine.py -k "cuda and (contended or pinned or no_eviction)" > $L/racecheck.log 2>&1;
  compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -p no:cacheprovider -q tests/table/test_parallel_engine.py -k "cuda and (contended or pinned or no_eviction)" > $L/memcheck.log 2>&1 ) &
MODES="0 1" MODE_JOBS=8 MODE_TIMEOUT=${MODE_TIMEOUT:-140} MODE_TESTS="tests/table tests/storage tests/lookup tests/optim tests/ops tests/checkpoint tests/admission tests/tracking tests/inference/test_collection.py tests/planner tests/shard" OUT=$L scripts/gpu_check.sh modes > $L/modes.out 2>&1
echo "modes: $(grep -c 'rc 0)' $L/modes_summary.txt) ok of $(wc -l < $L/modes_summary.txt)"; grep -v "rc 0)" $L/modes_summary.txt | head; head -20 $L/modes_failures.txt; pack
wait
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $L/racecheck.log $L/memcheck.log | tail -6
echo "all done at $(( $(date +%s) - t0 )) s"; pack
