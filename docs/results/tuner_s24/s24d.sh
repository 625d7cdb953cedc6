#!/usr/bin/env bash
# Session 24, call D: ResNet-152 (CUDNN, eager) again with a fresh profile, now with the host
# bound from whole iterations without hooks; then ResNet-152 --cuda-graph from call B's
# profile (dv/p3) if time is left.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
left() { echo $(( ${TOTAL:-588} - ($(date +%s) - T0) )); }
step() { echo "$1 rc $2 at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt; }
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
timeout 400 python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --timeout 392 --r152-batch 0 --out $OUT/r/r152 > $OUT/r/r152.txt 2>&1
step r152 $?
if [ $(left) -gt 200 ]; then
  timeout $(( $(left) - 5 )) python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --timeout $(( $(left) - 12 )) --r152-batch 0 --cuda-graph --profiles dv/p3 --out $OUT/r/r152g > $OUT/r/r152g.txt 2>&1
  step "r152 graph" $?
fi
cat $OUT/r/steps.txt; grep "^| resnet152" $OUT/r/r152/tuner_table.md $OUT/r/r152g/tuner_table.md 2>/dev/null; grep "whole\|host issue" $OUT/r/r152.txt | head -8; tail -3 $OUT/r/r152g.txt
cd $OUT && tar czf r.tgz r
