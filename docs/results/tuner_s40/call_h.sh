#!/usr/bin/env bash
# Session 40, call h: ResNet-34 fresh again, without the PyTorch peers, after 967a830 (the copy
# calibration at a k whose naive steps take 3x the host's least issue time, not 2x: call g
# calibrated at 41, fitted a prefetch at 23 % and missed k* by -5.9 %).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/h
timeout 170 python3 scripts/tuner_table.py --gpus 0 --nets resnet34:128 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --timeout 165 --out $OUT/h/resnet34 > $OUT/h/resnet34.txt 2>&1
echo "resnet34 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet34" $OUT/h/resnet34/tuner_table.md
grep -h "Copy calibration\|compute beside a copy" $OUT/h/resnet34.txt | cut -c1-300
cd $OUT && gzip -9 -n h/*/tuner/*_profile.json 2>/dev/null; tar czf h.tgz h && rm -rf h
