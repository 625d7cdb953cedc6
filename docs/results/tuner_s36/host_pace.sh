#!/usr/bin/env bash
# Session 36: is the host's pace between processes (ResNet-152 at 16, host-bound) the core the
# process lands on?  The same executor_overhead.py pass (plain, none) in processes started
# as they come and in processes bound to the GPU's own NUMA node's cores, alternated.
set -u
D=$OUT/host_pace; mkdir -p $D
BUS=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' | sed 's/^0000//')
CPUS=$(cat /sys/bus/pci/devices/$BUS/local_cpulist 2>/dev/null || echo "")
{ echo "bus $BUS local_cpulist '$CPUS'"; lscpu; numactl -H 2>&1 | head -5; nvidia-smi topo -m 2>&1 | head -5; } > $D/topology.txt 2>&1
A="scripts/executor_overhead.py --gpu --net resnet152 --batch 16 --size 0 --engine CUDNN --strategies plain,none --iters 20 --rounds 2 --brief"
for r in 1 2 3; do
  timeout 60 python3 $A --json $D/free$r.json > $D/free$r.txt 2>&1; echo "free$r rc $?"
  if [ -n "$CPUS" ]; then timeout 60 taskset -c $CPUS python3 $A --json $D/node$r.json > $D/node$r.txt 2>&1; echo "node$r rc $?"; fi
done
python3 - "$D" <<'PY'
import glob, json, os, sys
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    rows = json.load(open(p))
    rows = rows if isinstance(rows, list) else rows.get("rows", rows)
    print(os.path.basename(p), [(r.get("strategy"), round(r.get("iteration_ms", 0), 1), round(r.get("host_ms", 0) or 0, 1)) for r in rows])
PY
