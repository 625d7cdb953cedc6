#!/usr/bin/env bash
# Session 41, call g: ResNet-101 through the tuner with --cuda-graph on session 40 call e's
# profile, without the peers: the host-bound k (23: +17.2 % eagerly in session 40) as a graph.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/g
timeout 560 python3 scripts/tuner_table.py --gpus 0 --nets resnet101:23 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --cuda-graph --profiles docs/results/tuner_s40/e/resnet101/tuner --timeout 555 --out $OUT/g/resnet101 > $OUT/g/resnet101.txt 2>&1
echo "resnet101 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet101" $OUT/g/resnet101/tuner_table.md
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['tuner']; print([l for l in t['log'] if 'graph' in l])" $OUT/g/resnet101/tuner/resnet101.json
cd $OUT && gzip -9 -n g/*/tuner/*_profile.json 2>/dev/null; tar czf g.tgz g && rm -rf g
