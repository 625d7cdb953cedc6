#!/usr/bin/env bash
# Session 43, call d: the two tests fixed after call ab (on the graph API), then where the host's
# time goes at ResNet-101's k = 23: `none` against the tuner's plan at 23 (call c's profile),
# two rounds in one process, whole solver steps, cProfile of two passes of each.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
export MINICAFFE_CUDNN_API=graph
mkdir -p $OUT/d
python3 scripts/gpu_checks.py --failures $OUT/d/failures_d.txt \
  -k "test_bound_conv_is_the_free_functions or test_gpu_plan_replays_the_tuners_decision_from_its_profile" \
  tests/cudnn/test_cudnn.py tests/swap/test_swap_gpu.py 2>&1 | tail -6
python3 scripts/gpu_checks.py --failures $OUT/d/failures_d2.txt tests/cudnn/test_backend_api.py 2>&1 | tail -4
P=docs/results/tuner_s43/c_resnet101/resnet101/tuner/resnet101_profile.json.gz
timeout 360 python3 scripts/executor_overhead.py --gpu --engine CUDNN --net resnet101 --batch 23 --size 0 \
  --strategies none,tuned --profile $P --budget 12G --rounds 2 --step --iters 10 --cprofile 2 \
  --json $OUT/d/eo_r101_23.json > $OUT/d/eo_r101_23.txt 2>&1; echo "executor_overhead rc $?"
tail -45 $OUT/d/eo_r101_23.txt
cd $OUT && tar czf d.tgz d && rm -rf d
