#!/usr/bin/env bash
# session 22 call d (4 GPUs): ResNet-152 W=1/4 pairs, graph vs eager, then the swap GPU tests
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
T0=$(date +%s)
TAG=d BUDGET=${BUDGET:-420} VARIANTS="$VARIANTS" bash dv/diag22.sh 2>&1 | tail -16
left=$(( ${TOTAL:-540} - ($(date +%s) - T0) ))
timeout $left python3 -m pytest -q -p no:cacheprovider tests/swap/test_swap_gpu.py tests/swap/test_swap_graph_gpu.py > $OUT/r/d_swap_tests.txt 2>&1
echo "swap tests rc $?"; tail -3 $OUT/r/d_swap_tests.txt
