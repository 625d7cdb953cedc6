#!/usr/bin/env bash
# Session 44, call f: ResNet-34's and GoogLeNet's Table 1 rows with the PyTorch peers on the
# graph API, on session 43's graph-API profiles (call c), one network after the other.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/f
for nk in resnet34:109 googlenet:181; do
  n=${nk%%:*}
  L=$(( 380 - $(date +%s) + T0 )); [ $n = resnet34 ] && L=$(( L / 2 + 20 ))
  timeout $L python3 scripts/tuner_table.py --gpus 0 --nets $nk --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --profiles docs/results/tuner_s43/c_$n/$n/tuner --timeout $(( L - 5 )) --out $OUT/f/$n > $OUT/f/$n.txt 2>&1
  echo "$n peers rc $? at $(( $(date +%s) - T0 )) s"; grep "^| $n" $OUT/f/$n/tuner_table.md
done
cd $OUT && gzip -9 -n f/*/tuner/*_profile.json 2>/dev/null; rm -f f/*/*.png; tar czf f.tgz f && rm -rf f
