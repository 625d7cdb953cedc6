#!/usr/bin/env python3
"""The smallest budget that trains each network under `none`, `naive` and `vdnn`, and its speed.

`--strategies` takes `recompute` too (SuperNeurons' swap + recompute, the baseline of the
paper's Table 3), `dynamic`, and `plain`.

For each network at the paper's minibatch (AlexNet 256, GoogLeNet 128, VGG-16 64, ResNet-34
128, ResNet-50 64, ResNet-101 32, ResNet-152 32; ResNet-152 at 32 is also the paper's headline
point: Caffe needs more than 24 GB, naive swapping 2.5 GB) and each strategy, one process:

1. builds the net (``gen_prototxt.build(name, batch, data="dummy")`` with its DummyData replaced
   by an Input layer, filled once on the device with random images and labels, as
   ``bench_throughput.py`` does) and its SGD solver;
2. plans the strategy without a budget: the plan's smallest budget (its layout's extent);
3. runs the dry run (:func:`swap.runtime.measure_scratch`: one training iteration counting
   every transient CuPy allocation per step);
4. installs the strategy at the smallest budget that holds the plan and the measured
   transients (plus a margin for the pool's fragmentation: ``--margin``), strict, so that an
   allocation beyond the budget raises; runs ``--warmup`` iterations (the executor's own dry
   run first) and ``--iters`` timed ones (CUDA events around each ``Solver.step(1)``, median);
   if the reserve overflows, retries with a larger margin;
5. reports the plan's budget, the transients, the verified budget, the measured arena
   high-water mark (never above the budget: the test below checks it), the pinned host bytes,
   the bytes offloaded per iteration and the median iteration time.

The parent prints a table and writes a CSV and a markdown table.  ``--quick`` runs the same
code on the CPU with a tiny net (the CPU test of this script), where the reserve is accounted
but not enforced (NumPy temporaries cannot be redirected).

    python3 scripts/swap_budgets.py                                   # about 6 minutes, H200
    python3 scripts/swap_budgets.py --nets resnet50:64 --strategies naive,vdnn
    python3 scripts/swap_budgets.py --strategies none,naive,vdnn,recompute
    python3 scripts/swap_budgets.py --quick --csv /tmp/q.csv --md /tmp/q.md
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from scripts._child import run_child  # noqa: E402

DEFAULT_NETS = ("alexnet:256,googlenet:128,vgg16:64,resnet34:128,resnet50:64,resnet101:32,"
                "resnet152:32")
QUICK_NETS = "cifar10_quick:4"
STRATEGIES = "none,naive,vdnn"
PAPER = {("resnet152", 32): "paper (M40, Caffe): Caffe > 24 GB, naive 2.5 GB, dynamic 8.3 GB"}


# ------------------------------------------------------------------ child
def _solver(name, batch, engine, mode):
    import numpy as np
    from minicaffe.proto import caffe_pb2
    from minicaffe.solver import Solver
    from scripts.bench_throughput import minicaffe_net_param
    p = caffe_pb2.SolverParameter(base_lr=1e-4, momentum=0.9, weight_decay=5e-4,
                                  lr_policy="fixed", max_iter=10**9, display=0, random_seed=1)
    p.net_param.CopyFrom(minicaffe_net_param(name, batch, engine))
    s = Solver(p, mode=mode, verbose=False)
    net = s.net
    xp = net.xp
    rng = np.random.default_rng(0)
    d, lab = net.blobs["data"], net.blobs["label"]
    d.data[...] = xp.asarray(rng.standard_normal(d.shape, dtype=np.float32))
    lab.data[...] = xp.asarray(rng.integers(0, 10, lab.shape).astype(np.float32))
    return s


def _timed_steps(solver, iters, gpu, host: list | None = None):
    """ms of each of ``iters`` solver steps (CUDA events on the GPU); ``host``: a list that
    gets each step's host time too (ms until ``step`` returned: the iteration when it equals
    the step's time, i.e. the host, not the device, bounds it)."""
    times = []
    if gpu:
        import cupy as cp
        for _ in range(iters):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            t = time.perf_counter()
            solver.step(1)
            if host is not None:
                host.append((time.perf_counter() - t) * 1e3)
            b.record()
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b))
    else:
        for _ in range(iters):
            t = time.perf_counter()
            solver.step(1)
            times.append((time.perf_counter() - t) * 1e3)
            if host is not None:
                host.append(times[-1])
    return times


