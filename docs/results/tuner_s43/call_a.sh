#!/usr/bin/env bash
# Session 43, call a (prepared in session 42): the GPU suite with every bound cuDNN convolution on
# the graph API, first half of the files with GPU tests (sorted by path).
# Before graph becomes the default (backend_api.api_choice). Whole tracebacks go to failures_a.txt.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
export MINICAFFE_CUDNN_API=graph
mkdir -p $OUT/a
FILES=$(grep -rl "mark.gpu" tests --include="*.py" | sort); N=$(echo "$FILES" | wc -l)
PART=$(echo "$FILES" | head -n $(( N / 2 )))
timeout 580 python3 scripts/gpu_checks.py --failures $OUT/a/failures_a.txt $PART > $OUT/a/gpu_checks_a.txt 2>&1; echo "first half rc $?"
tail -30 $OUT/a/gpu_checks_a.txt
cd $OUT && tar czf a.tgz a && rm -rf a
