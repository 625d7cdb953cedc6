#!/usr/bin/env python3
"""Per-type against per-step throughput curves: where the predicted iteration leaves the
measured one, re-analysed on the CPU from the saved H200 profiles and runs (issue 5).

Nothing is measured here: every measured number is a run's own (``docs/results/tuner/*.json``,
``docs/results/tuner_table_run1.md``, ``docs/results/table3/*.json``), and only predictions are
computed again.  Per network with a saved profile (``<net>_profile.json`` or
``<net>_profile_host.json``) and its run's JSON:

1. **Where the per-type curve errs on its own profile.**  At the profiled k nearest the run's
   k*: per layer type and phase, the profiled sum of the steps, the per-type model's sum
   (:meth:`swap.model.ComputeModel.from_profile`, granularity "type": the runs' model), the
   range of its error over the single steps of the type, and the per-step model's sum
   (granularity "step", available, not the tuner's default); the single steps the per-type
   curve misses most, with their FLOP/s (what cancels in a type's sum).  Whether k* lies
   inside the profiled ks (extrapolation), and the profiled time per image at each k (a line
   through the origin is flat).
2. **Held out on the profile** (:func:`swap.model.leave_one_out`): each profiled k predicted by
   the curves fitted to the other four, per type and per step.
3. **Held out on the runs**: every measured iteration of the run that took the profile
   (never part of a fit), predicted as the tuner does: device (eq. 2 through the curves, plus
   the stalls of the run's plan as the run predicted them) then the host floor where the
   profile family has host times, plus O(k): ``max(device, H(k)) + O(k)``.  Before = per-type
   curves (the prediction of ``scripts/model_overhead.py``), after = per-step curves.  Each
   point says when it was measured (``none`` chunked at Caffe's k: before profiling; the
   others after it) and the spread (max - min) / median of its timed iterations.
4. **Other runs of the same network** (run 1 of the tuner table, Table 3's runs), whose
   profiles were not saved: the iteration measured there against this profile's models
   (compute, O(k) and host floor; the plan's stalls, at most 1.6 ms in the saved runs, are left
   out), beside the prediction those runs made from their own profiles.
5. ``--replan`` (default): Algorithm 2 again on the CPU with either model (O(k) and the host
   floor included as in the tuner): k* and its predicted iteration.

    python3 scripts/model_refit.py               # the committed H200 results, 3 to 6 minutes
    python3 scripts/model_refit.py --no-replan   # the tables alone, about 15 s
    python3 scripts/model_refit.py --tuner-dir docs/results/tuner_s5 --run1 '' \\
        --table3-dir '' --out docs/results/model_refit_s5.md   # session 5's runs alone, 30 s

Writes ``--out`` (default ``docs/results/model_refit.md``) and prints it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
RESULTS = os.path.join(REPO, "docs", "results")
STEADY = 0.05          # a point whose timed iterations spread more than this is "unsteady"

from scripts.model_overhead import (
    NAMES,
    _rel,
    _result_file,
    compute_alone,
    host_model_for,
    label,
    pred_has_overhead,
    replan,
)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def _abs(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def spread(times) -> float | None:
    """(max - min) / median of a point's timed iterations (None without them)."""
    if not times:
        return None
    return (max(times) - min(times)) / statistics.median(times)


def models_of(profile) -> dict:
    """The per-type (the runs', the tuner's default) and per-step compute models of a profile,
    with O(k), without the host model (added per point)."""
    from swap.model import ComputeModel
    return {g: ComputeModel.from_profile(profile, granularity=g, host=False)
            for g in ("type", "step")}


def type_errors(profile, models, k: int) -> list:
    """Per (type, phase) at the profiled ``k``: dicts with measured and predicted seconds of the
    type's steps (both models), its share of the step sum, and the smallest and largest error
    of the per-type model over its single steps."""
    steps = {s.step: s for s in profile.steps}
    rows: dict = {}
    for c in profile.compute:
        if c.k != k:
            continue
        s = steps[c.step]
        r = rows.setdefault((s.type, s.phase), {"type": s.type, "phase": s.phase,
                                                "measured": 0.0, "type_fit": 0.0,
                                                "step_fit": 0.0, "lo": None, "hi": None,
                                                "steps": 0})
        t_type = models["type"].step_time(s, c.flops)
        r["measured"] += c.time
        r["type_fit"] += t_type
        r["step_fit"] += models["step"].step_time(s, c.flops)
        r["steps"] += 1
        e = (t_type - c.time) / c.time if c.time > 0 else 0.0
        r["lo"] = e if r["lo"] is None else min(r["lo"], e)
        r["hi"] = e if r["hi"] is None else max(r["hi"], e)
    total = sum(r["measured"] for r in rows.values())
    for r in rows.values():
        r["share"] = r["measured"] / total
    return sorted(rows.values(), key=lambda r: -r["measured"])


