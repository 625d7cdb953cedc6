#!/usr/bin/env bash
# Session 38, call e: the host's issue before and after 587b4f0 (fused kernels looked up
# once; the SGD tables' storage key from the storages), at the host-bound k of ResNet-152
# (16) and ResNet-101 (23) under `none`, old and new trees alternated in separate
# processes; then the GPU tests of the changed file and of training.
# docs/results/tuner_s38/old/cuda_fused.py is the file before the change, not kept in the tree:
# git show 587b4f0~1:minicaffe/kernels/cuda_fused.py > docs/results/tuner_s38/old/cuda_fused.py
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
T0=$(date +%s)
NEW=$PWD; OLD=/tmp/old_tree
rm -rf $OLD && cp -r $NEW $OLD && cp docs/results/tuner_s38/old/cuda_fused.py $OLD/minicaffe/kernels/cuda_fused.py
mkdir -p $OUT/e
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/e/host.txt 2>&1
EO="python3 scripts/executor_overhead.py --gpu --engine CUDNN --size 0 --strategies none --workspace-budget 12G --step --brief --iters 30 --warmup 20"
for r in 1 2; do
  for nk in resnet152:16 resnet101:23; do
    n=${nk%%:*}; k=${nk##*:}
    for v in new old; do
      d=$NEW; [ $v = old ] && d=$OLD
      (cd $d && PYTHONPATH=/tmp/site:$d timeout 90 $EO --net $n --batch $k --json $OUT/e/${n}_${k}_${v}_$r.json > $OUT/e/${n}_${k}_${v}_$r.md 2>&1)
      echo "$n $k $v round $r rc $? at $(( $(date +%s) - T0 )) s: $(grep '^| none |' $OUT/e/${n}_${k}_${v}_$r.md | head -1)"
    done
  done
done
export PYTHONPATH=/tmp/site:$NEW
timeout 240 python3 scripts/gpu_checks.py tests/kernels/test_cuda_fused.py tests/test_gpu_training.py tests/test_solver.py tests/swap/test_swap_gpu.py > $OUT/e/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -7 $OUT/e/gpu_tests.txt
cd $OUT && tar czf e.tgz e && rm -rf e
