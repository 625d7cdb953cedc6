#!/usr/bin/env bash
# Session 33: VGG-16 with the cuDNN workspace fit on, --recompute auto, fresh profiles, under a
# lower workspace cap per call ($MINICAFFE_CUDNN_WORKSPACE_CAP; default a quarter of the budget,
# 3 GiB at 12 GiB).  Usage: TOTAL=470 bash docs/results/tuner_s33/call_cap.sh 1.5G 1G
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
T0=$(date +%s); left() { echo $(( ${TOTAL:-470} - ($(date +%s) - T0) )); }
for cap in "$@"; do
  D=$OUT/cap$cap; mkdir -p $D
  if [ $(left) -lt ${NEED:-200} ]; then echo "cap $cap skipped"; continue; fi
  { nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $D/host.txt 2>&1
  L=$(( $(left) - 5 ))
  MINICAFFE_CUDNN_WORKSPACE_CAP=$cap timeout $L python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --timeout $(( L - 5 )) --out $D/vgg16 > $D/vgg16.txt 2>&1
  echo "cap $cap rc $? at $(( $(date +%s) - T0 )) s"; grep "^| vgg16" $D/vgg16/tuner_table.md
  cp $D/vgg16/tuner/*profile* $D/ 2>/dev/null
done
cd $OUT && tar czf cap.tgz cap*
