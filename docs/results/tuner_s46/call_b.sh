#!/usr/bin/env bash
# Session 46, call b (prepared in session 45), nvidia-h200-x2: Table 2's ResNet-152 AccUDNN_PS
# rows at 85 under --cuda-graph again, after 3499dad. Session 45 (call e): the parameter
# server's workers ran their graph plan, which stalls at 85 with the 640 MiB scratch reserve
# (predicted 266 ms, measured 276.5 ms of compute) where the eager plan ran 214 ms; the tuner
# should now log "the eager iterations are predicted faster" and train eagerly (expected:
# about 147 / 396 images/s at W = 1 / 2, as eager). NCCL turns the graph off in the CLI.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/b /tmp/p
gunzip -c docs/results/tuner_s44/c/resnet152/tuner/resnet152_profile.json.gz > /tmp/p/resnet152_profile.json
MINICAFFE_SCRATCH=640M timeout 330 python3 scripts/ps_scaling.py --nets resnet152 --modes accudnn_ps \
  --comms ps,nccl --links emulated --gpus 1,2 --profile resnet152=/tmp/p/resnet152_profile.json \
  --accudnn-batch resnet152=85 --cuda-graph --warmup 3 --iters 6 --timeout 80 \
  --csv $OUT/b/t2_graph.csv --md $OUT/b/t2_graph.md --work-dir /tmp/wd > $OUT/b/t2_graph.txt 2>&1
echo "ps_scaling rc $?"; grep -E "^\[" $OUT/b/t2_graph.txt | cut -c1-200
grep -h "cuda_graph: \(WARNING\|graph launches\|--comm\)" /tmp/wd/*/rank0.log | cut -c1-250
find /tmp/wd -name "*.log" | tar czf $OUT/b/logs.tgz -T - 2>/dev/null
cd $OUT && tar czf b.tgz b && rm -rf b
