#!/usr/bin/env bash
# Session 23, call A (one GPU): the CUDNN engine's GPU tests (the new fit), VGG-16's Table 1 row
# with each convolution's bytes per image fitted to its fastest algorithms (fresh profile), then
# ResNet-152 with --cuda-graph (fresh profile).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
left() { echo $(( ${TOTAL:-585} - ($(date +%s) - T0) )); }
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
timeout 120 python3 scripts/gpu_checks.py tests/layers/test_cudnn_engine.py tests/test_engine.py > $OUT/r/gpu_checks.txt 2>&1
echo "gpu_checks rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
timeout 280 python3 scripts/tuner_table.py --gpus 0 --nets vgg16:32 --engine CUDNN --timeout 270 --r152-batch 0 --out $OUT/r/vgg > $OUT/r/vgg.txt 2>&1
echo "vgg16 rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
if [ $(left) -gt 120 ]; then
  timeout $(( $(left) - 5 )) python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --timeout $(( $(left) - 15 )) --r152-batch 0 --cuda-graph --out $OUT/r/r152g > $OUT/r/r152g.txt 2>&1
  echo "r152 graph rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
fi
cat $OUT/r/steps.txt; tail -3 $OUT/r/gpu_checks.txt; grep FAILED $OUT/r/gpu_checks.txt | cut -c1-300
for f in vgg r152g; do grep -A3 "^| net | k Caffe" $OUT/r/$f/tuner_table.md 2>/dev/null | tail -1; grep "^| vgg16\|^| resnet152" $OUT/r/$f/tuner_table.md 2>/dev/null | head -8; done
cd $OUT && tar czf r.tgz r
