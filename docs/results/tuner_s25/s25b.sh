#!/usr/bin/env bash
# Session 25, call B: ResNet-152 (CUDNN, eager) through tuner_table with a fresh profile, now
# with the copy calibration (every map kept at the smallest naive k) and the tuner's 2 %
# bound on what copies add to the compute; then the GPU tests of swap/.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
left() { echo $(( ${TOTAL:-588} - ($(date +%s) - T0) )); }
step() { echo "$1 rc $2 at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt; }
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
timeout 460 python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --timeout 452 --r152-batch 0 --out $OUT/r/r152 > $OUT/r/r152.txt 2>&1
step r152 $?
if [ $(left) -gt 60 ]; then
  timeout $(( $(left) - 5 )) python3 scripts/gpu_checks.py tests/swap/test_swap_gpu.py tests/swap/test_swap_graph_gpu.py > $OUT/r/gpu_swap.txt 2>&1
  step gpu_swap $?
fi
cat $OUT/r/steps.txt; grep "^| resnet152" $OUT/r/r152/tuner_table.md 2>/dev/null; grep -i "copy calibration\|beside a copy\|AccUDNN decision: k\*\|predicted iteration" $OUT/r/r152.txt | head -8; tail -4 $OUT/r/gpu_swap.txt
cp $OUT/r/r152/*profile* $OUT/r/ 2>/dev/null; ls $OUT/r/r152
cd $OUT && tar czf r.tgz r
