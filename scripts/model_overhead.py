#!/usr/bin/env python3
"""How much of the measured iteration the time outside the layer steps explains.

The performance model predicts an iteration as the compute steps along Algorithm 1's timeline
(eq. 2 plus stalls).  :class:`swap.model.IterationOverhead` adds ``O(k) = a + b k``, the time
outside the steps, fitted from the profile (the gaps between steps in which no transfer ended,
the pass's head and tail, and the solver step's head and tail where the profile marks them).
This script puts the old and the new prediction beside what the GPU measured.  Nothing is
measured here: every number comes from the files, or from the model fitted to them.

    python3 scripts/model_overhead.py                  # the committed H200 results, ~30 s
    python3 scripts/model_overhead.py --no-replan      # the tables alone, ~3 s

Per network with both ``<net>_profile.json`` and ``<net>.json`` in ``--tuner-dir`` (written by
``scripts/tuner_table.py``; default ``docs/results/tuner``):

1. the fit: per profiled k, the head, the gaps (the mean clean gap times the step boundaries,
   and how many boundaries were clean), the tail, and O(k); then a and b.  Profiles without a
   ``<net>.json`` (and ``--extra-profile`` files) get this table only;
2. per measured point, each plan at its k: ``dynamic`` (measured ms; old = the tuner's
   ``pred_ms``; new = old + O(k), which is what the tuner predicts now: the timeline does not
   change with O) and ``none`` without swapping at the same k (``none_ms``; and
   ``none_chunked`` at Caffe's largest k; old = the compute alone, eq. 2 from the profile's
   model with FLOPs scaled by eq. 1, new = old + O(k)).  Errors are (predicted - measured) /
   measured, as in the tuner table; the residual ``measured - new`` is also given per image;
3. ``--replan`` (default): the network rebuilt on the CPU at its k_base, Algorithm 2 run
   again on the profile's model without and with O(k), with the run's budget, host bound and
   the scratch model fitted to the profile's transients: k* and its predicted ms, old and new.

Writes ``--out`` (default ``docs/results/model_overhead.md``) and prints it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
RESULTS = os.path.join(REPO, "docs", "results")
NAMES = {"alexnet": "AlexNet", "googlenet": "GoogLeNet", "vgg16": "VGG-16",
         "resnet34": "ResNet-34", "resnet50": "ResNet-50", "resnet101": "ResNet-101",
         "resnet152": "ResNet-152"}


def _rel(path: str) -> str:
    try:
        return os.path.relpath(path, REPO)
    except ValueError:
        return path


def compute_alone(model, profile, k: int) -> float:
    """eq. (2) at k without a GMAP: each profiled step's FLOPs at the largest profiled k,
    scaled to k (eq. 1), through the model's curves.  Seconds."""
    kp = max(profile.ks)
    flops = {c.step: c.flops for c in profile.compute if c.k == kp}
    return sum(model.step_time(s, flops[s.step] * k / kp) for s in profile.steps
               if s.step in flops)


def measured_points(result: dict, model, profile) -> list:
    """(k, plan, measured ms, old predicted ms) of every measured point of a tuner JSON."""
    pts = []
    nc = result.get("none_chunked") or {}
    if "ms" in nc:
        k = int(nc["k"])
        pts.append((k, "none", float(nc["ms"]), 1e3 * compute_alone(model, profile, k)))
    for d in result.get("dynamic", []):
        if "ms" not in d:
            continue
        k = int(d["k"])
        pts.append((k, "dynamic", float(d["ms"]), float(d["pred_ms"])))
        if d.get("none_ms") is not None:
            old = d.get("pred_compute_ms")
            old = float(old) if old is not None else 1e3 * compute_alone(model, profile, k)
            pts.append((k, "none", float(d["none_ms"]), old))
    return pts


