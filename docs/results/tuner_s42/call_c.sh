#!/usr/bin/env bash
# Session 42, call c: call b again after the search takes every engine of the operation
# graph, not only those the heuristics name.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/c
timeout 240 python3 scripts/gpu_checks.py tests/cudnn/test_backend_api.py > $OUT/c/gpu_checks.txt 2>&1; echo "gpu_checks rc $?"
tail -6 $OUT/c/gpu_checks.txt
timeout 120 python3 docs/results/tuner_s42/bound_host.py 200 > $OUT/c/bound_host.txt 2>&1; echo "bound_host rc $?"
tail -6 $OUT/c/bound_host.txt
for K in 16 72; do
  timeout 200 python3 docs/results/tuner_s42/ab_api.py resnet152 $K 8 8 > $OUT/c/ab_api_$K.txt 2>&1; echo "ab_api $K rc $?"
  tail -8 $OUT/c/ab_api_$K.txt
done
cd $OUT && tar czf c.tgz c && rm -rf c
