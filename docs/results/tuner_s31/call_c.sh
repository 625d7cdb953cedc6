#!/usr/bin/env bash
# Session 31, calls c and d: the cuDNN GMAP test, then ResNet-152 through tuner_table on
# call a's profile with the 1 % copy limit (the new default).  Usage: TAG=c [TEST=1] bash ...
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
D=$OUT/$TAG; mkdir -p $D; T0=$(date +%s)
if [ "${TEST:-0}" = 1 ]; then
  timeout 120 python3 scripts/gpu_checks.py tests/swap/test_swap_gpu.py > $D/test.txt 2>&1; echo "test rc $?"; tail -3 $D/test.txt
fi
L=$(( ${TOTAL:-560} - ($(date +%s) - T0) ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --r152-batch 0 --profiles docs/results/tuner_s31/prof_a --timeout $(( L - 5 )) --out $D/resnet152 > $D/resnet152.txt 2>&1; echo "r152 rc $? at $(( $(date +%s) - T0 )) s"
grep "^| resnet152" $D/resnet152/tuner_table.md
cd $OUT && tar czf $TAG.tgz $TAG
