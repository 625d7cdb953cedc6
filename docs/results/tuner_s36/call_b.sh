#!/usr/bin/env bash
# Session 36, call b: (1) how fast VGG-16 at 221 can go with every map kept (--budget 130G)
# under larger cuDNN workspace caps than 1.5 GiB (call a: 4.85x save_on_cpu, at 288.6 ms);
# (2) host_pace.sh (ResNet-152 at 16 in free and NUMA-bound processes).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/b
zcat docs/results/tuner_s34/a/cap1.5G/vgg16/tuner/vgg16_profile.json.gz > /tmp/p.json
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
A="train /tmp/v64.prototxt --engine CUDNN --swap dynamic --budget 130G --profile /tmp/p.json --batch 221 --max-iter 60 --display 1 -gpu 0"
for cap in 1.5G 3G 8G; do
  MINICAFFE_CUDNN_WORKSPACE_CAP=$cap timeout 90 python3 docs/results/tuner_s34/algos.py $OUT/b/kept$cap.json $A > $OUT/b/kept$cap.log 2>&1
  echo "kept $cap rc $? at $(( $(date +%s) - T0 )) s"
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/b/kept*.log
bash docs/results/tuner_s36/host_pace.sh
echo "done at $(( $(date +%s) - T0 )) s"
