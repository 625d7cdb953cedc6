#!/usr/bin/env bash
# Session 39, call e (and g, after the table searches its ks before saving the profile): GoogLeNet through the tuner again on call d's profile (reused: its
# searches are in it), with the search kept only for the steps whose held-out profiled points
# it predicts better than the segments (swap.model._searched_wins) and the table's ks searched
# before any executor is installed; no PyTorch peers (call d has them).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
E=${E:-e}; mkdir -p $OUT/$E
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; git log -1 --format=%h; } > $OUT/$E/host.txt 2>&1
L=${L:-300}
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets googlenet:128 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --profiles docs/results/tuner_s39/d/googlenet/tuner --timeout $(( L - 5 )) --out $OUT/$E/googlenet > $OUT/$E/googlenet.txt 2>&1
echo "googlenet rc $? at $(( $(date +%s) - T0 )) s"; grep "^| googlenet" $OUT/$E/googlenet/tuner_table.md
grep -oh "cuDNN searched[^\"]*" $OUT/$E/googlenet/tuner/googlenet.json | head -2
grep -o "\"searched_at\": {[^}]*}" $OUT/$E/googlenet/googlenet.json $OUT/$E/googlenet/tuner/googlenet.json 2>/dev/null | head -2
cd $OUT && tar czf $E.tgz $E && rm -rf $E
