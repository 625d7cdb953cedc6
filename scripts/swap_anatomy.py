#!/usr/bin/env python3
"""Where does the dynamic plan's time over `none` go?  Step by step, at one k (issue 5).

At ResNet-152's k* the dynamic plan ran 1.030 to 1.043 times `none` (H200, session 24) with no
stall predicted.  This script takes that difference apart.  Three configurations of one net at
one k are timed in turn, ABC then CBA:

* ``none``: no swapping, every convolution's workspace at once (the tuner table's reference);
* ``kept``: the dynamic plan's executor with every feature map pinned.  It has the dynamic
  plan's arena layout and per-step scratch, and it makes no copies;
* ``dynamic``: the tuner's plan at k (``train_dynamic --batch k``), copies included.

Each runs with the executor's memory trace.  Per step, the trace gives the CUDA event when the
compute stream reached the step, the one when the step was past its waits (prefetches, regions
still being offloaded), and the one when its compute ended.  So each step's time splits into
**wait** and **compute**.  The report sums both per phase.  It then sets the dynamic plan's
extra compute per step (dynamic minus kept) against the bytes its copies move during that step.
The copy intervals come from the planner's replay (:func:`swap.planner.simulate`) on the kept
steps' measured times.  A least-squares fit gives the slowdown per GiB for each direction
(device to host, host to device).  ``scripts/graph_copies.py`` measures the same on synthetic
kernels: about 0.5 ms per GiB each way on an H200, session 24.

    python3 scripts/swap_anatomy.py --net resnet152 --k 89 --engine CUDNN \\
        --profile dv/p3/resnet152_profile.json --out-dir /tmp/anatomy
    python3 scripts/swap_anatomy.py --quick --out-dir /tmp/anatomy      # CPU, a tiny net

Writes ``<out-dir>/anatomy_<net>_<k>.json`` (every step's medians, per configuration) and
``.md`` (the summary).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

CONFIGS = ("none", "kept", "dynamic")
QUICK = {"net": "cifar10_quick", "k_base": 4, "k": 8}
GIB = float(1 << 30)


# ------------------------------------------------------------------ analysis
def step_medians(path, iterations: int) -> dict:
    """The last ``iterations`` complete iterations of a memory trace: per step the median wait
    (ready - start) and compute (end - ready) in seconds, and the median sums."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: empty memory trace")
    by_it: dict = {}
    for r in rows:
        by_it.setdefault(int(r["iteration"]), []).append(r)
    n = max(len(v) for v in by_it.values())
    its = sorted(i for i, v in by_it.items() if len(v) == n)[-iterations:]
    wait = np.zeros((len(its), n))
    comp = np.zeros((len(its), n))
    names, phases = [], []
    for a, it in enumerate(its):
        rs = sorted(by_it[it], key=lambda r: int(r["step"]))
        for j, r in enumerate(rs):
            s, e = float(r["t_start_ms"]), float(r["t_end_ms"])
            ready = float(r.get("t_ready_ms") or s)
            wait[a, j] = max(0.0, ready - s) / 1e3
            comp[a, j] = max(0.0, e - ready) / 1e3
            if a == 0:
                names.append(r["layer"])
                phases.append(r["phase"])
    return {"layer": names, "phase": phases, "iterations": its,
            "wait": np.median(wait, axis=0), "compute": np.median(comp, axis=0),
            "wait_sum": float(np.median(wait.sum(axis=1))),
            "compute_sum": float(np.median(comp.sum(axis=1)))}


def copy_overlap(step_start, step_end, copies) -> np.ndarray:
    """Bytes of ``copies`` ((start, end, bytes), seconds) in flight during each step, shared pro
    rata of the time each copy overlaps the step (a copy's bytes move at an even rate)."""
    s = np.asarray(step_start, dtype=np.float64)
    e = np.asarray(step_end, dtype=np.float64)
    out = np.zeros(len(s))
    for a, b, nbytes in copies:
        if b <= a:
            continue
        ov = np.clip(np.minimum(e, b) - np.maximum(s, a), 0.0, None)
        out += nbytes * ov / (b - a)
    return out


