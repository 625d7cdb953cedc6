#!/usr/bin/env python3
"""Issue 5's accuracy check: does training at the tuner's k* with the learning rate of eq. (9)
reach the base minibatch's test accuracy in the same number of epochs?  (paper, section 4.2)

The digits LeNet (``prototxt/digits/``: base minibatch k_base = 64, base_lr 0.01, 2000
iterations, lr_policy ``inv``) is trained on the bundled UCI 8x8 digits several ways, each in a
child process of its own with a fresh Solver and the same random seed (the same initial weights;
``--seeds`` repeats everything per seed, each seed's runs compared with its own base), each for
the same number of training images (epochs):

* ``base``: the solver as it is, k_base at base_lr;
* ``tuner``: the real three stages, :func:`swap.tuner.train_dynamic` with ``auto_batch`` and
  ``lr_rule="eq9"`` (what ``minicaffe train --swap dynamic --budget B --auto-batch`` runs):
  it profiles the first iterations at 1/8 .. 1 of k_max (they train and count in the images),
  picks k* by Algorithm 2, sets lr* by eq. (9) (c = 1), rescales max_iter and the steps to keep
  the images, and installs the dynamic plan; ``solver.solve()`` trains the rest.  Skipped when
  ``--k`` is given;
* ``eq9``, ``linear``, ``sqrt``: a fresh Solver resized to k* (:func:`swap.profiler.
  set_batch_size`), lr from :func:`swap.lr.scale_lr` with that rule, the schedule from
  :func:`swap.tuner._rescale_schedule`; no profiling and no swapping (the executor does not
  change the arithmetic, so these rows differ from one another only in the learning rate);
* ``eq9, gamma per iteration``: as ``eq9`` without the gamma rescaling below.

**The inv policy's gamma.**  ``lr(it) = lr_0 (1 + gamma it)^-power`` counts iterations; at k*
the same image is reached at iteration ``it / q``, q = k* / k_base, so an unchanged gamma decays
the rate q times more slowly per epoch (2000 base iterations end at a factor (1 + 0.2)^-0.75 =
0.87; at k* = 8 k_base with gamma unchanged the 250 iterations end at 0.98).  The schedule is a
function of the epoch, as ``stepsize`` and ``stepvalue`` are, which ``_rescale_schedule``
already moves; so gamma is multiplied by q (``inv``, ``sigmoid``; ``exp``: gamma^q), which
makes the rate per image the base's, scaled by lr*/lr_0.  This script's first version did that
itself, because ``train_dynamic`` left gamma per iteration; ``_rescale_schedule`` does it now
for every run.  The last row restores gamma per iteration to show what that omission costs.

**k*.**  With ``--k`` it is given.  Otherwise it is the tuner's, on the CPU (or the GPU with
``--gpu``).  The budget B is ``--budget``, or chosen so that k_max is several times k_base:
the smallest arena of the naive plan at ``--k-max-factor`` x k_base (default 8, so k_max = 512;
the tuner's chunked lowering, :func:`swap.plan.min_budget`); a decision-only probe (profile and
decide, no training) runs at that budget, and while the probe's k* is below 4 k_base the factor
doubles (up to 64).  The probes are printed and recorded in the .md.  The CPU tuner's k* is
below k_max (it pins feature maps whose memcpy would stall compute) and depends on the measured
timings, so it can change from run to run: the fixed-k rows use the k* of the ``tuner`` row.

**Accuracy.**  At the end of each run the test net (sharing the trained weights) is run over the
whole test set once: ceil(N / batch) forward passes from its first record, the top-1 prediction
(the Accuracy layer's bottoms: scores and labels) of each of the N images compared with its
label.  Intermediate tests are switched off (a ``test_interval`` no iteration reaches, no
``test_initialization``) so that the test reader starts
at record 0.  The digits test set has 360 images: one image is 0.28 points, so the 0.5-point
target allows one image of difference.  Epochs are the training records the Data layer consumed
(its ``state_dict``), over the training set's size; they agree across runs within one minibatch
(the last iteration at k* is whole).

    python3 scripts/tuner_accuracy.py                    # CPU, the tuner's k*, docs/results
    python3 scripts/tuner_accuracy.py --seeds 1,2,3,4,5  # what docs/results holds
    python3 scripts/tuner_accuracy.py --k 512            # a given k*, no tuner row
    python3 scripts/tuner_accuracy.py --gpu --budget 64M
    python3 scripts/tuner_accuracy.py --quick --out-dir /tmp/ta   # 200 base iterations (the test)

Writes ``<out-dir>/<prefix>.csv`` and ``.md`` (prefix tuner_accuracy, --quick:
tuner_accuracy_quick; default out-dir docs/results): per run k, lr, rule, gamma, iterations,
images, epochs, test accuracy, correct images, difference in points against the base of the
same seed, wall time; the .md has the device, date, command, the budget probes, the tuner's
decision, the mean over the seeds and whether the target is met (on that mean).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import shlex
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

SOLVER = "prototxt/digits/solver.prototxt"
QUICK_ITERS = 200
K_MAX_FACTOR = 8          # default budget: k_max = 8 x k_base
MAX_FACTOR = 64           # the budget search stops doubling here
K_STAR_MIN_FACTOR = 4     # ... or once the probe's k* >= 4 x k_base
TARGET_POINTS = 0.5       # issue 5: same accuracy within 0.5 points
FIXED_RUNS = (            # (run, rule, rescale gamma)
    ("eq9", "eq9", True),
    ("linear", "linear", True),
    ("sqrt", "sqrt", True),
    ("eq9, gamma per iteration", "eq9", False),
)
FIELDS = ("seed", "run", "k", "k_source", "rule", "lr", "gamma", "iterations", "images",
          "train_images", "epochs", "accuracy", "correct", "test_images", "diff_points",
          "wall_s", "tuner_s")


def say(msg):
    print(msg, flush=True)


# ------------------------------------------------------------------ the child
def make_solver(solver_path: str, mode: str, max_iter: int | None, seed: int | None):
    """A fresh Solver on ``solver_path`` without snapshots, display or intermediate tests (the
    final evaluation must start at the test set's first record, see the module doc, and the
    Data layer's consumed records must be the images trained)."""
    from minicaffe.proto import read_solver_param
    from minicaffe.solver import Solver
    param = read_solver_param(solver_path)
    if max_iter is not None:
        param.max_iter = max_iter
    if seed is not None:
        param.random_seed = seed
    param.snapshot = 0
    param.snapshot_after_train = False
    # no intermediate test: Caffe refuses a test net without a test_interval > 0, so the
    # interval is one no iteration reaches, and iteration 0 is not tested
    param.test_interval = 2**31 - 1
    param.test_initialization = False
    param.display = 0          # else solve() ends with one more forward pass (a batch not trained)
    return Solver(param, mode=mode, verbose=False)


def _layer(net, type_name: str):
    """The first layer of ``net`` of Caffe type ``type_name``, with its index."""
    for li, layer in enumerate(net.layers):
        if layer.type == type_name:
            return li, layer
    raise ValueError(f"net {net.name!r} has no {type_name} layer (needed here)")


def db_size(net) -> int:
    """Records in the LMDB of ``net``'s Data layer."""
    from minicaffe.io import LMDBReader
    _, layer = _layer(net, "Data")
    with LMDBReader(layer.source) as db:
        return len(db)


def evaluate(solver) -> tuple[int, int]:
    """(correct, N): top-1 of the test net over its whole test set, once (module doc).

    Each forward pass gives scores ``(B, classes)`` and labels ``(B,)`` (the Accuracy layer's
    bottoms); the last pass may wrap around, only its first N mod B rows count."""
    import numpy as np

    from minicaffe.backend import to_numpy
    net = solver.test_nets[0]
    li, _ = _layer(net, "Accuracy")
    scores_name, label_name = net.layer_bottom_names[li][:2]
    n = db_size(net)
    correct = seen = 0
    while seen < n:
        net.forward_from_to()
        scores = to_numpy(net.blobs[scores_name].data)          # one sync per batch
        labels = to_numpy(net.blobs[label_name].data).reshape(-1).astype(np.int64)
        take = min(len(labels), n - seen)
        pred = scores.reshape(len(labels), -1).argmax(axis=1)
        correct += int((pred[:take] == labels[:take]).sum())
        seen += take
    return correct, n


def child(spec: dict) -> dict:
    """One run (``spec["kind"]``: base, tuner, probe or fixed) in this process."""
    from swap.gmap import net_batch_size
    from swap.lr import scale_lr
    from swap.profiler import device_name, set_batch_size
    from swap.tuner import _rescale_schedule, train_dynamic
    kind = spec["kind"]
    t0 = time.perf_counter()
    solver = make_solver(spec["solver"], spec["mode"], spec["iters"], spec.get("seed"))
    p = solver.param
    k_base = net_batch_size(solver.net)
    base_lr = float(p.base_lr)
    out = {"run": spec["run"], "seed": int(p.random_seed), "device": device_name(solver.net),
           "k_base": k_base,
           "base_lr": base_lr, "rule": spec.get("rule", ""), "tuner_s": None}
    ex = None
    if kind in ("tuner", "probe"):
        lines = []
        ex, td = train_dynamic(solver, spec["budget"], auto_batch=True, lr_rule="eq9",
                               log=lines.append)
        for ln in lines:
            print(ln, file=sys.stderr, flush=True)
        out.update(tuner_s=time.perf_counter() - t0, k=td.decision.k_star,
                   k_max=td.decision.k_max, lr=td.lr, rule="eq9", budget=spec["budget"],
                   decision=[ln for ln in lines if ln.startswith("AccUDNN decision: k*")])
        if kind == "probe":
            ex.close()
            return out
    elif kind == "fixed":
        k = int(spec["k"])
        set_batch_size(solver.net, k)
        lr = base_lr if k == k_base else scale_lr(base_lr, k, k_base, spec["rule"])
        p.base_lr = lr
        if k != k_base:
            gamma = p.gamma
            _rescale_schedule(p, 0, 0, k_base, k)     # moves gamma too (module doc)
            if not spec["rescale_gamma"]:
                p.gamma = gamma
        out.update(k=k, lr=lr)
    else:
        out.update(k=k_base, lr=base_lr, rule="base")
    solver.solve()
    out["wall_s"] = time.perf_counter() - t0
    correct, n = evaluate(solver)
    if ex is not None:
        ex.close()
    _, data = _layer(solver.net, "Data")
    out.update(gamma=float(p.gamma), iterations=solver.iter,
               images=int(data.state_dict()["records_read"]), train_images=db_size(solver.net),
               correct=correct, test_images=n, accuracy=correct / n)
    return out


# ------------------------------------------------------------------ the parent
def run_spec(spec: dict, timeout: float) -> dict:
    from scripts._child import run_child
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    res = run_child(cmd, spec["run"], timeout, cwd=REPO, tail_lines=8)
    if res is None:
        raise SystemExit(f"run {spec['run']!r} failed (see above)")
    return res


def naive_budget(solver_path: str, k: int) -> int:
    """The smallest arena (bytes) of the naive plan of the solver's train net at minibatch k,
    with the chunked lowering that train_dynamic plans with, plus 1% (so k_max is a little
    above k)."""
    from swap.gmap import build_gmap
    from swap.plan import min_budget
    from swap.runtime import set_lowering
    solver = make_solver(solver_path, "CPU", None, None)
    set_lowering(solver.net, "chunked")
    solver.net.reshape()
    g = build_gmap(solver.net, solver_type=solver.type)
    # + 1%: the runtime keeps a little for the test nets' buffers (1 KiB on the CPU) that
    # k_max does not count; without it the profile's largest k would not fit
    return int(math.ceil(min_budget(g.at(k), "naive") * 1.01 / 1024)) * 1024


def choose_budget(args, base_spec, k_base, timeout) -> tuple[int, list]:
    """The tuner's budget and the probes that chose it (module doc, k*)."""
    from swap.memory import fmt_bytes, parse_bytes
    probes = []
    if args.budget:
        budget = parse_bytes(args.budget)
        say(f"budget {fmt_bytes(budget)} (--budget)")
        return budget, probes
    factor = args.k_max_factor
    while True:
        budget = naive_budget(args.solver, factor * k_base)
        r = run_spec(dict(base_spec, run=f"probe {factor}x", kind="probe", budget=budget),
                     timeout)
        probes.append({"factor": factor, "budget": budget, "k_max": r["k_max"], "k": r["k"],
                       "tuner_s": r["tuner_s"]})
        say(f"budget probe: naive arena at {factor} x k_base = {factor * k_base} is "
            f"{fmt_bytes(budget)}; the tuner (profile + decide) gives k_max {r['k_max']}, "
            f"k* {r['k']} ({r['tuner_s']:.1f}s)")
        if r["k"] >= K_STAR_MIN_FACTOR * k_base or factor * 2 > MAX_FACTOR:
            return budget, probes
        factor *= 2


def finish_row(r: dict, base: dict, k_source: str) -> dict:
    row = {f: r.get(f) for f in FIELDS}
    row["k_source"] = k_source
    row["epochs"] = r["images"] / r["train_images"]
    row["diff_points"] = 100.0 * (r["accuracy"] - base["accuracy"])
    return row


def summarize(rows) -> list:
    """Per run over the seeds: mean accuracy, mean / min / max difference against the base of
    the same seed, and in how many seeds the difference is within the target."""
    out = []
    for run in dict.fromkeys(r["run"] for r in rows):
        rs = [r for r in rows if r["run"] == run]
        d = [r["diff_points"] for r in rs]
        out.append({"run": run, "k": sorted({r["k"] for r in rs}), "rule": rs[0]["rule"],
                    "seeds": len(rs), "accuracy": sum(r["accuracy"] for r in rs) / len(rs),
                    "diff": sum(d) / len(d), "diff_min": min(d), "diff_max": max(d),
                    "within": sum(abs(x) <= TARGET_POINTS + 1e-9 for x in d)})
    return out


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else f"{v:.6g}" if isinstance(v, float) else v)
                        for k, v in r.items()})


