#!/usr/bin/env bash
# Session 20, second call (one GPU): VGG-16 with conv1_1 recomputable where pins alone stall
# (from the first call's profile), then the GPU tests of swap/.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; date -u; } > $OUT/r/host.txt 2>&1
timeout 250 python3 scripts/tuner_table.py --gpus 0 --nets vgg16:32 --engine CUDNN --timeout 240 --r152-batch 0 --recompute vgg16=conv1_1 --profiles dv/p --out $OUT/r/rc2 > $OUT/r/rc2.txt 2>&1
echo "rc2 run rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
timeout $(( 430 - ($(date +%s) - T0) )) python3 scripts/gpu_checks.py tests/swap > $OUT/r/gpu_checks.txt 2>&1
echo "gpu_checks rc $? at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt
cat $OUT/r/steps.txt; tail -4 $OUT/r/gpu_checks.txt; grep FAILED $OUT/r/gpu_checks.txt | cut -c1-300
grep "^| vgg16" $OUT/r/rc2/tuner_table.md
cd $OUT && tar czf r.tgz r
