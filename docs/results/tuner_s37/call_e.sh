#!/usr/bin/env bash
# Session 37, call e: the end-to-end GPU training tests with the wheels (call d ran them
# without: LMDB missing), the pairs' GPU test with its tolerance for cuDNN algorithms searched
# apart; then the pairs' effect on AlexNet (batch 256) and GoogLeNet (batch 128), `none`,
# CUDNN, each with MINICAFFE_FUSE_CONV_RELU=1 and 0, alternated.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/e
timeout 150 python3 scripts/gpu_checks.py tests/test_gpu_training.py "tests/kernels/test_cuda_fused.py::test_conv_relu_pair_on_cudnn_is_the_two_layers" > $OUT/e/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -4 $OUT/e/gpu_tests.txt
for net in alexnet:256 googlenet:128; do
  n=${net%%:*}; k=${net##*:}
  sed -e 's/type: "gaussian"/type: "constant"/' -e "s/dim: 32$/dim: $k/" -e "s/dim: 256$/dim: $k/" prototxt/$n/dummy.prototxt > /tmp/$n.prototxt
  for r in 1 2; do
    for f in 1 0; do
      MINICAFFE_FUSE_CONV_RELU=$f timeout 60 python3 -m minicaffe train /tmp/$n.prototxt --engine CUDNN --display 1 -gpu 0 --max-iter 40 > $OUT/e/${n}_fuse${f}_$r.log 2>&1
      echo "$n fuse=$f round $r rc $? at $(( $(date +%s) - T0 )) s"
    done
  done
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/e/*.log
cd $OUT && tar czf e.tgz e && rm -rf e
