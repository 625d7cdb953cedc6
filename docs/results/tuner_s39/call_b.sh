#!/usr/bin/env bash
# Session 39, call b: call a's VGG-16 profile (naive plan) ran 1539 and 1387 us per image at
# k = 33 and 65, while every map kept ran 1229 at 48 (call a) and 1239 at 92.  Whether the
# naive plan's copies or cuDNN's algorithms at those shapes make 33 and 65 slow: `none` and
# `naive` at 33, 48 and 65 in one process each, under call a's settings (1.5 GiB cap, CUDNN),
# with the convolutions' algorithms per direction.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/b
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/b/host.txt 2>&1
for k in 33 48 65; do
  MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G timeout 110 python3 scripts/executor_overhead.py --gpu --engine CUDNN --size 0 --net vgg16 --batch $k --strategies none,naive --workspace-budget 12G --step --iters 10 --warmup 5 --rounds 2 --json $OUT/b/vgg16_$k.json > $OUT/b/vgg16_$k.md 2>&1
  echo "k $k rc $? at $(( $(date +%s) - T0 )) s"; grep -E '^\| (none|naive) ' $OUT/b/vgg16_$k.md | head -4
done
cd $OUT && tar czf b.tgz b && rm -rf b
