#!/usr/bin/env bash
# Session 44, call d: ResNet-152's Table 1 row with the PyTorch peers (eager and save_on_cpu,
# torchvision's and the same net) on the graph API, on session 42's graph-API profile
# (no fresh profiling: the call's time goes to the peers).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/d
L=$(( 585 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --profiles docs/results/tuner_s42/f/resnet152/tuner --timeout $(( L - 5 )) --out $OUT/d/resnet152 > $OUT/d/resnet152.txt 2>&1
echo "resnet152 peers rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet152" $OUT/d/resnet152/tuner_table.md
cd $OUT && gzip -9 -n d/*/tuner/*_profile.json 2>/dev/null; rm -f d/*/*.png; tar czf d.tgz d && rm -rf d
