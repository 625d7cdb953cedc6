#!/usr/bin/env bash
# Session 38, call h: the GPU tests of this session's host changes (587b4f0, 4e764f0, af7306c:
# fused kernels looked up once, the SGD tables' key from the storages, cuDNN handles keeping
# their library, the bound convolutions' own try blocks), then the paired A/B of all of them
# against 0086a97's code (ab_host.py with old/ops.py, not kept in the tree: git show
# 0086a97:minicaffe/cudnn/ops.py > docs/results/tuner_s38/old/ops.py), ResNet-152 at 16 and ResNet-101 at 23.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/h
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/h/host.txt 2>&1
timeout 220 python3 scripts/gpu_checks.py tests/cudnn tests/layers/test_cudnn_engine.py tests/kernels/test_cuda_fused.py tests/test_networks.py tests/test_gpu_training.py > $OUT/h/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -8 $OUT/h/gpu_tests.txt
for nk in resnet152:16 resnet101:23; do
  timeout 150 python3 docs/results/tuner_s38/ab_host.py ${nk%%:*} ${nk##*:} 16 10 > $OUT/h/${nk%%:*}.txt 2>&1
  echo "rc $? at $(( $(date +%s) - T0 )) s"; head -1 $OUT/h/${nk%%:*}.txt; tail -1 $OUT/h/${nk%%:*}.txt
done
cd $OUT && tar czf h.tgz h && rm -rf h
