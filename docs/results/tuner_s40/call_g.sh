#!/usr/bin/env bash
# Session 40, call g: ResNet-34 with a fresh profile, the search pricing at
# SEARCH_MARGIN = 0.75 (session 33 row: k* 438, 4.02x, 202 s), and
# the PyTorch peers.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/g
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/g/host.txt 2>&1
L=$(( 390 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet34:128 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/g/resnet34 > $OUT/g/resnet34.txt 2>&1
echo "resnet34 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet34" $OUT/g/resnet34/tuner_table.md
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['tuner']; print('searched_at', t.get('searched_at')); print([l for l in t['log'] if 'cuDNN searched' in l])" $OUT/g/resnet34/tuner/resnet34.json
cd $OUT && gzip -9 -n g/*/tuner/*_profile.json 2>/dev/null; tar czf g.tgz g && rm -rf g
