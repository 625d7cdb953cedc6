#!/usr/bin/env bash
# Session 26, call A: the GPU tests of the new PyTorch peer (scripts/torch_peer.py) and of
# swap/; AlexNet through tuner_table with both PyTorch peers (the prototxt's own network and
# torchvision's); the peers alone on ResNet-152 at session 25's k* (86).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/a
T0=$(date +%s)
left() { echo $(( ${TOTAL:-585} - ($(date +%s) - T0) )); }
step() { echo "$1 rc $2 at $(( $(date +%s) - T0 )) s" >> $OUT/a/steps.txt; }
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/a/host.txt 2>&1
timeout 150 python3 scripts/gpu_checks.py tests/scripts/test_torch_peer.py tests/swap tests/scripts/test_swap_anatomy.py > $OUT/a/gpu_checks.txt 2>&1
step gpu_checks $?
timeout 300 python3 scripts/tuner_table.py --gpus 0 --nets alexnet:256 --engine CUDNN --timeout 290 --r152-batch 0 --out $OUT/a/alex > $OUT/a/alex.txt 2>&1
step alexnet $?
if [ $(left) -gt 100 ]; then
  timeout $(( $(left) - 5 )) python3 scripts/tuner_table.py --torch-one resnet152:86 --iters 5 --warmup 3 > $OUT/a/r152_peers.txt 2>&1
  step r152_peers $?
fi
cat $OUT/a/steps.txt; tail -3 $OUT/a/gpu_checks.txt; grep "^| alexnet" $OUT/a/alex/tuner_table.md 2>/dev/null; grep RESULT $OUT/a/r152_peers.txt | cut -c1-900
cp $OUT/a/alex/tuner/*profile* $OUT/a/ 2>/dev/null
cd $OUT && tar czf a.tgz a