def step_misses(profile, models, k: int, n: int = 6) -> dict:
    """The single steps behind the per-type sum at the profiled ``k``: the ``n`` largest
    misses of the per-type curve (profiled seconds, per-type seconds, their FLOP/s) and the
    sums of all its misses below and above the profile (what cancels in the type's sum)."""
    steps = {s.step: s for s in profile.steps}
    rows = []
    for c in profile.compute:
        if c.k != k or c.time <= 0:
            continue
        s = steps[c.step]
        t = models["type"].step_time(s, c.flops)
        rows.append({"name": s.name, "type": s.type, "phase": s.phase, "measured": c.time,
                     "type_fit": t, "miss": t - c.time, "flops": c.flops})
    # several timed iterations of one step at k: their mean
    merged: dict = {}
    for r in rows:
        m = merged.setdefault((r["name"], r["phase"]), dict(r, measured=0.0, type_fit=0.0,
                                                             miss=0.0, n=0))
        for key in ("measured", "type_fit", "miss"):
            m[key] += r[key]
        m["n"] += 1
    out = []
    for m in merged.values():
        for key in ("measured", "type_fit", "miss"):
            m[key] /= m["n"]
        out.append(m)
    return {"worst": sorted(out, key=lambda r: -abs(r["miss"]))[:n],
            "below": sum(r["miss"] for r in out if r["miss"] < 0),
            "above": sum(r["miss"] for r in out if r["miss"] > 0)}


def per_image(profile) -> list:
    """(k, profiled step sum / k in seconds) per profiled k (the mean over iterations at k)."""
    import numpy as np
    return [(k, float(np.nansum(profile.step_times(k))) / k) for k in profile.ks]


def run_points(result: dict, profile, models, hm) -> list:
    """Every measured iteration of the run that took the profile, predicted both ways (module
    doc, 3)."""
    with_o = pred_has_overhead(result)
    typ, step = models["type"], models["step"]
    oh = typ.overhead                       # O(k) does not depend on the curves' granularity
    k_star = (result.get("tuner") or {}).get("k_star")
    pts = []

    def add(k, plan, ms, times, when, device_type):
        c_type = 1e3 * compute_alone(typ, profile, k)
        stall = max(device_type - c_type, 0.0)
        c_step = 1e3 * compute_alone(step, profile, k)
        o = 0.0 if oh is None else 1e3 * oh(k)
        h = None if hm is None else 1e3 * hm(k)
        before = max(device_type, h or 0.0) + o
        after = max(c_step + stall, h or 0.0) + o
        pts.append({"k": k, "plan": plan, "ms": ms, "spread": spread(times), "when": when,
                    "k_star": plan == "dynamic" and k == k_star, "stall": stall,
                    "host": h, "o": o, "before": before, "after": after,
                    "err_before": (before - ms) / ms, "err_after": (after - ms) / ms,
                    "bound": "host" if h is not None and h > c_step + stall else "device"})
    nc = result.get("none_chunked") or {}
    if "ms" in nc:
        k = int(nc["k"])
        add(k, "none", float(nc["ms"]), nc.get("times"), "before profiling",
            1e3 * compute_alone(typ, profile, k))
    for i, d in enumerate(result.get("dynamic", [])):
        if "ms" not in d:
            continue
        k = int(d["k"])
        dev = float(d["pred_ms"]) - (1e3 * typ.overhead_at(k) if with_o else 0.0)
        add(k, "dynamic", float(d["ms"]), d.get("times"), f"after profiling ({i + 1})", dev)
        if d.get("none_ms") is not None:
            old = d.get("pred_compute_ms")
            old = float(old) if old is not None else 1e3 * compute_alone(typ, profile, k)
            add(k, "none", float(d["none_ms"]), None, f"after profiling ({i + 1})", old)
    return pts


