#!/usr/bin/env python3
"""Session 27, CPU: GoogLeNet's Concat steps counted as 0 FLOPs, so the performance model
fitted each as a constant (its mean over the profiled k) while it takes time in proportion
to k.  Concat, Slice and Crop now count the elements they copy (minicaffe/layers/concat.py).
This replays every saved GoogLeNet tuner_table run whose profile is saved beside it, with the
profile's Concat samples as recorded (0) and with the elements copied at their k (from a
CPU-built GMAP at minibatch 1, times k), at each measured point that kept every feature map
(nothing offloaded: the prediction is the step curves' sum, the time outside the steps and
the host bound).  Nothing runs on a device.

    python3 docs/results/tuner_s27/concat.py > docs/results/tuner_s27/concat.txt
"""
import dataclasses
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

from scripts.swap_budgets import _solver  # noqa: E402
from swap import model as M  # noqa: E402
from swap.gmap import build_gmap  # noqa: E402
from scripts.tuner_table import kept_prediction, saved_runs  # noqa: E402
from swap.profiler import Profile  # noqa: E402

COPY_TYPES = ("Concat", "Slice", "Crop")


def per_image_work():
    """(layer, phase) -> elements copied per image, from GoogLeNet's GMAP at minibatch 1."""
    net = _solver("googlenet", 1, "CAFFE", "CPU").net
    g = build_gmap(net)
    return {(net.layers[s.layer].name, s.phase): s.flops for s in g.steps
            if s.type in COPY_TYPES}


def with_copy_work(p, work):
    steps = {s.step: s for s in p.steps}
    comp = []
    for c in p.compute:
        s = steps[c.step]
        if s.type in COPY_TYPES:
            c = dataclasses.replace(c, flops=work[(s.layer, s.phase)] * c.k)
        comp.append(c)
    return dataclasses.replace(p, compute=tuple(comp))


def main():
    work = per_image_work()
    print(f"Concat steps of GoogLeNet: {len(work)}; elements copied per image, forward: "
          f"{sum(v for (l, ph), v in work.items() if ph == 'forward'):.0f}")
    print("run | k | measured ms | 0 FLOPs ms (err) | elements copied ms (err)")
    for base, run, prof in saved_runs(os.path.join(REPO, "docs/results/tuner_s*/*googlenet_profile.json*")):
        try:
            p = Profile.load(prof)
            gran = run.get("granularity", "segment")
            old = M.ComputeModel.from_profile(p, granularity=gran)
            q = with_copy_work(p, work)
            new = M.ComputeModel.from_profile(q, granularity=gran)
        except Exception as e:           # a profile of an older format
            print(f"{os.path.relpath(base, REPO)}: skipped ({type(e).__name__}: {e})")
            continue
        for d in run["dynamic"]:
            if "ms" not in d or d.get("offload_fraction", 1) > 0:
                continue
            ms = d.get("ms_pooled", d["ms"])
            a = 1e3 * kept_prediction(old, p, d["k"])
            b = 1e3 * kept_prediction(new, q, d["k"])
            print(f"{os.path.relpath(base, REPO)} | {d['k']} | {ms:.1f} | "
                  f"{a:.1f} ({100 * (a / ms - 1):+.1f} %) | {b:.1f} ({100 * (b / ms - 1):+.1f} %)")


if __name__ == "__main__":
    main()
