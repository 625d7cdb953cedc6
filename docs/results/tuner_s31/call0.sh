#!/usr/bin/env bash
# Session 31, call 0: GPU tests of session 30's changes and the idle check.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
D=$OUT/c0; mkdir -p $D
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $D/host.txt 2>&1
timeout 150 python3 scripts/gpu_checks.py tests/swap/test_swap_gpu.py > $D/swap_gpu.txt 2>&1; echo "swap_gpu rc $?" >> $D/steps.txt
timeout 150 python3 scripts/gpu_idle.py --net resnet50:64 --engine CUDNN --no-counts > $D/gpu_idle.txt 2>&1; echo "gpu_idle rc $?" >> $D/steps.txt
timeout 240 python3 scripts/gpu_checks.py tests/test_net.py tests/test_python_layer.py tests/test_solver.py tests/test_io.py > $D/core_gpu.txt 2>&1; echo "core rc $?" >> $D/steps.txt
cat $D/steps.txt; tail -5 $D/swap_gpu.txt; tail -15 $D/gpu_idle.txt; tail -8 $D/core_gpu.txt
