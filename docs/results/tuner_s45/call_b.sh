#!/usr/bin/env bash
# Session 45, call b (prepared in session 44): ResNet-152 under the plan "none" at k = 35 and
# 71, each step timed with CUDA events as the profiler times it, against the model's t_j(k)
# from session 42's graph-API profile, and the whole iteration without hooks: where the 9 ms
# that k = 71 takes beyond its predicted steps go (177.6 / 178.5 ms measured in sessions 42
# and 44, 169.0 predicted). Twice, to see the noise.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/b
for r in 1 2; do
  timeout 280 python3 scripts/step_gaps.py --gpu --engine CUDNN --net resnet152 --k-base 16 --ks 35,71 \
    --profile docs/results/tuner_s42/f/resnet152/tuner/resnet152_profile.json.gz \
    --json $OUT/b/step_gaps_$r.json > $OUT/b/step_gaps_$r.txt 2>&1
  echo "round $r rc $?"; grep -A3 "^k = " $OUT/b/step_gaps_$r.txt | head -12
done
cd $OUT && tar czf b.tgz b && rm -rf b
