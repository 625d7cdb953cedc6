#!/usr/bin/env bash
# Session 33, call b: VGG-16's paper's rule with the prefetch lead, workspace fit off, on session
# 31's profile v (the same as session 32's call c1, without the tests).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
D=$OUT/${TAG:-b}; mkdir -p $D /tmp/prof_v
gunzip -c docs/results/tuner_s31/v/vgg16_profile.json.gz > /tmp/prof_v/vgg16_profile.json
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $D/host.txt 2>&1
MINICAFFE_CUDNN_FIT_FASTEST=0 timeout ${LIMIT:-560} python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --profiles /tmp/prof_v --timeout $(( ${LIMIT:-560} - 5 )) --out $D/vgg16 > $D/vgg16.txt 2>&1
echo "vgg16 rc $?"; grep "^| vgg16" $D/vgg16/tuner_table.md
cd $OUT && tar czf ${TAG:-b}.tgz ${TAG:-b}
