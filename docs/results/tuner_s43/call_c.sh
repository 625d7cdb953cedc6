#!/usr/bin/env bash
# Session 43, call c: NET (resnet101:23 or resnet50:36, the two whose host-bound k missed 5 % on
# the legacy API in session 40) through tuner_table.py on the graph API, fresh profile, without
# the peers (a tuner run that does not finish in 590 s writes nothing).  Usage: bash call_c.sh NET:K
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
export MINICAFFE_CUDNN_API=graph
SPEC=${1:-resnet101:23}; NET=${SPEC%%:*}
T0=$(date +%s)
mkdir -p $OUT/c_$NET
L=$(( 585 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets $SPEC --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --timeout $(( L - 5 )) --out $OUT/c_$NET/$NET > $OUT/c_$NET/$NET.txt 2>&1
echo "$NET rc $? at $(( $(date +%s) - T0 )) s"; grep "^| $NET" $OUT/c_$NET/$NET/tuner_table.md
cd $OUT && gzip -9 -n c_$NET/*/tuner/*_profile.json 2>/dev/null; rm -f c_$NET/*/*.png; tar czf c_$NET.tgz c_$NET && rm -rf c_$NET
