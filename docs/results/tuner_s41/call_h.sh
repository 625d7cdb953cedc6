#!/usr/bin/env bash
# Session 41, call h: the graph calibration at two k (the largest that keeps every map by the
# naive-plan-with-every-map-pinned rule, and a quarter of it; the gap linear in k between):
# tests/swap/test_swap_graph_gpu.py, then ResNet-152 (call a's profile; call f: one gap at 9:
# -6.9 / -4.8 / +5.4 %) and ResNet-101 (session 40 call e's profile; call g: no calibration,
# +3.2 / +2.0 / +33.0 %) with --cuda-graph, without the peers.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/h
timeout 150 python3 scripts/gpu_checks.py tests/swap/test_swap_graph_gpu.py > $OUT/h/gpu_tests.txt 2>&1
echo "gpu tests rc $? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/h/gpu_tests.txt
for spec in resnet152:16:docs/results/tuner_s41/a/resnet152/tuner resnet101:23:docs/results/tuner_s40/e/resnet101/tuner; do
  IFS=: read net k prof <<< "$spec"
  L=$(( 585 - $(date +%s) + T0 )); [ $L -gt 200 ] && L=200
  timeout $L python3 scripts/tuner_table.py --gpus 0 --nets $net:$k --engine CUDNN --r152-batch 0 --no-stall-rounds 1 --iters 3 --no-torch --cuda-graph --profiles $prof --timeout $(( L - 5 )) --out $OUT/h/$net > $OUT/h/$net.txt 2>&1
  echo "$net rc $? at $(( $(date +%s) - T0 )) s"; grep "^| $net" $OUT/h/$net/tuner_table.md
  python3 -c "import json, sys; t = json.load(open(sys.argv[1]))['tuner']; print([l for l in t['log'] if 'graph' in l])" $OUT/h/$net/tuner/$net.json
done
cd $OUT && gzip -9 -n h/*/tuner/*_profile.json 2>/dev/null; tar czf h.tgz h && rm -rf h
