#!/usr/bin/env bash
# Session 34, call a: the GPU tests of session 33's changes (the workspace cap, the region-wait
# gate of the prefetch lead), then VGG-16 with the cuDNN workspace fit on under a 1.5 GiB
# workspace cap per call, fresh profile, --recompute auto (session 33's two runs stopped where
# the decided plan did not fit the net built at k*; install_decision now decides again there).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
T0=$(date +%s)
mkdir -p $OUT/tests
timeout 200 python3 scripts/gpu_checks.py tests/swap/test_swap_gpu.py tests/swap/test_replay_limits.py tests/test_engine.py > $OUT/tests/gpu_tests.txt 2>&1
echo "gpu_tests rc $? at $(( $(date +%s) - T0 )) s"; tail -8 $OUT/tests/gpu_tests.txt
TOTAL=$(( ${TOTAL:-560} - ($(date +%s) - T0) )) NEED=${NEED:-190} bash docs/results/tuner_s33/call_cap.sh 1.5G
