#!/usr/bin/env bash
# Session 40, call a: the GPU tests of ConvolutionLayer.call_choices (the one place that turns a
# convolution's calls into cuDNN's search arguments, for its reshape, the profiler's search
# pricing and executor_overhead.py), then GoogLeNet on session 39's profile at SEARCH_MARGIN =
# 0.75 (session 39's calls e and g had every winning step searched: 192 was +6.6 % back to back;
# the CPU replay at 0.75 gives about +4.8 %).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/a
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/a/host.txt 2>&1
timeout 240 python3 scripts/gpu_checks.py tests/cudnn tests/layers/test_cudnn_engine.py tests/layers/test_conv.py tests/swap/test_swap_gpu.py > $OUT/a/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -6 $OUT/a/gpu_tests.txt
L=$(( 585 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets googlenet:128 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --profiles docs/results/tuner_s39/d/googlenet/tuner --timeout $(( L - 5 )) --out $OUT/a/googlenet > $OUT/a/googlenet.txt 2>&1
echo "googlenet rc $? at $(( $(date +%s) - T0 )) s"; grep "^| googlenet" $OUT/a/googlenet/tuner_table.md
cd $OUT && gzip -9 -n a/*/tuner/*_profile.json 2>/dev/null; tar czf a.tgz a && rm -rf a
