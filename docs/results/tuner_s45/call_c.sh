#!/usr/bin/env bash
# Session 45, call c, on nvidia-h200-x2: issue 6's checks on two GPUs (the whole of
# tests/ps/test_gpu.py, its six 2-GPU tests included: 2fff4e9 made --comm nccl follow the
# solver's layer_wise_reduce, CPU-tested only), then Table 2's ResNet-152 AccUDNN_PS rows
# under --cuda-graph at W = 1, 2 for the parameter server and NCCL, at k* = 85 from session
# 44's --cuda-graph tuner run (its profile). Call d runs the same rows eagerly.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/c /tmp/p
nvidia-smi -L > $OUT/c/gpus.txt
T0=$(date +%s)
timeout 200 python3 scripts/gpu_checks.py --failures $OUT/c/failures_c.txt tests/ps/test_gpu.py > $OUT/c/gpu_checks_c.txt 2>&1; echo "ps gpu checks rc $? in $(( $(date +%s) - T0 )) s"
tail -3 $OUT/c/gpu_checks_c.txt
gunzip -c docs/results/tuner_s44/c/resnet152/tuner/resnet152_profile.json.gz > /tmp/p/resnet152_profile.json
MINICAFFE_SCRATCH=640M timeout 340 python3 scripts/ps_scaling.py --nets resnet152 --modes accudnn_ps \
  --comms ps,nccl --gpus 1,2 --profile resnet152=/tmp/p/resnet152_profile.json --accudnn-batch resnet152=85 \
  --cuda-graph --copy-up update --warmup 3 --iters 6 --timeout 150 --csv $OUT/c/t2_graph.csv --md $OUT/c/t2_graph.md \
  --work-dir /tmp/wd > $OUT/c/t2_graph.txt 2>&1; echo "ps_scaling rc $?"
tail -12 $OUT/c/t2_graph.txt
find /tmp/wd -name "*.log" | head -40 | tar czf $OUT/c/logs.tgz -T - 2>/dev/null
cd $OUT && tar czf c.tgz c && rm -rf c
