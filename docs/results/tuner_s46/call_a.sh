#!/usr/bin/env bash
# Session 46, call a (prepared in session 45), one H200: the whole GPU suite on session 45's
# CPU-only changes to GPU-shared code (3499dad: under --cuda-graph the tuner decides on the
# graph and the eager model and trains eagerly where eager is predicted >2 % faster; 901ebca:
# step_gaps' hooked passes behind the profiler's head start), then ResNet-152's steps under
# "none" at 35 and 71 with the head start against the model's t_j(k) (session 45 without it:
# +28 / +63 ms, the host's pace). Session 45's call a: 902 passed in 258 s.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/a
FILES=$(grep -rl "mark.gpu" tests --include="*.py" | sort)
T0=$(date +%s)
timeout 420 python3 scripts/gpu_checks.py --failures $OUT/a/failures_a.txt $FILES > $OUT/a/gpu_checks_a.txt 2>&1; echo "suite rc $? in $(( $(date +%s) - T0 )) s"
tail -3 $OUT/a/gpu_checks_a.txt
L=$(( 580 - $(date +%s) + T0 ))
timeout $L python3 scripts/step_gaps.py --gpu --engine CUDNN --net resnet152 --k-base 16 --ks 35,71 \
  --profile docs/results/tuner_s42/f/resnet152/tuner/resnet152_profile.json.gz \
  --json $OUT/a/step_gaps.json > $OUT/a/step_gaps.txt 2>&1
echo "step_gaps rc $?"; grep -A1 "^k = " $OUT/a/step_gaps.txt
cd $OUT && tar czf a.tgz a && rm -rf a
