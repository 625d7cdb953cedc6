#!/usr/bin/env bash
# Session 39, call c: the convolutions priced by cuDNN's own search (swap.model "searched",
# swap.profiler.search_times_now / search_probe) and the copy calibration without its
# disturbed steps: the swap GPU tests, then call a's VGG-16 row again (1.5 GiB cap).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/c
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/c/host.txt 2>&1
timeout 150 python3 scripts/gpu_checks.py tests/swap/test_swap_gpu.py > $OUT/c/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -4 $OUT/c/gpu_tests.txt
grep -B5 -A25 "Error\|FAILED" $OUT/c/gpu_tests.txt | head -60
L=$(( 590 - $(date +%s) + T0 ))
MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G timeout $L python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/c/vgg16 > $OUT/c/vgg16.txt 2>&1
echo "vgg16 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| vgg16" $OUT/c/vgg16/tuner_table.md
grep -oh "cuDNN searched[^\"]*\|compute beside a copy[^\"]*" $OUT/c/vgg16/tuner/vgg16.json | head -4
cd $OUT && tar czf c.tgz c && rm -rf c
