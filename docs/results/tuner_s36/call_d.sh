#!/usr/bin/env bash
# Session 36, call d, after the chunks of whole probes: VGG-16 under the 1.5 GiB cap through
# the three-stage training with the paper's objective (--auto-batch --k-objective largest
# --recompute auto), a fresh profile saved; then the fixed 221 (2.40x k_none) on that profile
# alternated with PyTorch save_on_cpu on the same network at 221.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/d
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/d/host.txt 2>&1
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G
B="train /tmp/v64.prototxt --engine CUDNN --swap dynamic --budget 12G --display 1 -gpu 0"
timeout 240 python3 -m minicaffe $B --auto-batch --k-objective largest --recompute auto --save-profile $OUT/d/vgg16_profile.json --max-iter 120 > $OUT/d/auto.log 2>&1
echo "auto rc $? at $(( $(date +%s) - T0 )) s"
grep -h "AccUDNN decision\|k\* \|swap 'dynamic'" $OUT/d/auto.log | cut -c1-400 | head -8
python3 docs/results/tuner_s34/iter_ms.py $OUT/d/auto.log
SOC="from scripts.bench_throughput import run_torch; r = run_torch('vgg16', 221, 5, 2, save_on_cpu=True, arch='prototxt'); print('save_on_cpu vgg16 221', r['ms'], 'ms', 221e3 / r['ms'], 'img/s')"
for r in 1 2; do
  [ -f $OUT/d/vgg16_profile.json ] && timeout 80 python3 -m minicaffe $B --profile $OUT/d/vgg16_profile.json --recompute auto --batch 221 --max-iter 60 > $OUT/d/dyn$r.log 2>&1
  echo "dyn$r rc $? at $(( $(date +%s) - T0 )) s"
  timeout 130 python3 -c "$SOC" > $OUT/d/soc$r.txt 2>&1
  echo "soc$r rc $? at $(( $(date +%s) - T0 )) s"; tail -1 $OUT/d/soc$r.txt
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/d/dyn1.log $OUT/d/dyn2.log
grep -h "AccUDNN decision: predicted\|swap 'dynamic'" $OUT/d/dyn1.log | cut -c1-300
gzip -9 $OUT/d/vgg16_profile.json; cd $OUT && tar czf d.tgz d && rm -rf d
