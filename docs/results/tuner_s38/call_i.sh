#!/usr/bin/env bash
# Session 38, call i: VGG-16 at k_none = 92 was over-predicted by 5.1 % (call b): every map
# kept ran 1.24 ms per image where the profile's steps, timed under the naive plan at 65 and
# 130, give 1.39 and 1.25.  Here, under call b's settings (1.5 GiB cap, fit on, CUDNN), the
# steps' sum ("layers ms") and iteration with every map kept (`none`) and under `naive`, in one
# process, two rounds, at 92 and 130: whether naive's copies slow the compute steps.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/i
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/i/host.txt 2>&1
for k in 92 130; do
  MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G timeout 95 python3 scripts/executor_overhead.py --gpu --engine CUDNN --size 0 --net vgg16 --batch $k --strategies none,naive --workspace-budget 12G --step --iters 10 --warmup 5 --rounds 2 --json $OUT/i/vgg16_$k.json > $OUT/i/vgg16_$k.md 2>&1
  echo "k $k rc $? at $(( $(date +%s) - T0 )) s"; grep -E '^\| (none|naive) \|' $OUT/i/vgg16_$k.md | head -4
done
cd $OUT && tar czf i.tgz i && rm -rf i
