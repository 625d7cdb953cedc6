#!/usr/bin/env bash
# Session 40, call c: VGG-16 under the 1.5 GiB cap with a fresh profile, the search pricing at
# SEARCH_MARGIN = 0.75 (session 39's call c, at margin 1.0: -1.1 / -0.3 / +0.0 / -0.3 %), and
# the PyTorch peers.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/c
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/c/host.txt 2>&1
L=$(( 590 - $(date +%s) + T0 ))
MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G timeout $L python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/c/vgg16 > $OUT/c/vgg16.txt 2>&1
echo "vgg16 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| vgg16" $OUT/c/vgg16/tuner_table.md
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['tuner']; print('searched_at', t.get('searched_at')); print([l for l in t['log'] if 'cuDNN searched' in l])" $OUT/c/vgg16/tuner/vgg16.json
cd $OUT && gzip -9 -n c/*/tuner/*_profile.json 2>/dev/null; tar czf c.tgz c && rm -rf c
