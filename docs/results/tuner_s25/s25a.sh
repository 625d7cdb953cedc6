#!/usr/bin/env bash
# Session 25, call A: ResNet-152 at 89 taken apart (none / kept / dynamic, traced, from
# session 24 call b's profile in dv/p3), then the whole GPU suite.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
step() { echo "$1 rc $2 at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt; }
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
timeout 200 python3 scripts/swap_anatomy.py --net resnet152 --k 89 --engine CUDNN --profile dv/p3/resnet152_profile.json --out-dir $OUT/r/anat > $OUT/r/anat.txt 2>&1
step anatomy $?
timeout 370 python3 scripts/gpu_checks.py tests > $OUT/r/gpu_checks.txt 2>&1
step gpu_checks $?
cat $OUT/r/steps.txt; tail -40 $OUT/r/anat.txt; tail -12 $OUT/r/gpu_checks.txt
cd $OUT/r/anat && gzip -q trace_*.csv; cd $OUT && tar czf r.tgz r
