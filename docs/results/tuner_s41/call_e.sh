#!/usr/bin/env bash
# Session 41, call e: GPU tests of c3fd82a (MultiTensorSGD.matches' identity fast path) and
# 7a48ada (TransientMeter.abandon), then the paired A/B of the fast path (ab_sgd.py), ResNet-152
# at 16 and ResNet-101 at 23, then host_profile.py on ResNet-152 at 16 again.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/e
timeout 200 python3 scripts/gpu_checks.py tests/kernels/test_cuda_fused.py tests/swap/test_swap_gpu.py tests/swap/test_swap_alloc.py > $OUT/e/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -4 $OUT/e/gpu_tests.txt
for nk in resnet152:16 resnet101:23; do
  timeout 120 python3 docs/results/tuner_s41/ab_sgd.py ${nk%%:*} ${nk##*:} 16 10 > $OUT/e/ab_${nk%%:*}.txt 2>&1
  echo "rc $? at $(( $(date +%s) - T0 )) s"; grep "matches()" $OUT/e/ab_${nk%%:*}.txt; tail -1 $OUT/e/ab_${nk%%:*}.txt
done
timeout 100 python3 docs/results/tuner_s41/host_profile.py resnet152 16 60 10 $OUT/e/hp_r152 2>&1 | head -1
cd $OUT && tar czf e.tgz e && rm -rf e
