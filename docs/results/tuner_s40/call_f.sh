#!/usr/bin/env bash
# Session 40, call f: Python's garbage collector against the host's pace (ab_gc.py), ResNet-101
# at 4 and 23 (its k_none, host-bound: call e's time error there was +17 %, -5 % with the host
# timed again).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/f
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/f/host.txt 2>&1
timeout 150 python3 docs/results/tuner_s40/ab_gc.py resnet101 4 16 10 2>&1 | tee $OUT/f/r101_k4.txt | tail -3
timeout 150 python3 docs/results/tuner_s40/ab_gc.py resnet101 23 10 10 2>&1 | tee $OUT/f/r101_k23.txt | tail -3
