#!/usr/bin/env bash
# Session 38, call g: the ReLU joined to the BatchNorm+Scale pairs, on against off, paired in one process
# the code before and after 587b4f0, 16 rounds of 10 steps; ResNet-152 at 16, ResNet-101 at 23.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/g
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/g/host.txt 2>&1
for nk in resnet152:16 resnet101:23; do
  timeout 200 python3 docs/results/tuner_s38/ab_host.py ${nk%%:*} ${nk##*:} 16 10 bnrelu > $OUT/g/${nk%%:*}.txt 2>&1
  echo "rc $?"; tail -1 $OUT/g/${nk%%:*}.txt
done
cd $OUT && tar czf g.tgz g && rm -rf g
