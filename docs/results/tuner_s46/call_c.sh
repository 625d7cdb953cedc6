#!/usr/bin/env bash
# Session 46, call c (prepared in session 45), one H200: ResNet-152 through tuner_table.py
# --cuda-graph on session 44's graph profile (--profiles), after 3499dad: the standalone run
# (scratch reserve 74 MiB) chose k* 85 stall-free under the graph in session 44 (407 img/s);
# the graph should be kept, with the log line "cuda_graph: graph launches predicted at ...,
# eagerly ...".
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/c /tmp/p
gunzip -c docs/results/tuner_s44/c/resnet152/tuner/resnet152_profile.json.gz > /tmp/p/resnet152_profile.json
L=$(( 585 - $(date +%s) + T0 ))
timeout $L python3 scripts/tuner_table.py --gpus 0 --nets resnet152:16 --engine CUDNN --r152-batch 0 --cuda-graph --profiles /tmp/p --no-stall-rounds 1 --iters 3 --no-torch --timeout $(( L - 5 )) --out $OUT/c/resnet152 > $OUT/c/resnet152.txt 2>&1
echo "resnet152 --cuda-graph rc $? at $(( $(date +%s) - T0 )) s"; grep "^| resnet152" $OUT/c/resnet152/tuner_table.md
python3 -c "import json,sys; [print(l[:250]) for l in json.load(open(sys.argv[1]))['tuner']['log'] if l.startswith('cuda_graph')]" $OUT/c/resnet152/tuner/resnet152.json
cd $OUT && rm -f c/*/*.png; tar czf c.tgz c && rm -rf c
