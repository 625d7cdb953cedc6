#!/usr/bin/env python3
"""Where one training iteration's GPU time goes: minicaffe per layer type beside PyTorch per op.

For each ``name:batch`` this times, in separate processes:

* minicaffe (``--engines``): ``minicaffe time``'s per-layer forward and backward
  CUDA-event times (:func:`minicaffe.cli.layer_times`), summed per layer type,
  plus the solver's update timed alone, and the whole iteration;
* PyTorch eager (torchvision's architecture, float32, TF32 off,
  ``cudnn.benchmark`` on): ``torch.profiler``'s device time per aten op over
  ``--iters`` iterations, summed into the same categories (convolution, batch
  normalization, ReLU, pooling, ...), and the whole iteration by CUDA events.

The per-category table is what issue 3 asks the closing note to say: for a
network under target, where the time goes.  Categories are matched by name, so
they are approximate on the PyTorch side (an op that launches a kernel of
another kind counts where the op is).

    python3 scripts/layer_profile.py --nets resnet50:64,googlenet:128 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from scripts._child import run_child  # noqa: E402

# minicaffe layer type -> category (types not listed are their own category)
CAFFE_CATEGORY = {"Convolution": "conv", "BatchNorm": "bn+scale", "Scale": "bn+scale",
                  "ReLU": "relu", "Pooling": "pool", "Eltwise": "add", "InnerProduct": "fc",
                  "Concat": "concat", "LRN": "lrn", "Dropout": "dropout",
                  "SoftmaxWithLoss": "loss", "Softmax": "loss", "Input": "data",
                  "Split": "split"}

# PyTorch aten op name fragments -> category, first match wins
TORCH_CATEGORY = [("convolution", "conv"), ("conv", "conv"), ("batch_norm", "bn+scale"),
                  ("relu", "relu"), ("clamp_min", "relu"), ("threshold_backward", "relu"),
                  ("pool", "pool"),
                  ("addmm", "fc"), ("aten::mm", "fc"), ("linear", "fc"), ("aten::cat", "concat"),
                  ("dropout", "dropout"), ("native_dropout", "dropout"),
                  ("softmax", "loss"), ("nll_loss", "loss"), ("cross_entropy", "loss"),
                  ("sgd", "update"), ("_foreach", "update"), ("add", "add")]


def torch_category(op: str) -> str:
    low = op.lower()
    for frag, cat in TORCH_CATEGORY:
        if frag in low:
            return cat
    return "other"


def profile_minicaffe(name: str, batch: int, engine: str, iters: int, warmup: int) -> dict:
    import cupy as cp
    import numpy as np

    from minicaffe.cli import layer_times
    from scripts.bench_throughput import minicaffe_solver
    solver = minicaffe_solver(name, batch, engine)
    net = solver.net
    for _ in range(warmup):
        solver.step(1)
    fwd, bwd, totals = layer_times(net, iters, warmup=1)
    upd = []
    for _ in range(iters):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        solver.apply_update()
        b.record()
        b.synchronize()
        upd.append(cp.cuda.get_elapsed_time(a, b))
    whole = []
    for _ in range(iters):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        solver.step(1)
        b.record()
        b.synchronize()
        whole.append(cp.cuda.get_elapsed_time(a, b))
    cats = defaultdict(lambda: [0.0, 0.0, 0])
    for layer, f, b in zip(net.layers, fwd, bwd):
        c = cats[CAFFE_CATEGORY.get(layer.type, layer.type)]
        c[0] += float(f)
        c[1] += float(b)
        c[2] += 1
    per_layer = [{"name": n, "type": lay.type, "fwd_ms": float(f), "bwd_ms": float(b)}
                 for n, lay, f, b in zip(net.layer_names, net.layers, fwd, bwd)]
    return {"categories": {k: {"fwd_ms": v[0], "bwd_ms": v[1], "count": v[2]}
                           for k, v in cats.items()},
            "update_ms": statistics.median(upd), "layers_ms": float(np.median(totals)),
            "step_ms": statistics.median(whole), "per_layer": per_layer}


def profile_torch(name: str, batch: int, iters: int, warmup: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from scripts.bench_throughput import torch_training_step
    step = torch_training_step(name, batch)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    whole = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        whole.append(a.elapsed_time(b))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    cats = defaultdict(float)
    ops = []
    for evt in prof.key_averages():
        # aten ops only: the kernels they launch are listed too, under their own
        # names, and would count twice
        if not evt.key.startswith("aten::"):
            continue
        us = getattr(evt, "self_device_time_total", None)
        if us is None:
            us = getattr(evt, "self_cuda_time_total", 0.0)
        if not us:
            continue
        ms = us / 1e3 / iters
        cats[torch_category(evt.key)] += ms
        ops.append({"op": evt.key, "ms": ms, "calls": evt.count // iters})
    ops.sort(key=lambda o: -o["ms"])
    return {"categories": {k: {"ms": v} for k, v in cats.items()},
            "step_ms": statistics.median(whole), "ops": ops[:25]}


def one(spec: str, iters: int, warmup: int) -> dict:
    kind, engine, name, batch = spec.split(":")
    if kind == "torch":
        r = profile_torch(name, int(batch), iters, warmup)
    else:
        r = profile_minicaffe(name, int(batch), engine, iters, warmup)
    r.update(kind=kind, engine=engine, net=name, batch=int(batch))
    return r


def table(results: list) -> str:
    """Per net: one row per category, minicaffe engines' forward+backward beside PyTorch."""
    out = []
    nets = []
    for r in results:
        if (r["net"], r["batch"]) not in nets:
            nets.append((r["net"], r["batch"]))
    for net, batch in nets:
        rs = [r for r in results if (r["net"], r["batch"]) == (net, batch)]
        heads = [(r["engine"] if r["kind"] == "minicaffe" else "PyTorch") for r in rs]
        out.append(f"\n{net} batch {batch}: GPU ms per iteration by category "
                   "(minicaffe: fwd+bwd of its layers; PyTorch: device time of its ops)")
        out.append("| category | " + " | ".join(heads) + " |")
        out.append("|---|" + "---|" * len(heads))
        cats = []
        for r in rs:
            for c in r["categories"]:
                if c not in cats:
                    cats.append(c)
        if any(r["kind"] == "minicaffe" for r in rs):
            cats.append("update")
        rows = []
        for c in dict.fromkeys(cats):
            vals = []
            for r in rs:
                if r["kind"] == "minicaffe":
                    if c == "update":
                        vals.append(r["update_ms"])
                        continue
                    v = r["categories"].get(c)
                    vals.append(v["fwd_ms"] + v["bwd_ms"] if v else None)
                else:
                    v = r["categories"].get(c)
                    vals.append(v["ms"] if v else None)
            rows.append((c, vals))
        rows.sort(key=lambda cv: -max(v or 0 for v in cv[1]))
        for c, vals in rows:
            out.append(f"| {c} | " + " | ".join("" if v is None else f"{v:.1f}" for v in vals)
                       + " |")
        out.append("| **whole step (CUDA events)** | "
                   + " | ".join(f"{r['step_ms']:.1f}" for r in rs) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default="resnet50:64")
    ap.add_argument("--engines", default="CUDNN")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.iters, args.warmup)))
        return 0
    specs = []
    for item in args.nets.split(","):
        name, batch = item.split(":")
        specs += [f"minicaffe:{e}:{name}:{batch}" for e in args.engines.split(",") if e]
        if not args.no_torch:
            specs.append(f"torch:eager:{name}:{batch}")
    results = []
    for spec in specs:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", spec,
               "--iters", str(args.iters), "--warmup", str(args.warmup)]
        r = run_child(cmd, spec, args.timeout, cwd=REPO)
        if r is None:
            continue
        results.append(r)
        print(f"{spec}: step {r['step_ms']:.1f} ms", flush=True)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
