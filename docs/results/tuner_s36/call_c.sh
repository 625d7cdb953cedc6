#!/usr/bin/env bash
# Session 36, call c, after the chunks of whole probes (a chunk holds at most a multiple of the
# probe's 16 images): the cuDNN engine's GPU tests, then VGG-16 at 221 under the 1.5 GiB cap:
# every map kept (call b: 282.9 ms before, 270.2 under a 3 GiB cap), and dynamic (session 34's
# profile) alternated with PyTorch save_on_cpu on the same network at 221.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/tests $OUT/c
timeout 120 python3 scripts/gpu_checks.py tests/layers/test_cudnn_engine.py tests/test_engine.py tests/cudnn > $OUT/tests/gpu_tests_c.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -5 $OUT/tests/gpu_tests_c.txt
zcat docs/results/tuner_s34/a/cap1.5G/vgg16/tuner/vgg16_profile.json.gz > /tmp/p.json
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G
A="train /tmp/v64.prototxt --engine CUDNN --swap dynamic --profile /tmp/p.json --batch 221 --max-iter 60 --display 1 -gpu 0"
timeout 80 python3 docs/results/tuner_s34/algos.py $OUT/c/kept.json $A --budget 130G > $OUT/c/kept.log 2>&1
echo "kept rc $? at $(( $(date +%s) - T0 )) s"
SOC="from scripts.bench_throughput import run_torch; r = run_torch('vgg16', 221, 5, 2, save_on_cpu=True, arch='prototxt'); print('save_on_cpu vgg16 221', r['ms'], 'ms', 221e3 / r['ms'], 'img/s')"
for r in 1 2; do
  timeout 80 python3 docs/results/tuner_s34/algos.py $OUT/c/dyn$r.json $A --budget 12G --recompute auto > $OUT/c/dyn$r.log 2>&1
  echo "dyn$r rc $? at $(( $(date +%s) - T0 )) s"
  timeout 70 python3 -c "$SOC" > $OUT/c/soc$r.txt 2>&1
  echo "soc$r rc $? at $(( $(date +%s) - T0 )) s"; tail -1 $OUT/c/soc$r.txt
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/c/kept.log $OUT/c/dyn1.log $OUT/c/dyn2.log
grep -h "AccUDNN decision: predicted\|swap 'dynamic'" $OUT/c/dyn1.log | cut -c1-300
cd $OUT && tar czf c.tgz c tests && rm -rf c tests
