#!/usr/bin/env bash
# Session 42, call f: ResNet-152 through tuner_table.py without the PyTorch peers (--no-torch), a fresh
# profile, every bound cuDNN convolution on the graph API (MINICAFFE_CUDNN_API=graph): session
# 41 call a is the same run on the legacy API (k* 72, 393 img/s; 36 at -12.1 %, 16 at -38.5 %).
# Call d (the same with the peers) did not finish in 590 s: the searches then took 9 to 29 s per
# minibatch; after call e they take 1.3 to 3.5 s.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
export MINICAFFE_CUDNN_API=graph
T0=$(date +%s)
mkdir -p $OUT/f
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/f/host.txt 2>&1
L=$(( 470 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --timeout $(( L - 5 )) --out $OUT/f/resnet152 > $OUT/f/resnet152.txt 2>&1
echo "resnet152 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet152" $OUT/f/resnet152/tuner_table.md
tail -5 $OUT/f/resnet152.txt
cd $OUT && gzip -9 -n f/*/tuner/*_profile.json 2>/dev/null; rm -f f/*/*.png; tar czf f.tgz f && rm -rf f
