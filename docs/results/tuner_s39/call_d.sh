#!/usr/bin/env bash
# Session 39, call d: GoogLeNet through the tuner (12 GiB, CUDNN) with its convolutions priced
# by cuDNN's search and the choice by images/s asking every 8th k (f69935e); session 38's
# call d is the same command before them.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/d
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; git log -1 --format=%h; } > $OUT/d/host.txt 2>&1
L=575
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets googlenet:128 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/d/googlenet > $OUT/d/googlenet.txt 2>&1
echo "googlenet rc $? at $(( $(date +%s) - T0 )) s"; grep "^| googlenet" $OUT/d/googlenet/tuner_table.md
grep -oh "cuDNN searched[^\"]*\|compute beside a copy[^\"]*" $OUT/d/googlenet/tuner/googlenet.json | head -4
tail -5 $OUT/d/googlenet.txt
cd $OUT && tar czf d.tgz d && rm -rf d
