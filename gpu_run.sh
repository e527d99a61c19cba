#!/usr/bin/env bash
# one device call: build, the CUDA tests of the grouped path, the training bench (ours) and --split
export PYTHONPATH=$PWD:/tmp/site DYNAMICEMB_CACHE_DIR=/tmp/demb_build PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
( time python3 -m dynamicemb_core build ) > $OUT/build.log 2>&1 || { tail -60 $OUT/build.log; exit 1; }
tail -3 $OUT/build.log
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/lookup tests/storage/test_prefetch_pinning.py tests/optim > $OUT/tests.log 2>&1
grep -E "FAILED|passed|failed" $OUT/tests.log | tail -25
cd benchmarks
timeout 150 python3 bench_training.py --device cuda --ids 1048576 --num-ids 1000000 --batch 4096 --pooling none --table-counts 1,10,26 --no-peer --warmup 3 --repeats 10 > $OUT/bench.log 2>&1; grep -E "^\||Shape|rror" $OUT/bench.log | tail -20
timeout 60 python3 bench_training.py --device cuda --ids 1048576 --num-ids 1000000 --batch 4096 --pooling none --table-counts 1,26 --split --optimizers sgd --warmup 3 --repeats 6 > $OUT/split.log 2>&1; tail -30 $OUT/split.log
