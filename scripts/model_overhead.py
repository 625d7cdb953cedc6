#!/usr/bin/env python3
"""Predicted against measured iterations: the time outside the steps and the host's issue floor.

The performance model predicts an iteration as the compute steps along Algorithm 1's timeline
(eq. 2 plus stalls).  :class:`swap.model.IterationOverhead` adds ``O(k) = a + b k``, the time
outside the steps, fitted from the profile (the gaps between steps in which no transfer ended,
the pass's head and tail, and the solver step's head and tail where the profile marks them).
:class:`swap.model.HostModel` puts a floor under the steps: ``H(k) = sum_j (a_j + b_j k)``, the
host's time to issue them, fitted under the profile's host issue times where it has them; the
prediction is ``max(eq. 2 + stalls, H(k)) + O(k)``.  This script puts the predictions without
O, with O (before the host model) and with the host floor (after) beside what the GPU
measured.  Nothing is measured here: every number comes from the files, or from the model
fitted to them.

    python3 scripts/model_overhead.py                  # the committed H200 results, ~70 s
    python3 scripts/model_overhead.py --no-replan      # the tables alone, ~5 s

Per network with both ``<net>_profile.json`` and ``<net>.json`` in ``--tuner-dir`` (written by
``scripts/tuner_table.py``; default ``docs/results/tuner``), and per ``<net>_profile_host.json``
(the same net profiled again with host times) with ``<net>_host.json`` (the measured points of
the run that took it):

1. the fit: per profiled k, the head, the gaps (the mean clean gap times the step boundaries,
   and how many boundaries were clean), the tail, and O(k); then a and b.  Profiles without a
   result JSON (and ``--extra-profile`` files) get this table only;
2. the host model (method ``line``, the default) of each profile with host times, and the
   check of it and of the ``min`` estimate against the measured iterations; a network whose
   profile has no host times takes those of ``<net>_profile_host.json`` where it exists;
3. per measured point, each plan at its k: ``dynamic`` (measured ms; eq. 2 + stalls = the
   tuner's ``pred_ms`` less O(k) where the run's prediction held it, :func:`pred_has_overhead`)
   and ``none`` without swapping at the same k (``none_ms``; and ``none_chunked`` at Caffe's
   largest k; eq. 2 from the profile's model with FLOPs scaled by eq. 1, or the JSON's
   ``pred_compute_ms``); before = + O(k), after = max(., H(k)) + O(k).  Errors are (predicted -
   measured) / measured, as in the tuner table;
4. ``--replan`` (default): the network rebuilt on the CPU at its k_base, Algorithm 2 run
   again on the profile's model without O(k), with it, and with O(k) and the host model, with
   the run's budget, host bound (or the profile's k_max where the run recorded none) and the
   scratch model fitted to the profile's transients: k* and its predicted ms; and, at each
   measured k, the per-step coupling of host and device (:func:`coupled`) beside the model's
   per-iteration max, for comparison.

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


def pred_has_overhead(result: dict) -> bool:
    """Whether the run's ``pred_ms`` already holds O(k): the tuner added it from 2026-11-21
    16:40 on, and its log then names "the time outside the layer steps"; a JSON written by
    hand says so in ``pred_includes_overhead``."""
    if "pred_includes_overhead" in result:
        return bool(result["pred_includes_overhead"])
    log = (result.get("tuner") or {}).get("log") or []
    return any("time outside the layer steps" in line or "outside the steps" in line
               for line in log)


def measured_points(result: dict, model, profile) -> list:
    """(k, plan, measured ms, device ms) of every measured point of a tuner JSON: the device
    prediction without O(k) (a run whose ``pred_ms`` held O(k) has it taken off again)."""
    pts = []
    with_o = pred_has_overhead(result)
    nc = result.get("none_chunked") or {}
    if "ms" in nc:
        k = int(nc["k"])
        pts.append((k, "none", float(nc["ms"]), 1e3 * compute_alone(model, profile, k)))
    for d in result.get("dynamic", []):
        if "ms" not in d:
            continue
        k = int(d["k"])
        pred = float(d["pred_ms"]) - (1e3 * model.overhead_at(k) if with_o else 0.0)
        pts.append((k, "dynamic", float(d["ms"]), pred))
        if d.get("none_ms") is not None:
            old = d.get("pred_compute_ms")
            old = float(old) if old is not None else 1e3 * compute_alone(model, profile, k)
            pts.append((k, "none", float(d["none_ms"]), old))
    return pts


def coupled(device, host) -> float:
    """A finer form than the per-iteration max, for comparison only: the host issues the
    steps back to back (``host[j]`` each, never waiting) and the device runs step j
    (``device[j]``) after step j - 1, ending no earlier than the host has issued it.
    Seconds of the last step's end."""
    end = issued = 0.0
    for d, h in zip(device, host):
        issued += float(h)
        end = max(end + float(d), issued)
    return end