# ------------------------------------------------------------------ other runs
def run1_points(path: str) -> dict:
    """The model-error table of ``tuner_table_run1.md`` (the first tuner-table run, whose
    profiles were not saved): net -> [(k, plan, measured ms, that run's predicted ms), ...]."""
    out: dict = {}
    if not os.path.exists(path):
        return out
    header = None
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| net | k | measured ms"):
                header = cells
                continue
            if header is None or not line.startswith("|") or set(line.strip()) <= set("|-"):
                if header is not None and not line.startswith("|"):
                    header = None
                continue
            row = dict(zip(header, cells))
            try:
                k, ms, pred = int(row["k"]), float(row["measured ms"]), float(row["predicted ms"])
            except (KeyError, ValueError):
                continue                    # a failed point
            pts = out.setdefault(row["net"], [])
            pts.append((k, "dynamic", ms, pred))
            none = row.get("none ms", "-")
            if none not in ("-", ""):
                pts.append((k, "none", float(none), None))
    return out


def table3_points(directory: str) -> dict:
    """Table 3's measured AccUDNN iterations (``table3/<net>.json``; profiles not saved):
    net -> [(k, plan, measured ms, that run's predicted ms, spread), ...]."""
    out: dict = {}
    if not os.path.isdir(directory):
        return out
    for f in sorted(os.listdir(directory)):
        if not f.endswith(".json"):
            continue
        with open(os.path.join(directory, f)) as fh:
            d = json.load(fh)
        pts = []
        a = d.get("accudnn") or {}
        if "ms" in a:
            pts.append((int(a["k"]), "dynamic", float(a["ms"]), a.get("pred_ms"),
                        spread(a.get("times"))))
        dyn = (d.get("fixed") or {}).get("dynamic") or {}
        if "ms" in dyn:
            pts.append((int(dyn["k"]), "dynamic", float(dyn["ms"]), dyn.get("pred_ms"),
                        spread(dyn.get("times"))))
        if pts:
            out[d.get("net", f[:-5])] = pts
    return out


def other_points(name: str, profile, models, hm, run1: dict, t3: dict) -> list:
    """Module doc, 4: the other runs' iterations against this profile's models."""
    typ, step = models["type"], models["step"]
    oh = typ.overhead
    rows = []
    src = [("tuner table run 1", k, plan, ms, pred, None) for k, plan, ms, pred in
           run1.get(name, [])]
    src += [("Table 3", k, plan, ms, pred, sp) for k, plan, ms, pred, sp in t3.get(name, [])]
    for run, k, plan, ms, pred, sp in src:
        o = 0.0 if oh is None else 1e3 * oh(k)
        h = 0.0 if hm is None else 1e3 * hm(k)
        before = max(1e3 * compute_alone(typ, profile, k), h) + o
        after = max(1e3 * compute_alone(step, profile, k), h) + o
        rows.append({"run": run, "k": k, "plan": plan, "ms": ms, "own_pred": pred,
                     "spread": sp, "before": before, "after": after,
                     "err_before": (before - ms) / ms, "err_after": (after - ms) / ms})
    return rows


