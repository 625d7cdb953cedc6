#!/usr/bin/env bash
# Session 44, call e: ResNet-101's and ResNet-50's Table 1 rows with the PyTorch peers on the
# graph API, on session 43's graph-API profiles (call c), one network after the other.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/e
for nk in resnet101:23 resnet50:36; do
  n=${nk%%:*}
  L=$(( 585 - $(date +%s) + T0 )); [ $n = resnet101 ] && L=$(( L / 2 + 20 ))
  timeout $L python3 scripts/tuner_table.py --gpus 0 --nets $nk --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --profiles docs/results/tuner_s43/c_$n/$n/tuner --timeout $(( L - 5 )) --out $OUT/e/$n > $OUT/e/$n.txt 2>&1
  echo "$n peers rc $? at $(( $(date +%s) - T0 )) s"; grep "^| $n" $OUT/e/$n/tuner_table.md
done
cd $OUT && gzip -9 -n e/*/tuner/*_profile.json 2>/dev/null; rm -f e/*/*.png; tar czf e.tgz e && rm -rf e