def replan(name: str, result: dict, profile) -> dict:
    """Algorithm 2 again on the CPU, from the profile, without and with O(k) (module doc)."""
    from scripts.swap_budgets import _solver
    from swap.gmap import build_gmap
    from swap.model import ComputeModel, PCIeModel
    from swap.profiler import ScratchModel, max_batch_scratch
    from swap.runtime import budget_for_plan, set_lowering
    from swap.tuner import tune
    solver = _solver(name, int(result["k_base"]), result.get("engine", "CAFFE"), "CPU")
    set_lowering(solver.net, "chunked")          # what the tuner plans with
    solver.net.reshape()
    g = build_gmap(solver.net, solver_type=solver.type)
    profile.check_net(g)
    scratch = None
    if profile.meta.get("transients"):
        scratch = ScratchModel.from_gmap(g)
        for k, peak in profile.meta["transients"]:
            scratch.add(k, peak)
    budget = int(result["budget"])
    base = budget_for_plan(solver, budget, scratch=0, gmap=g)
    k_max = max_batch_scratch(g, base, scratch, host_budget=result.get("host_budget"))
    pcie = PCIeModel.from_profile(profile)
    method = result.get("search", "bisect")
    out = {}
    for tag, overhead in (("old", False), ("new", True)):
        model = ComputeModel.from_profile(profile, overhead=overhead)
        t0 = time.perf_counter()
        d = tune(g, base, model, pcie, method=method, k_max=k_max, scratch=scratch)
        out[tag] = {"k_star": d.k_star, "ms": 1e3 * d.t_iter,
                    "timeline_ms": 1e3 * d.timeline.t_iter, "overhead_ms": 1e3 * d.overhead,
                    "seconds": time.perf_counter() - t0}
    out["k_max"] = k_max
    return out


def memory_points(result: dict, profile) -> list:
    """Per measured dynamic point: the measured peak (plan in use + transients the dry run
    measured), the run's prediction (eq. 4 + the scratch model's upper line, what the reserve
    holds) and the prediction with :meth:`swap.profiler.ScratchModel.expected` (the
    least-squares line through the transient peaks the profile measured)."""
    from swap.profiler import ScratchModel
    S = ScratchModel()
    for k, peak in profile.meta.get("transients") or []:
        S.add(int(k), int(peak))
    out = []
    for r in result.get("dynamic", []):
        if "pred_total" not in r or "transients" not in r:
            continue
        meas = int(r["peak_in_use"]) + int(r["transients"])
        out.append({"k": r["k"], "measured": meas, "old": int(r["pred_total"]),
                    "new": int(r["pred_peak"]) + S.expected(r["k"])})
    return out


def _result_file(tuner_dir: str, name: str) -> str | None:
    """The tuner table's JSON of a network: ``<net>.json``, else the one a run whose
    measurements failed left (``<net>_failed_measurements.json``), else None."""
    for f in (f"{name}.json", f"{name}_failed_measurements.json"):
        p = os.path.join(tuner_dir, f)
        if os.path.exists(p):
            return p
    return None