def replan(name: str, result: dict, profile, host=None, ks=(),
           granularity: str = "type") -> dict:
    """Algorithm 2 again on the CPU, from the profile: without O(k), with it, and with O(k)
    and the host model ``host`` (where given); and, at each k of ``ks``, the stall-free
    device sum, the host sum and :func:`coupled` (module doc).  granularity: of the throughput
    curves; "type" (the runs' model, what this report shows) or "step" (the tuner's default
    since, compared in ``scripts/model_refit.py``)."""
    import dataclasses

    from scripts.swap_budgets import _solver
    from swap.gmap import build_gmap
    from swap.model import ComputeModel, PCIeModel
    from swap.profiler import ScratchModel, max_batch_scratch
    from swap.runtime import budget_for_plan, set_lowering
    from swap.tuner import tune
    net = result.get("net", name)
    solver = _solver(net, int(result["k_base"]), result.get("engine", "CAFFE"), "CPU")
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
    if result.get("host_budget") is None and profile.meta.get("k_max"):
        k_max = min(k_max, int(profile.meta["k_max"]))   # the run's own k_max, host bound in
    pcie = PCIeModel.from_profile(profile)
    method = result.get("search", "bisect")
    with_o = ComputeModel.from_profile(profile, granularity=granularity, host=False)
    models = [("old", ComputeModel.from_profile(profile, granularity=granularity,
                                                overhead=False, host=False)),
              ("new", with_o)]
    if host is not None:
        models.append(("host", dataclasses.replace(with_o, host=host)))
    out = {}
    for tag, model in models:
        t0 = time.perf_counter()
        d = tune(g, base, model, pcie, method=method, k_max=k_max, scratch=scratch)
        out[tag] = {"k_star": d.k_star, "ms": 1e3 * d.t_iter,
                    "timeline_ms": 1e3 * d.timeline.t_iter, "overhead_ms": 1e3 * d.overhead,
                    "host_ms": 1e3 * d.host, "seconds": time.perf_counter() - t0}
    out["k_max"] = k_max
    if host is not None:
        times = with_o.times_fn(g)
        out["coupled"] = {int(k): {"device_ms": 1e3 * float(times(k).sum()),
                                   "host_ms": 1e3 * host(k),
                                   "coupled_ms": 1e3 * coupled(times(k), host.step_times(k))}
                          for k in sorted(set(ks))}
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


def _same_steps(a, b) -> bool:
    return [(s.layer, s.phase) for s in a.steps] == [(s.layer, s.phase) for s in b.steps]


def host_model_for(name: str, prof, ppath: str, tuner_dir: str, method: str = "line"):
    """(host model, the profile it comes from) for a network: its own profile's host times,
    else those of ``<net>_profile_host.json`` beside it (the same net, profiled again with host
    times), else (None, None)."""
    from swap.model import HostModel
    from swap.profiler import Profile
    hm = HostModel.from_profile(prof, method)
    if hm is not None:
        return hm, ppath
    hpath = os.path.join(tuner_dir, f"{name}_profile_host.json")
    if os.path.exists(hpath) and os.path.abspath(hpath) != os.path.abspath(ppath):
        hp = Profile.load(hpath)
        if hp.net == prof.net and _same_steps(hp, prof):
            hm = HostModel.from_profile(hp, method)
            if hm is not None:
                return hm, hpath
    return None, None


def label(name: str) -> str:
    """The network's name in the report; ``<net>_host`` is the run that took
    ``<net>_profile_host.json``."""
    if name.endswith("_host"):
        base = name[:-len("_host")]
        return f"{NAMES.get(base, base)} (host-timed run)"
    return NAMES.get(name, name)


