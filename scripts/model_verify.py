#!/usr/bin/env python3
"""Verify the performance model (paper, section 6.2.1): FLOPS against FLOPs, and the estimated
against the observed timeline of one iteration.

(a) **FLOPS vs FLOPs.**  AlexNet trains real iterations at k = 8, 16, ..., 1024 under the
    ``naive`` plan within the budget (:func:`swap.profiler.profile_solver`, one call per k, so
    that a k that fails is reported and the others still count): each step's compute time is
    measured with CUDA events on the compute stream (``perf_counter`` on the CPU), its FLOPs
    come from the GMAP (eq. 1).  Every convolution and fully connected step gives one point
    (its FLOPs, its achieved FLOP/s); the paper's points, "averaging over all the layers of
    same type within one iteration", are the larger markers; the saturating curve of
    :mod:`swap.model` (eq. 2, ``FLOPS(x) = P x / (x + x_half)``, fitted per layer type and
    phase by :meth:`swap.model.ComputeModel.from_profile` on every step of every k) is drawn
    over them.  One panel for convolutions, one for inner products.

(b) **Estimated vs observed timeline** at k = 256, 512, 1024.  The net is resized to k and
    trained ``--trace-warmup + --trace-iters`` iterations under the ``naive`` plan (or the
    ``dynamic`` plan of :func:`swap.tuner.plan_at`, ``--strategy dynamic``) with the
    executor's ``--memory-trace`` (:class:`swap.runtime.MemoryTrace`: per step its start and
    end, CUDA events on the compute stream, stalls included).  The estimate replays the very
    plan that ran (:func:`swap.planner.simulate`, the runtime's dependencies on three streams)
    with the step times of the fitted model and the PCIe model fitted to the profile's copies
    (eq. 5).  Reported: per step the predicted and observed start and end, the predicted and
    observed iteration time and the relative error ``(predicted - observed) / observed``, the
    stall-free eq. (2) time; the observed iteration is the trace's last complete one
    (:func:`swap.planner.read_trace`).  Each k is also drawn by ``minicaffe plan --plot``'s
    :func:`swap.planner.plot_timeline` (three streams, predicted beside observed).

GPU mode uses CuPy; ``--quick`` runs the same code on the CPU with cifar10_quick at k = 2, 4, 8,
16 (timelines at 8 and 16), where copies are synchronous memcpy on the compute thread, so the
three-stream estimate is expected to be short: the CPU run checks the machinery, not the model.

    python3 scripts/model_verify.py                              # AlexNet on the GPU, 12 GiB
    python3 scripts/model_verify.py --strategy dynamic --out-dir /tmp/mv
    python3 scripts/model_verify.py --profile docs/results/model_verify_profile.json  # no (a) runs
    python3 scripts/model_verify.py --quick --out-dir /tmp/mv   # CPU, under a minute (the test)

Writes under ``--out-dir`` (default docs/results), with ``<prefix>`` model_verify (quick:
model_verify_quick): ``_profile.json`` (the profile, :class:`swap.profiler.Profile`),
``_flops.csv`` and ``_flops.png`` (a), ``_timeline.csv`` and ``_timeline.png`` (b),
``_timeline_k<k>.png`` (the three streams), and ``.md`` (the tables with the device, date and
command, for docs/RESULTS.md).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import shlex
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

NET = "alexnet"
KS = (8, 16, 32, 64, 128, 256, 512, 1024)
TIMELINE_KS = (256, 512, 1024)
QUICK_NET = "cifar10_quick"
QUICK_KS = (2, 4, 8, 16)
QUICK_TIMELINE_KS = (8, 16)
BUDGET = "12G"
PANELS = (("Convolution", "convolutions"), ("InnerProduct", "fully connected (InnerProduct)"))
PHASE_STYLE = {"forward": ("#4c72b0", "o"), "backward": ("#c44e52", "s")}


def say(msg):
    print(msg, flush=True)


# ------------------------------------------------------------------ the solver
def make_solver(name: str, batch: int, engine: str, mode: str):
    """An SGD solver on the Input variant of ``name`` (``bench_throughput``'s: every layer's
    engine set, data written once by :func:`fill_inputs`), small learning rate, no test net."""
    from minicaffe import engine as engine_mod
    from minicaffe.proto import caffe_pb2
    from minicaffe.solver import Solver
    from scripts.bench_throughput import minicaffe_net_param
    engine_mod.set_default_engine(engine)
    p = caffe_pb2.SolverParameter(base_lr=1e-4, momentum=0.9, weight_decay=5e-4,
                                  lr_policy="fixed", max_iter=10**9, display=0, random_seed=1)
    p.net_param.CopyFrom(minicaffe_net_param(name, batch, engine))
    return Solver(p, mode=mode, verbose=False)


def fill_inputs(net, seed: int = 0):
    """Random images and labels (10 classes, valid for every net here) in the Input tops
    (resizing leaves new rows at zero)."""
    rng = np.random.default_rng(seed)
    xp = net.xp
    d, lab = net.blobs["data"], net.blobs["label"]
    d.data[...] = xp.asarray(rng.standard_normal(d.shape, dtype=np.float32))
    lab.data[...] = xp.asarray(rng.integers(0, 10, lab.shape).astype(np.float32))


def resize(solver, k: int):
    from swap.profiler import set_batch_size
    net = solver.net
    if getattr(net, "executor", None) is not None:
        net.executor.close()
    set_batch_size(net, k)
    fill_inputs(net, seed=k)


# ------------------------------------------------------------------ (a) profile
def profile(solver, ks, budget: int, *, warmup: int, iterations: int, strategy: str = "naive"):
    """(profile, scratch model): a :class:`swap.profiler.Profile` of ``solver`` at every k of
    ``ks`` that runs, one :func:`swap.profiler.profile_solver` call per k (a k that fails is
    reported and recorded in ``meta["failed"]``, not fatal).

    GPU: each k gets a scratch reserve from :class:`swap.profiler.ScratchModel` (the estimate,
    then the transients measured at the smaller ks), as ``train --swap dynamic`` does."""
    from swap.gmap import build_gmap
    from swap.profiler import Profile, ScratchModel, profile_solver
    from swap.runtime import budget_for_plan, default_scratch
    net = solver.net
    k_base = ks[0]
    resize(solver, k_base)
    g0 = build_gmap(net, solver_type=solver.type)
    gpu = net.mode == "GPU"
    scratch = ScratchModel.from_gmap(g0, floor=default_scratch() or 0) if gpu else None
    plan_budget = budget_for_plan(solver, budget, scratch=0, gmap=g0) if gpu else None
    parts, failed = [], []
    for i, k in enumerate(ks):
        t0 = time.time()
        resize(solver, k)
        try:
            p = profile_solver(solver, budget, (k,), warmup=warmup, iterations=iterations,
                               strategy=strategy, bandwidth=gpu and i == 0,
                               log=say, scratch=scratch, plan_budget=plan_budget,
                               calibrate_copies=False)
        except Exception as e:          # noqa: BLE001 - reported, the other ks still count
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            say(f"minibatch {k}: profiling failed: {type(e).__name__}: {msg[:400]}")
            failed.append([k, f"{type(e).__name__}: {msg[:400]}"])
            if getattr(net, "executor", None) is not None:
                net.executor.close()
            continue
        parts.append(p)
        say(f"minibatch {k}: {len(p.compute)} compute samples, {len(p.transfers)} transfers "
            f"({time.time() - t0:.1f}s)")
    if not parts:
        raise SystemExit("no minibatch could be profiled: " + "; ".join(m for _, m in failed))
    meta = {"warmup": warmup, "iterations": iterations, "strategy": strategy, "budget": budget,
            "script": "scripts/model_verify.py", "failed": failed}
    for key in ("scratch", "transients", "runs"):
        vals = [x for p in parts for x in p.meta.get(key, [])]
        if vals:
            meta[key] = vals
    bw = next((p.bandwidth for p in parts if p.bandwidth), None)
    first = parts[0]
    return Profile(net=first.net, device=first.device, mode=first.mode, k_base=k_base,
                   ks=tuple(k for p in parts for k in p.ks), steps=first.steps,
                   compute=tuple(c for p in parts for c in p.compute),
                   transfers=tuple(t for p in parts for t in p.transfers),
                   iterations=tuple(x for p in parts for x in p.iterations), bandwidth=bw,
                   date=first.date, meta=meta), scratch


def flops_rows(prof, model) -> list:
    """One row per compute sample of the panels' layer types: FLOPs, time, FLOP/s, the fitted
    curve's time and its relative error."""
    steps = {s.step: s for s in prof.steps}
    types = {t for t, _ in PANELS}
    rows = []
    for c in prof.compute:
        s = steps[c.step]
        if s.type not in types:
            continue
        n = model.calls(s, c.flops)          # a chunked convolution: priced per call
        fit = n * float(model.curve(s).time(c.flops / n))
        rows.append({"k": c.k, "step": c.step, "layer": s.layer, "type": s.type,
                     "phase": s.phase, "flops": c.flops, "time_s": c.time,
                     "flops_per_s": c.flops / c.time if c.time > 0 else float("nan"),
                     "fitted_time_s": fit,
                     "fitted_flops_per_s": c.flops / fit if fit > 0 else float("nan"),
                     "time_rel_err": (fit - c.time) / c.time if c.time > 0 else float("nan")})
    return rows


