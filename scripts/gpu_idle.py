#!/usr/bin/env python3
"""How long the GPU sits idle during one training iteration, and where.

    python3 scripts/gpu_idle.py                          # ResNet-50, batch 64, CAFFE engine
    python3 scripts/gpu_idle.py --net resnet152:32 --engine CUDNN --graph
    MINICAFFE_FUSED=0 python3 scripts/gpu_idle.py        # the generic CuPy paths, for comparison

The net is the dummy variant with an Input layer (``bench_throughput.py``'s), data
drawn once on the device.  Everything runs on one non-blocking stream.

* ``T_iter``: CUDA events around ``Solver.step(1)``, median of ``--iters``
  (what ``bench_throughput.py`` reports).
* ``busy``: for each *unit* of the iteration (clearing the param diffs, each
  layer's forward, each layer's backward, the solver update) the GPU time of its
  kernels alone.  The unit's launches are queued behind a device-side wait that keeps
  the GPU busy until the host has issued all of them, so the events after the
  wait and after the unit time the kernels back to back, without the host's
  launch cost.  (The wait is lengthened and the unit re-timed when the host was
  slower than the wait; a unit that synchronizes the host is flagged ``sync``.)
  GPU idle share = 1 - sum(busy) / T_iter.  The target is under 5 %.
* ``span``: events around each unit in an ordinary eager iteration;
  span - busy is the GPU time lost inside the unit to launch overhead,
  and T_iter - sum(span) the time between units.
* ``launches``: per unit, the nodes of a CUDA graph captured from that unit
  (``--no-counts`` skips it); capture records and runs nothing, so this counts
  kernels, memsets and copies exactly.  A unit that cannot be captured
  (a host sync, a host-to-device copy) shows why.
* ``allocs``: per unit, allocations from CuPy's memory pool in a steady-state
  eager iteration (a MemoryHook); the fused paths should show none.
* ``--graph``: also time the whole iteration replayed as one CUDA graph
  (:mod:`minicaffe.graph`), the lower bound that launch overhead allows.

Output: per layer type, then the top units by idle time, then the totals; with
``--json PATH`` everything per unit as well.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

class Unit:
    """One piece of the iteration, run by ``fn`` (host side issues its kernels)."""

    def __init__(self, name, kind, phase, fn):
        self.name, self.kind, self.phase, self.fn = name, kind, phase, fn
        self.busy_ms = self.span_ms = self.host_ms = 0.0
        self.launches = None       # {"nodes": n, "kernels": k, ...} or None
        self.capture_error = None
        self.allocs = 0
        self.alloc_bytes = 0
        self.syncs = False

    def row(self):
        return {"name": self.name, "type": self.kind, "phase": self.phase,
                "busy_ms": self.busy_ms, "span_ms": self.span_ms, "host_ms": self.host_ms,
                "launches": self.launches, "capture_error": self.capture_error,
                "allocs": self.allocs, "alloc_bytes": self.alloc_bytes, "syncs": self.syncs}


def build_solver(net: str, batch: int, engine: str):
    import cupy as cp
    from scripts.bench_throughput import minicaffe_net_param
    from minicaffe.proto import caffe_pb2
    from minicaffe.solver import Solver
    p = caffe_pb2.SolverParameter(base_lr=1e-4, momentum=0.9, weight_decay=5e-4,
                                  lr_policy="fixed", max_iter=10**9, display=0, random_seed=1)
    p.net_param.CopyFrom(minicaffe_net_param(net, batch, engine))
    solver = Solver(p, mode="GPU", device_id=0, verbose=False)
    rng = cp.random.default_rng(0)
    n = solver.net
    n.blobs["data"].data[...] = rng.standard_normal(n.blobs["data"].shape, dtype=cp.float32)
    n.blobs["label"].data[...] = rng.integers(0, 1000, n.blobs["label"].shape).astype(cp.float32)
    return solver


def make_units(solver):
    net = solver.net
    units = [Unit("clear_param_diffs", "Solver", "clear", net.clear_param_diffs)]
    for li, (name, layer) in enumerate(zip(net.layer_names, net.layers)):
        units.append(Unit(name, layer.type, "forward", lambda li=li: net.forward_layer(li)))
    for li in range(len(net.layers) - 1, -1, -1):
        if net.layer_need_backward[li]:
            units.append(Unit(net.layer_names[li], net.layers[li].type, "backward",
                              lambda li=li: net.backward_layer(li)))
    units.append(Unit("apply_update", "Solver", "update", solver.apply_update))
    return units


def finish_iteration(solver):
    solver.iter += 1


def time_iterations(cp, solver, iters):
    times = []
    for _ in range(iters):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        solver.step(1)
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return statistics.median(times), times


def measure_spans(cp, solver, units):
    """Events around every unit of one eager iteration; host time per unit."""
    events = [cp.cuda.Event() for _ in range(len(units) + 1)]
    events[0].record()
    for i, u in enumerate(units):
        t0 = time.perf_counter()
        u.fn()
        u.host_ms = (time.perf_counter() - t0) * 1e3
        events[i + 1].record()
    events[-1].synchronize()
    for i, u in enumerate(units):
        u.span_ms = cp.cuda.get_elapsed_time(events[i], events[i + 1])
    finish_iteration(solver)
    return cp.cuda.get_elapsed_time(events[0], events[-1])


def measure_busy(cp, solver, units):
    """Each unit's kernels queued behind a device-side wait (:func:`swap.profiler.device_wait`):
    their back-to-back GPU time."""
    from swap.profiler import device_wait
    for u in units:
        spin_ms = max(0.2, 3.0 * u.host_ms + 0.1)
        for _ in range(4):
            e0, e1, e2 = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            device_wait(cp, spin_ms / 1e3)
            e1.record()
            t0 = time.perf_counter()
            u.fn()
            host = (time.perf_counter() - t0) * 1e3
            e2.record()
            e2.synchronize()
            spun = cp.cuda.get_elapsed_time(e0, e1)
            u.busy_ms = cp.cuda.get_elapsed_time(e1, e2)
            if host < 0.9 * spun:
                u.syncs = False
                break
            u.syncs = True  # the host waited on the GPU, or the spin was too short
            spin_ms = 2.0 * host + 1.0
    finish_iteration(solver)


_NODE = re.compile(r'"?graph_\d+_node_\d+"?\s*\[')


def parse_dot(dot: str) -> dict:
    """Count the nodes of a graph from cudaGraphDebugDotPrint's DOT text, by kind
    (a node's attribute list, which may span lines, runs from its ``[`` to ``];``)."""
    counts = defaultdict(int)
    for m in _NODE.finditer(dot):
        end = dot.find("];", m.end())
        label = dot[m.end(): end if end >= 0 else len(dot)].upper()
        counts["nodes"] += 1
        for kind in ("KERNEL", "MEMSET", "MEMCPY", "EVENT", "HOST"):
            if kind in label:
                counts[kind.lower()] += 1
                break
    return dict(counts)


def count_launches(cp, stream, units):
    """Capture each unit into a CUDA graph (nothing runs) and count its nodes."""
    for u in units:
        stream.begin_capture()
        try:
            u.fn()
        except Exception as e:
            try:
                stream.end_capture()
            except Exception:
                pass
            u.capture_error = f"{type(e).__name__}: {str(e)[:120]}"
            continue
        try:
            graph = stream.end_capture()
            u.launches = parse_dot(graph.debug_dot_str())
        except Exception as e:
            u.capture_error = f"{type(e).__name__}: {str(e)[:120]}"


def count_allocs(cp, solver, units):
    from cupy.cuda import memory_hook

    class Count(memory_hook.MemoryHook):
        name = "gpu_idle_count"

        def __init__(self):
            self.n = self.bytes = 0

        def malloc_preprocess(self, **kw):
            self.n += 1
            self.bytes += kw.get("mem_size", kw.get("size", 0))

    for u in units:
        hook = Count()
        with hook:
            u.fn()
        u.allocs, u.alloc_bytes = hook.n, hook.bytes
    finish_iteration(solver)


def time_graph(cp, solver, iters):
    from minicaffe.graph import IterationGraph, NotCapturable
    try:
        g = IterationGraph(solver)
    except NotCapturable as e:
        return None, str(e)
    try:
        for _ in range(g.warmup + 2):
            g.step()
        cp.cuda.get_current_stream().synchronize()
        times = []
        for _ in range(iters):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            g.step()
            b.record()
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b))
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e)[:300]}"
    return statistics.median(times), None


