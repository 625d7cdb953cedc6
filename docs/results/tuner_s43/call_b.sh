#!/usr/bin/env bash
# Session 43, call b: the GPU suite on the graph API, the second half of the files.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
export MINICAFFE_CUDNN_API=graph
mkdir -p $OUT/b
FILES=$(grep -rl "mark.gpu" tests --include="*.py" | sort); N=$(echo "$FILES" | wc -l)
PART=$(echo "$FILES" | tail -n +$(( N / 2 + 1 )))
timeout 580 python3 scripts/gpu_checks.py --failures $OUT/b/failures_b.txt $PART > $OUT/b/gpu_checks_b.txt 2>&1; echo "second half rc $?"
tail -30 $OUT/b/gpu_checks_b.txt
cd $OUT && tar czf b.tgz b && rm -rf b
