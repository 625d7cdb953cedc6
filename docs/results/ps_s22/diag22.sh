#!/usr/bin/env bash
# W = 1 diagnosis of the parameter server's compute slowdown: variants alternated, ResNet-152.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
mkdir -p $OUT/r
[ -n "${PROBE:-}" ] && timeout 90 python3 dv/smt_probe.py $PROBE > $OUT/r/${TAG}_smt.txt 2>&1
T0=$(date +%s); BUDGET=${BUDGET:-540}
{ nvidia-smi --query-gpu=index,name --format=csv,noheader; nproc; lscpu | grep -E "Model name|Socket|NUMA|L3|Thread|Core"; nvidia-smi topo -m; } > $OUT/r/${TAG}_host.txt 2>&1
for v in $VARIANTS; do
  IFS=: read -r name net comms links gpus envs opts <<< "$v"
  k=72; [ $net = resnet101 ] && k=104
  left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ $left -lt 45 ]; then echo "skip $v (left $left s)" >> $OUT/r/${TAG}_steps.txt; continue; fi
  extra=$(echo "${opts:-}" | tr ',' ' ' | tr '=' ' ')
  envx=$(echo "${envs:-}" | tr ',' ' ')
  echo "$(date -u +%T) $v (limit $left s)" >> $OUT/r/${TAG}_steps.txt
  env MINICAFFE_SCRATCH=640M $envx timeout $left python3 scripts/ps_scaling.py --nets $net --modes accudnn_ps --comms $comms --links $links --gpus $gpus \
    --profile $net=dv/p/${net}_profile.json --accudnn-batch $net=$k --warmup 3 --iters ${ITERS:-10} --timeout 150 \
    --csv $OUT/r/${TAG}_${name}.csv --md $OUT/r/${TAG}_${name}.md --append --work-dir /tmp/w $extra >> $OUT/r/${TAG}.log 2>&1
  echo "  rc $? at $(date -u +%T)" >> $OUT/r/${TAG}_steps.txt
  grep -h "cuda_graph\|Error\|error" /tmp/w/*/*.log 2>/dev/null | cut -c1-300 | sort | uniq -c | sort -rn | head -6 >> $OUT/r/${TAG}_steps.txt
  (cd /tmp/w && tar czf $OUT/r/${TAG}_${name}_raw.tgz --exclude="*.prototxt" */*.jsonl */gpu_samples.csv */rank*.log 2>/dev/null; rm -rf /tmp/w/*/)
done
if [ -n "${TESTS:-}" ]; then
  left=$(( ${TOTAL:-570} - ($(date +%s) - T0) ))
  timeout $left python3 scripts/gpu_checks.py $TESTS > $OUT/r/${TAG}_gpu_checks.txt 2>&1
  echo "gpu_checks rc $?" >> $OUT/r/${TAG}_steps.txt
fi
cat $OUT/r/${TAG}_steps.txt
tail -4 $OUT/r/${TAG}_gpu_checks.txt 2>/dev/null
python3 - <<'PY'
import csv, glob, os
for f in sorted(glob.glob(os.environ["OUT"] + "/r/*.csv")):
    for x in csv.DictReader(open(f)):
        g = lambda c: x.get(c) or ""
        print(os.path.basename(f), x["comm"], x["world_size"], x["status"], "ips", g("images_per_s")[:6],
              "comp", g("compute_s")[:6], "ahead", g("host_ahead_s")[:6], "cpu", g("host_cpu_s")[:6],
              "vcsw", g("host_vcsw"), "ivcsw", g("host_ivcsw"), "comm", g("comm_s")[:6], "rcpu", g("round_cpu_s")[:6], "ccpu", g("copy_cpu_s")[:6], "backlog", g("gpu_backlog_s")[:6], "eff", g("efficiency")[:5])
PY