def fit_interference(delta, x_out, x_in) -> dict:
    """Least squares ``delta = a_out x_out + a_in x_in`` (no intercept; seconds per byte, each
    at least 0): the compute a step loses per byte copied beside it, each way.  Also the share
    of ``delta``'s sum on steps with no copy beside them."""
    from swap.model import nonnegative_fit
    d = np.asarray(delta, dtype=np.float64)
    X = np.stack([np.asarray(x_out, dtype=np.float64), np.asarray(x_in, dtype=np.float64)], 1)
    coef = nonnegative_fit(d, X[:, 0], X[:, 1])
    pred = X @ coef
    ss = float(((d - d.mean()) ** 2).sum())
    quiet = ~(X > 0).any(axis=1)
    return {"s_per_byte_out": float(coef[0]), "s_per_byte_in": float(coef[1]),
            "ms_per_gib_out": 1e3 * GIB * float(coef[0]), "ms_per_gib_in": 1e3 * GIB * float(coef[1]),
            "r2": 1.0 - float(((d - pred) ** 2).sum()) / ss if ss > 0 else 0.0,
            "delta_s": float(d.sum()), "explained_s": float(pred.sum()),
            "delta_quiet_s": float(d[quiet].sum()), "quiet_steps": int(quiet.sum())}


def plan_copies(plan, times, pcie) -> tuple:
    """The plan's replay on measured step ``times`` (seconds): each step's start and end, and
    its offloads and prefetches as (start, end, bytes)."""
    from swap.plan import OFFLOAD, PREFETCH
    from swap.planner import simulate
    tl = simulate(plan, times, pcie)
    out, into = [], []
    for i, op in enumerate(plan.ops):
        if op.kind == OFFLOAD:
            out.append((tl.op_start[i], tl.op_end[i], op.nbytes))
        elif op.kind == PREFETCH and tl.op_end[i] > tl.op_start[i]:
            into.append((tl.op_start[i], tl.op_end[i], op.nbytes))
    return tl.step_start, tl.step_end, out, into


def phase_sums(m: dict) -> dict:
    ph = np.asarray(m["phase"])
    return {p: {"wait": float(m["wait"][ph == p].sum()), "compute": float(m["compute"][ph == p].sum())}
            for p in ("forward", "backward")}


def analyse(meds: dict, plan, pcie, times_ms: dict) -> dict:
    """The summary of one k: per configuration the timed iteration (``times_ms``: median ms of
    the solver steps), the traced wait and compute by phase; the dynamic plan's extra compute
    over ``kept`` fitted to the bytes its copies move beside each step."""
    out = {"configs": {}}
    for c, m in meds.items():
        out["configs"][c] = {"ms": times_ms.get(c), "wait_ms": 1e3 * m["wait_sum"],
                             "compute_ms": 1e3 * m["compute_sum"],
                             "phases": {p: {q: 1e3 * v for q, v in d.items()}
                                        for p, d in phase_sums(m).items()}}
    if "dynamic" in meds and "kept" in meds:
        dyn, kept = meds["dynamic"], meds["kept"]
        if dyn["layer"] != kept["layer"] or dyn["phase"] != kept["phase"]:
            raise ValueError("the dynamic and kept traces list different steps")
        s, e, offl, pref = plan_copies(plan, kept["compute"], pcie)
        x_out, x_in = copy_overlap(s, e, offl), copy_overlap(s, e, pref)
        fit = fit_interference(dyn["compute"] - kept["compute"], x_out, x_in)
        fit.update(offload_gib=sum(b for _, _, b in offl) / GIB,
                   prefetch_gib=sum(b for _, _, b in pref) / GIB)
        out["interference"] = fit
        order = np.argsort(dyn["compute"] - kept["compute"])[::-1][:8]
        out["most_slowed"] = [
            {"layer": dyn["layer"][j], "phase": dyn["phase"][j],
             "kept_ms": 1e3 * kept["compute"][j], "dynamic_ms": 1e3 * dyn["compute"][j],
             "wait_ms": 1e3 * dyn["wait"][j], "out_mib": x_out[j] / 2**20,
             "in_mib": x_in[j] / 2**20} for j in order]
        out["most_waited"] = [
            {"layer": dyn["layer"][j], "phase": dyn["phase"][j], "wait_ms": 1e3 * dyn["wait"][j]}
            for j in np.argsort(dyn["wait"])[::-1][:5] if dyn["wait"][j] > 0]
    return out