def analyse(tuner_dir: str, extra_profiles=(), do_replan: bool = True, log=print) -> dict:
    """Everything the report shows, per network (module doc)."""
    from swap.model import ComputeModel, HostModel, IterationOverhead, overhead_samples
    from swap.profiler import Profile
    nets = []
    files = sorted(os.listdir(tuner_dir))
    names = sorted({f[:-len("_profile.json")] for f in files if f.endswith("_profile.json")})
    paths = [(n, os.path.join(tuner_dir, f"{n}_profile.json"), _result_file(tuner_dir, n))
             for n in names]
    # a network profiled again with host times, and that run's measured points
    for f in files:
        if f.endswith("_profile_host.json"):
            n = f[:-len("_profile_host.json")] + "_host"
            paths.append((n, os.path.join(tuner_dir, f), _result_file(tuner_dir, n)))
    paths += [(os.path.splitext(os.path.basename(p))[0], p, None) for p in extra_profiles]
    for name, ppath, rpath in paths:
        prof = Profile.load(ppath)
        model = ComputeModel.from_profile(prof, host=False)
        oh = model.overhead or IterationOverhead()
        base = name[:-len("_host")] if name.endswith("_host") else name
        hm, hsrc = host_model_for(base, prof, ppath, tuner_dir)
        hmin = HostModel.from_profile(Profile.load(hsrc), "min") if hsrc else None
        entry = {"name": name, "net": prof.net, "profile": _rel(ppath), "device": prof.device,
                 "date": prof.date, "steps": len(prof.steps), "a": oh.a, "b": oh.b,
                 "marks": bool(prof.solver_steps), "fit": overhead_samples(prof), "points": [],
                 "result": None, "replan": None,
                 "host": None if hm is None else {
                     "source": _rel(hsrc), "own": hsrc == ppath, "method": hm.method,
                     "intercept": hm.intercept, "slope": hm.slope, "ks": list(hm.ks),
                     "min": hmin.intercept,
                     "at": {int(k): hm(k) for k in hm.ks}}}
        if rpath is not None and os.path.exists(rpath):
            with open(rpath) as f:
                result = json.load(f)
            entry["result"] = _rel(rpath)
            entry["result_date"] = result.get("date", "")
            entry["pred_had_overhead"] = pred_has_overhead(result)
            for k, plan, ms, old in measured_points(result, model, prof):
                o = 1e3 * oh(k)
                new = old + o
                p = {"k": k, "plan": plan, "ms": ms, "old": old, "new": new,
                     "k_star": k == result.get("tuner", {}).get("k_star"),
                     "host": None, "host_min": None, "floor": new, "bound": "device"}
                if hm is not None:
                    h = 1e3 * hm(k)
                    p.update(host=h, host_min=1e3 * hmin(k), floor=max(old, h) + o,
                             bound="host" if h > old else "device")
                entry["points"].append(p)
            entry["memory"] = memory_points(result, prof)
            if do_replan:
                log(f"{name}: Algorithm 2 again on the CPU ...")
                try:
                    entry["replan"] = replan(name, result, prof, hm,
                                             [p["k"] for p in entry["points"]])
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
        lines.append(f"| {label(n['name'])} | {m['k']} | "
                     f"{m['measured'] / gib:.2f} | {m['old'] / gib:.2f} | {m['new'] / gib:.2f} | "
                     f"{_pct((m['old'] - m['measured']) / m['measured'])} | "
                     f"{_pct((m['new'] - m['measured']) / m['measured'])} |")
    return lines


def _err(pred: float, ms: float) -> str:
    return _pct((pred - ms) / ms)


