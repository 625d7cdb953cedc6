#!/usr/bin/env bash
# Session 36, call a: the GPU suite (every file but the parameter server's and the end-to-end
# training runs: the retry of session 34 changed BatchNorm, the recurrent layers, the loss value
# and the log threshold on the CPU only), then VGG-16 at the fixed 221 (2.40x k_none) against
# PyTorch save_on_cpu at 221 itself, alternated twice (session 34's 4.9x had save_on_cpu at 180).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/tests $OUT/a
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,pci.bus_id --format=csv,noheader; nproc; date -u; } > $OUT/a/host.txt 2>&1
FILES=$(ls tests/test_*.py tests/*/test_*.py | grep -v -e '^tests/ps/test_gpu.py$' -e '^tests/test_gpu_training.py$')
timeout ${TESTS_S:-280} python3 scripts/gpu_checks.py $FILES > $OUT/tests/gpu_suite.txt 2>&1
echo "gpu suite rc $? at $(( $(date +%s) - T0 )) s"; grep -v " 0  *0  *[0-9.]*$" $OUT/tests/gpu_suite.txt | tail -15; tail -1 $OUT/tests/gpu_suite.txt
zcat docs/results/tuner_s34/a/cap1.5G/vgg16/tuner/vgg16_profile.json.gz > /tmp/p.json
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G
A="train /tmp/v64.prototxt --engine CUDNN --swap dynamic --budget 12G --profile /tmp/p.json --recompute auto --batch 221 --max-iter 70 --display 1 -gpu 0"
for r in 1 2; do
  timeout 100 python3 -m minicaffe $A > $OUT/a/dyn$r.log 2>&1
  echo "dyn$r rc $? at $(( $(date +%s) - T0 )) s"
  timeout 150 python3 scripts/tuner_table.py --torch-one vgg16:221 --iters 5 --warmup 2 --out /tmp/tt > $OUT/a/torch$r.txt 2>&1
  echo "torch$r rc $? at $(( $(date +%s) - T0 )) s"
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/a/dyn1.log $OUT/a/dyn2.log
grep -h "^RESULT" $OUT/a/torch*.txt | cut -c1-600
