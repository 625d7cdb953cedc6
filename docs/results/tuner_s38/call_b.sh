#!/usr/bin/env bash
# Session 38, call b (prepared in session 37): Table 1's VGG-16 row redrawn with the
# Convolution + ReLU pairs, under the 1.5 GiB cuDNN workspace cap as session 37's calls ran
# (its k* by both objectives, the paper's 237 measured beside the default one, the PyTorch
# peers at k*).  One call of at most 600 s: fewer rounds than the default.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/b
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; git log -1 --format=%h; } > $OUT/b/host.txt 2>&1
L=570
MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G timeout $L python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/b/vgg16 > $OUT/b/vgg16.txt 2>&1
echo "vgg16 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| vgg16" $OUT/b/vgg16/tuner_table.md
cd $OUT && tar czf b.tgz b && rm -rf b