def analyse(tuner_dir: str, extra_profiles=(), do_replan: bool = True, log=print) -> dict:
    """Everything the report shows, per network (module doc)."""
    from swap.model import ComputeModel, IterationOverhead, overhead_samples
    from swap.profiler import Profile
    nets = []
    names = sorted({f[:-len("_profile.json")] for f in os.listdir(tuner_dir)
                    if f.endswith("_profile.json")})
    paths = [(n, os.path.join(tuner_dir, f"{n}_profile.json"), _result_file(tuner_dir, n))
             for n in names]
    paths += [(os.path.splitext(os.path.basename(p))[0], p, None) for p in extra_profiles]
    for name, ppath, rpath in paths:
        prof = Profile.load(ppath)
        model = ComputeModel.from_profile(prof)
        oh = model.overhead or IterationOverhead()
        entry = {"name": name, "net": prof.net, "profile": _rel(ppath), "device": prof.device,
                 "date": prof.date, "steps": len(prof.steps), "a": oh.a, "b": oh.b,
                 "marks": bool(prof.solver_steps), "fit": overhead_samples(prof), "points": [],
                 "result": None, "replan": None}
        if rpath is not None and os.path.exists(rpath):
            with open(rpath) as f:
                result = json.load(f)
            entry["result"] = _rel(rpath)
            entry["result_date"] = result.get("date", "")
            for k, plan, ms, old in measured_points(result, model, prof):
                new = old + 1e3 * oh(k)
                entry["points"].append({"k": k, "plan": plan, "ms": ms, "old": old, "new": new,
                                        "k_star": k == result.get("tuner", {}).get("k_star")})
            entry["memory"] = memory_points(result, prof)
            if do_replan:
                log(f"{name}: Algorithm 2 again on the CPU ...")
                try:
                    entry["replan"] = replan(name, result, prof)
                    entry["replan"]["k_star_run"] = result.get("tuner", {}).get("k_star")
                except Exception as e:          # reported, the tables still come out
                    entry["replan"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        nets.append(entry)
    return {"nets": nets}


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def memory_report(nets) -> list:
    """Markdown lines: the memory model's error per measured point, old and new prediction."""
    rows = [(n, m) for n in nets for m in n.get("memory") or []]
    if not rows:
        return []
    gib = 2 ** 30
    lines = ["", "## Memory: eq. (4) plus the transients", "",
             "The plan's peak in use equals eq. (4) at every point; the error is in the "
             "transients. Old: the scratch model's line above every measured transient peak "
             "(what the reserve holds). New: its least-squares line (`ScratchModel.expected`).",
             "", "| net | k | measured GiB | old GiB | new GiB | old error | new error |",
             "|---|---|---|---|---|---|---|"]
    for n, m in rows:
        lines.append(f"| {NAMES.get(n['name'], n['name'])} | {m['k']} | "
                     f"{m['measured'] / gib:.2f} | {m['old'] / gib:.2f} | {m['new'] / gib:.2f} | "
                     f"{_pct((m['old'] - m['measured']) / m['measured'])} | "
                     f"{_pct((m['new'] - m['measured']) / m['measured'])} |")
    return lines


def report(res: dict, command: str) -> str:
    """The markdown report of :func:`analyse`'s result."""
    nets = res["nets"]
    devices = sorted({n["device"] for n in nets})
    lines = [
        "# The time outside the layer steps: old and new predicted iteration against measured",
        "",
        (f"`{command}`, {datetime.date.today().isoformat()}. Profiles and measurements from "
         f"{', '.join(devices)} (the tuner table's runs; each file is named below). Nothing "
         "is measured by this script."),
        "",
        ("O(k) = a + b k is :class:`swap.model.IterationOverhead`, fitted per profile: at each "
         "profiled k (naive plan), the head (pass start to first step), the gaps between steps "
         "(mean gap over the boundaries in which no transfer ended, the others may be waits for a "
         "prefetch, times the number of boundaries), the tail (last step's end to the pass's end) "
         "and, where the profile has solver-step marks, the time before the pass and the solver "
         "update after it. The steps' compute is eq. (2)'s sum as profiled; the steps' host time "
         "(what the host took to issue them; `-` where the profile does not record it) is not "
         "in O(k)."),
        "",
        "## The fit",
        "",
        ("| profile | steps | solver marks | profiled k | head us | mean clean gap us (clean / "
         "boundaries) | gaps ms | tail us | O(k) ms | a ms | b us/image | steps' compute ms | "
         "steps' host ms |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in nets:
        for i, r in enumerate(n["fit"]):
            # the profile's own columns on its first row only
            own = ([n["profile"], str(n["steps"]), "yes" if n["marks"] else "no"] if i == 0
                   else ["", "", ""])
            fit = [f"{1e3 * n['a']:.3f}", f"{1e6 * n['b']:.3f}"] if i == 0 else ["", ""]
            row = own + [str(r["k"]), f"{1e6 * r['head']:.1f}",
                         f"{1e6 * r['gap']:.2f} ({r['clean']} / {r['boundaries']})",
                         f"{1e3 * r['gaps']:.3f}", f"{1e6 * r['tail']:.1f}",
                         f"{1e3 * r['seconds']:.3f}"] + fit + [
                         f"{1e3 * r['compute']:.1f}",
                         "-" if r["host"] is None else f"{1e3 * r['host']:.1f}"]
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "## Predicted against measured",
        "",
        ("`dynamic`: the tuner's plan at k, old = its predicted ms in the run, new = old + O(k). "
         "`none`: no swapping at the same k (chunked im2col), old = the compute alone (eq. 2), "
         "new = old + O(k). Residual = measured - new."),
        "",
        ("| net | k | plan | measured ms | old predicted ms | new predicted ms | old error | "
         "new error | residual ms | residual us/image |"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in nets:
        for p in sorted(n["points"], key=lambda p: (p["plan"], p["k"])):
            name = NAMES.get(n["name"], n["name"])
            star = " (k*)" if p["k_star"] and p["plan"] == "dynamic" else ""
            resid = p["ms"] - p["new"]
            lines.append(
                f"| {name} | {p['k']}{star} | {p['plan']} | {p['ms']:.1f} | {p['old']:.1f} | "
                f"{p['new']:.1f} | {_pct((p['old'] - p['ms']) / p['ms'])} | "
                f"{_pct((p['new'] - p['ms']) / p['ms'])} | {resid:.1f} | "
                f"{1e3 * resid / p['k']:.0f} |")
    marked = [n for n in nets if n["marks"]]
    lines += ["", "## Per network", "",
              f"Profiles with solver-step marks: {len(marked)} of {len(nets)}"
              + (" (" + ", ".join(n["profile"] for n in marked) + ")" if marked else "")
              + ". Without them O(k) holds the gaps between steps and the pass's own head and "
              "tail, not the solver update.", ""]
    for n in nets:
        if not n["points"]:
            lines.append(f"- {NAMES.get(n['name'], n['name'])} ({n['profile']}): O = "
                         f"{1e3 * n['a']:.3f} ms + {1e6 * n['b']:.3f} us x k; no measured points.")
            continue
        pts = n["points"]
        better = sum(abs(p["new"] - p["ms"]) < abs(p["old"] - p["ms"]) for p in pts)
        mean_old = sum(abs(p["old"] - p["ms"]) / p["ms"] for p in pts) / len(pts)
        mean_new = sum(abs(p["new"] - p["ms"]) / p["ms"] for p in pts) / len(pts)
        text = (f"- {NAMES.get(n['name'], n['name'])} ({n['profile']}, {n['result']}): O(k) = "
                f"{1e3 * n['a']:.3f} ms + {1e6 * n['b']:.3f} us x k. |error| smaller at "
                f"{better} of {len(pts)} points; mean |error| {100 * mean_old:.1f} % -> "
                f"{100 * mean_new:.1f} %.")
        over = [p for p in pts if p["new"] > p["ms"]]
        if over:
            text += (" Over-predicted with O: " + ", ".join(
                f"{p['plan']} at {p['k']} ({_pct((p['new'] - p['ms']) / p['ms'])})"
                for p in over) + ".")
        rp = n.get("replan")
        if rp and "error" in rp:
            text += f" Algorithm 2 again: failed ({rp['error']})."
        elif rp:
            o, w = rp["old"], rp["new"]
            text += (f" Algorithm 2 again on the CPU (k_max {rp['k_max']}): k* {o['k_star']} "
                     f"without O, {w['k_star']} with it (the run's k*: {rp['k_star_run']}); "
                     f"predicted {o['ms']:.1f} -> {w['ms']:.1f} ms at k*.")
        lines.append(text)
    lines += memory_report(nets)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tuner-dir", default=os.path.join(RESULTS, "tuner"),
                    help="the tuner table's JSONs and profiles (default docs/results/tuner)")
    ap.add_argument("--extra-profile", action="append", default=None,
                    help="another profile to fit (fit table only); default "
                         "docs/results/model_verify_profile.json when it exists")
    ap.add_argument("--no-replan", dest="replan", action="store_false",
                    help="skip running Algorithm 2 again on the CPU")
    ap.add_argument("--out", default=os.path.join(RESULTS, "model_overhead.md"))
    args = ap.parse_args(argv)
    if not os.path.isdir(args.tuner_dir):
        raise SystemExit(f"no such directory: {args.tuner_dir} (write it with "
                         "scripts/tuner_table.py, or name another with --tuner-dir)")
    extra = args.extra_profile
    if extra is None:
        mv = os.path.join(RESULTS, "model_verify_profile.json")
        extra = [mv] if os.path.exists(mv) else []
    res = analyse(args.tuner_dir, extra, args.replan,
                  log=lambda m: print(m, file=sys.stderr, flush=True))
    command = "python3 scripts/model_overhead.py" + "".join(f" {shlex.quote(a)}" for a in argv)
    text = report(res, command)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