def host_report(nets) -> list:
    """Markdown lines: the host models, and the check of the two estimates at the measured
    points."""
    hosted = [n for n in nets if n.get("host")]
    if not hosted:
        return []
    lines = ["", "## The host's issue time", "",
             ("H(k) = sum_j (a_j + b_j k) is :class:`swap.model.HostModel` fitted to the steps' "
              "host issue times of the profile named (`ComputeSample.host`): per step, the line "
              "under every profiled sample with the largest sum (method `line`, the default), "
              "or the smallest sample as a constant (`min`). The predicted iteration is then "
              "max(eq. 2 + stalls, H(k)) + O(k). A network whose own profile has no host times "
              "borrows them from `<net>_profile_host.json` (the same net profiled again)."),
             "", "| net | host times from | A = sum a_j ms | B = sum b_j us/image | "
             "`min` estimate ms | profiled k: measured host sum ms / H(k) ms |",
             "|---|---|---|---|---|---|"]
    for n in hosted:
        h = n["host"]
        if not h["own"]:
            continue
        raw = {r["k"]: r["host"] for r in n["fit"]}
        at = "; ".join(f"{k}: {'-' if raw.get(k) is None else f'{1e3 * raw[k]:.1f}'} / "
                       f"{1e3 * v:.1f}" for k, v in sorted(h["at"].items()))
        lines.append(f"| {label(n['name'])} | {h['source']} | {1e3 * h['intercept']:.1f} | "
                     f"{1e6 * h['slope']:.1f} | {1e3 * h['min']:.1f} | {at} |")
    borrowed = [n for n in hosted if not n["host"]["own"]]
    if borrowed:
        lines += ["", "Borrowed: " + "; ".join(
            f"{label(n['name'])} ({n['profile']}, no host times) takes {n['host']['source']}'s"
            for n in borrowed) + ". Same net and device, profiled again later the same day; "
            "the code changed in between, so these points check the host model less directly."]
    rows = [(n, p) for n in hosted for p in n["points"]]
    if rows:
        lines += ["", ("Check of the two estimates against the measured iterations: H(k) + O(k) "
                       "is the least the host alone allows, so it should not exceed a measured "
                       "iteration by more than the noise."), "",
                  "| net | k | plan | measured ms | `line` H(k) + O(k) ms | `min` H + O(k) ms |",
                  "|---|---|---|---|---|---|"]
        for n, p in sorted(rows, key=lambda x: (x[0]["name"], x[1]["plan"], x[1]["k"])):
            o = p["new"] - p["old"]
            lines.append(f"| {label(n['name'])} | {p['k']} | {p['plan']} | {p['ms']:.1f} | "
                         f"{p['host'] + o:.1f} ({_err(p['host'] + o, p['ms'])}) | "
                         f"{p['host_min'] + o:.1f} ({_err(p['host_min'] + o, p['ms'])}) |")
    return lines


def coupled_report(nets) -> list:
    """Markdown lines: the per-step coupling of host and device against the per-iteration max,
    where Algorithm 2 was run again with a host model."""
    rows = []
    for n in nets:
        rp = n.get("replan") or {}
        cp = rp.get("coupled")
        if not cp:
            continue
        for p in sorted(n["points"], key=lambda p: (p["plan"], p["k"])):
            c = cp.get(p["k"])
            if c is None:
                continue
            o = p["new"] - p["old"]
            rows.append(f"| {label(n['name'])} | {p['k']} | {p['plan']} | {p['ms']:.1f} | "
                        f"{c['device_ms']:.1f} | {c['host_ms']:.1f} | "
                        f"{p['floor']:.1f} ({_err(p['floor'], p['ms'])}) | "
                        f"{c['coupled_ms'] + o:.1f} ({_err(c['coupled_ms'] + o, p['ms'])}) |")
    if not rows:
        return []
    return ["", "## A finer form, for comparison (not in the model)", "",
            ("Per step instead of per iteration: the host issues the steps back to back and the "
             "device ends step j no earlier than the host has issued it "
             "(`model_overhead.coupled`; stall-free device step times, no launch-queue limit). "
             "It adds where host and device are close. The model keeps the per-iteration max: "
             "the finer form needs the host's time between steps and the queue's depth, which "
             "the profile does not record, and it is not better on every point below."), "",
            ("| net | k | plan | measured ms | device steps ms | H(k) ms | max + O(k) ms "
             "(the model) | coupled + O(k) ms |"),
            "|---|---|---|---|---|---|---|---|"] + rows


