#!/usr/bin/env bash
# Session 36, call d: VGG-16 through tuner_table.py with the chunks of whole probes, the fit on,
# under a 1.5 GiB cap, fresh profile, --recompute auto (session 34, call a: k* 180 at 756 img/s
# before the chunk fixes).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
T0=$(date +%s); L=$(( ${TOTAL:-560} - 10 ))
mkdir -p $OUT/d
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $OUT/d/host.txt 2>&1
MINICAFFE_CUDNN_WORKSPACE_CAP=1.5G timeout $L python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --no-stall-rounds 1 --iters 3 --timeout $(( L - 5 )) --out $OUT/d/vgg16 > $OUT/d/vgg16.txt 2>&1
echo "vgg16 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| vgg16" $OUT/d/vgg16/tuner_table.md | cut -c1-400
cd $OUT && tar czf d.tgz d && rm -rf d
