#!/usr/bin/env bash
# Session 36, call f: call e's `none` at 185 (call e gave it --batch, which needs --swap
# dynamic): the prototxt's DummyData at 185, every map resident, Caffe mode, twice.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s); mkdir -p $OUT/f
sed 's/type: "gaussian"/type: "constant"/; s/dim: 64$/dim: 185/' prototxt/vgg16/dummy.prototxt > /tmp/v185.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G
for r in 1 2; do
  timeout 55 python3 -m minicaffe train /tmp/v185.prototxt --engine CUDNN --swap none --budget 130G --max-iter 50 --display 1 -gpu 0 > $OUT/f/none$r.log 2>&1; echo "none$r rc $? at $(( $(date +%s) - T0 )) s"
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/f/*.log
cd $OUT && tar czf f.tgz f && rm -rf f