def report(units, t_iter, span_total, t_graph, graph_note, args):
    busy = sum(u.busy_ms for u in units)
    span = sum(u.span_ms for u in units)
    launches = sum((u.launches or {}).get("nodes", 0) for u in units)
    kernels = sum((u.launches or {}).get("kernel", 0) for u in units)
    allocs = sum(u.allocs for u in units)
    print(f"\n{'type':<16} {'phase':<8} {'n':>4} {'busy ms':>9} {'span ms':>9} {'host ms':>9} "
          f"{'launches':>9} {'allocs':>7}")
    groups = defaultdict(list)
    for u in units:
        groups[(u.kind, u.phase)].append(u)
    for (kind, phase), us in sorted(groups.items(), key=lambda kv: -sum(u.span_ms for u in kv[1])):
        nl = sum((u.launches or {}).get("nodes", 0) for u in us)
        bad = sum(1 for u in us if u.capture_error)
        print(f"{kind:<16} {phase:<8} {len(us):>4} {sum(u.busy_ms for u in us):>9.2f} "
              f"{sum(u.span_ms for u in us):>9.2f} {sum(u.host_ms for u in us):>9.2f} "
              f"{nl:>9}{'*' if bad else ' '} {sum(u.allocs for u in us):>6}")
    worst = sorted(units, key=lambda u: u.busy_ms - u.span_ms)[:args.top]
    print(f"\ntop {args.top} units by GPU idle inside them (span - busy):")
    for u in worst:
        flag = " [host sync]" if u.syncs else ""
        print(f"  {u.kind:<14} {u.phase:<8} {u.name:<34} span {u.span_ms:7.3f}  busy "
              f"{u.busy_ms:7.3f}  launches {(u.launches or {}).get('nodes', '?')}{flag}")
    errors = [u for u in units if u.capture_error]
    if errors:
        print(f"\n{len(errors)} units could not be captured (first 5):")
        for u in errors[:5]:
            print(f"  {u.kind} {u.phase} {u.name}: {u.capture_error}")
    print(f"\nT_iter (events around Solver.step, median)  {t_iter:9.2f} ms")
    print(f"sum of unit spans (one eager iteration)       {span:9.2f} ms "
          f"(events first..last {span_total:.2f})")
    print(f"sum of unit busy time (kernels back to back)  {busy:9.2f} ms")
    print(f"GPU idle share 1 - busy/T_iter                {100 * (1 - busy / t_iter):8.1f} %   "
          f"(target < 5 %)")
    print(f"  inside units (span - busy)                  {span - busy:9.2f} ms")
    print(f"  between units (T_iter - span)               {t_iter - span:9.2f} ms")
    print(f"launches per iteration (graph nodes)          {launches:9d}   (kernels {kernels})")
    print(f"pool allocations per iteration                {allocs:9d}")
    if t_graph is not None:
        print(f"whole iteration as one CUDA graph             {t_graph:9.2f} ms "
              f"({100 * (1 - t_graph / t_iter):.1f} % below eager)")
    elif graph_note:
        print(f"CUDA graph: not captured: {graph_note}")
    return {"t_iter_ms": t_iter, "busy_ms": busy, "span_ms": span,
            "idle_share": 1 - busy / t_iter, "launches": launches, "kernels": kernels,
            "allocs": allocs, "t_graph_ms": t_graph, "graph_note": graph_note,
            "units": [u.row() for u in units]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", default="resnet50:64", help="name:batch (scripts/gen_prototxt.py names)")
    ap.add_argument("--engine", default="CAFFE", choices=("CAFFE", "CUDNN"))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-counts", action="store_true", help="skip the per-unit graph capture")
    ap.add_argument("--graph", action="store_true", help="also time the iteration as a CUDA graph")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy as cp
    from minicaffe.kernels import cuda_fused
    name, batch = args.net.split(":")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        solver = build_solver(name, int(batch), args.engine)
        print(f"{args.net} engine {args.engine}, fused kernels "
              f"{'on' if cuda_fused.enabled_for(cp, solver.net.dtype) else 'off'}, "
              f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
        for _ in range(args.warmup):
            solver.step(1)
        stream.synchronize()
        t_iter, times = time_iterations(cp, solver, args.iters)
        units = make_units(solver)
        span_total = measure_spans(cp, solver, units)
        measure_spans(cp, solver, units)  # again: host times of a warm iteration
        measure_busy(cp, solver, units)
        count_allocs(cp, solver, units)
        if not args.no_counts:
            stream.synchronize()
            count_launches(cp, stream, units)
        t_graph, note = (None, None)
        if args.graph:
            t_graph, note = time_graph(cp, solver, args.iters)
        stream.synchronize()
    out = report(units, t_iter, span_total, t_graph, note, args)
    out.update(net=args.net, engine=args.engine, iter_times_ms=times)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
