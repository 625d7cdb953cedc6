#!/usr/bin/env bash
# Session 40, call b: a fresh ResNet-50 row with the search pricing at SEARCH_MARGIN = 0.75
# (its 1x1 and 3x3 convolutions have many shapes: the tuner's "cuDNN searched ... (s)" line says
# what the searches cost; tuner.searched_at which table points they priced). Session 32's row
# (before the search pricing) took 260 s.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/b
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/b/host.txt 2>&1
L=$(( 590 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet50:36 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/b/resnet50 > $OUT/b/resnet50.txt 2>&1
echo "resnet50 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet50" $OUT/b/resnet50/tuner_table.md
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['tuner']; print('searched_at', t.get('searched_at')); print([l for l in t['log'] if 'cuDNN searched' in l])" $OUT/b/resnet50/tuner/resnet50.json
cd $OUT && gzip -9 -n b/*/tuner/*_profile.json 2>/dev/null; tar czf b.tgz b && rm -rf b
