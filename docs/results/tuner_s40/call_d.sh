#!/usr/bin/env bash
# Session 40, call d: AlexNet with a fresh profile (its convolutions run in chunks at large k), the search pricing at
# SEARCH_MARGIN = 0.75 (session 26 row: k* 1926, 1.70x, before chunks and search pricing), and
# the PyTorch peers.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/d
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/d/host.txt 2>&1
L=$(( 590 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets alexnet:256 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/d/alexnet > $OUT/d/alexnet.txt 2>&1
echo "alexnet rc $? at $(( $(date +%s) - T0 )) s"; grep "^| alexnet" $OUT/d/alexnet/tuner_table.md
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['tuner']; print('searched_at', t.get('searched_at')); print([l for l in t['log'] if 'cuDNN searched' in l])" $OUT/d/alexnet/tuner/alexnet.json
cd $OUT && gzip -9 -n d/*/tuner/*_profile.json 2>/dev/null; tar czf d.tgz d && rm -rf d
