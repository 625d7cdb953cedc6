#!/usr/bin/env bash
# Session 44, call c: ResNet-152 through the tuner under --cuda-graph on the graph API (session
# 41 on the legacy API: +1.0 / +4.7 / +15.2 % at k* / middle / k_none), without the peers.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/c
L=$(( 585 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --r152-batch 0 --cuda-graph --no-stall-rounds 1 --iters 3 --no-torch --timeout $(( L - 5 )) --out $OUT/c/resnet152 > $OUT/c/resnet152.txt 2>&1
echo "resnet152 --cuda-graph rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet152" $OUT/c/resnet152/tuner_table.md
cd $OUT && gzip -9 -n c/*/tuner/*_profile.json 2>/dev/null; rm -f c/*/*.png; tar czf c.tgz c && rm -rf c
