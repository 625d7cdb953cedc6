#!/usr/bin/env python3
"""Plot one iteration of a ``--memory-trace`` CSV as the paper's Figure 11.

The paper (section 6, "GPU memory usage model") draws, for AlexNet at minibatch 256 in a 3 GB
budget, the memory taken by stream_swap-in (allocations and prefetches, cumulative) and given
back by stream_swap-out (releases, cumulative) over one iteration: the first rises steeply in
forward (allocations take microseconds), more slowly in backward (prefetches wait for the
copies); the second follows compute; their difference, the memory held, never exceeds the
budget (eq. 4).  This script draws the same curves from the executor's trace:

* top: cumulative bytes allocated (allocate + prefetch: the paper's swap-in curve) and
  released (release: the swap-out curve), with the bytes prefetched and offloaded as thinner
  lines, against the step times of the trace (CUDA events on the GPU), the forward/backward
  boundary dashed, and the largest difference marked;
* bottom: the bytes held (resident buffers included) against the budget.

Allocations are placed at the start of their step, releases at its end, as the executor
issues them.  Make the trace, then plot it::

    MINICAFFE_SCRATCH=768M python3 -m minicaffe train prototxt/alexnet/dummy.prototxt --gpu 0 \\
        --max-iter 3 --swap naive --budget 3G --memory-trace alexnet_3g.csv
    python3 scripts/plot_memory_trace.py alexnet_3g.csv -o figure11.png --budget 3G
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

INT_FIELDS = ("iteration", "step", "allocated_compute", "allocated_swap_in", "released_compute",
              "released_swap_out", "offloaded", "prefetched", "in_use", "high_water")


def read_trace(path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: the trace has no rows")
    for r in rows:
        for k in INT_FIELDS:
            r[k] = int(r[k])
        r["t_start_ms"] = float(r["t_start_ms"])
        r["t_end_ms"] = float(r["t_end_ms"])
    return rows


def pick_iteration(rows, iteration=None) -> list[dict]:
    """The rows of one iteration: ``iteration``, or the last complete training iteration (the
    most steps; forward-only passes have fewer)."""
    by = {}
    for r in rows:
        by.setdefault(r["iteration"], []).append(r)
    if iteration is not None:
        if iteration not in by:
            raise ValueError(f"the trace has no iteration {iteration} "
                             f"(it has {min(by)}..{max(by)})")
        return by[iteration]
    full = max(len(v) for v in by.values())
    return by[max(i for i, v in by.items() if len(v) == full)]


def curves(rows) -> dict:
    """Step functions of one iteration (times in ms from its start, bytes)."""
    t0 = rows[0]["t_start_ms"]
    t, alloc, rel, pre, off, held = [], [], [], [], [], []
    a = r_ = p = o = 0
    resident = rows[0]["in_use"] - rows[0]["allocated_compute"] - rows[0]["allocated_swap_in"] \
        + rows[0]["released_compute"] + rows[0]["released_swap_out"]
    for r in rows:
        # before the step: allocations and prefetches
        a += r["allocated_compute"] + r["allocated_swap_in"]
        p += r["prefetched"]
        t.append(r["t_start_ms"] - t0)
        alloc.append(a), rel.append(r_), pre.append(p), off.append(o)
        held.append(resident + a - r_)
        # after it: releases and offloads
        r_ += r["released_compute"] + r["released_swap_out"]
        o += r["offloaded"]
        t.append(r["t_end_ms"] - t0)
        alloc.append(a), rel.append(r_), pre.append(p), off.append(o)
        held.append(resident + a - r_)
    backward = next((r["t_start_ms"] - t0 for r in rows if r["phase"] == "backward"), None)
    return {"t": t, "allocated": alloc, "released": rel, "prefetched": pre, "offloaded": off,
            "held": held, "resident": resident, "backward_ms": backward,
            "high_water": max(r["high_water"] for r in rows)}


def plot(rows, out, budget=None, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    c = curves(rows)
    top = max(c["allocated"][-1], c["high_water"], budget or 0)
    unit, gib = ("GiB", 2.0 ** 30) if top >= 2 ** 30 else ("MiB", 2.0 ** 20)
    t = c["t"]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 2]})
    ax.step(t, [v / gib for v in c["allocated"]], where="post", lw=2, color="tab:blue",
            label="swap-in stream: allocated + prefetched (cumulative)")
    ax.step(t, [v / gib for v in c["released"]], where="post", lw=2, color="tab:red",
            label="swap-out stream: released (cumulative)")
    if c["prefetched"][-1]:
        ax.step(t, [v / gib for v in c["prefetched"]], where="post", lw=1, ls=":",
                color="tab:blue", label="of which prefetched")
    if c["offloaded"][-1]:
        ax.step(t, [v / gib for v in c["offloaded"]], where="post", lw=1, ls=":",
                color="tab:red", label="offloaded")
    diff = [x - y for x, y in zip(c["allocated"], c["released"])]
    k = max(range(len(diff)), key=diff.__getitem__)
    ax.annotate("", xy=(t[k], c["allocated"][k] / gib), xytext=(t[k], c["released"][k] / gib),
                arrowprops=dict(arrowstyle="<->", ls="--", color="k"))
    ax.text(t[k], (c["allocated"][k] + c["released"][k]) / 2 / gib,
            f"  {diff[k] / gib:.2f} {unit}", va="center", fontsize=8)
    ax.set_ylabel(unit)
    ax.legend(loc="upper left", fontsize=8)
    bx.step(t, [v / gib for v in c["held"]], where="post", color="tab:purple",
            label="held (resident + per-iteration)")
    bx.axhline(c["high_water"] / gib, color="tab:gray", lw=1, ls="-.",
               label=f"arena high-water mark {c['high_water'] / gib:.2f} {unit}")
    if budget:
        bx.axhline(budget / gib, color="k", lw=1.5, label=f"budget {budget / gib:.2f} {unit}")
    bx.set_ylabel(unit)
    bx.set_xlabel("time in the iteration (ms)")
    bx.legend(loc="upper left", fontsize=8)
    for axis in (ax, bx):
        if c["backward_ms"] is not None:
            axis.axvline(c["backward_ms"], color="k", lw=0.8, ls="--")
        axis.grid(alpha=0.3)
    if c["backward_ms"] is not None:
        ax.text(c["backward_ms"], ax.get_ylim()[1], " backward", va="top", fontsize=8)
    it = rows[0]["iteration"]
    fig.suptitle(title or f"GPU memory usage within one iteration (iteration {it})")
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(out))
    os.makedirs(d, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="CSV written by --memory-trace")
    ap.add_argument("-o", "--out", default=None, help="PNG (default: the trace's name .png)")
    ap.add_argument("--iteration", type=int, default=None,
                    help="which iteration (default: the last complete one)")
    ap.add_argument("--budget", default=None, help="draw the budget line (12G, 3072M, bytes)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    from swap.memory import fmt_bytes, parse_bytes
    budget = parse_bytes(args.budget) if args.budget else None
    rows = pick_iteration(read_trace(args.trace), args.iteration)
    out = args.out or os.path.splitext(args.trace)[0] + ".png"
    c = plot(rows, out, budget, args.title)
    peak = max(h for h in c["held"])
    print(f"{out}: iteration {rows[0]['iteration']}, {len(rows)} steps, "
          f"{c['t'][-1]:.1f} ms, peak held {fmt_bytes(peak)}, "
          f"high-water {fmt_bytes(c['high_water'])}"
          + (f", budget {fmt_bytes(budget)}" if budget else ""))
    if budget and peak > budget:
        print("warning: the bytes held passed the budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