def curve_table(prof, model) -> list:
    """Per (type, phase) curve of the model: P, x_half, 90 % saturation, and how well it fits
    the samples it was fitted to (relative error of the time)."""
    steps = {s.step: s for s in prof.steps}
    errs: dict = {}
    for c in prof.compute:
        s = steps[c.step]
        if c.time > 0:
            n = model.calls(s, c.flops)
            t = n * float(model.curve(s).time(c.flops / n))
            errs.setdefault((s.type, s.phase), []).append(abs(t - c.time) / c.time)
    out = []
    for key, curve in model.curves:
        if key[0] in ("*", "step") or key not in errs:
            continue
        e = np.array(errs[key])
        out.append({"type": key[0], "phase": key[1], "peak": curve.peak, "x_half": curve.x_half,
                    "t0": curve.t0, "saturation90": curve.saturation(0.9), "n": len(e),
                    "median_err": float(np.median(e)), "max_err": float(e.max())})
    order = {t: i for i, (t, _) in enumerate(PANELS)}
    out.sort(key=lambda r: (order.get(r["type"], len(order)), r["type"], r["phase"] != "forward"))
    return out


def averages(rows) -> dict:
    """{(type, phase, k): FLOP/s over all layers of the type in one iteration} (the paper's
    points: total FLOPs over total time)."""
    acc: dict = {}
    for r in rows:
        a = acc.setdefault((r["type"], r["phase"], r["k"]), [0.0, 0.0])
        a[0] += r["flops"]
        a[1] += r["time_s"]
    return {key: f / t for key, (f, t) in acc.items() if t > 0}


