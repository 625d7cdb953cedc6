#!/usr/bin/env bash
# Session 24, call A: GPU tests of the fused kernels (16-byte lanes), the kernel bench,
# graph_copies (first GPU run), ResNet-152 at 85 with lanes on and off (ABAB).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
left() { echo $(( ${TOTAL:-585} - ($(date +%s) - T0) )); }
step() { echo "$1 rc $2 at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt; }
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
timeout 200 python3 scripts/gpu_checks.py tests/kernels tests/layers/test_batchnorm.py tests/layers/test_scale.py tests/layers/test_eltwise.py tests/layers/test_shape.py tests/scripts/test_fused_bench.py tests/scripts/test_graph_copies.py > $OUT/r/gpu_checks.txt 2>&1
step gpu_checks $?
timeout 120 python3 scripts/fused_bench.py --batch 85 --out $OUT/r/fused_bench.csv > $OUT/r/fused_bench.txt 2>&1
step fused_bench $?
timeout 150 python3 scripts/graph_copies.py --out $OUT/r/graph_copies.csv > $OUT/r/graph_copies.txt 2>&1
step graph_copies $?
for i in 1 0 1 0; do
  if [ $(left) -gt 70 ]; then
    MINICAFFE_FUSED_LANES=$i timeout $(( $(left) - 10 )) python3 scripts/bench_throughput.py --nets resnet152:85 --engines CUDNN --no-torch --repeat 1 --csv $OUT/r/r152_lanes$i.$(date +%s).csv >> $OUT/r/r152_ab.txt 2>&1
    step "r152 lanes=$i" $?
  fi
done
cat $OUT/r/steps.txt; tail -12 $OUT/r/gpu_checks.txt; cat $OUT/r/fused_bench.txt | tail -30; tail -15 $OUT/r/graph_copies.txt; grep "run 0" $OUT/r/r152_ab.txt
cd $OUT && tar czf r.tgz r
