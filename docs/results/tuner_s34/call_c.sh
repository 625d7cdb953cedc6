#!/usr/bin/env bash
# Session 34, call c: call b's every-map-kept reference at 221 again, with the memory trace, to
# set its per-step compute beside the dynamic plan's (call b's dyn1.csv).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/c
zcat docs/results/tuner_s34/a/cap1.5G/vgg16/tuner/vgg16_profile.json.gz > /tmp/p.json
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G
timeout 170 python3 -m minicaffe train /tmp/v64.prototxt --engine CUDNN --swap dynamic --budget 130G --batch 221 --profile /tmp/p.json --max-iter 100 --display 1 -gpu 0 --memory-trace $OUT/c/kept.csv > $OUT/c/kept.log 2>&1
echo "kept rc $?"
timeout 170 python3 -m minicaffe train /tmp/v64.prototxt --engine CUDNN --swap dynamic --budget 12G --batch 221 --profile /tmp/p.json --recompute auto --max-iter 100 --display 1 -gpu 0 --memory-trace $OUT/c/dyn.csv > $OUT/c/dyn.log 2>&1
echo "dyn rc $?"
python3 docs/results/tuner_s34/iter_ms.py $OUT/c/kept.log $OUT/c/dyn.log
