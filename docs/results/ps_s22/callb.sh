#!/usr/bin/env bash
# session 22 call b (one GPU): the graph's GPU tests, then ResNet-152 W=1 eager vs graph
set -u
mkdir -p $OUT/r
T0=$(date +%s)
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/swap/test_swap_graph_gpu.py tests/ps/test_gpu.py -k "graph" > $OUT/r/b_tests.txt 2>&1
echo "tests rc $? $(( $(date +%s) - T0 )) s"; tail -25 $OUT/r/b_tests.txt
left=$(( ${TOTAL:-400} - ($(date +%s) - T0) ))
TAG=b BUDGET=$left VARIANTS="${VARIANTS}" bash dv/diag22.sh 2>&1 | tail -12
for f in /tmp/w/*/rank0*.log; do :; done
