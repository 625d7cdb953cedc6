#!/usr/bin/env bash
# Session 36, call e: no stall at call d's k* = 185: `none` (every map resident, --budget 130G)
# against the dynamic plan on call d's profile, ABAB, under the 1.5 GiB cap.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s); mkdir -p $OUT/e
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
zcat docs/results/tuner_s36/d/vgg16_profile.json.gz > /tmp/p.json
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G
B="train /tmp/v64.prototxt --engine CUDNN --batch 185 --max-iter 50 --display 1 -gpu 0"
for r in 1 2; do
  timeout 60 python3 -m minicaffe $B --swap none --budget 130G > $OUT/e/none$r.log 2>&1; echo "none$r rc $? at $(( $(date +%s) - T0 )) s"
  timeout 60 python3 -m minicaffe $B --swap dynamic --budget 12G --profile /tmp/p.json --recompute auto > $OUT/e/dyn$r.log 2>&1; echo "dyn$r rc $? at $(( $(date +%s) - T0 )) s"
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/e/*.log
cd $OUT && tar czf e.tgz e && rm -rf e
