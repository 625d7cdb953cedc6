#!/usr/bin/env bash
# Session 45, call f, on nvidia-h200-x2: Table 2's NCCL rows under --cuda-graph again after
# the CLI turns the graph off for an NCCL worker that overlaps backward (call e: the plan was
# decided for graph launches, the worker ran eagerly, 270 ms against 210 eager).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/f /tmp/p
gunzip -c docs/results/tuner_s44/c/resnet152/tuner/resnet152_profile.json.gz > /tmp/p/resnet152_profile.json
MINICAFFE_SCRATCH=640M timeout 200 python3 scripts/ps_scaling.py --nets resnet152 --modes accudnn_ps \
  --comms nccl --gpus 1,2 --profile resnet152=/tmp/p/resnet152_profile.json \
  --accudnn-batch resnet152=85 --cuda-graph --warmup 3 --iters 6 --timeout 95 \
  --csv $OUT/f/t2_nccl_graph.csv --md $OUT/f/t2_nccl_graph.md --work-dir /tmp/wd > $OUT/f/t2_nccl_graph.txt 2>&1
echo "ps_scaling rc $?"; grep -E "^\[" $OUT/f/t2_nccl_graph.txt | cut -c1-200
grep -h "cuda_graph\|decision: predicted" /tmp/wd/*/rank0.log | cut -c1-250
find /tmp/wd -name "*.log" | tar czf $OUT/f/logs.tgz -T - 2>/dev/null
cd $OUT && tar czf f.tgz f && rm -rf f
