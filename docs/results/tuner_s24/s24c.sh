#!/usr/bin/env bash
# Session 24, call C: graph_copies with copies shorter than the kernels; ResNet-152's host
# issue time per k under `none` (is the tuner's host profile at k = 3-9 inflated?); the
# whole GPU suite; VGG-16 --recompute auto (paper's rule) if time is left.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
T0=$(date +%s)
left() { echo $(( ${TOTAL:-588} - ($(date +%s) - T0) )); }
step() { echo "$1 rc $2 at $(( $(date +%s) - T0 )) s" >> $OUT/r/steps.txt; }
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/r/host.txt 2>&1
timeout 60 python3 scripts/graph_copies.py --copy-mb 1024 --out $OUT/r/graph_copies_1g.csv > $OUT/r/graph_copies_1g.txt 2>&1
step graph_copies $?
timeout 80 python3 scripts/host_profile.py --nets resnet152:3/6/9 --engine CUDNN --strategy none --budget 12G --warmup 2 --iterations 5 --out-dir $OUT/r/hp > $OUT/r/hp.txt 2>&1
step host_profile_12G $?
timeout 80 python3 scripts/host_profile.py --nets resnet152:6/16/32 --engine CUDNN --strategy none --warmup 2 --iterations 5 --out-dir $OUT/r/hp2 > $OUT/r/hp2.txt 2>&1
step host_profile_device $?
timeout 330 python3 scripts/gpu_checks.py tests > $OUT/r/gpu_checks.txt 2>&1
step gpu_checks $?
if [ $(left) -gt 140 ]; then
  timeout $(( $(left) - 5 )) python3 scripts/tuner_table.py --gpus 0 --nets vgg16:32 --engine CUDNN --timeout $(( $(left) - 12 )) --r152-batch 0 --recompute vgg16=auto --profiles dv/p3 --out $OUT/r/vgga > $OUT/r/vgga.txt 2>&1
  step "vgg16 auto" $?
fi
cat $OUT/r/steps.txt; cat $OUT/r/graph_copies_1g.txt | tail -6; grep "^|" $OUT/r/hp/host_profile.md $OUT/r/hp2/host_profile.md; tail -3 $OUT/r/hp.txt $OUT/r/hp2.txt; tail -4 $OUT/r/gpu_checks.txt; grep FAILED $OUT/r/gpu_checks.txt | cut -c1-300
grep "^| vgg16" $OUT/r/vgga/tuner_table.md 2>/dev/null | head -8
rm -f $OUT/r/hp/*.json $OUT/r/hp2/*.json
cd $OUT && tar czf r.tgz r
