#!/usr/bin/env bash
# Session 24, call B: ResNet-152 (CUDNN, eager) through tuner_table with a fresh profile,
# after the 16-byte lanes of the fused kernels; the PyTorch peers at k*.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
left() { echo $(( ${TOTAL:-588} - ($(date +%s) - T0) )); }
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
timeout $(( $(left) - 6 )) python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --timeout $(( $(left) - 14 )) --r152-batch 0 --out $OUT/r/r152 > $OUT/r/r152.txt 2>&1
echo "r152 rc $? at $(( $(date +%s) - T0 )) s" > $OUT/r/steps.txt
cat $OUT/r/steps.txt; grep "^| resnet152" $OUT/r/r152/tuner_table.md 2>/dev/null; tail -5 $OUT/r/r152.txt
cp $OUT/r/r152/*profile* $OUT/r/ 2>/dev/null; ls $OUT/r/r152
cd $OUT && tar czf r.tgz r
