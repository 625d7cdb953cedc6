#!/usr/bin/env bash
# Session 37, call b: call a's save_on_cpu runs at 237 ran past their 90 s; and its fixed-k runs
# kept 50 iterations at k_base 64 = 14 at 237 (the same number of images).  Again on call a's
# profile: dynamic at 237 (160 base iterations = 44 at 237) alternated twice with PyTorch
# save_on_cpu at 237, then every map kept at 237; the fillers' GPU tests first.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/b
timeout 60 python3 scripts/gpu_checks.py tests/test_fillers.py > $OUT/b/gpu_tests_fillers.txt 2>&1
echo "filler tests rc $? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/b/gpu_tests_fillers.txt
zcat docs/results/tuner_s37/a/vgg16_profile.json.gz > /tmp/p.json
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G MINICAFFE_RECOMPUTE_COST_LIMIT=0.03
K=237
A="train /tmp/v64.prototxt --engine CUDNN --swap dynamic --display 1 -gpu 0 --profile /tmp/p.json --batch $K --max-iter 160"
SOC="from scripts.bench_throughput import run_torch; r = run_torch('vgg16', $K, 5, 2, save_on_cpu=True, arch='prototxt'); print('save_on_cpu vgg16 $K', r['ms'], 'ms', $K * 1e3 / r['ms'], 'img/s')"
for r in 1 2; do
  timeout 80 python3 -m minicaffe $A --budget 12G --recompute auto > $OUT/b/dyn$r.log 2>&1
  echo "dyn$r rc $? at $(( $(date +%s) - T0 )) s"
  timeout 150 python3 -c "$SOC" > $OUT/b/soc$r.txt 2>&1
  echo "soc$r rc $? at $(( $(date +%s) - T0 )) s"; tail -1 $OUT/b/soc$r.txt
done
timeout 80 python3 -m minicaffe $A --budget 130G > $OUT/b/kept.log 2>&1
echo "kept rc $? at $(( $(date +%s) - T0 )) s"
python3 docs/results/tuner_s34/iter_ms.py $OUT/b/dyn1.log $OUT/b/dyn2.log $OUT/b/kept.log
cd $OUT && tar czf b.tgz b && rm -rf b
