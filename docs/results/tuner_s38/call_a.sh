#!/usr/bin/env bash
# Session 38, call a (prepared in session 37): the first GPU run of the ReLU joining the
# BatchNorm+Scale pairs (session 37, after its device calls): the fused-kernel and network GPU
# tests, then ResNet-152 at 64 (`none`, CUDNN) with MINICAFFE_FUSE_BN_RELU=1 and 0 alternated
# twice (the speed it buys), and ResNet-50 at 128 the same way.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/a
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; git log -1 --format=%h; } > $OUT/a/host.txt 2>&1
timeout 200 python3 scripts/gpu_checks.py tests/kernels/test_cuda_fused.py tests/test_networks.py tests/test_gpu_training.py tests/swap/test_swap_gpu.py > $OUT/a/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -6 $OUT/a/gpu_tests.txt
for net in resnet152:64 resnet50:128; do
  n=${net%%:*}; k=${net##*:}
  sed -e 's/type: "gaussian"/type: "constant"/' -e "s/dim: 32$/dim: $k/" prototxt/$n/dummy.prototxt > /tmp/$n.prototxt
  grep -q "dim: $k$" /tmp/$n.prototxt || { echo "$n: batch dim not set"; continue; }
  for r in 1 2; do
    for f in 1 0; do
      MINICAFFE_FUSE_BN_RELU=$f timeout 80 python3 -m minicaffe train /tmp/$n.prototxt --engine CUDNN --display 1 -gpu 0 --max-iter 40 > $OUT/a/${n}_bnrelu${f}_$r.log 2>&1
      echo "$n bnrelu=$f round $r rc $? at $(( $(date +%s) - T0 )) s"
    done
  done
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/a/*.log
cd $OUT && tar czf a.tgz a && rm -rf a
