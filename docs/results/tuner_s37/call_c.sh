#!/usr/bin/env bash
# Session 37, call c, after the Convolution + in-place ReLU pairs (bbd6382): their GPU tests and
# the cuDNN engine's; VGG-16 under the 1.5 GiB cap and a 3 % recompute bound through the
# three-stage training (fresh profile); at its k*: every map kept with the pairs and without
# (MINICAFFE_FUSE_CONV_RELU=0), then dynamic alternated twice with PyTorch save_on_cpu.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/c
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; git log -1 --format=%h; } > $OUT/c/host.txt 2>&1
timeout 150 python3 scripts/gpu_checks.py tests/kernels/test_cuda_fused.py tests/layers/test_cudnn_engine.py tests/cudnn > $OUT/c/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -5 $OUT/c/gpu_tests.txt
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G MINICAFFE_RECOMPUTE_COST_LIMIT=0.03
B="train /tmp/v64.prototxt --engine CUDNN --swap dynamic --display 1 -gpu 0"
timeout 150 python3 -m minicaffe $B --budget 12G --auto-batch --k-objective largest --recompute auto --save-profile $OUT/c/vgg16_profile.json --max-iter 120 > $OUT/c/auto.log 2>&1
echo "auto rc $? at $(( $(date +%s) - T0 )) s"
grep -h "AccUDNN decision" $OUT/c/auto.log | cut -c1-300 | head -6
K=$(grep -o "AccUDNN decision: k\* = [0-9]*" $OUT/c/auto.log | head -1 | grep -o "[0-9]*$")
K=${K:-237}
echo "k* $K"
A="$B --profile $OUT/c/vgg16_profile.json --batch $K --max-iter 160"
timeout 70 python3 -m minicaffe $A --budget 130G > $OUT/c/kept.log 2>&1
echo "kept rc $? at $(( $(date +%s) - T0 )) s"
MINICAFFE_FUSE_CONV_RELU=0 timeout 70 python3 -m minicaffe $A --budget 130G > $OUT/c/kept_apart.log 2>&1
echo "kept apart rc $? at $(( $(date +%s) - T0 )) s"
SOC="from scripts.bench_throughput import run_torch; r = run_torch('vgg16', $K, 5, 2, save_on_cpu=True, arch='prototxt'); print('save_on_cpu vgg16 $K', r['ms'], 'ms', $K * 1e3 / r['ms'], 'img/s')"
for r in 1 2; do
  timeout 70 python3 -m minicaffe $A --budget 12G --recompute auto > $OUT/c/dyn$r.log 2>&1
  echo "dyn$r rc $? at $(( $(date +%s) - T0 )) s"
  timeout 130 python3 -c "$SOC" > $OUT/c/soc$r.txt 2>&1
  echo "soc$r rc $? at $(( $(date +%s) - T0 )) s"; tail -1 $OUT/c/soc$r.txt
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/c/auto.log $OUT/c/kept.log $OUT/c/kept_apart.log $OUT/c/dyn1.log $OUT/c/dyn2.log
grep -h "AccUDNN decision: predicted\|AccUDNN decision: recomputed\|swap 'dynamic'" $OUT/c/dyn1.log | cut -c1-300
gzip -9 $OUT/c/vgg16_profile.json; cd $OUT && tar czf c.tgz c && rm -rf c