def report(res: dict, command: str) -> str:
    """The markdown report of :func:`analyse`'s result."""
    nets = res["nets"]
    devices = sorted({n["device"] for n in nets})
    dates = sorted({n["date"][:10] for n in nets if n.get("date")})
    lines = [
        "# The time outside the layer steps and the host's issue time: predicted iteration "
        "against measured",
        "",
        (f"`{command}`, {datetime.date.today().isoformat()}, on the CPU. Profiles and "
         f"measurements from {', '.join(devices)} ({', '.join(dates)}; the tuner table's runs, "
         "each file named below). Nothing is measured by this script: measured values are "
         "the runs' own, only the predictions are computed again."),
        "",
        ("O(k) = a + b k is :class:`swap.model.IterationOverhead`, fitted per profile: at each "
         "profiled k (naive plan), the head (pass start to first step), the gaps between steps "
         "(mean gap over the boundaries in which no transfer ended, the others may be waits for a "
         "prefetch, times the number of boundaries), the tail (last step's end to the pass's end) "
         "and, where the profile has solver-step marks, the time before the pass and the solver "
         "update after it. The steps' compute is eq. (2)'s sum as profiled; the steps' host time "
         "is the sum of what the host took to issue them (`-` where the profile does not record "
         "it); the host model built on it is in the section after this one."),
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
    lines += host_report(nets)
    lines += [
        "",
        "## Predicted against measured",
        "",
        ("`dynamic`: the tuner's plan at k; eq. 2 + stalls = its predicted ms in the run (less "
         "O(k) where the run's prediction held it). `none`: no swapping at the same k (chunked "
         "im2col); eq. 2 = the compute alone. Before = + O(k), what the tuner predicted until "
         "the host model; after = max(eq. 2 + stalls, H(k)) + O(k), what it predicts now where "
         "the profile has host times (`-`: no host times for this network; after = before). "
         "Bound: which side sets the prediction after. Residual = measured - after."),
        "",
        ("| net | k | plan | measured ms | eq. 2 + stalls ms | before: + O(k) ms | H(k) ms | "
         "after: max(., H) + O(k) ms | bound | error eq. 2 | error before | error after | "
         "residual ms |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in nets:
        for p in sorted(n["points"], key=lambda p: (p["plan"], p["k"])):
            star = " (k*)" if p["k_star"] and p["plan"] == "dynamic" else ""
            host = "-" if p["host"] is None else f"{p['host']:.1f}"
            lines.append(
                f"| {label(n['name'])} | {p['k']}{star} | {p['plan']} | {p['ms']:.1f} | "
                f"{p['old']:.1f} | {p['new']:.1f} | {host} | {p['floor']:.1f} | {p['bound']} | "
                f"{_err(p['old'], p['ms'])} | {_err(p['new'], p['ms'])} | "
                f"{_err(p['floor'], p['ms'])} | {p['ms'] - p['floor']:.1f} |")
    marked = [n for n in nets if n["marks"]]
    lines += ["", "## Per network", "",
              f"Profiles with solver-step marks: {len(marked)} of {len(nets)}"
              + (" (" + ", ".join(n["profile"] for n in marked) + ")" if marked else "")
              + ". Without them O(k) holds the gaps between steps and the pass's own head and "
              "tail, not the solver update.", ""]
    for n in nets:
        name = label(n["name"])
        if not n["points"]:
            lines.append(f"- {name} ({n['profile']}): O = "
                         f"{1e3 * n['a']:.3f} ms + {1e6 * n['b']:.3f} us x k; no measured points.")
            continue
        pts = n["points"]

        def mean_err(key):
            return 100 * sum(abs(p[key] - p["ms"]) / p["ms"] for p in pts) / len(pts)
        text = (f"- {name} ({n['profile']}, {n['result']}): O(k) = "
                f"{1e3 * n['a']:.3f} ms + {1e6 * n['b']:.3f} us x k. Mean |error| "
                f"{mean_err('old'):.1f} % (eq. 2) -> {mean_err('new'):.1f} % (+ O) -> "
                f"{mean_err('floor'):.1f} % (+ host floor).")
        if n.get("pred_had_overhead"):
            text += " The run's predictions held O(k); it is taken off for eq. 2 + stalls."
        if n.get("host"):
            h = n["host"]
            bound = [p for p in pts if p["bound"] == "host"]
            text += (f" Host model from {h['source']}: H(k) = {1e3 * h['intercept']:.1f} ms + "
                     f"{1e6 * h['slope']:.1f} us x k; host-bound at "
                     + (", ".join(f"{p['plan']} {p['k']} ({_err(p['new'], p['ms'])} -> "
                                  f"{_err(p['floor'], p['ms'])})" for p in bound)
                        if bound else "no measured point") + ".")
        else:
            text += " No host times: predictions unchanged."
        rp = n.get("replan")
        if rp and "error" in rp:
            text += f" Algorithm 2 again: failed ({rp['error']})."
        elif rp:
            o, w = rp["old"], rp["new"]
            text += (f" Algorithm 2 again on the CPU (k_max {rp['k_max']}): k* {o['k_star']} "
                     f"without O, {w['k_star']} with it")
            if "host" in rp:
                x = rp["host"]
                text += (f", {x['k_star']} with O and the host floor (H(k*) "
                         f"{x['host_ms']:.1f} ms against the timeline's "
                         f"{x['timeline_ms']:.1f} ms)")
            text += (f" (the run's k*: {rp['k_star_run']}); predicted {o['ms']:.1f} -> "
                     f"{w['ms']:.1f}" + (f" -> {rp['host']['ms']:.1f}" if "host" in rp else "")
                     + " ms at k*.")
        lines.append(text)
    lines += coupled_report(nets)
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
