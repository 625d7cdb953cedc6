#!/usr/bin/env bash
# Session 45, call d, on nvidia-h200-x2: call c's Table 2 ResNet-152 AccUDNN_PS rows
# under eager execution (no --cuda-graph) at W = 1, 2 for the parameter server and NCCL, at k* = 85 from session
# 44's --cuda-graph tuner run (its profile). The reference for call c.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/d /tmp/p
nvidia-smi -L > $OUT/d/gpus.txt
gunzip -c docs/results/tuner_s44/c/resnet152/tuner/resnet152_profile.json.gz > /tmp/p/resnet152_profile.json
MINICAFFE_SCRATCH=640M timeout 340 python3 scripts/ps_scaling.py --nets resnet152 --modes accudnn_ps \
  --comms ps,nccl --gpus 1,2 --profile resnet152=/tmp/p/resnet152_profile.json --accudnn-batch resnet152=85 \
  --copy-up update --warmup 3 --iters 6 --timeout 150 --csv $OUT/d/t2_eager.csv --md $OUT/d/t2_eager.md \
  --work-dir /tmp/wd > $OUT/d/t2_eager.txt 2>&1; echo "ps_scaling rc $?"
tail -12 $OUT/d/t2_eager.txt
find /tmp/wd -name "*.log" | head -40 | tar czf $OUT/d/logs.tgz -T - 2>/dev/null
cd $OUT && tar czf d.tgz d && rm -rf d
