#!/usr/bin/env bash
# Session 45, call e, on nvidia-h200-x2, after call c found that a --ps worker's graph
# calibration trained 14 iterations before joining (every configuration failed: the shard at
# iteration 0, the workers at 14; NCCL's ran past max_iter). The fix: train_dynamic's
# train_before=False puts the calibration's iterations back (swap.tuner._Untrained). Here:
# the graph tests (the new one included), then Table 2's ResNet-152 AccUDNN_PS rows at k = 85,
# parameter server on emulated 10 Gb/s links and NCCL, W = 1 and 2, under --cuda-graph and
# eagerly, side by side in one call.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/e /tmp/p
nvidia-smi -L > $OUT/e/gpus.txt
timeout 100 python3 scripts/gpu_checks.py --failures $OUT/e/failures_e.txt tests/swap/test_swap_graph_gpu.py > $OUT/e/gpu_checks_e.txt 2>&1; echo "graph checks rc $?"
tail -2 $OUT/e/gpu_checks_e.txt
gunzip -c docs/results/tuner_s44/c/resnet152/tuner/resnet152_profile.json.gz > /tmp/p/resnet152_profile.json
for mode in graph eager; do
  extra=""; [ $mode = graph ] && extra="--cuda-graph"
  MINICAFFE_SCRATCH=640M timeout 225 python3 scripts/ps_scaling.py --nets resnet152 --modes accudnn_ps \
    --comms ps,nccl --links emulated --gpus 1,2 --profile resnet152=/tmp/p/resnet152_profile.json \
    --accudnn-batch resnet152=85 $extra --copy-up update --warmup 3 --iters 6 --timeout 100 \
    --csv $OUT/e/t2_$mode.csv --md $OUT/e/t2_$mode.md --work-dir /tmp/wd_$mode > $OUT/e/t2_$mode.txt 2>&1
  echo "ps_scaling $mode rc $?"; grep -E "^\[|resnet152 +accudnn" $OUT/e/t2_$mode.txt | cut -c1-200 | tail -8
done
find /tmp/wd_graph /tmp/wd_eager -name "*.log" | tar czf $OUT/e/logs.tgz -T - 2>/dev/null
cd $OUT && tar czf e.tgz e && rm -rf e