def table_lines(rows) -> list:
    lines = ["| seed | run | k | rule | lr | gamma | iterations | epochs | test accuracy | correct "
             "| diff vs base (points) | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['run']} | {r['k']} | {r['rule']} | {r['lr']:.6g} | "
                     f"{r['gamma']:.4g} | {r['iterations']} | {r['epochs']:.2f} | "
                     f"{100 * r['accuracy']:.2f} % | {r['correct']} / {r['test_images']} | "
                     f"{r['diff_points']:+.2f} | {r['wall_s']:.1f} |")
    return lines


def summary_lines(summary) -> list:
    lines = ["| run | k | rule | seeds | mean test accuracy | mean diff (points) | min | max | "
             f"seeds within {TARGET_POINTS} |", "|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        ks = ", ".join(map(str, s["k"]))
        lines.append(f"| {s['run']} | {ks} | {s['rule']} | {s['seeds']} | "
                     f"{100 * s['accuracy']:.2f} % | {s['diff']:+.2f} | {s['diff_min']:+.2f} | "
                     f"{s['diff_max']:+.2f} | {s['within']} / {s['seeds']} |")
    return lines


def verdicts(summary) -> list:
    """The target on the mean difference over the seeds (one seed: its difference)."""
    out = []
    for s in summary:
        if s["run"] in ("tuner", "eq9", "linear"):
            ok = abs(s["diff"]) <= TARGET_POINTS + 1e-9
            out.append(f"- {s['run']} (k {', '.join(map(str, s['k']))}): mean {s['diff']:+.2f} "
                       f"points over {s['seeds']} seed(s), {s['within']} of {s['seeds']} within "
                       f"{TARGET_POINTS}: target " + ("**met**" if ok else "**not met**"))
    return out


def write_md(path, rows, summary, *, device, date, command, k_source, budget, probes, tuners):
    from swap.memory import fmt_bytes
    base = rows[0]
    n_seeds = len({r["seed"] for r in rows})
    lines = ["# Accuracy at the tuner's k* (issue 5)", "",
             f"DigitsLeNet on the UCI 8x8 digits ({base['test_images']} test images, "
             f"{base['train_images']} training images), {device}; {date}; `{command}`", "",
             f"Base: k_base {base['k']}, base_lr {base['lr']:g}, {base['iterations']} iterations "
             f"({base['epochs']:.2f} epochs), lr_policy inv. Every run: a child process, a fresh "
             "Solver, the same number of training images; for each seed (the initial weights) "
             "every run uses it and is compared with the base run of that seed. Test accuracy "
             "over the whole test set at the end (one image = "
             f"{100 / base['test_images']:.2f} points). Wall s: from the Solver's creation to the "
             "end of training (the tuner's profiling and decision included), on a shared "
             "machine where other jobs may have run.", ""]
    if k_source == "given":
        lines += [f"k* = {rows[1]['k']} given with --k (no tuner run).", ""]
    else:
        how = f"budget {fmt_bytes(budget)}" + (" (--budget)" if not probes else "")
        ks = ", ".join(f"{t['k']} (seed {t['seed']}, k_max {t['k_max']}, tuner "
                       f"{t['tuner_s']:.1f} s)" for t in tuners)
        lines += [f"k* from `swap.tuner.train_dynamic` (auto-batch, eq. 9, CPU timings) at {how}: "
                  f"{ks}; the profiling iterations train and count in the images. The fixed-k "
                  "rows of a seed train at that seed's tuner k*.", ""]
        if probes:
            lines += ["Budget choice (decision-only probes: the naive plan's smallest arena at "
                      "factor x k_base, + 1%, doubled while k* < "
                      f"{K_STAR_MIN_FACTOR} k_base):", "",
                      "| factor | budget | k_max | k* |", "|---|---|---|---|"]
            lines += [f"| {p['factor']} | {fmt_bytes(p['budget'])} | {p['k_max']} | {p['k']} |"
                      for p in probes]
            lines.append("")
        for t in tuners:
            lines += [f"    seed {t['seed']}: {d}" for d in t.get("decision", [])]
        lines.append("")
    lrs = {r["rule"]: r for r in rows if r["k_source"] != "base" and r["run"] != "tuner"}
    if {"eq9", "linear", "sqrt"} <= set(lrs):
        q = lrs["eq9"]["k"] / base["k"]
        lines += [f"q = k*/k_base = {q:.3g}: eq. (9) (c = 1) gives lr* = {lrs['eq9']['lr']:.4g}, "
                  f"the linear rule {lrs['linear']['lr']:.4g} (eq. 9 is "
                  f"{100 * (1 - lrs['eq9']['lr'] / lrs['linear']['lr']):.1f}% below it: for "
                  "small base_lr c it is the linear rule), the sqrt rule "
                  f"{lrs['sqrt']['lr']:.4g}.", ""]
    if n_seeds > 1:
        lines += summary_lines(summary) + [""]
    lines += table_lines(rows) + [""]
    lines += ["gamma: the inv policy's per-iteration gamma times k*/k_base (the rate per epoch "
              "of the base run), except in the row that keeps it per iteration (what "
              "train_dynamic alone does). The fixed-k rows (eq9, linear, sqrt) train at k* "
              "without profiling or swapping; the tuner row profiles (10 iterations at 1/8 .. 1 "
              "of k_max, base_lr) and trains under the dynamic plan.", "",
              f"Target: the base's accuracy within {TARGET_POINTS} points in the same epochs"
              + (" (on the mean over the seeds)" if n_seeds > 1 else "") + ":", ""]
    lines += verdicts(summary) + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def _seeds(text):
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--seeds: comma-separated integers, not {text!r}") from None
    if not seeds:
        raise SystemExit("--seeds: give at least one seed")
    return seeds


def run_seed(args, spec0, seed, timeout, budget_state) -> list:
    """Every run of one seed: (result, k_source) pairs, the base first."""
    spec0 = dict(spec0, seed=seed)
    base = run_spec(dict(spec0, run="base", kind="base"), timeout)
    k_base = base["k_base"]
    say(f"seed {base['seed']}: base: k {k_base}, lr {base['lr']:g}, {base['iterations']} "
        f"iterations, accuracy {100 * base['accuracy']:.2f} % ({base['wall_s']:.1f}s)")
    out = [(base, "base")]
    if args.k is not None:
        k_star, k_source = args.k, "given"
    else:
        if budget_state.get("budget") is None:
            budget_state["budget"], budget_state["probes"] = choose_budget(args, spec0, k_base,
                                                                           timeout)
        tuner = run_spec(dict(spec0, run="tuner", kind="tuner", budget=budget_state["budget"],
                              rescale_gamma=True), timeout)
        k_star, k_source = tuner["k"], "tuner"
        out.append((tuner, k_source))
        say(f"seed {tuner['seed']}: tuner: k* {k_star} (k_max {tuner['k_max']}), lr "
            f"{tuner['lr']:.6g}, {tuner['iterations']} iterations, accuracy "
            f"{100 * tuner['accuracy']:.2f} % ({tuner['wall_s']:.1f}s, tuner "
            f"{tuner['tuner_s']:.1f}s)")
    if k_star <= k_base:
        say(f"warning: k* = {k_star} is not larger than k_base = {k_base}: nothing to compare")
    for run, rule, rescale in FIXED_RUNS:
        r = run_spec(dict(spec0, run=run, kind="fixed", k=k_star, rule=rule,
                          rescale_gamma=rescale), timeout)
        out.append((r, k_source))
        say(f"seed {r['seed']}: {run}: k {k_star}, lr {r['lr']:.6g}, {r['iterations']} "
            f"iterations, accuracy {100 * r['accuracy']:.2f} % ({r['wall_s']:.1f}s)")
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--solver", default=SOLVER)
    ap.add_argument("--k", type=int, default=None, help="k* (default: the tuner's)")
    ap.add_argument("--budget", default=None,
                    help="the tuner's budget, e.g. 12M (default: chosen, see the module doc)")
    ap.add_argument("--k-max-factor", type=int, default=K_MAX_FACTOR,
                    help="first budget probed: the naive plan's arena at this x k_base")
    ap.add_argument("--iters", type=int, default=None,
                    help=f"base iterations (default the solver's; --quick {QUICK_ITERS})")
    ap.add_argument("--seeds", default=None,
                    help="comma-separated random seeds, every run once per seed (default: the "
                         "solver's random_seed)")
    ap.add_argument("--gpu", action="store_true", help="train on the GPU (default CPU)")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_ITERS} base iterations (the test)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per child")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "docs", "results"))
    ap.add_argument("--prefix", default=None,
                    help="file names (default tuner_accuracy, --quick: tuner_accuracy_quick)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    if args.k is not None and args.k < 1:
        ap.error("--k must be positive")
    if args.k is not None and args.budget:
        ap.error("give --k or --budget (the tuner's), not both")
    seeds = _seeds(args.seeds) if args.seeds else [None]
    mode = "GPU" if args.gpu else "CPU"
    if mode == "GPU":
        from minicaffe.backend import gpu_available
        if not gpu_available():
            raise SystemExit("no CUDA device: run without --gpu")
    iters = args.iters or (QUICK_ITERS if args.quick else None)
    prefix = args.prefix or ("tuner_accuracy_quick" if args.quick else "tuner_accuracy")
    os.makedirs(args.out_dir, exist_ok=True)
    out = os.path.join(args.out_dir, prefix)
    command = "python3 scripts/tuner_accuracy.py" + (" " + shlex.join(argv) if argv else "")
    t_all = time.time()
    spec0 = {"solver": args.solver, "mode": mode, "iters": iters}
    budget_state = {}
    rows, tuners, device, k_source = [], [], None, None
    for seed in seeds:
        runs = run_seed(args, spec0, seed, args.timeout, budget_state)
        base = runs[0][0]
        device = base["device"]
        rows += [finish_row(r, base, src) for r, src in runs]
        tuners += [r for r, src in runs if r["run"] == "tuner"]
        k_source = runs[-1][1]
    summary = summarize(rows)
    write_csv(rows, out + ".csv")
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    write_md(out + ".md", rows, summary, device=device, date=date, command=command,
             k_source=k_source, budget=budget_state.get("budget"),
             probes=budget_state.get("probes", []), tuners=tuners)
    lines = table_lines(rows) + [""]
    if len(seeds) > 1:
        lines += summary_lines(summary) + [""]
    for ln in lines + verdicts(summary):
        say(ln)
    say(f"done in {time.time() - t_all:.0f}s: {out}.csv, {out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