def plot_flops(rows, model, prof, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from swap.profiler import StepInfo
    gpu = prof.mode == "GPU"
    unit, div = ("TFLOP/s", 1e12) if gpu else ("GFLOP/s", 1e9)
    avg = averages(rows)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(6.2 * len(PANELS), 4.6), squeeze=False)
    for ax, (typ, title) in zip(axes[0], PANELS):
        mine = [r for r in rows if r["type"] == typ]
        for phase, (color, marker) in PHASE_STYLE.items():
            pts = [r for r in mine if r["phase"] == phase]
            if not pts:
                continue
            x = np.array([r["flops"] for r in pts])
            ax.scatter(x, [r["flops_per_s"] / div for r in pts], s=12, alpha=0.45, color=color,
                       marker=marker, label=f"{phase}: each layer")
            ka = sorted({r["k"] for r in pts})
            xa = [sum(r["flops"] for r in pts if r["k"] == k) / sum(1 for r in pts if r["k"] == k)
                  for k in ka]
            ax.scatter(xa, [avg[(typ, phase, k)] / div for k in ka], s=70, color=color,
                       marker=marker, edgecolors="black", linewidths=0.8, zorder=3,
                       label=f"{phase}: layer average per k")
            curve = model.curve(StepInfo(0, "", typ, phase))
            xs = np.logspace(np.log10(max(x.min() / 3, 1.0)), np.log10(x.max() * 3), 200)
            ax.plot(xs, curve.flops_per_s(xs) / div, color=color, lw=1.8,
                    label=f"{phase}: fit, P = {curve.peak / div:.3g} {unit}, "
                          f"x_half = {curve.x_half:.3g}")
        ax.set_xscale("log")
        ax.set_xlabel("FLOPs of the step")
        ax.set_ylabel(f"achieved {unit}")
        ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    ks = ", ".join(map(str, prof.ks))
    fig.suptitle(f"{prof.net} on {prof.device}: FLOPS vs FLOPs at k = {ks} "
                 "(curve: FLOPS(x) = P x / (x + x_half), eq. 2)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------ (b) timeline
def run_traced(solver, k: int, budget: int, strategy: str, model, pcie, scratch, trace_path,
               warmup: int, iters: int):
    """Train ``warmup + iters`` iterations at k under ``strategy`` with a memory trace; return
    the executed plan (the executor is closed).  One retry on a scratch overflow."""
    from swap.gmap import build_gmap
    from swap.runtime import ScratchOverflow, budget_for_plan, install
    from swap.tuner import install_decision, plan_at
    net = solver.net
    resize(solver, k)
    reserve = scratch(k) if scratch is not None else None
    for attempt in (0, 1):
        if strategy == "dynamic":
            g0 = build_gmap(net, solver_type=solver.type)
            base = (budget_for_plan(solver, budget, scratch=0, gmap=g0) if scratch is not None
                    else budget)
            dec = plan_at(g0, k, base, model, pcie, scratch=scratch)
            ex = install_decision(solver, dec, budget, base - (reserve or 0), scratch=reserve,
                                  trace=trace_path)
        else:
            ex = install(solver, strategy, budget, scratch=reserve, trace=trace_path)
        try:
            for _ in range(warmup + iters):
                solver.step(1)
        except ScratchOverflow as e:
            ex.close()
            if scratch is None or attempt:
                raise
            peak = e.peak if e.peak is not None else e.scratch
            if peak is not None:
                scratch.add(k, peak)
            reserve = max(int(e.scratch or 0), scratch(k))
            say(f"minibatch {k}: scratch reserve too small, again with {reserve} bytes")
            continue
        except BaseException:
            ex.close()
            raise
        plan, gmap = ex.plan, ex.gmap
        ex.close()
        return plan, gmap
    raise AssertionError("unreachable")


def timeline_rows(k, gmap, tl, obs) -> list:
    rows = []
    for j, s in enumerate(gmap.steps):
        rows.append({"k": k, "step": j, "layer": s.name, "type": s.type, "phase": s.phase,
                     "flops": s.flops, "model_time_s": float(tl.times[j]),
                     "pred_start_s": float(tl.step_start[j]), "pred_end_s": float(tl.step_end[j]),
                     "obs_start_s": float(obs["start"][j]), "obs_end_s": float(obs["end"][j])})
    return rows


def summarize(k, tl, obs) -> dict:
    obs_t = float(obs["end"][-1])
    pred_t = float(tl.t_iter)
    scale = obs_t if obs_t > 0 else 1.0
    end_err = np.abs(np.asarray(tl.step_end) - np.asarray(obs["end"])) / scale
    return {"k": k, "observed_s": obs_t, "predicted_s": pred_t, "stall_free_s": float(tl.t_model),
            "predicted_stall_s": float(tl.total_stall),
            "rel_err": (pred_t - obs_t) / obs_t if obs_t > 0 else float("nan"),
            "mean_end_err": float(end_err.mean()), "max_end_err": float(end_err.max()),
            "iteration": obs["iteration"]}


def plot_timelines(summaries, trows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(summaries)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.2), squeeze=False)
    for ax, sm in zip(axes[0], summaries):
        rs = [r for r in trows if r["k"] == sm["k"]]
        j = [r["step"] for r in rs]
        ax.plot(j, [1e3 * r["obs_end_s"] for r in rs], color="black", lw=2, label="observed")
        ax.plot(j, [1e3 * r["pred_end_s"] for r in rs], color="#c44e52", lw=1.6, ls="--",
                label="estimated (model + plan replay)")
        ax.plot(j, 1e3 * np.cumsum([r["model_time_s"] for r in rs]), color="#4c72b0", lw=1,
                ls=":", label="stall-free, eq. (2)")
        b = next((r["step"] for r in rs if r["phase"] == "backward"), None)
        if b is not None:
            ax.axvline(b - 0.5, color="gray", lw=0.8, ls="--")
        ax.set_xlabel("step (forward, then backward)")
        ax.set_ylabel("end of step (ms from the iteration's start)")
        ax.set_title(f"k = {sm['k']}: observed {1e3 * sm['observed_s']:.1f} ms, estimated "
                     f"{1e3 * sm['predicted_s']:.1f} ms ({100 * sm['rel_err']:+.1f} %)",
                     fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------ outputs
def write_csv(rows, path):
    if not rows:
        with open(path, "w") as f:
            f.write("")
        return
    keys = list(rows[0])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.12g}" if isinstance(v, float) else v) for k, v in r.items()})


