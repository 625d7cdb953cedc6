#!/usr/bin/env bash
# Session 42, call e: after one device-side wait per search, two timed runs per candidate and
# a search per shape per process (call d's tuner run did not finish in 590 s: 9 to 29 s of
# searches per minibatch): the graph API's GPU tests; the swap executor's GPU tests with every
# bound convolution on the graph API (arenas, the compiled iteration, CUDA graph capture); the
# moved device_wait's test; ResNet-152 at 16, 36 and 72 in paired rounds legacy against graph.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/e
timeout 100 python3 scripts/gpu_checks.py tests/cudnn/test_backend_api.py > $OUT/e/gpu_checks.txt 2>&1; echo "backend_api tests rc $?"; tail -3 $OUT/e/gpu_checks.txt
MINICAFFE_CUDNN_API=graph timeout 200 python3 scripts/gpu_checks.py tests/swap/test_swap_gpu.py tests/swap/test_swap_graph_gpu.py > $OUT/e/gpu_checks_swap_graph_api.txt 2>&1; echo "swap tests on the graph API rc $? at $(( $(date +%s) - T0 )) s"; tail -4 $OUT/e/gpu_checks_swap_graph_api.txt
for K in 16 36 72; do
  timeout 100 python3 docs/results/tuner_s42/ab_api.py resnet152 $K 6 6 > $OUT/e/ab_api_$K.txt 2>&1; echo "ab_api $K rc $? at $(( $(date +%s) - T0 )) s"
  grep "first 3\|median\|searches" $OUT/e/ab_api_$K.txt
done
cd $OUT && tar czf e.tgz e && rm -rf e
