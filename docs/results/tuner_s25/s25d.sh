#!/usr/bin/env bash
# Session 25, call D: the GPU tests of swap/ after the calibration's three iterations.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
timeout 170 python3 scripts/gpu_checks.py tests/swap tests/scripts/test_swap_anatomy.py > $OUT/r/gpu_swap.txt 2>&1
echo "rc $?" >> $OUT/r/gpu_swap.txt
tail -25 $OUT/r/gpu_swap.txt
