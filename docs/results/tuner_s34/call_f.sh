#!/usr/bin/env bash
# Session 34, call f: after each chunk of a chunked convolution gets the cap as its workspace
# limit (minicaffe.layers.conv._call_limit): the cuDNN engine's GPU tests, then VGG-16 under
# the 1.5 GiB cap on call a's profile at a fixed 221 and 180 (call a's k*), with the algorithm
# choices (algos.py), against call b3/c's 306 ms at 221 and call a's 756 img/s at 180.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/tests $OUT/f
timeout 170 python3 scripts/gpu_checks.py tests/layers/test_cudnn_engine.py tests/test_engine.py tests/swap/test_swap_gpu.py > $OUT/tests/gpu_tests_f.txt 2>&1
echo "gpu_tests rc $? at $(( $(date +%s) - T0 )) s"; tail -6 $OUT/tests/gpu_tests_f.txt
zcat docs/results/tuner_s34/a/cap1.5G/vgg16/tuner/vgg16_profile.json.gz > /tmp/p.json
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G
A="train /tmp/v64.prototxt --engine CUDNN --swap dynamic --budget 12G --profile /tmp/p.json --recompute auto --max-iter 100 --display 1 -gpu 0"
for k in 221 180; do
  timeout 120 python3 docs/results/tuner_s34/algos.py $OUT/f/dyn$k.json $A --batch $k --memory-trace $OUT/f/dyn$k.csv > $OUT/f/dyn$k.log 2>&1
  echo "dyn$k rc $? at $(( $(date +%s) - T0 )) s"
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/f/dyn221.log $OUT/f/dyn180.log
grep -h "AccUDNN decision: predicted\|swap 'dynamic'" $OUT/f/*.log | cut -c1-330
gzip -9 $OUT/f/*.csv
