#!/usr/bin/env python3
"""The swap executor's own host time per iteration, separated from the layers' compute (issue 5).

On a fast GPU at small minibatch the host issues the iteration, and whatever the executor does
in Python around each step (issuing the plan's allocate / release / offload / prefetch ops,
residency checks, bindings, event records) adds to the critical path.  This script measures
that host work on the CPU (NumPy mode: the executor's CPU stand-ins for streams and events do
nothing, copies are synchronous memcpys) on a deep net with little compute: by default
ResNet-152 at batch 1 on 32x32 images (the generator's dummy variant with an Input layer of
that size and a global pool5), 1,441 steps.

Per strategy (``plain``: no executor at all; ``none``; ``naive``; ``vdnn``; ``dynamic``: the
naive plan with every second offloaded buffer pinned, a stand-in for the tuner's pins, which
need a GPU profile; ``kept``: the dynamic plan with every feature map pinned, the tuner's plan
where they all fit; ``resident``: :func:`swap.plan.plan_resident`) it runs ``--iters`` timed ``Net.forward_backward`` calls (median) and
reports:

* ``iteration``: the whole pass;
* ``layers``: summed time inside ``Net.forward_layer`` / ``backward_layer`` (the device work);
* ``copies``: summed time of the offload / prefetch copies (device work on the GPU: there they
  are asynchronous memcpys, here synchronous ones);
* ``overhead`` = iteration - layers - copies: the executor's own host time, per step too
  (it includes the cost of running the executor's Python with caches that the layers' compute
  has just swept);
* ``executor alone``: the same pass with every layer call a no-op: the executor's Python work
  with warm caches (its copies included, tiny at this size);
* per op kind (an instrumented pass of its own, so that its timers do not inflate the totals):
  count per iteration, ms per iteration and microseconds per op, copies excluded; ``step loop``
  is the overhead outside every op (the per-step loop, residency checks before a step,
  event records).

    python3 scripts/executor_overhead.py                       # ResNet-152, b1, 32x32, ~1 min
    python3 scripts/executor_overhead.py --net resnet50 --iters 20
    python3 scripts/executor_overhead.py --quick               # a few seconds (the CPU test)

On the GPU (``--gpu``; ``--size 0`` for the net's own images) each timed pass ends with a
synchronization, and ``host`` (until ``forward_backward`` returns) is reported beside the
iteration: where they are equal the host bounds the iteration.  ``--profile P --budget B``
adds the tuner's own plan at the batch (``tuned``: spare memory filled with pins;
``tuned-nofill``: the paper's pins only; with ``-pool``, CuPy's allocations stay in CuPy's
pool instead of the scratch reserve).  ``--op-by-op`` turns the executor's compiled
iteration off (every iteration issues the plan op by op, as the first one does):

    python3 scripts/executor_overhead.py --gpu --net resnet152 --batch 16 --size 0 \
        --strategies plain,none,tuned-nofill,tuned \
        --profile docs/results/tuner_s6/resnet152_profile.json.gz

Timers (``time.perf_counter``) around each layer and op cost ~0.1 us each and are counted in
``layers`` / the op kinds; ``overhead`` excludes nothing else.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from minicaffe.cudnn import backend_api  # noqa: E402
from swap.plan import OFFLOAD, PREFETCH, SWAP_IN, SWAP_OUT  # noqa: E402

STRATEGIES = ("plain", "none", "naive", "vdnn", "dynamic", "kept", "resident")
# the tuner's own dynamic plan at the batch (``--profile`` and ``--budget``): with its spare
# memory filled with pins (the default) and without (swap.planner.fill_pins)
TUNED = ("tuned", "tuned-nofill")


def net_param(name: str, batch: int, size: int | None, engine: str = "CAFFE"):
    """The dummy variant of ``name`` (Input layer, every layer's engine ``engine``) at
    ``batch``; ``size``: square images of that side (a ResNet's pool5 becomes global so that
    any size works)."""
    from scripts.bench_throughput import minicaffe_net_param
    p = minicaffe_net_param(name, batch, engine)
    if size:
        for layer in p.layer:
            if layer.type == "Input":
                shape = layer.input_param.shape[0]          # data: (N, C, H, W)
                shape.dim[2] = shape.dim[3] = size
            if layer.type == "Pooling" and layer.name == "pool5":
                layer.pooling_param.ClearField("kernel_size")
                layer.pooling_param.global_pooling = True
    return p


def make_solver(name: str, batch: int, size: int | None, mode: str = "CPU",
                engine: str = "CAFFE"):
    import numpy as np
    from minicaffe.proto import caffe_pb2
    from minicaffe.solver import Solver
    p = caffe_pb2.SolverParameter(base_lr=1e-4, momentum=0.9, weight_decay=5e-4,
                                  lr_policy="fixed", max_iter=10**9, display=0, random_seed=1)
    p.net_param.CopyFrom(net_param(name, batch, size, engine))
    s = Solver(p, mode=mode, verbose=False)
    xp = s.net.xp
    rng = np.random.default_rng(0)
    d, lab = s.net.blobs["data"], s.net.blobs["label"]
    d.data[...] = xp.asarray(rng.standard_normal(d.shape, dtype=np.float32))
    lab.data[...] = xp.asarray(rng.integers(0, 10, lab.shape).astype(np.float32))
    return s


def install_strategy(solver, strategy: str, tuned=None, workspace_budget: int | None = None):
    """The executor of ``strategy`` (None for ``plain``); ``tuned``: (profile path, budget
    bytes) for the strategies of :data:`TUNED`; ``workspace_budget``: the budget whose share
    bounds the cuDNN workspaces of the other strategies (the tuned plans' own budget bounds
    theirs), so that they run the algorithms a budgeted plan runs."""
    from swap.gmap import build_gmap
    from swap.plan import make_plan
    from swap.runtime import install, lay_out_for
    if strategy in TUNED:
        return install_tuned(solver, strategy == "tuned", *tuned)
    if strategy.startswith("tuned") and strategy.endswith("-pool"):
        return install_tuned(solver, strategy == "tuned-pool", *tuned, reserve=False)
    if strategy == "plain":
        # the lowering the swapping strategies run with
        lay_out_for(solver.net, "dynamic", workspace_budget, "chunked")   # as a plan
        solver.net.reshape()
        return None
    if strategy == "kept":          # the dynamic plan with every feature map pinned
        return install(solver, "dynamic", None, pinned="all", lowering="chunked",
                       workspace_budget=workspace_budget)
    pinned = frozenset()
    if strategy == "dynamic":
        solver.net.reshape()
        naive = make_plan(build_gmap(solver.net), "naive")
        pinned = frozenset(sorted(naive.offloaded)[::2])
    return install(solver, strategy, None, pinned=pinned, lowering="chunked",
                   workspace_budget=workspace_budget)


def install_tuned(solver, fill: bool, profile: str, budget: int, reserve: bool = True):
    """The tuner's dynamic plan at the net's batch under ``budget`` (the plan's share: no
    scratch reserve), from the performance model of a saved profile (per-step curves), in an
    arena of the budget whose rest serves CuPy's allocations (``reserve``), or of the plan's
    own size with CuPy's allocations left in CuPy's pool."""
    from swap.gmap import build_gmap, net_batch_size
    from swap.profiler import Profile
    from swap.runtime import lay_out_for
    from swap.tuner import install_decision, plan_at, profile_models
    net = solver.net
    lay_out_for(net, "dynamic", None, "chunked")
    net.reshape()
    g = build_gmap(net, solver_type=solver.type)
    model, pcie = profile_models(Profile.load(profile), g)
    d = plan_at(g, net_batch_size(net), budget, model, pcie, fill=fill)
    return install_decision(solver, d, budget if reserve else None, budget)


class _Timers:
    """Wraps a net's layer calls and the executor's copies (and, when ``per_op``, its ops) with
    perf_counter timers, as instance attributes that shadow the methods."""

    def __init__(self, net, ex, per_op: bool):
        self.layers = 0.0
        self.copies = 0.0
        self.copies_by = defaultdict(float)     # stream -> seconds
        self.by_kind = defaultdict(float)
        self.count = defaultdict(int)
        clock = time.perf_counter

        def timed_layer(fn):
            def call(li):
                t = clock()
                r = fn(li)
                self.layers += clock() - t
                return r
            return call
        net.forward_layer = timed_layer(net.forward_layer)
        net.backward_layer = timed_layer(net.backward_layer)
        if ex is None:
            return
        copy = ex.streams.copy

        def timed_copy(dst, src, stream):
            t = clock()
            copy(dst, src, stream)
            dt = clock() - t
            self.copies += dt
            self.copies_by[stream] += dt
        ex.streams.copy = timed_copy
        if per_op:
            kinds = [op.kind for op in ex.plan.ops]

            def timed(fn, kind):
                def call(i):
                    t = clock()
                    fn(i)
                    self.by_kind[kind] += clock() - t
                    self.count[kind] += 1
                return call
            # the executor's per-step tables of (issue method, op index), each entry wrapped
            for table in (ex._issue_before, ex._issue_after):
                table[:] = [tuple((timed(fn, kinds[i]), i) for fn, i in ops) for ops in table]

    def reset(self):
        self.layers = self.copies = 0.0
        self.copies_by.clear()
        self.by_kind.clear()
        self.count.clear()


def _synchronizer(gpu: bool):
    if not gpu:
        return lambda: None
    import cupy as cp
    return cp.cuda.Device().synchronize


def measure(name: str, batch: int, size: int | None, strategy: str, warmup: int,
            iters: int, gpu: bool = False, tuned=None, fast: bool = True, *,
            engine: str = "CAFFE", workspace_budget: int | None = None, step: bool = False,
            brief: bool = False, cprofile: int = 0) -> dict:
    """One strategy: medians of the timed pass, then one instrumented pass per op kind.

    On the GPU every timed pass ends with a device synchronization: ``iteration`` is the
    wall time of the pass until the device is done, ``host`` the time until
    ``forward_backward`` returned (the host's issue time; iteration ~ host: host-bound), and
    ``layers`` / ``copies`` the host's time inside the layer calls and the copy calls.

    ``step``: time the solver's whole step (the update included) instead of the net's
    forward and backward.  ``brief``: leave out the passes with no-op layers and per op kind.
    ``cprofile``: that many more passes under :mod:`cProfile`; the functions of most own
    host time per pass are kept in ``row["cprofile"]``.
    Each row also records what may slow a host-bound iteration from outside the executor
    (:func:`conditions`): the process's CPU time per iteration, the host's load, the GPU's
    clocks, and, with the CUDNN engine, the convolutions' chosen algorithms."""
    from swap.gmap import build_gmap
    solver = make_solver(name, batch, size, "GPU" if gpu else "CPU", engine)
    net = solver.net
    sync = _synchronizer(gpu)
    ex = install_strategy(solver, strategy, tuned, workspace_budget)
    if ex is not None:
        ex.fast = fast
    run = (lambda: solver.step(1)) if step else net.forward_backward
    try:
        timers = _Timers(net, ex, per_op=False)
        for _ in range(warmup):
            run()
        sync()
        before = conditions(gpu)
        graph0 = backend_api.counts()
        cpu0 = time.process_time()
        total, host, layers, copies = [], [], [], []
        for _ in range(iters):
            timers.reset()
            t = time.perf_counter()
            run()
            host.append(time.perf_counter() - t)
            sync()
            total.append(time.perf_counter() - t)
            layers.append(timers.layers)
            copies.append(timers.copies)
        cpu1 = time.process_time()
        graph1 = backend_api.counts()
        after = conditions(gpu)
        over = [a - b - c for a, b, c in zip(host, layers, copies)]
        steps = ex.gmap.n_steps if ex is not None else build_gmap(net).n_steps
        row = {"strategy": strategy, "steps": steps,
               "iteration_ms": 1e3 * statistics.median(total),
               "host_ms": 1e3 * statistics.median(host),
               "layers_ms": 1e3 * statistics.median(layers),
               "copies_ms": 1e3 * statistics.median(copies),
               "overhead_ms": 1e3 * statistics.median(over), "alone_ms": None, "kinds": {},
               "transfers": 0}
        if ex is not None:
            row["transfers"] = sum(1 for op in ex.plan.ops if op.kind in (OFFLOAD, PREFETCH))
        row["overhead_us_per_step"] = 1e3 * row["overhead_ms"] / row["steps"]
        row["times_ms"] = [1e3 * t for t in total]
        row["cpu_ms"] = 1e3 * (cpu1 - cpu0) / iters       # every thread of the process
        # cuDNN's graph API during the timed passes, per iteration (all 0 on the legacy API)
        row["graph_api"] = {k: (graph1[k] - graph0[k]) / iters for k in graph1}
        row["before"], row["after"] = before, after
        if engine == "CUDNN" and gpu:
            row["algos"] = conv_algorithms(net)
        if cprofile:
            row["cprofile"] = host_profile(run, sync, cprofile)
        row["by_type"], row["by_step"] = (step_times_by_type(ex, net, sync)
                                          if (gpu and ex is not None) else ({}, {}))
        if ex is not None and not brief:
            # the executor alone: the same pass with every layer call a no-op (its data are
            # left stale, so this runs last but one; the plan's ops and checks run as ever)
            net.forward_layer = lambda li: 0.0
            net.backward_layer = lambda li: None
            alone = []
            for _ in range(iters):
                t = time.perf_counter()
                net.forward_backward()
                sync()
                alone.append(time.perf_counter() - t)
            row["alone_ms"] = 1e3 * statistics.median(alone)
            net2 = solver.net
            del net2.forward_layer, net2.backward_layer     # back to the methods
            del ex.streams.copy
            ex.fast = False                                 # op by op: each op is timed
            timers = _Timers(net2, ex, per_op=True)
            runs = []
            for _ in range(max(1, iters // 2)):
                timers.reset()
                t = time.perf_counter()
                net2.forward_backward()
                t_host = time.perf_counter() - t
                sync()
                runs.append((t_host, timers.layers,
                             dict(timers.copies_by), dict(timers.by_kind), dict(timers.count)))
            runs.sort(key=lambda r: r[0])
            t, lay, copies_by, by_kind, count = runs[len(runs) // 2]
            copy_of = {OFFLOAD: copies_by.get(SWAP_OUT, 0.0), PREFETCH: copies_by.get(SWAP_IN, 0.0)}
            kinds = {k: (count[k], 1e3 * (v - copy_of.get(k, 0.0))) for k, v in by_kind.items()}
            kinds["step loop"] = (row["steps"], 1e3 * (t - lay - sum(by_kind.values())))
            row["kinds"] = kinds
        return row
    finally:
        if ex is not None:
            ex.close()
            ex.device.release()
        if gpu:             # the next strategy builds its own net: give this one's memory back
            import gc

            import cupy as cp
            solver = net = ex = None
            gc.collect()
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()


def host_profile(run, sync, passes: int, top: int = 60) -> list:
    """``run`` ``passes`` times under cProfile: the ``top`` functions by own time, as
    [function, calls per pass, own us per pass, cumulative us per pass] (the profiler's own
    cost inflates every call alike)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(passes):
        run()
    sync()
    prof.disable()
    stats = pstats.Stats(prof).stats
    rows = []
    for (file, line, fn), (_, calls, own, cum, _) in stats.items():
        where = f"{os.path.basename(file)}:{line}({fn})" if line else fn
        rows.append([where, calls / passes, 1e6 * own / passes, 1e6 * cum / passes])
    rows.sort(key=lambda r: -r[2])
    return rows[:top]


def conditions(gpu: bool) -> dict:
    """The host's load averages and, on the GPU, the SM and memory clocks and the power draw
    (``nvidia-smi``; absent where it does not run)."""
    c = {"loadavg": list(os.getloadavg())}
    if gpu:
        import subprocess
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,"
                                  "temperature.gpu", "--format=csv,noheader,nounits", "-i",
                                  os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]],
                                 capture_output=True, text=True, timeout=10).stdout
            sm, mem, power, temp = (float(v) for v in out.strip().split(","))
            c.update(sm_mhz=sm, mem_mhz=mem, power_w=power, temp_c=temp)
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    return c


def conv_algorithms(net) -> dict:
    """The cuDNN algorithms the net's CUDNN convolutions run at their current shapes and
    workspace limits (cached choices: nothing is searched again): per direction, how many
    convolutions run each algorithm, and the summed times that cuDNN's search measured for
    the chosen ones (ms; the convolutions' device time as the search saw it)."""
    from minicaffe import engine as engines
    count = defaultdict(lambda: defaultdict(int))
    search_ms = defaultdict(float)
    per_layer = defaultdict(list)
    workspace = 0
    for layer in net.layers:
        if getattr(layer, "engine", None) != engines.CUDNN or \
                getattr(layer, "_cudnn", None) is None or layer.type != "Convolution":
            continue
        # the calls the layer makes: one per chunk of its images past the workspace cap
        for size, choices in layer.call_choices():
            per_layer[layer.name].append(
                [size] + [[d, c.name, round(c.time_ms, 4)] for d, c in choices.items()])
            for d, c in choices.items():
                count[d][c.name] += 1
                search_ms[d] += max(c.time_ms, 0.0)
                workspace = max(workspace, c.workspace)
    return {"count": {d: dict(v) for d, v in count.items()}, "search_ms": dict(search_ms),
            "largest_workspace": workspace, "per_layer": dict(per_layer)}


def step_times_by_type(ex, net, sync, iters: int = 3) -> tuple:
    """Device time per layer type and phase, and per layer and phase (two dicts of ms, medians
    over ``iters`` traced passes): the
    executor's memory trace times every step with CUDA events on the compute stream (the
    traced passes run op by op; a step's time includes any wait of the device for the host
    within it)."""
    import csv
    import tempfile
    from swap.runtime import MemoryTrace
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.csv")
        ex.trace = MemoryTrace(path)
        try:
            for _ in range(iters):
                net.forward_backward()
            sync()
        finally:
            ex.trace.close()
            ex.trace = None
        with open(path) as f:
            rows = list(csv.DictReader(f))
    per = defaultdict(lambda: defaultdict(float))     # (type, phase) -> iteration -> ms
    each = defaultdict(lambda: defaultdict(float))    # (layer, phase) -> iteration -> ms
    for r in rows:
        layer = net.layers[ex.gmap.steps[int(r["step"])].layer]
        ms = float(r["t_end_ms"]) - float(r["t_start_ms"])
        per[f"{layer.type} {r['phase']}"][r["iteration"]] += ms
        each[f"{layer.name} {r['phase']}"][r["iteration"]] += ms
    return ({k: statistics.median(v.values()) for k, v in per.items()},
            {k: statistics.median(v.values()) for k, v in each.items()})


def _label(row) -> str:
    return row["strategy"] + (f" ({row['tag']})" if row.get("tag") else "")


def report(rows: list, title: str) -> str:
    lines = [title, "",
             "| strategy | steps | transfers | iteration ms | host ms | layers ms | copies ms | "
             "overhead ms | overhead us/step | executor alone ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        alone = "-" if r["alone_ms"] is None else f"{r['alone_ms']:.2f}"
        lines.append(f"| {_label(r)} | {r['steps']} | {r['transfers']} | "
                     f"{r['iteration_ms']:.1f} | {r['host_ms']:.1f} | "
                     f"{r['layers_ms']:.1f} | {r['copies_ms']:.2f} | {r['overhead_ms']:.2f} | "
                     f"{r['overhead_us_per_step']:.2f} | {alone} |")
    lines += ["", "Per op kind (instrumented pass; copies excluded):", "",
              "| strategy | kind | per iteration | ms | us each |", "|---|---|---|---|---|"]
    for r in rows:
        for kind, (n, ms) in sorted(r["kinds"].items()):
            lines.append(f"| {_label(r)} | {kind} | {n} | {ms:.2f} | "
                         f"{1e3 * ms / max(n, 1):.2f} |")
    seen = [r for r in rows if "cpu_ms" in r]
    if seen:
        lines += ["", "Around the timed passes (process CPU time per iteration; the host's "
                  "1-minute load; GPU SM clock before / after; the chosen convolutions' times "
                  "as cuDNN's search measured them, forward + backward data + backward "
                  "filter):", "",
                  "| strategy | iteration ms | host ms | min / max ms | CPU ms | load | SM MHz | "
                  "conv search ms | algorithms |", "|---|---|---|---|---|---|---|---|---|"]
        for r in seen:
            b, a = r["before"], r["after"]
            clock = (f"{b['sm_mhz']:.0f} / {a['sm_mhz']:.0f}" if "sm_mhz" in b and "sm_mhz" in a
                     else "-")
            al = r.get("algos")
            conv = f"{sum(al['search_ms'].values()):.1f}" if al else "-"
            names = ("; ".join(f"{d}: " + ", ".join(f"{n} {c}" for n, c in sorted(v.items()))
                               for d, v in sorted(al["count"].items())) if al else "-")
            lines.append(f"| {_label(r)} | {r['iteration_ms']:.1f} | {r['host_ms']:.1f} | "
                         f"{min(r['times_ms']):.1f} / {max(r['times_ms']):.1f} | "
                         f"{r['cpu_ms']:.1f} | {b['loadavg'][0]:.2f} | {clock} | {conv} | "
                         f"{names} |")
    graphed = [r for r in rows if any(r.get("graph_api", {}).values())]
    if graphed:
        keys = sorted(graphed[0]["graph_api"])
        lines += ["", "cuDNN's graph API per timed iteration (minicaffe.cudnn.backend_api."
                  "counts()):", "", "| strategy | " + " | ".join(keys) + " |",
                  "|---|" + "---|" * len(keys)]
        for r in graphed:
            lines.append(f"| {_label(r)} | "
                         + " | ".join(f"{r['graph_api'][k]:.1f}" for k in keys) + " |")
    typed = [r for r in rows if r.get("by_type")]
    if typed:
        keys = sorted({k for r in typed for k in r["by_type"]},
                      key=lambda k: -max(r["by_type"].get(k, 0.0) for r in typed))
        lines += ["", "Device time per layer type (ms, traced passes: CUDA events per step):", "",
                  "| layer type | " + " | ".join(_label(r) for r in typed) + " |",
                  "|---|" + "---|" * len(typed)]
        for k in keys + ["all"]:
            vals = [sum(r["by_type"].values()) if k == "all" else r["by_type"].get(k, 0.0)
                    for r in typed]
            lines.append(f"| {k} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", default="resnet152")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--size", type=int, default=32, help="image side (0: the net's own)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--quick", action="store_true",
                    help="cifar10_quick at batch 1, 1 warm-up, 2 iterations (the CPU test)")
    ap.add_argument("--gpu", action="store_true",
                    help="on the GPU (CuPy): every timed pass ends with a synchronization")
    ap.add_argument("--profile", default=None,
                    help="a saved profile: adds the tuner's plans (strategies tuned, tuned-nofill)")
    ap.add_argument("--budget", default="12G", help="the tuned plans' budget")
    ap.add_argument("--op-by-op", action="store_true",
                    help="every iteration issues the plan op by op (no compiled iteration)")
    ap.add_argument("--engine", default="CAFFE", choices=("CAFFE", "CUDNN"))
    ap.add_argument("--workspace-budget", default=None,
                    help="bound the untuned strategies' cuDNN workspaces as inside this budget "
                         "(the tuned plans' own budget bounds theirs)")
    ap.add_argument("--per-image", default=None,
                    help="comma-separated values of $MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE to run "
                         "every strategy under (0: the fixed bound, a sixteenth of the budget)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the strategies this many times, in turn (the noise, and any drift "
                         "as the process ages)")
    ap.add_argument("--step", action="store_true",
                    help="time the solver's whole step (the update included)")
    ap.add_argument("--brief", action="store_true",
                    help="leave out the passes with no-op layers and per op kind")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--cprofile", type=int, default=0,
                    help="after the timed passes, this many under cProfile (the functions of "
                         "most own host time go to the JSON rows)")
    args = ap.parse_args(argv)
    if args.quick:
        args.net, args.size, args.warmup, args.iters = "cifar10_quick", 0, 1, 2
    from minicaffe.cudnn.ops import ENV_WORKSPACE_PER_IMAGE as ENV_PER_IMAGE
    from swap.memory import parse_bytes
    tuned = None
    if args.profile:
        tuned = (args.profile, parse_bytes(args.budget))
    wb = parse_bytes(args.workspace_budget) if args.workspace_budget else None
    pool = tuple(f"{t}-pool" for t in TUNED)
    strategies = args.strategies.split(",")
    for strategy in strategies:
        if strategy not in STRATEGIES + (TUNED + pool if tuned else ()):
            known = STRATEGIES + TUNED
            ap.error(f"unknown strategy {strategy!r} (known: {', '.join(known)}; "
                     f"{', '.join(TUNED)} with --profile)")
    per_image = args.per_image.split(",") if args.per_image else [None]
    rows = []
    saved = os.environ.get(ENV_PER_IMAGE)
    try:
        for pi in per_image:
            if pi is not None:
                os.environ[ENV_PER_IMAGE] = pi
            for rnd in range(args.rounds):
                for strategy in strategies:
                    row = measure(args.net, args.batch, args.size or None, strategy,
                                  args.warmup, args.iters, args.gpu, tuned, not args.op_by_op,
                                  engine=args.engine, workspace_budget=wb, step=args.step,
                                  brief=args.brief, cprofile=args.cprofile)
                    tag = [f"round {rnd + 1}"] if args.rounds > 1 else []
                    tag += [f"{pi} per image"] if pi is not None else []
                    row["tag"] = ", ".join(tag)
                    rows.append(row)
                    print(f"{_label(row)}: {row['iteration_ms']:.1f} ms, host "
                          f"{row['host_ms']:.1f} ms", file=sys.stderr, flush=True)
    finally:
        if saved is None:
            os.environ.pop(ENV_PER_IMAGE, None)
        else:
            os.environ[ENV_PER_IMAGE] = saved
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    size = f"{args.size}x{args.size}" if args.size else "its own image size"
    where = ("GPU (CuPy)" if args.gpu else "CPU (NumPy)") + (", op by op" if args.op_by_op
                                                            else "")
    where += f", {args.engine} engine" + (", whole solver steps" if args.step else "")
    title = (f"Executor host overhead, {args.net} at batch {args.batch}, {size}, {where}, "
             f"median of {args.iters} iterations (`python3 scripts/executor_overhead.py"
             + "".join(f" {a}" for a in argv) + f"`, {time.strftime('%Y-%m-%d')})")
    print(report(rows, title))
    return rows


if __name__ == "__main__":
    main()
