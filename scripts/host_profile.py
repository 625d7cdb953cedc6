#!/usr/bin/env python3
"""Host issue time against device compute per step: is an iteration host-bound?

Profiles real training iterations (``swap.profiler.profile_solver``) of each network at the
given minibatches under one strategy (default ``none``: no transfers, so no compute-stream
waits, and the host's time to issue a step is its own cost, not back-pressure from a stalled
stream) and reports, per k: the measured iteration, the compute stream's summed step times, the
host's summed issue times, and the steps whose host time exceeds their device time the most.
An iteration is host-bound where its host sum approaches the iteration and exceeds the device
sum.

    python3 scripts/host_profile.py --nets resnet152:16/29,resnet34:106/184 --engine CAFFE
    python3 scripts/host_profile.py --quick --out-dir /tmp/hp        # CPU, a tiny net (the test)

The budget defaults to the device's free memory (the executor's own default); ``--budget``
sets one.  Writes ``<out-dir>/host_profile.{csv,md}`` and one profile JSON per network.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

QUICK_NETS = "cifar10_quick:4/8"


def summarize(profile, top: int = 5) -> list:
    """One row per profiled k: the median iteration and, averaged over the recorded iterations,
    the device and host sums (seconds) and the ``top`` steps by host minus device time."""
    import statistics
    names = {s.step: f"{s.layer} {s.phase}" for s in profile.steps}
    iters = defaultdict(list)
    for k, t in profile.iterations:
        iters[k].append(t)
    dev, host, has_host = defaultdict(float), defaultdict(float), set()
    per_step = defaultdict(lambda: defaultdict(float))
    for c in profile.compute:
        dev[c.k] += c.time
        if c.host is not None:
            has_host.add(c.k)
            host[c.k] += c.host
            per_step[c.k][c.step] += c.host - c.time
    rows = []
    for k in sorted(dev):
        n = max(1, len(iters.get(k, ())))
        w = sorted(((d / n, names.get(j, str(j))) for j, d in per_step[k].items()),
                   reverse=True)[:top]
        rows.append({"k": k, "iteration_s": statistics.median(iters[k]) if iters.get(k)
                     else float("nan"),
                     "device_s": dev[k] / n, "host_s": host[k] / n if k in has_host else None,
                     "worst": "; ".join(f"{name} {1e3 * d:+.2f} ms" for d, name in w)})
    return rows


def run(name, ks, strategy, engine, mode, budget, warmup, iterations, out_dir, log) -> list:
    from scripts.swap_budgets import _solver
    from swap.profiler import profile_solver
    solver = _solver(name, ks[0], engine, mode)
    prof = profile_solver(solver, budget, ks, warmup=warmup, iterations=iterations,
                          strategy=strategy, bandwidth=False, log=log, calibrate_copies=False)
    prof.save(os.path.join(out_dir, f"host_profile_{name}.json"))
    return [{"net": name, "strategy": strategy, "engine": engine, "device": prof.device, **r}
            for r in summarize(prof)]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=None, help="name:k1/k2/...,... (required unless --quick)")
    ap.add_argument("--strategy", default="none")
    ap.add_argument("--engine", default="CAFFE", choices=("CAFFE", "CUDNN"))
    ap.add_argument("--budget", default=None, help="bytes or 12G (default: the executor's)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="CPU, a tiny net (the test suite)")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "docs", "results"))
    args = ap.parse_args(argv)
    spec = args.nets or (QUICK_NETS if args.quick else None)
    if not spec:
        ap.error("--nets is required (name:k1/k2,...)")
    mode = "CPU" if args.quick else "GPU"
    budget = None
    if args.budget:
        from swap.memory import parse_bytes
        budget = parse_bytes(args.budget)
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    for item in spec.split(","):
        name, ks = item.split(":")
        rows += run(name, [int(k) for k in ks.split("/")], args.strategy, args.engine, mode,
                    budget, args.warmup, args.iterations, args.out_dir,
                    log=lambda m: print(m, file=sys.stderr, flush=True))
    base = os.path.join(args.out_dir, "host_profile")
    with open(base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    command = "python3 scripts/host_profile.py" + "".join(f" {a}" for a in argv)
    md = [f"Host issue time against device compute (`{command}`, {rows[0]['device']}, "
          f"{time.strftime('%Y-%m-%d')}); sums over one iteration's steps.", "",
          "| net | strategy | engine | k | iteration ms | device compute ms | host issue ms | "
          "steps with the most host time over device time |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        host = "-" if r["host_s"] is None else f"{1e3 * r['host_s']:.1f}"
        md.append(f"| {r['net']} | {r['strategy']} | {r['engine']} | {r['k']} | "
                  f"{1e3 * r['iteration_s']:.1f} | {1e3 * r['device_s']:.1f} | {host} | "
                  f"{r['worst']} |")
    with open(base + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
