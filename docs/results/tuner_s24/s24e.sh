#!/usr/bin/env bash
# Session 24, call E: ResNet-152 --cuda-graph from call B's profile (dv/p3), with the lanes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
timeout 245 python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --timeout 238 --r152-batch 0 --cuda-graph --profiles dv/p3 --out $OUT/r/r152g > $OUT/r/r152g.txt 2>&1
echo "r152 graph rc $?"
grep "^| resnet152\|CUDA graph launches" $OUT/r/r152g/tuner_table.md 2>/dev/null; tail -3 $OUT/r/r152g.txt
cd $OUT && tar czf r.tgz r