def _timed_back_to_back(solver, iters):
    """GPU: ms of each of ``iters`` solver steps issued back to back, as training issues them:
    an event on the compute stream between the steps and one wait at the end, so that the host
    runs ahead of the device from step to step (:func:`_timed_steps` waits after each step, so
    each of its steps starts on an idle device, and at small k the device then waits while the
    host issues the first layers)."""
    import cupy as cp
    events = [cp.cuda.Event() for _ in range(iters + 1)]
    events[0].record()
    for e in events[1:]:
        solver.step(1)
        e.record()
    events[-1].synchronize()
    return [cp.cuda.get_elapsed_time(a, b) for a, b in zip(events, events[1:])]


def run_one(spec: str, iters: int, warmup: int, engine: str, margin: float, mode: str,
            retries: int = 3, lowering: str | None = None) -> dict:
    """Everything for one net:batch:strategy in this process (module doc, steps 1-5)."""
    name, batch, strategy = spec.split(":")
    batch = int(batch)
    from swap.gmap import build_gmap
    from swap.memory import caffe_total
    from swap.plan import make_plan
    from swap.runtime import (ScratchOverflow, install, lowering_for, measure_scratch,
                              set_lowering)
    gpu = mode == "GPU"
    t0 = time.time()
    solver = _solver(name, batch, engine, mode)
    if strategy == "plain":
        return _run_plain(solver, name, batch, iters, warmup, engine, mode, t0)
    lowering = lowering_for(strategy, lowering)
    set_lowering(solver.net, lowering)
    solver.net.reshape()
    g = build_gmap(solver.net)
    plan = make_plan(g, strategy)
    tp = measure_scratch(solver, strategy, iterations=1, lowering=lowering)
    out = {"net": name, "batch": batch, "strategy": strategy, "mode": mode, "engine": engine,
           "lowering": lowering,
           "plan_bytes": plan.arena_bytes, "plan_peak": plan.peak,
           "caffe_bytes": caffe_total(g), "transient_bytes": tp.peak,
           "transient_where": tp.peak_where, "base_bytes": tp.layout.scratch_base,
           "attempts": []}
    out["device"] = _device(gpu)
    m = margin
    for attempt in range(retries + 1):
        budget = tp.budget(margin=m)
        ex = install(solver, strategy, budget, scratch=tp.reserve(margin=m), lowering=lowering)
        try:
            for _ in range(warmup):
                solver.step(1)
            times = _timed_steps(solver, iters, gpu)
        except ScratchOverflow as e:
            out["attempts"].append({"budget": budget, "margin": m, "error": str(e)[:300]})
            ex.close()
            m = 2 * m + 0.25
            continue
        a = ex._allocator
        off, pre = ex.plan.transfer_bytes()
        out.update(budget_bytes=budget, margin=m, high_water=ex.high_water,
                   scratch_bytes=ex.scratch.capacity, scratch_high_water=ex.scratch.high_water,
                   arena_plan_bytes=ex.plan.arena_bytes, host_bytes=ex.plan.host_bytes,
                   offload_bytes=off, prefetch_bytes=pre,
                   fallbacks=(a.fallbacks if a is not None else 0),
                   ms=statistics.median(times), times=times,
                   images_per_s=batch * 1000.0 / statistics.median(times),
                   loss=float(solver.last_loss), seconds=time.time() - t0)
        ex.close()
        assert out["high_water"] <= budget, (out["high_water"], budget)
        return out
    out.update(budget_bytes=None, ms=None, seconds=time.time() - t0)
    return out


