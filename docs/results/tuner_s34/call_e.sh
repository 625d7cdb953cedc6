#!/usr/bin/env bash
# Session 34, call e: the cuDNN algorithms VGG-16's convolutions chose at 221 under the 12 GiB
# plan and with every map kept under 130 GiB (call c: conv2_2, conv3_2 and conv3_3 ran 14 ms
# slower per iteration under the plan).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/e
zcat docs/results/tuner_s34/a/cap1.5G/vgg16/tuner/vgg16_profile.json.gz > /tmp/p.json
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G
A="train /tmp/v64.prototxt --engine CUDNN --swap dynamic --batch 221 --profile /tmp/p.json --max-iter 40 --display 1 -gpu 0"
timeout 150 python3 docs/results/tuner_s34/algos.py $OUT/e/dyn.json $A --budget 12G --recompute auto > $OUT/e/dyn.log 2>&1; echo "dyn rc $?"
timeout 150 python3 docs/results/tuner_s34/algos.py $OUT/e/kept.json $A --budget 130G > $OUT/e/kept.log 2>&1; echo "kept rc $?"
python3 docs/results/tuner_s34/iter_ms.py $OUT/e/dyn.log $OUT/e/kept.log
python3 - <<'PY'
import json, os
o = os.environ["OUT"] + "/e/"
for name in ("dyn", "kept"):
    d = json.load(open(o + name + ".json"))
    for r in d["choices"]:
        if r["w"][0] in (128, 256) and r["w"][1] in (128, 256) and r["x"][0] >= 100:
            print(name, r["x"], r["w"][:2], r["direction"], r["limit"] >> 20, r["algo"], r["workspace"] >> 20, round(r["time_ms"], 2))
PY
