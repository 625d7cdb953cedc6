#!/usr/bin/env python3
"""Session 26, CPU: the compute model below the smallest profiled k, two rules, replayed on
every saved tuner_table run whose profile is saved beside it.

For each measured point that kept every feature map (nothing offloaded, so the prediction is
the step curves' sum plus the time outside the steps) at a k below the run's smallest
profiled k: the prediction with the whole-range curve scaled to meet the first profiled point
(the rule before session 26) and with the first segment extended
(``swap.model.below_first_knot``, the rule now), against the measured iteration.  Nothing runs
on a device.

    python3 docs/results/tuner_s26/extrapolation.py > docs/results/tuner_s26/extrapolation.txt
"""
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
sys.path.insert(0, REPO)

from swap import model as M  # noqa: E402
from scripts.tuner_table import saved_runs  # noqa: E402
from swap.profiler import Profile  # noqa: E402


def scaled(c, x):
    """The rule before session 26: the fitted curve scaled to meet the first knot."""
    if not c.knots or x >= c.knots[0][0]:
        return c.time(x)
    kx, kt = c.knots[0]
    return c._base(np.float64(x)) * (kt / c._base(np.float64(kx)))


def predict(model, profile, k, rule):
    first = {}
    for c in profile.compute:
        first.setdefault(c.step, c)
    steps = {s.step: s for s in profile.steps}
    dev = 0.0
    for j, c in first.items():
        x = c.flops * k / c.k
        curve = model.curve(steps[j])
        dev += scaled(curve, x) if rule == "scaled" else model.step_time(steps[j], x)
    return model.iteration(dev, k)


def main():
    print("run | k | smallest profiled k | measured ms | scaled curve ms (err) | "
          "extended segment ms (err)")
    for base, run, prof in saved_runs(os.path.join(REPO, "docs/results/tuner_s*/*_profile.json*")):
        try:
            p = Profile.load(prof)
            m = M.ComputeModel.from_profile(p, granularity=run.get("granularity", "segment"))
        except Exception as e:           # a profile of an older format
            print(f"{os.path.relpath(base, REPO)}: skipped ({type(e).__name__})")
            continue
        kmin = min(c.k for c in p.compute)
        for d in run["dynamic"]:
            if "ms" not in d or d.get("offload_fraction", 1) > 0 or d["k"] >= kmin:
                continue
            a = 1e3 * predict(m, p, d["k"], "scaled")
            b = 1e3 * predict(m, p, d["k"], "segment")
            print(f"{os.path.relpath(base, REPO)} | {d['k']} | {kmin} | {d['ms']:.1f} | "
                  f"{a:.1f} ({100 * (a / d['ms'] - 1):+.1f} %) | "
                  f"{b:.1f} ({100 * (b / d['ms'] - 1):+.1f} %)")


if __name__ == "__main__":
    main()
