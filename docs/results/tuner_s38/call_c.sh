#!/usr/bin/env bash
# Session 38, call c: what the ReLU joined to the BatchNorm+Scale pairs buys where the host
# bounds the iteration (call a found nothing at ResNet-152 64 and ResNet-50 128, device-bound):
# ResNet-152 at 16 and ResNet-101 at 23 under `none` (CUDNN, the solver's whole step),
# MINICAFFE_FUSE_BN_RELU=1 and 0 alternated in separate processes, then one cProfile of
# ResNet-152 at 16 with it on (where the host's time goes now).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$(date +%s)
mkdir -p $OUT/c
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; git log -1 --format=%h; } > $OUT/c/host.txt 2>&1
EO="python3 scripts/executor_overhead.py --gpu --engine CUDNN --size 0 --strategies none --workspace-budget 12G --step --brief --iters 30 --warmup 20"
for r in 1 2; do
  for nk in resnet152:16 resnet101:23; do
    n=${nk%%:*}; k=${nk##*:}
    for f in 1 0; do
      MINICAFFE_FUSE_BN_RELU=$f timeout 90 $EO --net $n --batch $k --json $OUT/c/${n}_${k}_bnrelu${f}_$r.json > $OUT/c/${n}_${k}_bnrelu${f}_$r.md 2>&1
      echo "$n $k bnrelu=$f round $r rc $? at $(( $(date +%s) - T0 )) s: $(grep '^| none |' $OUT/c/${n}_${k}_bnrelu${f}_$r.md | head -1)"
    done
  done
done
MINICAFFE_FUSE_BN_RELU=1 timeout 120 $EO --net resnet152 --batch 16 --cprofile 3 --json $OUT/c/resnet152_16_cprofile.json > $OUT/c/resnet152_16_cprofile.md 2>&1
echo "cprofile rc $? at $(( $(date +%s) - T0 )) s"
cd $OUT && tar czf c.tgz c && rm -rf c
