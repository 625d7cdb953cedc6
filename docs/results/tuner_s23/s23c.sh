#!/usr/bin/env bash
# Session 23, call C (4 GPUs): the whole GPU suite, then ResNet-152 --cuda-graph from call A's
# profile with the gap calibration, then VGG-16 --recompute auto (paper's rule) if time is left.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
left() { echo $(( ${TOTAL:-580} - ($(date +%s) - T0) )); }
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
timeout 380 python3 scripts/gpu_checks.py tests > $OUT/r/gpu_checks.txt 2>&1
echo "gpu_checks rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
if [ $(left) -gt 150 ]; then
  timeout $(( $(left) - 5 )) python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --timeout $(( $(left) - 12 )) --r152-batch 0 --cuda-graph --profiles dv/p2 --out $OUT/r/r152g > $OUT/r/r152g.txt 2>&1
  echo "r152 graph rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
fi
if [ $(left) -gt 130 ]; then
  timeout $(( $(left) - 5 )) python3 scripts/tuner_table.py --gpus 0 --nets vgg16:32 --engine CUDNN --timeout $(( $(left) - 12 )) --r152-batch 0 --recompute vgg16=auto --profiles dv/p2 --out $OUT/r/vgga > $OUT/r/vgga.txt 2>&1
  echo "vgg16 auto rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
fi
cat $OUT/r/steps.txt; tail -4 $OUT/r/gpu_checks.txt; grep FAILED $OUT/r/gpu_checks.txt | cut -c1-300
for f in r152g vgga; do grep "^| vgg16\|^| resnet152\|CUDA graph launches" $OUT/r/$f/tuner_table.md 2>/dev/null | head -8; done
cd $OUT && tar czf r.tgz r
