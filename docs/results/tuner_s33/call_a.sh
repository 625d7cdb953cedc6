#!/usr/bin/env bash
# Session 33, call a: the GPU tests of session 32's changes (the executor on plans laid out with
# the prefetch lead), then GoogLeNet with a fresh profile under the replay rule that counts a
# predicted stall with the copies.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/tests
timeout 200 python3 scripts/gpu_checks.py tests/swap/test_swap_gpu.py tests/swap/test_dynamic_recompute.py tests/swap/test_replay_limits.py > $OUT/tests/gpu_tests.txt 2>&1
echo "gpu_tests rc $?" ; tail -8 $OUT/tests/gpu_tests.txt
TAG=${TAG:-a} TOTAL=${TOTAL:-380} NEED=${NEED:-250} bash docs/results/tuner_s26/s26net.sh googlenet:128
