#!/usr/bin/env python3
"""The paper's Table 3: AccUDNN against a SuperNeurons-style swap + recompute baseline, and
against vDNN at VGG-16 batch 192, in one run per network.

For each network (a child process per network, on its own GPU when ``--gpus`` names several),
at one memory budget (default 12 GiB, as the paper):

1. **SuperNeurons-style** (minicaffe's ``recompute`` strategy, ``--baseline``): the largest
   minibatch whose plan plus the CuPy temporaries that a dry run measures fits the budget
   (verified by training at it), then the images/s at that k and at 3/4 and 1/2 of it.  Its
   efficiency-optimal minibatch is the one of the three with the most images/s (SuperNeurons
   itself has no tuner; the paper reports the best it found).
2. **AccUDNN**: ``swap.tuner.train_dynamic`` from the paper's batch (profiling, Algorithm 2),
   then the decision's plan at k*, timed in the same process.
3. **vDNN** (only for the networks named by ``--fixed``, default ``vgg16:192``): ``vdnn`` and
   AccUDNN's ``dynamic`` plan at that fixed minibatch, both within the budget.

Iteration times are CUDA-event medians after warm-up (wall clock on the CPU).  The paper's
figures (an M40, 12 GB) sit in adjacent columns.  Results: ``docs/results/table3.{csv,md,png}``
and one JSON per network under ``docs/results/table3/``.

    python3 scripts/table3.py --gpus 0,1,2 --nets alexnet:256,vgg16:64,resnet50:64
    python3 scripts/table3.py --quick                 # CPU, a tiny net (the test suite)
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

DEFAULT_NETS = "alexnet:256,vgg16:64,resnet50:64,resnet101:32"
QUICK_NETS = "cifar10_quick:4"
# Table 3 of the paper: SuperNeurons k and img/s, AccUDNN k* and img/s
PAPER = {"alexnet": (640, 414, 1032, 853), "vgg16": (48, 30, 192, 50),
         "resnet50": (48, 60, 112, 66), "resnet101": (48, 30, 74, 34)}
PAPER_VDNN = "vDNN 11 % slower than AccUDNN on VGG-16 at batch 192"


def _time_strategy(solver, strategy, k, budget, iters, warmup, gpu, margin=0.10):
    """``strategy`` at k within ``budget``: ms/iteration and memory, or a recorded error."""
    from scripts.tuner_table import _close, _free, _mem, _offload_fraction, _timed
    from swap.profiler import set_batch_size
    from swap.plan import BudgetError
    from swap.runtime import ScratchOverflow, install, measure_scratch
    _close(solver.net)
    set_batch_size(solver.net, k)
    for attempt in range(3):
        tp = measure_scratch(solver, strategy)
        m = margin + 0.15 * attempt
        try:
            ex = install(solver, strategy, budget, scratch=tp.reserve(margin=m))
        except BudgetError as e:
            return {"k": k, "error": f"BudgetError: {e}"[:400]}
        try:
            ms, times = _timed(solver, iters, warmup, gpu)
            off, _ = ex.plan.transfer_bytes()
            return {"k": k, "ms": ms, "times": times, "images_per_s": k * 1e3 / ms,
                    "offload_bytes": int(off), "offload_fraction": _offload_fraction(ex.plan),
                    **_mem(ex)}
        except ScratchOverflow:
            continue
        finally:
            solver.net.executor = None
            _free(ex)
    return {"k": k, "error": "the temporaries outgrew the scratch reserve three times"}


def run_net(name, k_base, budget, iters, warmup, engine, mode, fixed, host_budget,
            profile_dir=None) -> dict:
    from scripts.swap_budgets import _device, _solver
    from scripts.tuner_table import (_close, _free, collecting_log, dynamic_point,
                                     largest_verified_k)
    from swap.profiler import set_batch_size
    from swap.tuner import profile_models, train_dynamic
    gpu = mode == "GPU"
    lines, log = collecting_log()

    t0 = time.time()
    solver = _solver(name, k_base, engine, mode)
    out = {"net": name, "k_base": k_base, "budget": budget, "mode": mode, "engine": engine,
           "device": _device(gpu), "date": time.strftime("%Y-%m-%d"), "baseline": BASELINE}
    # ---- 1. the swap + recompute baseline
    k_sn, _ = largest_verified_k(solver, BASELINE, budget, log)
    if k_sn < 1:
        raise RuntimeError(f"{BASELINE}: no minibatch fits {budget} bytes")
    points = []
    for k in sorted({k_sn, max(1, 3 * k_sn // 4), max(1, k_sn // 2)}, reverse=True):
        r = _time_strategy(solver, BASELINE, k, budget, iters, warmup, gpu)
        log(f"{BASELINE} at k = {k}: " + (f"{r['ms']:.1f} ms" if "ms" in r else r["error"]))
        points.append(r)
    ok = [p for p in points if "ms" in p]
    out["baseline_points"] = points
    out["baseline_best"] = max(ok, key=lambda p: p["images_per_s"]) if ok else None
    out["baseline_k_max"] = k_sn
    # ---- 2. AccUDNN: the tuner, then k* timed
    _close(solver.net)
    set_batch_size(solver.net, k_base)
    profile = None
    if profile_dir:  # a profile saved by an earlier run (tuner_table.py) at this budget
        from swap.profiler import saved_profile
        path = saved_profile(profile_dir, name)
        if path is not None:
            profile = path
            out["profile_reused"] = os.path.relpath(path, REPO)
            log(f"AccUDNN: reusing the saved profile {path} (stage 1 skipped)")
    t1 = time.perf_counter()
    ex, td = train_dynamic(solver, budget, auto_batch=True, log=log, keep_epochs=False,
                           host_budget=host_budget if gpu else None, profile=profile)
    # with a reused profile this is the decision and install only, without profiling
    out["tuner_seconds"] = time.perf_counter() - t1
    dec = td.decision
    g = ex.gmap
    model, pcie = profile_models(td.profile, g)
    solver.net.executor = None
    _free(ex)

    def dynamic_at(k):
        return dynamic_point(solver, dec, g, k, td, model, pcie, budget, iters, warmup, gpu)

    out["accudnn"] = dynamic_at(dec.k_star)
    log(f"AccUDNN at k* = {dec.k_star}: " + (f"{out['accudnn']['ms']:.1f} ms"
                                             if "ms" in out["accudnn"] else
                                             out["accudnn"]["error"]))
    # ---- 3. vDNN and AccUDNN at a fixed minibatch
    if name in fixed:
        k = fixed[name]
        out["fixed"] = {"k": k, "vdnn": _time_strategy(solver, "vdnn", k, budget, iters, warmup,
                                                        gpu),
                        "dynamic": dynamic_at(k)}
    out["log"] = lines[-30:]
    out["seconds"] = time.time() - t0
    return out


BASELINE = "recompute"


# ----------------------------------------------------------------- parent
def _ratio(a, b):
    return None if a is None or b is None or not b else a / b


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def write_outputs(results, out_dir, header):
    rows = []
    for r in results:
        b = r.get("baseline_best") or {}
        a = r.get("accudnn") or {}
        p = PAPER.get(r["net"], (None,) * 4)
        rows.append({"net": r["net"], "baseline_k": b.get("k"),
                     "baseline_img_s": b.get("images_per_s"), "baseline_k_max": r["baseline_k_max"],
                     "accudnn_k": a.get("k"), "accudnn_img_s": a.get("images_per_s"),
                     "k_gain": _ratio(a.get("k"), b.get("k")),
                     "img_s_gain": _ratio(a.get("images_per_s"), b.get("images_per_s")),
                     "paper_sn_k": p[0], "paper_sn_img_s": p[1], "paper_acc_k": p[2],
                     "paper_acc_img_s": p[3], "tuner_s": r.get("tuner_seconds")})
    with open(os.path.join(out_dir, "table3.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = [header, "", "| net | swap+recompute k (of max) | img/s | AccUDNN k* | img/s | k gain | "
          "img/s gain | paper: SuperNeurons k, img/s | paper: AccUDNN k*, img/s | paper gains |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        pk = _ratio(row["paper_acc_k"], row["paper_sn_k"])
        pi = _ratio(row["paper_acc_img_s"], row["paper_sn_img_s"])
        md.append(f"| {row['net']} | {_fmt(row['baseline_k'], 'd')} ({row['baseline_k_max']}) | "
                  f"{_fmt(row['baseline_img_s'], '.0f')} | {_fmt(row['accudnn_k'], 'd')} | "
                  f"{_fmt(row['accudnn_img_s'], '.0f')} | {'-' if row['k_gain'] is None else format(row['k_gain'] - 1, '+.0%')} | "
                  f"{'-' if row['img_s_gain'] is None else format(row['img_s_gain'] - 1, '+.0%')} | "
                  f"{_fmt(row['paper_sn_k'], 'd')}, {_fmt(row['paper_sn_img_s'], 'd')} | "
                  f"{_fmt(row['paper_acc_k'], 'd')}, {_fmt(row['paper_acc_img_s'], 'd')} | "
                  f"{'-' if pk is None else format(pk - 1, '+.0%')}, "
                  f"{'-' if pi is None else format(pi - 1, '+.0%')} |")
    for r in results:
        fx = r.get("fixed")
        if not fx:
            continue
        v, d = fx["vdnn"], fx["dynamic"]
        md += ["", f"**{r['net']} at batch {fx['k']}** (paper: {PAPER_VDNN}):", "",
               "| strategy | ms/iter | img/s | arena high-water GiB |", "|---|---|---|---|"]
        for label, x in (("vDNN", v), ("AccUDNN dynamic", d)):
            if "ms" in x:
                md.append(f"| {label} | {x['ms']:.1f} | {x['images_per_s']:.0f} | "
                          f"{x['high_water'] / 2**30:.2f} |")
            else:
                md.append(f"| {label} | failed: {x['error'][:120]} | | |")
        if "ms" in v and "ms" in d:
            md.append(f"\nvDNN takes {v['ms'] / d['ms']:.2f}x AccUDNN's iteration time.")
    with open(os.path.join(out_dir, "table3.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "\n".join(md)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    names = [row["net"] for row in rows]
    x = range(len(rows))
    for ax, (key_b, key_a, pb, pa, title) in zip(axes, (
            ("baseline_k", "accudnn_k", "paper_sn_k", "paper_acc_k", "efficiency-optimal k"),
            ("baseline_img_s", "accudnn_img_s", "paper_sn_img_s", "paper_acc_img_s", "images/s"))):
        w = 0.2
        for i, (key, label) in enumerate(((key_b, "swap+recompute (here)"),
                                          (key_a, "AccUDNN (here)"),
                                          (pb, "SuperNeurons (paper, M40)"),
                                          (pa, "AccUDNN (paper, M40)"))):
            ax.bar([j + (i - 1.5) * w for j in x], [row[key] or 0 for row in rows], w,
                   label=label)
        ax.set_xticks(list(x))
        ax.set_xticklabels(names)
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "table3.png"), dpi=120)
    return "\n".join(md)


def main(argv=None) -> int:
    global BASELINE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=None, help=f"name:k_base,... (default {DEFAULT_NETS})")
    ap.add_argument("--budget", default="12G")
    ap.add_argument("--gpus", default="0")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--engine", default="CAFFE", choices=("CAFFE", "CUDNN"))
    ap.add_argument("--fixed", default="vgg16:192", help="name:k for the vDNN comparison")
    ap.add_argument("--baseline", default="recompute", help="the swap+recompute strategy")
    ap.add_argument("--host-budget", default=None)
    ap.add_argument("--profiles", default=None,
                    help="a folder of saved profiles (NAME_profile.json, as tuner_table.py "
                         "writes them, or NAME_profile.json.gz): the tuner reuses them instead "
                         "of profiling again")
    ap.add_argument("--timeout", type=int, default=560, help="seconds per network")
    ap.add_argument("--quick", action="store_true", help="CPU, a tiny net (the test suite)")
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "results"))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from swap.memory import parse_bytes
    BASELINE = args.baseline
    mode = args.mode or ("CPU" if args.quick else "GPU")
    if args.quick and args.budget == "12G":
        args.budget = "40M"
    if args.quick and args.fixed == "vgg16:192":
        args.fixed = "cifar10_quick:6"
    fixed = {n: int(k) for n, k in (s.split(":") for s in args.fixed.split(",") if s)}
    budget = parse_bytes(args.budget)
    out_dir = args.out
    os.makedirs(os.path.join(out_dir, "table3"), exist_ok=True)
    if args.one:
        name, k = args.one.split(":")
        hb = parse_bytes(args.host_budget) if args.host_budget else None
        r = run_net(name, int(k), budget, args.iters, args.warmup, args.engine, mode, fixed, hb,
                    args.profiles)
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    from scripts.tuner_table import _child, run_side_by_side, work_plan
    nets, gpus, hb = work_plan(args, QUICK_NETS if args.quick else DEFAULT_NETS, mode)
    results, failures, lock = {}, [], threading.Lock()

    def job(name, k, gpu_id):
        extra = ["--one", f"{name}:{k}", "--budget", args.budget, "--iters", str(args.iters),
                 "--warmup", str(args.warmup), "--engine", args.engine, "--fixed", args.fixed,
                 "--baseline", args.baseline, "--mode", mode, "--out", args.out]
        if args.profiles:
            extra += ["--profiles", args.profiles]
        if hb:
            extra += ["--host-budget", hb]
        r, err = _child(args, extra, gpu_id, args.timeout, f"{name} (GPU {gpu_id})",
                        script=__file__)
        with lock:
            if r is None:
                failures.append((name, err))
                print(f"{name}: failed: {err}", flush=True)
                return
            results[name] = r
            with open(os.path.join(out_dir, "table3", f"{name}.json"), "w") as f:
                json.dump(r, f, indent=1)

    seconds = run_side_by_side(nets, gpus, job)
    ordered = [results[n] for n, _ in nets if n in results]
    if ordered:
        dev = ordered[0]["device"]
        header = (f"Table 3, {dev}, {mode} mode, engine {args.engine}, budget {args.budget}, "
                  f"baseline `{args.baseline}` (`python3 scripts/table3.py "
                  f"{' '.join(argv if argv is not None else sys.argv[1:])}`, "
                  f"{time.strftime('%Y-%m-%d')})")
        print(write_outputs(ordered, out_dir, header))
    for name, err in failures:
        print(f"FAILED {name}: {err}")
    print(f"{len(ordered)}/{len(nets)} networks in {seconds:.0f}s")
    return 0 if ordered and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
