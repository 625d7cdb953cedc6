#!/usr/bin/env python3
"""The overhead of AccUDNN per network (the paper's section 6.F): static analysis, profiling and
the tuner's decision.

* **Static analysis** is timed here, on this machine's CPU (it never touches a device): building
  the net's GMAP (:func:`swap.gmap.build_gmap`, the ordered steps and every buffer) at the
  paper's minibatch, after the net itself is built (net construction is timed beside it, since
  any framework pays it).  Median of ``--repeat`` runs.
* **Profiling** and **decision** come from the tuner table's JSONs (``docs/results/tuner``):
  ``tuner.seconds`` is the whole tuner (profiling iterations that still train, then Algorithm
  2); ``tuner.decision_seconds`` is Algorithm 2 alone, timed again on the same profile.
  Profiling = the first less the second.  Those were measured on the GPU host, whose CPU differs
  from this one; the table names both.

    python3 scripts/overhead.py                  # the 7 networks
    python3 scripts/overhead.py --quick --out-dir /tmp/oh     # two small nets (the test)

Writes ``<out-dir>/overhead.{csv,md,png}``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

DEFAULT_NETS = ("alexnet:256,googlenet:128,vgg16:64,resnet34:128,resnet50:64,resnet101:32,"
                "resnet152:32")
QUICK_NETS = "digits:64,cifar10_quick:100"
NAMES = {"alexnet": "AlexNet", "googlenet": "GoogLeNet", "vgg16": "VGG-16",
         "resnet34": "ResNet-34", "resnet50": "ResNet-50", "resnet101": "ResNet-101",
         "resnet152": "ResNet-152"}


def static_analysis(name: str, k: int, repeat: int) -> dict:
    """Seconds to build the net (CPU) and its GMAP at minibatch k (medians), and the GMAP's
    size."""
    from minicaffe.net import Net
    from minicaffe.proto.caffe_pb2 import TRAIN
    from scripts.fig1_memory import net_param
    from swap.gmap import build_gmap
    param = net_param(name, k)
    t_net, t_gmap, g = [], [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        net = Net(param, TRAIN, mode="CPU")
        t1 = time.perf_counter()
        g = build_gmap(net)
        t2 = time.perf_counter()
        t_net.append(t1 - t0)
        t_gmap.append(t2 - t1)
    return {"net_s": statistics.median(t_net), "gmap_s": statistics.median(t_gmap),
            "steps": len(g.steps), "buffers": len(g.buffers)}


def tuner_seconds(tuner_dir: str, name: str) -> dict:
    """(whole tuner, decision alone, device) from the tuner table's JSON of ``name``; {} if none."""
    path = os.path.join(tuner_dir, f"{name}.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        r = json.load(f)
    t = r.get("tuner") or {}
    if "seconds" not in t:
        return {}
    return {"tuner_s": float(t["seconds"]), "decision_s": float(t.get("decision_seconds", 0.0)),
            "tuner_device": r.get("device", ""), "tuner_date": r.get("date", ""),
            "profiled_ks": t.get("profiled_ks", [])}


def tuner_seconds_from_csv(csv_paths, name: str) -> dict:
    """The same from a tuner table's CSV row (a run whose JSON was not kept), or {}."""
    for path in csv_paths:
        if not os.path.exists(path):
            continue
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r.get("net") == name and r.get("tuner_s"):
                    return {"tuner_s": float(r["tuner_s"]),
                            "decision_s": float(r.get("decision_s") or 0.0),
                            "tuner_device": f"{os.path.basename(path)} (no JSON kept)",
                            "tuner_date": "", "source": os.path.relpath(path, REPO)}
    return {}


def measure(nets, tuner_dir: str, repeat: int, log=print, csv_paths=()) -> list:
    rows = []
    for name, k in nets:
        log(f"{name} at k = {k}: static analysis ...")
        row = {"net": name, "k": k, **static_analysis(name, k, repeat)}
        tu = tuner_seconds(tuner_dir, name) or tuner_seconds_from_csv(csv_paths, name)
        row.update(tu)
        if tu:
            row["profiling_s"] = tu["tuner_s"] - tu["decision_s"]
        rows.append(row)
    return rows


FIELDS = ("net", "k", "steps", "buffers", "net_s", "gmap_s", "profiling_s", "decision_s",
          "tuner_s", "tuner_device", "tuner_date", "profiled_ks")


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in FIELDS})


def _f(x, spec):
    return "-" if x is None or x == "" else format(x, spec)


def write_md(rows, path, command, date) -> str:
    here = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    lines = [f"Overhead of AccUDNN per network (`{command}`, {date}). Static analysis: this "
             f"machine's CPU ({here}), median of the repeats. Profiling and decision: the tuner "
             "table's runs (device and date per row).", "",
             "| net | k | steps | buffers | build net s | static analysis (GMAP) s | profiling s "
             "(iterations that still train) | decision s (Algorithm 2) | tuner device, date |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {NAMES.get(r['net'], r['net'])} | {r['k']} | {r['steps']} | "
                     f"{r['buffers']} | {r['net_s']:.3f} | {r['gmap_s']:.3f} | "
                     f"{_f(r.get('profiling_s'), '.0f')} | {_f(r.get('decision_s'), '.1f')} | "
                     f"{r.get('tuner_device') or '-'}, {r.get('tuner_date') or '-'} |")
    lines += ["", "The paper: static analysis is a graph walk, profiling iterations still train, "
              "Algorithm 2 is O(N^2), a few hundred seconds in all."]
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [NAMES.get(r["net"], r["net"]) for r in rows]
    parts = (("static analysis (GMAP)", "gmap_s"), ("profiling", "profiling_s"),
             ("decision (Algorithm 2)", "decision_s"))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    bottom = [0.0] * len(rows)
    for label, key in parts:
        vals = [float(r.get(key) or 0.0) for r in rows]
        ax.bar(names, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("seconds")
    ax.set_title("AccUDNN's one-off overhead per network")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=None, help=f"name:k,... (default {DEFAULT_NETS})")
    ap.add_argument("--tuner-dir", default=os.path.join(REPO, "docs", "results", "tuner"))
    ap.add_argument("--tuner-csv", default=os.path.join(REPO, "docs", "results",
                                                     "tuner_table_run1.csv"),
                    help="comma-separated tuner-table CSVs for networks without a JSON")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="two small nets (the test suite)")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "docs", "results"))
    args = ap.parse_args(argv)
    spec = args.nets or (QUICK_NETS if args.quick else DEFAULT_NETS)
    nets = [(n, int(k)) for n, k in (s.split(":") for s in spec.split(",") if s.strip())]
    rows = measure(nets, args.tuner_dir, args.repeat,
                   log=lambda m: print(m, file=sys.stderr, flush=True),
                   csv_paths=[p for p in args.tuner_csv.split(",") if p])
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, "overhead")
    write_csv(rows, base + ".csv")
    command = "python3 scripts/overhead.py" + "".join(f" {a}" for a in argv)
    print(write_md(rows, base + ".md", command, time.strftime("%Y-%m-%d")))
    plot(rows, base + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
