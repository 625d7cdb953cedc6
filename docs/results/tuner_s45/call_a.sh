#!/usr/bin/env bash
# Session 45, call a (prepared in session 44): the whole GPU suite. Session 44 changed GPU
# paths on the CPU only: adf563b (a learned Scale's diff is zeroed before backward where
# Caffe overwrites it: the generic, fused and BatchNorm-paired paths), and added
# tests/layers/test_torch_fuzz.py (CPU). Whole tracebacks go to failures_a.txt. (Session 44's
# call a: 902 passed in 301 s.)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/a
FILES=$(grep -rl "mark.gpu" tests --include="*.py" | sort)
T0=$(date +%s)
timeout 560 python3 scripts/gpu_checks.py --failures $OUT/a/failures_a.txt $FILES > $OUT/a/gpu_checks_a.txt 2>&1; echo "suite rc $? in $(( $(date +%s) - T0 )) s"
tail -30 $OUT/a/gpu_checks_a.txt
cd $OUT && tar czf a.tgz a && rm -rf a
