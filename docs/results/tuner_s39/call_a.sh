#!/usr/bin/env bash
# Session 39, call a (prepared in session 38): the first GPU run of the chunk rules (eb74522:
# ConvolutionLayer.chunk_rule, _chunks_at through it, the profiler's meta["chunks"], the model
# pricing a chunked convolution per call): the cuDNN, convolution, swap and network GPU tests,
# then session 38's call b again (VGG-16 under the 1.5 GiB cap, fresh profile, the PyTorch
# peers): its model error at k_none = 92 was +5.1 % per image.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/a
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/a/host.txt 2>&1
timeout 200 python3 scripts/gpu_checks.py tests/cudnn tests/layers/test_cudnn_engine.py tests/layers/test_conv.py tests/swap/test_swap_gpu.py tests/test_networks.py > $OUT/a/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -8 $OUT/a/gpu_tests.txt
L=$(( 590 - $(date +%s) + T0 ))
MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G timeout $L python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/a/vgg16 > $OUT/a/vgg16.txt 2>&1
echo "vgg16 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| vgg16" $OUT/a/vgg16/tuner_table.md
python3 -c "import json, sys; m = json.load(open(sys.argv[1]))['meta']; print('chunks:', m.get('chunks')); print('chunk_counts:', m.get('chunk_counts'))" $OUT/a/vgg16/tuner/vgg16_profile.json | cut -c1-900
cd $OUT && tar czf a.tgz a && rm -rf a
