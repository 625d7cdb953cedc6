#!/usr/bin/env bash
# Device driver: STEPS="net:mode:comms:links:gpus[:suffix[:--opt=val,--opt=val]] ..." under one deadline.
# Each step appends to $OUT/r/${TAG}${SUF}.csv (suffix separates variants that share a row key).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s); BUDGET=${BUDGET:-500}
nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader > $OUT/r/${TAG}_gpus.txt
nproc >> $OUT/r/${TAG}_gpus.txt
for st in $STEPS; do
  IFS=: read -r net mode comms links gpus suf opts <<< "$st"
  left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ $left -lt 40 ]; then echo "skip $st (left $left s)" >> $OUT/r/${TAG}_steps.txt; continue; fi
  k=72; [ $net = resnet101 ] && k=104
  extra=$(echo "${opts:-}" | tr ',' ' ' | tr '=' ' ')
  echo "$(date -u +%T) $st (limit $left s)" >> $OUT/r/${TAG}_steps.txt
  MINICAFFE_SCRATCH=640M timeout $left python3 scripts/ps_scaling.py --nets $net --modes $mode --comms $comms --links $links --gpus $gpus \
    --profile $net=dv/p/${net}_profile.json --accudnn-batch $net=$k --warmup 3 --iters 6 --timeout 120 \
    --csv $OUT/r/${TAG}${suf:-}.csv --md $OUT/r/${TAG}${suf:-}.md --append --work-dir /tmp/w $extra >> $OUT/r/${TAG}.log 2>&1
  echo "  rc $? at $(date -u +%T)" >> $OUT/r/${TAG}_steps.txt
done
if [ -n "${TESTS:-}" ]; then
  left=$(( BUDGET + 60 - ($(date +%s) - T0) ))
  timeout $left python3 scripts/gpu_checks.py $TESTS > $OUT/r/${TAG}_gpu_checks.txt 2>&1
  echo "gpu_checks rc $?" >> $OUT/r/${TAG}_steps.txt
fi
cat $OUT/r/${TAG}_steps.txt; grep -h "^\[" $OUT/r/${TAG}.log; tail -3 $OUT/r/${TAG}_gpu_checks.txt 2>/dev/null
