#!/usr/bin/env bash
# Session 42, call d: ResNet-152 through tuner_table.py with the PyTorch peers and a fresh
# profile, every bound cuDNN convolution on the graph API (MINICAFFE_CUDNN_API=graph): session
# 41 call a is the same run on the legacy API (k* 72, 393 img/s; 36 at -12.1 %, 16 at -38.5 %).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
export MINICAFFE_CUDNN_API=graph
T0=$(date +%s)
mkdir -p $OUT/d
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/d/host.txt 2>&1
L=$(( 590 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/d/resnet152 > $OUT/d/resnet152.txt 2>&1
echo "resnet152 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet152" $OUT/d/resnet152/tuner_table.md
tail -5 $OUT/d/resnet152.txt
cd $OUT && gzip -9 -n d/*/tuner/*_profile.json 2>/dev/null; rm -f d/*/*.png; tar czf d.tgz d && rm -rf d
