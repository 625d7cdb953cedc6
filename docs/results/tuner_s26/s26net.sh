#!/usr/bin/env bash
# Session 26, calls B and later: networks through tuner_table (CUDNN, fresh profiles, both
# PyTorch peers), one after another while the call's time lasts.  Usage:
#   TAG=b bash docs/results/tuner_s26/s26net.sh resnet101:32 [resnet50:64 ...]
# A network starts only with at least NEED seconds left (default 330).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
D=$OUT/$TAG; mkdir -p $D
T0=$(date +%s)
left() { echo $(( ${TOTAL:-585} - ($(date +%s) - T0) )); }
step() { echo "$1 rc $2 at $(( $(date +%s) - T0 )) s" >> $D/steps.txt; }
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $D/host.txt 2>&1
for spec in "$@"; do
  n=${spec%%:*}
  if [ $(left) -lt ${NEED:-330} ]; then step "$n skipped" -; continue; fi
  timeout $(( $(left) - 5 )) python3 scripts/tuner_table.py --gpus 0 --nets $spec --engine CUDNN --timeout $(( $(left) - 10 )) --r152-batch 0 --out $D/$n > $D/$n.txt 2>&1
  step $n $?
  grep "^| $n" $D/$n/tuner_table.md 2>/dev/null
  cp $D/$n/tuner/*profile* $D/ 2>/dev/null
done
cat $D/steps.txt
cd $OUT && tar czf $TAG.tgz $TAG
