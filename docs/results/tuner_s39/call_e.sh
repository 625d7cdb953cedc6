#!/usr/bin/env bash
# Session 39, call e: GoogLeNet through the tuner again on call d's profile (reused: its
# searches are in it), with the search kept only for the steps whose held-out profiled points
# it predicts better than the segments (swap.model._searched_wins) and the table's ks searched
# before any executor is installed; no PyTorch peers (call d has them).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/e
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; git log -1 --format=%h; } > $OUT/e/host.txt 2>&1
L=300
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets googlenet:128 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --profiles docs/results/tuner_s39/d/googlenet/tuner --timeout $(( L - 5 )) --out $OUT/e/googlenet > $OUT/e/googlenet.txt 2>&1
echo "googlenet rc $? at $(( $(date +%s) - T0 )) s"; grep "^| googlenet" $OUT/e/googlenet/tuner_table.md
grep -oh "cuDNN searched[^\"]*" $OUT/e/googlenet/tuner/googlenet.json | head -2
tail -3 $OUT/e/googlenet.txt
cd $OUT && tar czf e.tgz e && rm -rf e