# ------------------------------------------------------------------ analysis
def analyse(tuner_dir: str, run1_path: str, table3_dir: str, do_replan: bool = True,
            log=print) -> dict:
    from swap.model import leave_one_out
    from swap.profiler import Profile
    files = sorted(os.listdir(tuner_dir))
    paths = [(f[:-len("_profile.json")], os.path.join(tuner_dir, f)) for f in files
             if f.endswith("_profile.json")]
    paths += [(f[:-len("_profile_host.json")] + "_host", os.path.join(tuner_dir, f))
              for f in files if f.endswith("_profile_host.json")]
    run1, t3 = run1_points(run1_path), table3_points(table3_dir)
    nets = []
    for name, ppath in paths:
        rpath = _result_file(tuner_dir, name)
        if rpath is None:
            continue
        with open(rpath) as f:
            result = json.load(f)
        prof = Profile.load(ppath)
        base = name.removesuffix("_host")
        hm, hsrc = host_model_for(base, prof, ppath, tuner_dir)
        models = models_of(prof)
        k_star = (result.get("tuner") or {}).get("k_star")
        near = min(prof.ks, key=lambda k: abs(k - (k_star or prof.ks[-1])))
        entry = {"name": name, "net": prof.net, "profile": _rel(ppath), "result": _rel(rpath),
                 "ks": list(prof.ks), "k_star": k_star, "near": near,
                 "host_from": None if hsrc is None else _rel(hsrc),
                 "types": type_errors(prof, models, near), "per_image": per_image(prof),
                 "misses": step_misses(prof, models, near),
                 "loo": {g: leave_one_out(prof, g) for g in ("type", "step")},
                 "points": run_points(result, prof, models, hm),
                 "other": [] if name.endswith("_host") else other_points(base, prof, models,
                                                                          hm, run1, t3),
                 "replan": None}
        if do_replan:
            log(f"{name}: Algorithm 2 again on the CPU, per type and per step ...")
            try:
                rp = {}
                for g in ("type", "step"):
                    r = replan(base, result, prof, hm, (), granularity=g)
                    rp[g] = r["host" if hm is not None else "new"]
                    rp["k_max"] = r["k_max"]
                entry["replan"] = rp
            except Exception as e:                    # reported; the tables still come out
                entry["replan"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        nets.append(entry)
    # networks measured without a saved profile
    profiled = {n["name"] for n in nets}
    missing = {}
    for name in sorted(set(run1) | set(t3)):
        if name not in profiled:
            missing[name] = {"run1": run1.get(name, []), "table3": t3.get(name, [])}
    return {"nets": nets, "missing": missing}


def _mean_abs(xs) -> float | None:
    xs = [abs(x) for x in xs]
    return sum(xs) / len(xs) if xs else None


def summary(n: dict) -> dict:
    """Errors before and after: at k* (the run's dynamic k*), and mean |error| over the run's
    other points, over all its points and over its steady points."""
    pts = n["points"]
    star = [p for p in pts if p["k_star"]]
    rest = [p for p in pts if not p["k_star"]]
    steady = [p for p in pts if p["spread"] is not None and p["spread"] <= STEADY]
    out = {}
    for tag in ("before", "after"):
        e = f"err_{tag}"
        out[tag] = {"k_star": star[0][e] if star else None,
                    "rest": _mean_abs(p[e] for p in rest),
                    "all": _mean_abs(p[e] for p in pts),
                    "steady": _mean_abs(p[e] for p in steady),
                    "other_runs": _mean_abs(p[e] for p in n["other"])}
    out["n"] = (len(pts), len(steady), len(n["other"]))
    return out


def report(res: dict, command: str) -> str:
    nets = res["nets"]
    L = ["# Per-type against per-step throughput curves: the model's error, re-analysed", "",
         (f"`{command}`, {datetime.date.today().isoformat()}, on the CPU (no GPU). Profiles and "
          "measurements: NVIDIA H200, 2026-11-21, the files named below. This is a "
          "re-analysis of saved data, not a new measurement: measured values are the runs' "
          "own; only the predictions are computed again. Before = per-type curves (the runs' "
          "model and the tuner's default, as `scripts/model_overhead.py` reports it); after = "
          "per-step curves (`granularity=\"step\"`). Both add the run's own "
          "predicted stalls, O(k) and, where the profile family has host times, the host "
          "floor."), ""]
    # ---- summary
    L += ["## Summary", "",
          ("| net | profile | profiled k | run's k* | k* in the profiled range | error at k* "
           "before / after | mean abs error, other points of the run, before / after | "
           "mean abs error, steady points (spread <= 5 %) | mean abs error, other runs | "
           "points (steady, other runs) |"),
          "|---|---|---|---|---|---|---|---|---|---|"]
    for n in nets:
        s = summary(n)
        b, a = s["before"], s["after"]
        lo, hi = n["ks"][0], n["ks"][-1]
        ks = n["k_star"]
        rng = ("-" if ks is None else "inside" if lo <= ks <= hi else
               f"below ({ks} < {lo})" if ks < lo else f"above ({ks} > {hi})")

        def pair(x, y, f=_abs):
            return f"{f(x)} / {f(y)}" if x is not None else "-"
        L.append(f"| {label(n['name'])} | {n['profile']} | {', '.join(map(str, n['ks']))} | "
                 f"{ks} | {rng} | {pair(b['k_star'], a['k_star'], _pct)} | "
                 f"{pair(b['rest'], a['rest'])} | {pair(b['steady'], a['steady'])} | "
                 f"{pair(b['other_runs'], a['other_runs'])} | {s['n'][0]} ({s['n'][1]}, "
                 f"{s['n'][2]}) |")
    for name, m in res["missing"].items():
        L.append(f"| {NAMES.get(name, name)} | not saved | - | - | - | the runs' own: "
                 + "; ".join(f"{k} {plan} {_pct((pred - ms) / ms)}" for k, plan, ms, pred, *_
                             in m["run1"] + m["table3"] if pred is not None)
                 + " | - | - | - | - |")
    # ---- 1. per type
    L += ["", "## 1. Where the per-type curve errs on its own profile", "",
          ("At the profiled k nearest the run's k*: the steps of each type and phase summed. "
           "`single steps` is the range of the per-type curve's error over the type's steps "
           "(the sum hides it where they cancel). Types under 1 % of the iteration are left "
           "out."), ""]
    for n in nets:
        L += [f"**{label(n['name'])}** ({n['profile']}), k = {n['near']} (k* {n['k_star']}); "
              "profiled time per image: "
              + ", ".join(f"{k}: {1e3 * t:.4f} ms" for k, t in n["per_image"]), "",
              "| type | phase | steps | share | profiled ms | per type ms | error | single "
              "steps | per step ms | error |", "|---|---|---|---|---|---|---|---|---|---|"]
        tot = {"measured": 0.0, "type_fit": 0.0, "step_fit": 0.0}
        for r in n["types"]:
            for key in tot:
                tot[key] += r[key]
            if r["share"] < 0.01:
                continue
            L.append(f"| {r['type']} | {r['phase']} | {r['steps']} | {100 * r['share']:.1f} % | "
                     f"{1e3 * r['measured']:.2f} | {1e3 * r['type_fit']:.2f} | "
                     f"{_pct((r['type_fit'] - r['measured']) / r['measured'])} | "
                     f"{_pct(r['lo'])} to {_pct(r['hi'])} | {1e3 * r['step_fit']:.2f} | "
                     f"{_pct((r['step_fit'] - r['measured']) / r['measured'])} |")
        L.append(f"| **all** | | | 100 % | {1e3 * tot['measured']:.1f} | "
                 f"{1e3 * tot['type_fit']:.1f} | "
                 f"{_pct((tot['type_fit'] - tot['measured']) / tot['measured'])} | | "
                 f"{1e3 * tot['step_fit']:.1f} | "
                 f"{_pct((tot['step_fit'] - tot['measured']) / tot['measured'])} |")
        m = n["misses"]
        L += ["", (f"Its largest single-step misses (all steps: {1e3 * m['below']:+.1f} ms below "
                   f"the profile, {1e3 * m['above']:+.1f} ms above):"), "",
              "| step | type | phase | profiled ms | TFLOP/s | per type ms | TFLOP/s | miss ms |",
              "|---|---|---|---|---|---|---|---|"]
        for r in m["worst"]:
            tf = ("-", "-") if r["flops"] <= 0 else (f"{r['flops'] / r['measured'] / 1e12:.1f}",
                                                     f"{r['flops'] / r['type_fit'] / 1e12:.1f}")
            L.append(f"| {r['name']} | {r['type']} | {r['phase']} | {1e3 * r['measured']:.2f} | "
                     f"{tf[0]} | {1e3 * r['type_fit']:.2f} | {tf[1]} | "
                     f"{1e3 * r['miss']:+.2f} |")
        L.append("")
    # ---- 2. leave one out
    L += ["## 2. Held out on the profile: each k predicted from the other four", "",
          ("`swap.model.leave_one_out`: eq. (2) at the held-out k against the profiled step "
           "sum. The first and last k are extrapolations."), "",
          "| net | curves | " + " | ".join(f"k{i + 1}" for i in range(5)) + " |",
          "|---|---|---|---|---|---|---|"]
    for n in nets:
        for g in ("type", "step"):
            cells = [f"{r['k']}: {_pct(r['error'])}" for r in n["loo"][g]]
            L.append(f"| {label(n['name'])} | per {g} | " + " | ".join(cells) + " |")
    # ---- 3. run points
    L += ["", "## 3. Held out on the runs: every measured iteration of the run that took the "
          "profile", "",
          ("Spread: (max - min) / median of the point's timed iterations (`-`: not recorded). "
           "Stall: the run's predicted stalls of its plan, kept in both predictions. Host: "
           "H(k) of `swap.model.HostModel` where the profile family has host times."), "",
          ("| net | k | plan | when | measured ms | spread | stall ms | H(k) ms | O(k) ms | "
           "before ms | error | after ms | error | bound after |"),
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in nets:
        for p in n["points"]:
            star = " (k*)" if p["k_star"] else ""
            sp = "-" if p["spread"] is None else f"{100 * p['spread']:.1f} %"
            host = "-" if p["host"] is None else f"{p['host']:.1f}"
            L.append(f"| {label(n['name'])} | {p['k']}{star} | {p['plan']} | {p['when']} | "
                     f"{p['ms']:.1f} | {sp} | {p['stall']:.2f} | {host} | "
                     f"{p['o']:.2f} | {p['before']:.1f} | {_pct(p['err_before'])} | "
                     f"{p['after']:.1f} | {_pct(p['err_after'])} | {p['bound']} |")
    # ---- 4. other runs
    L += ["", "## 4. Other runs of the same network against this profile's models", "",
          ("Their own profiles were not saved; the same code and device, other sessions. "
           "Predicted: compute (eq. 2), O(k) and the host floor from this profile; the plans' "
           "stalls are not included. `own` is what that run predicted from its own profile "
           "(per-type curves)."), "",
          ("| net | run | k | plan | measured ms | ms per image | spread | own prediction | "
           "before ms | error | after ms | error |"),
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in nets:
        for p in n["other"]:
            own = ("-" if p["own_pred"] is None else
                   f"{p['own_pred']:.1f} ({_pct((p['own_pred'] - p['ms']) / p['ms'])})")
            sp = "-" if p["spread"] is None else f"{100 * p['spread']:.1f} %"
            L.append(f"| {label(n['name'])} | {p['run']} | {p['k']} | {p['plan']} | "
                     f"{p['ms']:.1f} | {p['ms'] / p['k']:.4f} | {sp} | {own} | "
                     f"{p['before']:.1f} | {_pct(p['err_before'])} | {p['after']:.1f} | "
                     f"{_pct(p['err_after'])} |")
    for name, m in res["missing"].items():
        for run, pts in (("tuner table run 1", m["run1"]), ("Table 3", m["table3"])):
            for k, plan, ms, pred, *rest in pts:
                sp = rest[0] if rest else None
                sp = "-" if sp is None else f"{100 * sp:.1f} %"
                own = "-" if pred is None else f"{pred:.1f} ({_pct((pred - ms) / ms)})"
                L.append(f"| {NAMES.get(name, name)} | {run} | {k} | {plan} | {ms:.1f} | "
                         f"{ms / k:.4f} | {sp} | {own} | profile not saved | | | |")
    # ---- 5. replan
    L += ["", "## 5. Algorithm 2 again on the CPU, per type and per step", "",
          ("The network rebuilt on the CPU at its k_base, the run's budget and host bound, the "
           "scratch model from the profile's transients (as `scripts/model_overhead.py`); "
           "O(k) and the host floor included."), "",
          "| net | run's k* | k_max | k* per type | predicted ms | k* per step | predicted ms |",
          "|---|---|---|---|---|---|---|"]
    for n in nets:
        rp = n["replan"]
        if not rp:
            continue
        if "error" in rp:
            L.append(f"| {label(n['name'])} | {n['k_star']} | failed: {rp['error']} | | | | |")
            continue
        L.append(f"| {label(n['name'])} | {n['k_star']} | {rp['k_max']} | "
                 f"{rp['type']['k_star']} | {rp['type']['ms']:.1f} | {rp['step']['k_star']} | "
                 f"{rp['step']['ms']:.1f} |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tuner-dir", default=os.path.join(RESULTS, "tuner"))
    ap.add_argument("--run1", default=os.path.join(RESULTS, "tuner_table_run1.md"),
                    help="the first tuner-table run's report (its model-error table); '' skips it")
    ap.add_argument("--table3-dir", default=os.path.join(RESULTS, "table3"),
                    help="Table 3's run JSONs; '' skips them")
    ap.add_argument("--no-replan", dest="replan", action="store_false",
                    help="skip running Algorithm 2 again on the CPU")
    ap.add_argument("--out", default=os.path.join(RESULTS, "model_refit.md"))
    args = ap.parse_args(argv)
    res = analyse(args.tuner_dir, args.run1, args.table3_dir, args.replan,
                  log=lambda m: print(m, file=sys.stderr, flush=True))
    command = "python3 scripts/model_refit.py" + "".join(f" {shlex.quote(a)}" for a in argv)
    text = report(res, command)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