def markdown(summary: dict, header: str) -> str:
    lines = [header, "", "| configuration | timed ms | traced wait ms | traced compute ms | "
             "forward compute | backward compute | forward wait | backward wait |",
             "|---|---|---|---|---|---|---|---|"]
    for c, r in summary["configs"].items():
        ms = "-" if r["ms"] is None else f"{r['ms']:.2f}"
        f, b = r["phases"]["forward"], r["phases"]["backward"]
        lines.append(f"| {c} | {ms} | {r['wait_ms']:.2f} | {r['compute_ms']:.2f} | "
                     f"{f['compute']:.2f} | {b['compute']:.2f} | {f['wait']:.2f} | "
                     f"{b['wait']:.2f} |")
    fit = summary.get("interference")
    if fit:
        lines += ["", f"dynamic minus kept, compute summed over the steps: "
                  f"{1e3 * fit['delta_s']:.2f} ms; "
                  f"{fit['offload_gib']:.2f} GiB offloaded and {fit['prefetch_gib']:.2f} GiB "
                  f"prefetched; fit {fit['ms_per_gib_out']:.2f} ms/GiB out, "
                  f"{fit['ms_per_gib_in']:.2f} ms/GiB in, explaining "
                  f"{1e3 * fit['explained_s']:.2f} ms (R^2 {fit['r2']:.2f}); "
                  f"{1e3 * fit['delta_quiet_s']:.2f} ms on the {fit['quiet_steps']} steps "
                  "with no copy beside them.", "",
                  "| most slowed step | kept ms | dynamic ms | wait ms | MiB out beside it | "
                  "MiB in beside it |", "|---|---|---|---|---|---|"]
        for r in summary["most_slowed"]:
            lines.append(f"| {r['layer']} {r['phase']} | {r['kept_ms']:.3f} | "
                         f"{r['dynamic_ms']:.3f} | {r['wait_ms']:.3f} | {r['out_mib']:.0f} | "
                         f"{r['in_mib']:.0f} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ GPU / CPU run
def run(net_name, k_base, k, budget, engine, mode, profile, iters, rounds, out_dir, log):
    from scripts.swap_budgets import _solver
    from scripts.tuner_table import _close, _free, _timed
    from swap.profiler import set_batch_size
    from swap.runtime import install
    from swap.tuner import install_decision, profile_models, train_dynamic
    gpu = mode == "GPU"
    solver = _solver(net_name, k_base, engine, mode)
    net = solver.net
    ex, td = train_dynamic(solver, budget, auto_batch=False, batch=k, profile=profile,
                           keep_epochs=False, log=log,
                           host_budget="auto" if gpu else None)
    dec = td.decision
    S = td.scratch
    reserve = S(k) if S is not None else None
    net.executor = None
    _free(ex)
    _, pcie = profile_models(td.profile, None)

    def install_config(c, path):
        _close(net)
        if c == "dynamic":
            return install_decision(solver, dec, budget, td.plan_budget - (reserve or 0),
                                    scratch=reserve, trace=path)
        set_batch_size(net, k)
        if c == "none":
            return install(solver, "none", None, lowering="chunked", workspace_budget=budget,
                           trace=path)
        return install(solver, "dynamic", None, lowering="chunked", pinned="all",
                       workspace_budget=budget, trace=path)

    times = {c: [] for c in CONFIGS}
    traces = {c: [] for c in CONFIGS}
    plan = None
    for r in range(rounds):
        for c in (CONFIGS if r % 2 == 0 else CONFIGS[::-1]):
            path = os.path.join(out_dir, f"trace_{net_name}_{k}_{c}_{r}.csv")
            ex = install_config(c, path)
            try:
                if c == "dynamic":
                    plan = ex.plan
                # each step waited for, and no more steps: the trace's last iterations
                ms, ts = _timed(solver, iters, 1, gpu, back_to_back=False)
                times[c] += ts
                traces[c].append(path)
                log(f"round {r} {c}: {ms:.2f} ms")
            finally:
                net.executor = None
                _free(ex)
    meds = {}
    for c in CONFIGS:       # the traced steps of every round, pooled
        ms_ = [step_medians(p, iters) for p in traces[c]]
        m = dict(ms_[0])
        m["wait"] = np.median(np.stack([x["wait"] for x in ms_]), axis=0)
        m["compute"] = np.median(np.stack([x["compute"] for x in ms_]), axis=0)
        m["wait_sum"] = float(np.median([x["wait_sum"] for x in ms_]))
        m["compute_sum"] = float(np.median([x["compute_sum"] for x in ms_]))
        meds[c] = m
    timed = {c: statistics.median(v) for c, v in times.items()}
    summary = analyse(meds, plan, pcie, timed)
    summary.update(net=net_name, k=k, budget=budget, engine=engine, mode=mode,
                   offloaded_bytes=int(plan.transfer_bytes()[0]),
                   predicted_ms=1e3 * dec.t_iter, rounds=rounds, iterations=iters,
                   predicted_copy_ms=1e3 * dec.timeline.interference,
                   slow_out=pcie.slow_out, slow_in=pcie.slow_in,
                   steps={c: {"layer": meds[c]["layer"], "phase": meds[c]["phase"],
                              "wait_ms": (1e3 * meds[c]["wait"]).round(4).tolist(),
                              "compute_ms": (1e3 * meds[c]["compute"]).round(4).tolist()}
                          for c in CONFIGS})
    return summary


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", default="resnet152")
    ap.add_argument("--k-base", type=int, default=16)
    ap.add_argument("--k", type=int, default=None, help="the minibatch (required unless --quick)")
    ap.add_argument("--budget", default="12G")
    ap.add_argument("--engine", default="CUDNN", choices=("CAFFE", "CUDNN"))
    ap.add_argument("--profile", default=None, help="a saved profile (else profiled at k)")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="CPU, a tiny net (the test suite)")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "docs", "results", "anatomy"))
    args = ap.parse_args(argv)
    from swap.memory import parse_bytes
    if args.quick:
        net, k_base, k, mode = QUICK["net"], QUICK["k_base"], QUICK["k"], "CPU"
        budget = parse_bytes(args.budget) if args.budget != "12G" else None
    else:
        if args.k is None:
            ap.error("--k is required")
        net, k_base, k, mode = args.net, args.k_base, args.k, "GPU"
        budget = parse_bytes(args.budget)
    os.makedirs(args.out_dir, exist_ok=True)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if budget is None:          # --quick: a budget that makes the plan offload
        budget = quick_budget(net, k_base, k)
    summary = run(net, k_base, k, budget, args.engine if not args.quick else "CAFFE", mode,
                  args.profile, args.iterations, args.rounds, args.out_dir, log)
    base = os.path.join(args.out_dir, f"anatomy_{net}_{k}")
    with open(base + ".json", "w") as f:
        json.dump(summary, f, indent=1)
    command = "python3 scripts/swap_anatomy.py" + "".join(f" {a}" for a in argv)
    header = (f"Swap anatomy, {net} at k = {k}, budget {budget / GIB:.2f} GiB, {mode} "
              f"(`{command}`, {time.strftime('%Y-%m-%d')}); medians of {args.rounds} rounds x "
              f"{args.iterations} iterations; the dynamic plan offloads "
              f"{summary['offloaded_bytes'] / GIB:.2f} GiB, predicted "
              f"{summary['predicted_ms']:.2f} ms, of which the copies' cost to the compute "
              f"beside them {summary['predicted_copy_ms']:.2f} ms (PCIe model: "
              f"{100 * summary['slow_out']:.1f} % beside an offload, "
              f"{100 * summary['slow_in']:.1f} % beside a prefetch).")
    md = markdown(summary, header)
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)
    return 0


def quick_budget(net_name, k_base, k) -> int:
    """Halfway between the naive plan's least budget and everything kept, at k (CPU)."""
    from scripts.swap_budgets import _solver
    from swap.gmap import build_gmap
    from swap.plan import min_budget
    from swap.profiler import set_batch_size
    s = _solver(net_name, k_base, "CAFFE", "CPU")
    set_batch_size(s.net, k)
    g = build_gmap(s.net)
    lo = min_budget(g, "naive")
    hi = min_budget(g, "dynamic", frozenset(g.feature_maps()))
    return int((lo + hi) // 2)


if __name__ == "__main__":
    sys.exit(main())