def write_md(path, *, prof, model_rows, avg, summaries, pcie, head, strategy, budget):
    from swap.memory import fmt_bytes
    gpu = prof.mode == "GPU"
    unit, div = ("TFLOP/s", 1e12) if gpu else ("GFLOP/s", 1e9)
    lines = [head, "",
             f"(a) FLOPS vs FLOPs: profiled k = {', '.join(map(str, prof.ks))} under the naive "
             f"plan at {fmt_bytes(prof.meta.get('budget') or budget)}; curve FLOPS(x) = P x / (x + x_half) per layer type "
             "and phase (eq. 2), least squares on log time over every step of every k:", "",
             f"| type | phase | P ({unit}) | x_half (FLOPs) | 90 % of P at (FLOPs) | samples | "
             "median time error | max time error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in model_rows:
        peak = "const" if not np.isfinite(r["peak"]) else f"{r['peak'] / div:.3g}"
        lines.append(f"| {r['type']} | {r['phase']} | {peak} | {r['x_half']:.3g} | "
                     f"{r['saturation90']:.3g} | {r['n']} | {100 * r['median_err']:.1f} % | "
                     f"{100 * r['max_err']:.1f} % |")
    keys = [(t, ph) for t, _ in PANELS for ph in ("forward", "backward")]
    lines += ["", f"Achieved {unit} per k, all layers of the type in one iteration (the paper's "
              "points), and the measured iteration time:", "",
              "| k | " + " | ".join(f"{t} {ph}" for t, ph in keys) + " | iteration ms |",
              "|---|" + "---|" * (len(keys) + 1)]
    it = {}
    for k, s in prof.iterations:
        it.setdefault(k, []).append(s)
    for k in prof.ks:
        cells = [f"{avg[(t, ph, k)] / div:.3g}" if (t, ph, k) in avg else "-" for t, ph in keys]
        ms = f"{1e3 * float(np.mean(it[k])):.2f}" if k in it else "-"
        lines.append(f"| {k} | " + " | ".join(cells) + f" | {ms} |")
    if prof.meta.get("failed"):
        lines += ["", "Not profiled: " + "; ".join(f"k = {k}: {m}" for k, m in
                                                  prof.meta["failed"])]
    if summaries:
        lines += ["", f"(b) One iteration under the {strategy} plan at {fmt_bytes(budget)}: "
                  "estimated (the executed plan replayed by `swap.planner.simulate` with the "
                  "fitted step times and PCIe model) against observed (`--memory-trace`, the "
                  "last complete iteration). PCIe model: "
                  f"h2d {pcie.h2d / 1e9:.2f} GB/s, d2h {pcie.d2h / 1e9:.2f} GB/s, both "
                  + ("-" if pcie.both is None else f"{pcie.both / 1e9:.2f} GB/s")
                  + f", latency {1e6 * pcie.latency:.1f} us.", "",
                  "| k | observed ms | estimated ms | relative error | stall-free eq. (2) ms | "
                  "estimated stall ms | mean step-end error | max step-end error |",
                  "|---|---|---|---|---|---|---|---|"]
        for s in summaries:
            lines.append(f"| {s['k']} | {1e3 * s['observed_s']:.2f} | "
                         f"{1e3 * s['predicted_s']:.2f} | {100 * s['rel_err']:+.1f} % | "
                         f"{1e3 * s['stall_free_s']:.2f} | {1e3 * s['predicted_stall_s']:.2f} | "
                         f"{100 * s['mean_end_err']:.1f} % | {100 * s['max_end_err']:.1f} % |")
        lines += ["", "Relative error: (estimated - observed) / observed iteration time (forward "
                  "and backward steps; the solver update is in neither). Step-end errors are "
                  "fractions of the observed iteration."]
        if not gpu:
            lines += ["", "CPU mode: copies are synchronous memcpy on the compute thread, so the "
                      "three-stream estimate leaves them out of the compute stream; this run "
                      "checks the machinery, not the model."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# ------------------------------------------------------------------ main
def _ints(text) -> tuple:
    return tuple(int(x) for x in str(text).split(",") if x.strip())


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", default=None, help=f"default {NET} (--quick: {QUICK_NET})")
    ap.add_argument("--ks", default=None,
                    help=f"profiled minibatches (default {','.join(map(str, KS))}; --quick: "
                         f"{','.join(map(str, QUICK_KS))})")
    ap.add_argument("--timeline-ks", default=None,
                    help=f"minibatches of the timelines (default "
                         f"{','.join(map(str, TIMELINE_KS))}; --quick: "
                         f"{','.join(map(str, QUICK_TIMELINE_KS))}; '' for none)")
    ap.add_argument("--budget", default=BUDGET, help="device memory budget (binary units)")
    ap.add_argument("--strategy", default="naive", choices=("naive", "dynamic"),
                    help="the plan of the timelines (the profile always runs naive)")
    ap.add_argument("--engine", default="CAFFE", choices=("CAFFE", "CUDNN"))
    ap.add_argument("--warmup", type=int, default=1, help="profiling: iterations before timing")
    ap.add_argument("--iterations", type=int, default=1, help="profiling: timed iterations")
    ap.add_argument("--trace-warmup", type=int, default=2,
                    help="timelines: iterations before the traced one (the dry run included)")
    ap.add_argument("--trace-iters", type=int, default=1,
                    help="timelines: iterations after the warm-up (the last is compared)")
    ap.add_argument("--granularity", default="type", choices=("type", "step", "segment"),
                    help="one curve per layer type and phase (the paper's) or per step")
    ap.add_argument("--profile", default=None,
                    help="a saved profile to fit instead of profiling (skips (a)'s runs)")
    ap.add_argument("--mode", default=None, choices=("CPU", "GPU"),
                    help="default GPU, --quick CPU")
    ap.add_argument("--quick", action="store_true",
                    help=f"CPU, {QUICK_NET} at k = {','.join(map(str, QUICK_KS))} (the test)")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "docs", "results"))
    ap.add_argument("--prefix", default=None,
                    help="file names (default model_verify, --quick: model_verify_quick)")
    args = ap.parse_args(argv)
    from swap.memory import fmt_bytes, parse_bytes
    from swap.planner import plot_timeline, read_trace, simulate
    from swap.profiler import Profile, ScratchModel
    from swap.tuner import profile_models
    mode = args.mode or ("CPU" if args.quick else "GPU")
    if mode == "GPU":
        from minicaffe.backend import gpu_available
        if not gpu_available():
            raise SystemExit("no CUDA device: run on the GPU machine, or give --quick / "
                             "--mode CPU")
    name = args.net or (QUICK_NET if args.quick else NET)
    ks = _ints(args.ks) if args.ks else (QUICK_KS if args.quick else KS)
    tks = (_ints(args.timeline_ks) if args.timeline_ks is not None
           else (QUICK_TIMELINE_KS if args.quick else TIMELINE_KS))
    if not ks or min(ks) < 1 or (tks and min(tks) < 1):
        ap.error("minibatch sizes must be positive")
    budget = parse_bytes(args.budget)
    prefix = args.prefix or ("model_verify_quick" if args.quick else "model_verify")
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, prefix)
    command = "python3 scripts/model_verify.py" + (" " + shlex.join(argv) if argv else "")
    t_all = time.time()

    solver = make_solver(name, ks[0], args.engine, mode)
    from swap.gmap import build_gmap
    if args.profile:
        prof = Profile.load(args.profile)
        scratch = None
        if mode == "GPU":
            from swap.runtime import default_scratch
            scratch = ScratchModel.from_gmap(build_gmap(solver.net, solver_type=solver.type),
                                             floor=default_scratch() or 0)
            for k, peak in prof.meta.get("transients", []):
                scratch.add(k, peak)
        say(f"profile of {prof.net!r} on {prof.device} loaded from {args.profile}")
    else:
        say(f"(a) profiling {name} at k = {list(ks)} under the naive plan, budget "
            f"{fmt_bytes(budget)}, {mode} mode, engine {args.engine}")
        prof, scratch = profile(solver, ks, budget, warmup=args.warmup,
                                iterations=args.iterations)
    prof.save(base + "_profile.json")
    g_first = build_gmap(solver.net, solver_type=solver.type)
    model, pcie = profile_models(prof, g_first, args.granularity)
    rows = flops_rows(prof, model)
    write_csv(rows, base + "_flops.csv")
    plot_flops(rows, model, prof, base + "_flops.png")
    model_rows = curve_table(prof, model)
    for r in model_rows:
        if r["type"] in dict(PANELS):
            say(f"  {r['type']} {r['phase']}: P {r['peak']:.4g} FLOP/s, x_half "
                f"{r['x_half']:.4g}, median time error {100 * r['median_err']:.1f} %")

    summaries, trows = [], []
    for k in tks:
        t0 = time.time()
        trace_path = f"{base}_trace_k{k}.csv"
        try:
            plan, gmap = run_traced(solver, k, budget, args.strategy, model, pcie, scratch,
                                    trace_path, args.trace_warmup, args.trace_iters)
        except Exception as e:           # noqa: BLE001 - reported, the other ks still count
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            say(f"(b) minibatch {k}: failed: {type(e).__name__}: {msg[:400]}")
            continue
        obs = read_trace(trace_path)
        tl = simulate(plan, model.step_times(gmap), pcie)
        trows += timeline_rows(k, gmap, tl, obs)
        sm = summarize(k, tl, obs)
        summaries.append(sm)
        plot_timeline(tl, f"{base}_timeline_k{k}.png", trace=obs, budget=budget)
        os.remove(trace_path)
        say(f"(b) minibatch {k}: observed {1e3 * sm['observed_s']:.2f} ms, estimated "
            f"{1e3 * sm['predicted_s']:.2f} ms ({100 * sm['rel_err']:+.1f} %), stall-free "
            f"{1e3 * sm['stall_free_s']:.2f} ms ({time.time() - t0:.1f}s)")
    write_csv(trows, base + "_timeline.csv")
    if summaries:
        plot_timelines(summaries, trows, base + "_timeline.png",
                       f"{prof.net} on {prof.device}, {args.strategy} plan at "
                       f"{fmt_bytes(budget)}: estimated vs observed iteration")
    date = datetime.date.today().isoformat()
    head = (f"Performance model verification, {prof.net} on {prof.device} ({prof.mode} mode, "
            f"engine {args.engine}), profile of {prof.date}; {date}; `{command}`")
    write_md(base + ".md", prof=prof, model_rows=model_rows, avg=averages(rows),
             summaries=summaries, pcie=pcie, head=head, strategy=args.strategy, budget=budget)
    say(f"done in {time.time() - t_all:.0f}s: {base}.md, {base}_profile.json, "
        f"{base}_flops.csv/.png, {base}_timeline.csv/.png")
    return 0 if len(summaries) == len(tks) and not prof.meta.get("failed") else 1


if __name__ == "__main__":
    sys.exit(main())
