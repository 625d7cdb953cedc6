#!/usr/bin/env bash
# Session 25, call C: ResNet-152 through tuner_table again (fresh profile with the copy
# calibration), then the anatomy (none / kept / dynamic, traced) at the k* it chose, from
# that run's own profile.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
left() { echo $(( ${TOTAL:-540} - ($(date +%s) - T0) )); }
step() { echo "$1 rc $2 at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt; }
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
timeout 430 python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --timeout 422 --r152-batch 0 --out $OUT/r/r152 > $OUT/r/r152.txt 2>&1
step r152 $?
K=$(python3 -c "import json;print(json.load(open('$OUT/r/r152/tuner/resnet152.json'))['tuner']['k_star'])" 2>/dev/null)
if [ -n "$K" ] && [ $(left) -gt 60 ]; then
  timeout $(( $(left) - 5 )) python3 scripts/swap_anatomy.py --net resnet152 --k $K --engine CUDNN --iterations 3 --profile $OUT/r/r152/tuner/resnet152_profile.json --out-dir $OUT/r/anat > $OUT/r/anat.txt 2>&1
  step "anatomy k=$K" $?
fi
cat $OUT/r/steps.txt; grep "^| resnet152" $OUT/r/r152/tuner_table.md 2>/dev/null; tail -22 $OUT/r/anat.txt
rm -f $OUT/r/anat/trace_*.csv
cd $OUT && tar czf r.tgz r
