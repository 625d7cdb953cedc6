#!/usr/bin/env bash
# Session 43, call ab: the whole GPU suite with every bound cuDNN convolution on the graph API
# (calls a and b in one; the suite took about 171 s without the ps and training files in session 36).
# Whole tracebacks go to failures_ab.txt.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
export MINICAFFE_CUDNN_API=graph
mkdir -p $OUT/ab
FILES=$(grep -rl "mark.gpu" tests --include="*.py" | sort)
T0=$(date +%s)
timeout 560 python3 scripts/gpu_checks.py --failures $OUT/ab/failures_ab.txt $FILES > $OUT/ab/gpu_checks_ab.txt 2>&1; echo "suite rc $? in $(( $(date +%s) - T0 )) s"
tail -30 $OUT/ab/gpu_checks_ab.txt
cd $OUT && tar czf ab.tgz ab && rm -rf ab