def _device(gpu):
    if not gpu:
        return "CPU"
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _run_plain(solver, name, batch, iters, warmup, engine, mode, t0):
    """No executor at all (the baseline `none` is compared with): CuPy's pool, no budget."""
    from swap.gmap import build_gmap
    from swap.memory import caffe_total
    gpu = mode == "GPU"
    solver.net.reshape()
    caffe = caffe_total(build_gmap(solver.net))
    for _ in range(warmup):
        solver.step(1)
    times = _timed_steps(solver, iters, gpu)
    peak = None
    if gpu:
        import cupy as cp
        peak = cp.get_default_memory_pool().total_bytes()
    ms = statistics.median(times)
    return {"net": name, "batch": batch, "strategy": "plain", "mode": mode, "engine": engine,
            "device": _device(gpu), "plan_bytes": None, "plan_peak": None,
            "caffe_bytes": caffe, "transient_bytes": None, "transient_where": "",
            "base_bytes": None, "attempts": [], "budget_bytes": None, "high_water": peak,
            "ms": ms, "times": times, "images_per_s": batch * 1000.0 / ms,
            "loss": float(solver.last_loss), "seconds": time.time() - t0}


# ----------------------------------------------------------------- parent
def _gib(n):
    return "-" if n is None else f"{n / 2**30:.2f}"


COLUMNS = [("net", "net"), ("batch", "batch"), ("strategy", "strategy"),
           ("budget_gib", "smallest budget GiB"), ("plan_gib", "plan GiB"),
           ("transient_gib", "transients GiB"), ("high_water_gib", "high-water GiB"),
           ("host_gib", "pinned host GiB"), ("offload_gib", "offload/iter GiB"),
           ("ms", "ms/iter"), ("images_per_s", "img/s"), ("caffe_gib", "Caffe GiB"),
           ("retries", "retries")]


def _row(r):
    label = r["strategy"]
    if r.get("lowering") and r["lowering"] != ("caffe" if label == "none" else "chunked"):
        label += f" ({r['lowering']} im2col)"
    return {"net": r["net"], "batch": r["batch"], "strategy": label,
            "budget_gib": _gib(r.get("budget_bytes")), "plan_gib": _gib(r.get("plan_bytes")),
            "transient_gib": _gib(r.get("transient_bytes")),
            "high_water_gib": _gib(r.get("high_water")), "host_gib": _gib(r.get("host_bytes")),
            "offload_gib": _gib(r.get("offload_bytes")),
            "ms": "-" if r.get("ms") is None else f"{r['ms']:.1f}",
            "images_per_s": "-" if r.get("ms") is None else f"{r['images_per_s']:.0f}",
            "caffe_gib": _gib(r["caffe_bytes"]), "retries": str(len(r["attempts"]))}


