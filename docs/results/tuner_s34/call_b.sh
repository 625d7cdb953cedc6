#!/usr/bin/env bash
# Session 34, call b: the GPU tests after the layout orders (swap.plan.LAYOUT_ORDERS), then
# VGG-16 at a fixed k = 221 (2.40x k_none) under the 1.5 GiB workspace cap, on call a's profile:
# `--swap dynamic --batch 221 --recompute auto` (which stopped before plan_at left out the sets
# that do not fit) against every map kept at 221 outside the budget, twice each, alternating.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
T0=$(date +%s)
mkdir -p $OUT/tests $OUT/b
[ -n "${SKIP_TESTS:-}" ] || timeout 150 python3 scripts/gpu_checks.py tests/swap/test_swap_gpu.py tests/swap/test_replay_limits.py > $OUT/tests/gpu_tests_b.txt 2>&1
echo "gpu_tests rc $? at $(( $(date +%s) - T0 )) s"; tail -5 $OUT/tests/gpu_tests_b.txt
zcat docs/results/tuner_s34/a/cap1.5G/vgg16/tuner/vgg16_profile.json.gz > /tmp/p.json
# constant data: DummyData refills a gaussian filler every iteration, drawn on the host (1.3 s
# per iteration at 221 in the first try of this call, and 254 MiB of transients)
sed 's/type: "gaussian"/type: "constant"/' prototxt/vgg16/dummy.prototxt > /tmp/v64.prototxt
sed 's/dim: 64$/dim: 221/' /tmp/v64.prototxt > /tmp/v221.prototxt
export MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/b/host.txt 2>&1
# the reference: the same plan-free lowering and workspaces with every feature map kept (as
# tuner_table.py's `none` (chunked)): --swap dynamic with a budget the whole net fits in
for r in 1 2; do
  timeout 170 python3 -m minicaffe train /tmp/v64.prototxt --engine CUDNN --swap dynamic --budget 12G --batch 221 --profile /tmp/p.json --recompute auto --max-iter ${ITERS:-100} --display 1 -gpu 0 --memory-trace $OUT/b/dyn$r.csv > $OUT/b/dyn$r.log 2>&1
  echo "dyn$r rc $? at $(( $(date +%s) - T0 )) s"
  timeout 170 python3 -m minicaffe train /tmp/v64.prototxt --engine CUDNN --swap dynamic --budget 130G --batch 221 --profile /tmp/p.json --max-iter ${ITERS:-100} --display 1 -gpu 0 > $OUT/b/kept$r.log 2>&1
  echo "kept$r rc $? at $(( $(date +%s) - T0 )) s"
done
python3 docs/results/tuner_s34/iter_ms.py $OUT/b/dyn1.log $OUT/b/kept1.log $OUT/b/dyn2.log $OUT/b/kept2.log
grep -h "swap 'dynamic'" $OUT/b/*.log | cut -c1-400
grep -i "predicted\|peak memory\|recomputed\|feature maps\|tried" $OUT/b/dyn1.log | head -8
