#!/usr/bin/env bash
# Session 40, call b (prepared in session 39): GoogLeNet on session 39's profile at
# SEARCH_MARGIN = 0.75 (session 39's calls e and g had every winning step searched: 192 was
# +6.6 % back to back; the CPU replay at 0.75 gives about +4.8 %), then VGG-16 under the 1.5 GiB
# cap with a fresh profile (session 39's call c had every winning step searched and every k).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/b
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/b/host.txt 2>&1
timeout 170 python3 scripts/tuner_table.py --gpus 0 --nets googlenet:128 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --profiles docs/results/tuner_s39/d/googlenet/tuner --timeout 165 --out $OUT/b/googlenet > $OUT/b/googlenet.txt 2>&1
echo "googlenet rc $? at $(( $(date +%s) - T0 )) s"; grep "^| googlenet" $OUT/b/googlenet/tuner_table.md
L=$(( 585 - $(date +%s) + T0 ))
MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G timeout $L python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --no-stall-rounds 1 --iters 3 --no-torch --timeout $(( L - 5 )) --out $OUT/b/vgg16 > $OUT/b/vgg16.txt 2>&1
echo "vgg16 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| vgg16" $OUT/b/vgg16/tuner_table.md
cd $OUT && gzip -9 -n b/*/tuner/*_profile.json 2>/dev/null; tar czf b.tgz b && rm -rf b
