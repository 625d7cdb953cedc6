#!/usr/bin/env bash
# Session 42, call b: the graph API's GPU tests, its host cost per call on BoundConv's own
# path, and ResNet-152 at 16 and 72 in paired rounds legacy against graph.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/b
timeout 240 python3 scripts/gpu_checks.py tests/cudnn/test_backend_api.py tests/cudnn/test_cudnn.py > $OUT/b/gpu_checks.txt 2>&1; echo "gpu_checks rc $?"
tail -6 $OUT/b/gpu_checks.txt
timeout 120 python3 docs/results/tuner_s42/bound_host.py 200 > $OUT/b/bound_host.txt 2>&1; echo "bound_host rc $?"
tail -6 $OUT/b/bound_host.txt
for K in 16 72; do
  timeout 200 python3 docs/results/tuner_s42/ab_api.py resnet152 $K 8 8 > $OUT/b/ab_api_$K.txt 2>&1; echo "ab_api $K rc $?"
  tail -8 $OUT/b/ab_api_$K.txt
done
cd $OUT && tar czf b.tgz b && rm -rf b
