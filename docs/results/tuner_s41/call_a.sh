#!/usr/bin/env bash
# Session 41, call a (prepared in session 40): ResNet-152 with a fresh profile on today's engine, the search pricing at
# SEARCH_MARGIN = 0.75 (session 31 row: k* 76, 4.75x; ResNet-101 took 327 s in session 40), and
# the PyTorch peers.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/a
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/a/host.txt 2>&1
L=$(( 590 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/a/resnet152 > $OUT/a/resnet152.txt 2>&1
echo "resnet152 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet152" $OUT/a/resnet152/tuner_table.md
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['tuner']; print('searched_at', t.get('searched_at')); print([l for l in t['log'] if 'cuDNN searched' in l])" $OUT/a/resnet152/tuner/resnet152.json
cd $OUT && gzip -9 -n a/*/tuner/*_profile.json 2>/dev/null; tar czf a.tgz a && rm -rf a
