#!/usr/bin/env bash
# Session 40, call a (prepared in session 39): the search pricing at SEARCH_MARGIN = 0.75
# (b6d5f1d, CPU replay only) on the GPU: the swap GPU tests, then a fresh ResNet-50 row (its
# 1x1 and 3x3 convolutions have many shapes: the tuner's "cuDNN searched ... (s)" line says
# what the searches cost; tuner.searched_at which table points they priced).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/a
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/a/host.txt 2>&1
timeout 120 python3 scripts/gpu_checks.py tests/swap/test_swap_gpu.py > $OUT/a/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/a/gpu_tests.txt
L=$(( 585 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet50:36 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/a/resnet50 > $OUT/a/resnet50.txt 2>&1
echo "resnet50 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet50" $OUT/a/resnet50/tuner_table.md
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['tuner']; print('searched_at', t.get('searched_at')); print([l for l in t['log'] if 'cuDNN searched' in l])" $OUT/a/resnet50/tuner/resnet50.json
cd $OUT && gzip -9 -n a/resnet50/tuner/*_profile.json; tar czf a.tgz a && rm -rf a
