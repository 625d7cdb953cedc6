#!/usr/bin/env bash
# Session 44, call b: VGG-16 through the tuner on the graph API as session 40 ran it (1.5 GiB
# workspace cap, --recompute vgg16=auto), without the peers.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/b
L=$(( 585 - $(date +%s) + T0 ))
MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G timeout $L python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --no-stall-rounds 1 --iters 3 --no-torch --timeout $(( L - 5 )) --out $OUT/b/vgg16 > $OUT/b/vgg16.txt 2>&1
echo "vgg16 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| vgg16" $OUT/b/vgg16/tuner_table.md
cd $OUT && gzip -9 -n b/*/tuner/*_profile.json 2>/dev/null; rm -f b/*/*.png; tar czf b.tgz b && rm -rf b
