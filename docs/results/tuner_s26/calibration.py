#!/usr/bin/env python3
"""Session 26, CPU: the copy calibration with and without the host-bound steps, on the six
profiles of this session's calls, and the points that kept every map predicted again.

"before": every step of the calibration enters the fit, and a calibration whose kept steps
sum to more than 1.05x the naive ones is not used (the rule of session 25, as the GPU runs
used it).  "now": ``swap.model.copy_slowdown`` (steps under 2x their host issue time left
out, at least 25 % of the naive step time left, no fit at the cap).  The predictions use
today's curves (``swap.model.below_first_knot`` below the smallest profiled k) for both,
so the columns differ by the calibration alone.  Nothing runs on a device.

    python3 docs/results/tuner_s26/calibration.py > docs/results/tuner_s26/calibration.txt
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, REPO)

from scripts.tuner_table import kept_prediction  # noqa: E402
from swap import model as M  # noqa: E402
from swap.profiler import Profile  # noqa: E402

RUNS = ("a_alexnet", "b_resnet101", "c_resnet50", "c_googlenet", "d_resnet34", "d_vgg16")


def before(profile):
    """Session 25's rule (what the runs used)."""
    cal = profile.meta.get("copy_calibration")
    if not cal:
        return None
    k = int(cal["k"])
    kept = np.asarray(cal["kept"], dtype=np.float64)
    comp, out_s, in_s = M.copy_overlaps(profile, k)
    n = len(profile.steps)
    cnt, naive, bo, bi = (np.zeros(n) for _ in range(4))
    for c, o, i in zip(comp, out_s, in_s):
        cnt[c.step] += 1
        naive[c.step] += c.time
        bo[c.step] += o
        bi[c.step] += i
    ok = (cnt > 0) & np.isfinite(kept)
    cnt = np.maximum(cnt, 1)
    if kept[ok].sum() > M.COPY_CALIBRATION_SANE * (naive / cnt)[ok].sum():
        return None
    g = M.nonnegative_fit((naive / cnt - kept)[ok], (bo / cnt)[ok], (bi / cnt)[ok])
    g = np.minimum(g, M.COPY_SLOWDOWN_CAP / (1 + M.COPY_SLOWDOWN_CAP))
    return float(g[0] / (1 - g[0])), float(g[1] / (1 - g[1]))


def predict(profile, k, slow):
    """The iteration at k with every map kept, from curves cleaned by ``slow``."""
    os.environ[M.ENV_COPY_SLOWDOWN] = "0" if slow is None else f"{slow[0]},{slow[1]}"
    try:
        m = M.ComputeModel.from_profile(profile, granularity="segment")
    finally:
        del os.environ[M.ENV_COPY_SLOWDOWN]
    return kept_prediction(m, profile, k)


def fmt(slow):
    return "none" if slow is None else f"{100 * slow[0]:.1f} / {100 * slow[1]:.1f} %"


def main():
    for tag in RUNS:
        p = Profile.load(os.path.join(HERE, f"{tag}_profile.json.gz"))
        run = json.load(open(os.path.join(HERE, f"{tag}.json")))
        old, new = before(p), M.copy_slowdown(p)
        print(f"{tag}: calibration at k = {p.meta['copy_calibration']['k']}: slow out / in "
              f"before {fmt(old)}, now {fmt(new)}")
        for d in run["dynamic"]:
            if d.get("offload_fraction", 1) > 0:
                continue
            a, b = 1e3 * predict(p, d["k"], old), 1e3 * predict(p, d["k"], new)
            print(f"  k = {d['k']}: measured {d['ms']:.1f} ms; predicted before {a:.1f} "
                  f"({100 * (a / d['ms'] - 1):+.1f} %), now {b:.1f} ({100 * (b / d['ms'] - 1):+.1f} %)")


if __name__ == "__main__":
    main()
