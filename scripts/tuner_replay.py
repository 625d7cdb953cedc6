#!/usr/bin/env python3
"""Issue 5: the measured points of ``tuner_table.py`` runs predicted again with today's
iteration formula (``swap.model.iteration_time``) and a constant host issue time.

For each point of each run JSON: the predicted device time that the run recorded
(``pred_device_ms``), H = the least of the run's small-k host sums (``HostModel`` method
"issue"), O(k) and its device tail from the profile the run used.  A re-analysis of saved
measurements: nothing is run on a device.

    python3 scripts/tuner_replay.py docs/results/tuner_s8/c2_*.json \
        --profiles resnet50=docs/results/tuner_s7/resnet50_profile.json,...
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def replay(run: dict, overhead) -> list:
    """Rows (k, measured ms, predicted ms, error, H ms, O ms, none ms, dynamic/none) of one
    run; ``overhead``: the profile's :class:`swap.model.IterationOverhead`."""
    from swap.model import iteration_time
    hm = (run.get("tuner") or {}).get("host_model") or {}
    sums = hm.get("meta") or []
    if not sums:
        raise ValueError(f"{run.get('net')}: the run recorded no small-k host sums")
    host = min(float(m["host"]) for m in sums)
    rows = []
    for p in run.get("dynamic", []):
        if "pred_device_ms" not in p:
            continue
        k = int(p["k"])
        pred = 1e3 * iteration_time(p["pred_device_ms"] / 1e3, host, overhead(k), overhead.tail)
        rows.append({"net": run["net"], "k": k, "ms": p["ms"], "pred_ms": pred,
                     "err": (pred - p["ms"]) / p["ms"], "host_ms": 1e3 * host,
                     "o_ms": 1e3 * overhead(k), "none_ms": p.get("none_ms"),
                     "slowdown": p.get("slowdown")})
    return rows


def main(argv=None) -> int:
    from swap.model import IterationOverhead
    from swap.profiler import Profile
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="tuner_table per-network JSON files")
    ap.add_argument("--profiles", required=True, help="net=profile.json,... (the runs' profiles)")
    args = ap.parse_args(argv)
    paths = dict(x.split("=", 1) for x in args.profiles.split(",") if x)
    cache = {}
    print("| run | net | k | measured ms | predicted ms | error | H ms | O(k) ms | none ms | "
          "dynamic/none |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in args.runs:
        with open(path) as f:
            run = json.load(f)
        net = run["net"]
        if net not in paths:
            raise SystemExit(f"{path}: no profile given for {net!r} (--profiles {net}=...)")
        if net not in cache:
            cache[net] = IterationOverhead.from_profile(Profile.load(paths[net]))
        for r in replay(run, cache[net]):
            none = f"{r['none_ms']:.1f}" if r["none_ms"] else "-"
            slow = f"{r['slowdown']:.3f}" if r["slowdown"] else "-"
            print(f"| {os.path.basename(path)} | {net} | {r['k']} | {r['ms']:.1f} | "
                  f"{r['pred_ms']:.1f} | {100 * r['err']:+.1f} % | {r['host_ms']:.1f} | "
                  f"{r['o_ms']:.1f} | {none} | {slow} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
