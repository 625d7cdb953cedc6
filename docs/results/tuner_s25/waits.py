"""Session 25, CPU: how many cross-stream waits the dynamic plan of ResNet-152 at 86 has
(the plan from call c's profile on a CPU-built GMAP, CAFFE engine, so not the GPU run's plan),
and how many a wait on only the latest prefetch a step needs would leave.

    python3 docs/results/tuner_s25/waits.py
"""
import sys, gzip, json
sys.path.insert(0, ".")
from scripts.swap_budgets import _solver
from swap.gmap import build_gmap
from swap.profiler import Profile
from swap.runtime import set_lowering
from swap.tuner import plan_at, profile_models
from swap.plan import ALLOCATE, COMPUTE, PREFETCH
with gzip.open("docs/results/tuner_s25/c_resnet152_profile.json.gz", "rt") as f:
    prof = Profile.from_dict(json.load(f))
solver = _solver("resnet152", 16, "CAFFE", "CPU")
set_lowering(solver.net, "chunked", 12 << 30)
solver.net.reshape()
g = build_gmap(solver.net, solver_type=solver.type)
model, pcie = profile_models(prof, g, "segment")
for k in (86,):
    d = plan_at(g, k, int(12 * 2**30 * 0.99), model, pcie)
    p = d.plan
    ops = p.ops
    n = g.n_steps
    pre_waits = sum(len(p.needs[j]) for j in range(n))
    steps_with = sum(1 for j in range(n) if p.needs[j])
    # coalesced: prefetch ops are issued in op order on one serial stream; a step waits only on
    # its latest-issued needed prefetch, and not at all if an earlier step waited on a later one
    order = {i: r for r, i in enumerate(i for i, op in enumerate(ops) if op.kind == PREFETCH)}
    waited = -1; coalesced = 0
    for j in range(n):
        if not p.needs[j]:
            continue
        m = max(order[i] for i in p.needs[j])
        if m > waited:
            coalesced += 1; waited = m
    alloc_waits = 0
    for i, op in enumerate(ops):
        if op.kind == ALLOCATE and any(ops[a].stream != COMPUTE for a in op.after):
            alloc_waits += 1
    print(f"k {k}: offloaded {len(p.offloaded)} buffers; prefetch waits {pre_waits} at {steps_with} steps, coalesced {coalesced}; allocations waiting on swap-out releases {alloc_waits}; steps {n}")
