#!/usr/bin/env bash
# Session 38, call d: Table 1's GoogLeNet row redrawn with the
# Convolution + ReLU pairs (every GoogLeNet Convolution has its ReLU), as session 33's g2 ran
# it (no workspace cap), the PyTorch peers at k*.  One call of at most 600 s: fewer rounds.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/d
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; git log -1 --format=%h; } > $OUT/d/host.txt 2>&1
L=520
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets googlenet:128 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/d/googlenet > $OUT/d/googlenet.txt 2>&1
echo "googlenet rc $? at $(( $(date +%s) - T0 )) s"; grep "^| googlenet" $OUT/d/googlenet/tuner_table.md
cd $OUT && tar czf d.tgz d && rm -rf d
