#!/usr/bin/env bash
# Session 41, call b (prepared in session 40): MINICAFFE_COPY_STEP_COST=1 (5113aa6, the copy
# fit with a cost per step; off by default, CPU replay only) on session 40's ResNet-50 and
# GoogLeNet profiles, without the peers: session 40's errors at 36 and 192 were +6.6 / +4.9 %;
# the replay says about +4.1 / +3.8 %. ResNet-50's k* moves from 170 to about 160.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
export MINICAFFE_COPY_STEP_COST=1
T0=$(date +%s)
mkdir -p $OUT/b
timeout 280 python3 scripts/tuner_table.py --gpus 0 --nets resnet50:36 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --profiles docs/results/tuner_s40/b/resnet50/tuner --timeout 275 --out $OUT/b/resnet50 > $OUT/b/resnet50.txt 2>&1
echo "resnet50 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet50" $OUT/b/resnet50/tuner_table.md
L=$(( 585 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets googlenet:128 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --profiles docs/results/tuner_s40/a/googlenet/tuner --timeout $(( L - 5 )) --out $OUT/b/googlenet > $OUT/b/googlenet.txt 2>&1
echo "googlenet rc $? at $(( $(date +%s) - T0 )) s"; grep "^| googlenet" $OUT/b/googlenet/tuner_table.md
cd $OUT && gzip -9 -n b/*/tuner/*_profile.json 2>/dev/null; tar czf b.tgz b && rm -rf b
