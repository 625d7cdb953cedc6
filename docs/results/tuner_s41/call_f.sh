#!/usr/bin/env bash
# Session 41, call f: ResNet-152 through the tuner with --cuda-graph (the iteration as one
# graph launch: no host bound; swap.tuner.calibrate_graph's gap per step) on call a's profile,
# without the PyTorch peers (call a has them): the time error at the k that call a found
# host-bound (36: -12.1 %, 16: -38.5 %), and no stall under the graph (session 23: 1.052 at k*).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/f
timeout 560 python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --cuda-graph --profiles docs/results/tuner_s41/a/resnet152/tuner --timeout 555 --out $OUT/f/resnet152 > $OUT/f/resnet152.txt 2>&1
echo "resnet152 rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet152" $OUT/f/resnet152/tuner_table.md
python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['tuner']; print([l for l in t['log'] if 'graph' in l])" $OUT/f/resnet152/tuner/resnet152.json
cd $OUT && gzip -9 -n f/*/tuner/*_profile.json 2>/dev/null; tar czf f.tgz f && rm -rf f