def write_outputs(rows, csv_path, md_path, header):
    table = [_row(r) for r in rows]
    if csv_path:
        os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
        keys = ["net", "batch", "strategy", "lowering", "mode", "engine", "device", "budget_bytes",
                "plan_bytes", "transient_bytes", "transient_where", "high_water",
                "scratch_bytes", "scratch_high_water", "host_bytes", "offload_bytes",
                "prefetch_bytes", "caffe_bytes", "ms", "images_per_s", "fallbacks", "attempts"]
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(keys)
            for r in rows:
                w.writerow([json.dumps(r.get(k)) if k == "attempts" else r.get(k, "")
                            for k in keys])
    if md_path:
        os.makedirs(os.path.dirname(os.path.abspath(md_path)), exist_ok=True)
        lines = [header, "", "| " + " | ".join(t for _, t in COLUMNS) + " |",
                 "|" + "|".join("---" for _ in COLUMNS) + "|"]
        for t in table:
            lines.append("| " + " | ".join(str(t[k]) for k, _ in COLUMNS) + " |")
        notes = sorted({PAPER[(r["net"], r["batch"])] for r in rows
                        if (r["net"], r["batch"]) in PAPER})
        lines += [""] + [f"{n}." for n in notes]
        lines += ["", "smallest budget: the plan (its layout's extent, test nets none) plus the "
                  "transient CuPy allocations measured by the dry run and a margin, verified "
                  "by training at it with every allocation served from the budget (strict). "
                  "Caffe GiB: what Caffe allocates for the same net (CAFFE_FACTS)."]
        with open(md_path, "w") as f:
            f.write("\n".join(lines) + "\n")
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=None, help=f"name:batch,... (default {DEFAULT_NETS})")
    ap.add_argument("--strategies", default=STRATEGIES,
                    help="of none, naive, vdnn, recompute (alias superneurons), dynamic, and "
                         "plain (no executor: the baseline "
                         "of `none`; its high-water column is CuPy's pool)")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations (median)")
    ap.add_argument("--warmup", type=int, default=2,
                    help="iterations before timing (the executor's dry run is the first)")
    ap.add_argument("--engine", default="CAFFE", choices=("CAFFE", "CUDNN"))
    ap.add_argument("--lowering", default=None, choices=("caffe", "chunked"),
                    help="the CAFFE-engine convolutions' im2col (default: Caffe's one image "
                         "for none, chunks of up to 64 MiB for the others)")
    ap.add_argument("--margin", type=float, default=0.10,
                    help="reserve = transients x (1 + margin) + 16 MiB")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per process")
    ap.add_argument("--quick", action="store_true", help="CPU, a tiny net (CI)")
    ap.add_argument("--csv", default=os.path.join(REPO, "results", "swap_budgets.csv"))
    ap.add_argument("--md", default=os.path.join(REPO, "results", "swap_budgets.md"))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    mode = args.mode or ("CPU" if args.quick else "GPU")
    if args.one:
        r = run_one(args.one, args.iters, args.warmup, args.engine, args.margin, mode,
                    lowering=args.lowering)
        print("RESULT " + json.dumps(r), flush=True)
        return 0

    nets = args.nets or (QUICK_NETS if args.quick else DEFAULT_NETS)
    if args.quick and args.iters == 3 and args.warmup == 2:
        args.iters, args.warmup = 2, 2
    specs = [f"{item.strip()}:{s.strip()}" for item in nets.split(",") if item.strip()
             for s in args.strategies.split(",") if s.strip()]
    rows = []
    t_all = time.time()
    for spec in specs:
        t0 = time.time()
        cmd = [sys.executable, os.path.abspath(__file__), "--one", spec, "--iters",
               str(args.iters), "--warmup", str(args.warmup), "--engine", args.engine,
               "--margin", str(args.margin), "--mode", mode]
        if args.lowering:
            cmd += ["--lowering", args.lowering]
        r = run_child(cmd, spec, args.timeout, cwd=REPO, tail_lines=4)
        if r is None:
            continue
        rows.append(r)
        t = _row(r)
        print(f"{spec}: budget {t['budget_gib']} GiB (plan {t['plan_gib']}, transients "
              f"{t['transient_gib']}), high-water {t['high_water_gib']} GiB, {t['ms']} ms/iter"
              f" ({time.time() - t0:.0f}s)", flush=True)
    device = rows[0]["device"] if rows else "?"
    header = (f"Smallest training budgets, {device}, {mode} mode, engine {args.engine}, "
              f"{args.iters} timed iterations after {args.warmup} "
              f"(`python3 scripts/swap_budgets.py{' --quick' if args.quick else ''}`, "
              f"{time.strftime('%Y-%m-%d')})")
    table = write_outputs(rows, args.csv, args.md, header)
    print()
    widths = [max(len(title), *(len(str(t[k])) for t in table)) if table else len(title)
              for k, title in COLUMNS]
    print("  ".join(title.rjust(w) for (_, title), w in zip(COLUMNS, widths)))
    for t in table:
        print("  ".join(str(t[k]).rjust(w) for (k, _), w in zip(COLUMNS, widths)))
    print(f"\n{len(rows)}/{len(specs)} configurations in {time.time() - t_all:.0f}s; "
          f"CSV {args.csv}, markdown {args.md}")
    return 0 if len(rows) == len(specs) else 1


if __name__ == "__main__":
    sys.exit(main())
