#!/usr/bin/env bash
# Session 40, call e: ResNet-101 with a fresh profile and session 38's host changes, the search pricing at
# SEARCH_MARGIN = 0.75 (session 32 row: k* 110, 4.78x; its k_none = 23 is host-bound), and
# the PyTorch peers.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/e
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/e/host.txt 2>&1
L=$(( 590 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet101:23 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/e/resnet101 > $OUT/e/resnet101.txt 2>&1
echo "resnet101 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet101" $OUT/e/resnet101/tuner_table.md
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['tuner']; print('searched_at', t.get('searched_at')); print([l for l in t['log'] if 'cuDNN searched' in l])" $OUT/e/resnet101/tuner/resnet101.json
cd $OUT && gzip -9 -n e/*/tuner/*_profile.json 2>/dev/null; tar czf e.tgz e && rm -rf e
