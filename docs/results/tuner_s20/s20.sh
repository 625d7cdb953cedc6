#!/usr/bin/env bash
# Session 20, one GPU: GPU tests of the dynamic plan's recomputation, then VGG-16's Table 1 row
# with conv1_1 recomputed and without (same profile, same machine), then AlexNet without chunks.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
left() { echo $(( ${TOTAL:-585} - ($(date +%s) - T0) )); }
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
python3 scripts/gpu_checks.py tests/swap/test_dynamic_recompute.py tests/swap/test_recompute.py > $OUT/r/gpu_checks.txt 2>&1
echo "gpu_checks rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
timeout $(( $(left) - 10 )) python3 scripts/tuner_table.py --gpus 0 --nets vgg16:32 --engine CUDNN --timeout 300 --r152-batch 0 --recompute vgg16=conv1_1 --out $OUT/r/rc > $OUT/r/rc.txt 2>&1
echo "rc run rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
mkdir -p /tmp/p && cp $OUT/r/rc/tuner/vgg16_profile.json /tmp/p/ 2>/dev/null
if [ $(left) -gt 150 ]; then
  timeout $(( $(left) - 10 )) python3 scripts/tuner_table.py --gpus 0 --nets vgg16:32 --engine CUDNN --timeout 240 --r152-batch 0 --profiles /tmp/p --out $OUT/r/plain > $OUT/r/plain.txt 2>&1
  echo "plain run rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
fi
if [ $(left) -gt 170 ]; then
  MINICAFFE_CUDNN_CHUNKS=0 timeout $(( $(left) - 5 )) python3 scripts/tuner_table.py --gpus 0 --nets alexnet:256 --engine CUDNN --timeout 200 --r152-batch 0 --out $OUT/r/ax0 > $OUT/r/ax0.txt 2>&1
  echo "alexnet chunks off rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
fi
cat $OUT/r/steps.txt; tail -5 $OUT/r/gpu_checks.txt
for f in rc plain ax0; do grep -A3 "^| net | k Caffe" $OUT/r/$f/tuner_table.md 2>/dev/null | tail -1; done
cd $OUT && tar czf r.tgz r
