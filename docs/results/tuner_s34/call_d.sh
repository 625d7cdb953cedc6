#!/usr/bin/env bash
# Session 34, call d: every GPU test of tests/swap after the layout orders, then VGG-16 through
# tuner_table.py with the fit on under a 1.5 GiB cap and 13.8 MiB of workspace per image (chunks
# of at most 111 images, each with the whole cap: call c found conv2_2, conv3_2 and conv3_3
# 14 ms faster per iteration at 221 with 1.5 GiB per chunk than with 888 MiB).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
T0=$(date +%s); left() { echo $(( ${TOTAL:-560} - ($(date +%s) - T0) )); }
mkdir -p $OUT/tests $OUT/d
timeout 240 python3 scripts/gpu_checks.py tests/swap > $OUT/tests/gpu_tests_d.txt 2>&1
echo "gpu_tests rc $? at $(( $(date +%s) - T0 )) s"; tail -25 $OUT/tests/gpu_tests_d.txt
if [ $(left) -lt ${NEED:-230} ]; then echo "vgg16 skipped"; exit 0; fi
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/d/host.txt 2>&1
L=$(( $(left) - 5 ))
MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE=13.8M timeout $L python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/d/vgg16 > $OUT/d/vgg16.txt 2>&1
echo "vgg16 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| vgg16" $OUT/d/vgg16/tuner_table.md
cd $OUT && tar czf d.tgz d
