#!/usr/bin/env bash
# Session 37, call a: VGG-16 under the 1.5 GiB cuDNN workspace cap with recomputations allowed
# up to 3 % of the compute (MINICAFFE_RECOMPUTE_COST_LIMIT=0.03; session 36's CPU replay of its
# profile: the paper's objective takes 237 recomputing conv1_1, predicted 773 img/s).  The
# three-stage training (--auto-batch --k-objective largest --recompute auto, fresh profile);
# then at its k*: every map kept (130 GiB budget), and the fixed k* on the fresh profile
# alternated twice with PyTorch save_on_cpu on the same network at k*.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/a
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; git log -1 --format=%h; } > $OUT/a/host.txt 2>&1
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G MINICAFFE_RECOMPUTE_COST_LIMIT=0.03
B="train /tmp/v64.prototxt --engine CUDNN --swap dynamic --display 1 -gpu 0"
timeout 240 python3 -m minicaffe $B --budget 12G --auto-batch --k-objective largest --recompute auto --save-profile $OUT/a/vgg16_profile.json --max-iter 120 > $OUT/a/auto.log 2>&1
echo "auto rc $? at $(( $(date +%s) - T0 )) s"
grep -h "AccUDNN decision" $OUT/a/auto.log | cut -c1-400 | head -9
python3 docs/results/tuner_s34/iter_ms.py $OUT/a/auto.log
K=$(grep -o "AccUDNN decision: k\* = [0-9]*" $OUT/a/auto.log | head -1 | grep -o "[0-9]*$")
K=${K:-237}
echo "k* $K"
A="$B --profile $OUT/a/vgg16_profile.json --batch $K --max-iter 50"
timeout 80 python3 docs/results/tuner_s34/algos.py $OUT/a/kept.json $A --budget 130G > $OUT/a/kept.log 2>&1
echo "kept rc $? at $(( $(date +%s) - T0 )) s"
SOC="from scripts.bench_throughput import run_torch; r = run_torch('vgg16', $K, 5, 2, save_on_cpu=True, arch='prototxt'); print('save_on_cpu vgg16 $K', r['ms'], 'ms', $K * 1e3 / r['ms'], 'img/s')"
for r in 1 2; do
  timeout 80 python3 -m minicaffe $A --budget 12G --recompute auto > $OUT/a/dyn$r.log 2>&1
  echo "dyn$r rc $? at $(( $(date +%s) - T0 )) s"
  timeout 90 python3 -c "$SOC" > $OUT/a/soc$r.txt 2>&1
  echo "soc$r rc $? at $(( $(date +%s) - T0 )) s"; tail -1 $OUT/a/soc$r.txt
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/a/kept.log $OUT/a/dyn1.log $OUT/a/dyn2.log
grep -h "AccUDNN decision: predicted\|AccUDNN decision: recomputed\|swap 'dynamic'" $OUT/a/dyn1.log | cut -c1-300
gzip -9 $OUT/a/vgg16_profile.json; cd $OUT && tar czf a.tgz a && rm -rf a
