#!/usr/bin/env python3
"""Session 29, CPU: the copy calibration of this session's two tuner runs with the host's
pace per step taken as the median of its samples (what the runs used) and as the least
(``swap.model.host_bound_steps`` since), and the points that kept every map predicted
again with each (curves cleaned of the copies' cost by the fit, or not).  Nothing runs on
a device.

    python3 docs/results/tuner_s29/replay.py > docs/results/tuner_s29/replay.txt
"""
import importlib.util
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, REPO)

from swap import model as M  # noqa: E402
from swap.profiler import Profile  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "calibration_s26", os.path.join(HERE, "..", "tuner_s26", "calibration.py"))
_s26 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_s26)
predict, fmt = _s26.predict, _s26.fmt        # session 26's replay: kept iteration at k

RUNS = (("a", "resnet152"), ("c", "resnet50"))


def fit_with(profile, pace):
    """copy_slowdown_fit with the host's pace per step taken by ``pace`` over its samples."""
    saved = M.host_bound_steps

    def bound(p, device):
        device = np.asarray(device, dtype=np.float64)
        by = {}
        for h in p.host_samples:
            by.setdefault(h.step, []).append(h.time)
        host = np.zeros(len(device))
        for j, ts in by.items():
            host[j] = pace(ts)
        return device < M.COPY_CALIBRATION_HOST_MARGIN * host
    M.host_bound_steps = bound
    try:
        return M.copy_slowdown_fit(profile, profile.meta["copy_calibration"])
    finally:
        M.host_bound_steps = saved


def main():
    for tag, net in RUNS:
        p = Profile.load(os.path.join(HERE, tag, f"{net}_profile.json.gz"))
        run = json.load(open(os.path.join(HERE, tag, f"{net}.json")))
        sums = [round(1e3 * s["whole"], 1) for s in p.meta["host_sums"]]
        old, why = fit_with(p, np.median)
        new, _ = fit_with(p, min)
        print(f"{tag}_{net}: calibration at k = {p.meta['copy_calibration']['k']}, host whole "
              f"iterations {sums} ms at k = {p.meta['host_ks']}: slow out / in with the "
              f"median {fmt(old)}{' (' + why + ')' if why else ''}, with the least {fmt(new)}")
        for d in run["dynamic"]:
            if d.get("offload_fraction", 1) > 0:
                continue
            a, b = 1e3 * predict(p, d["k"], old), 1e3 * predict(p, d["k"], new)
            ms, b2b = d["ms"], d["ms_b2b"]
            print(f"  k = {d['k']}: measured {ms:.1f} ms in the first round ({b2b:.1f} back to back); predicted "
                  f"with the median {a:.1f} ({100 * (a / ms - 1):+.1f} %), with the least "
                  f"{b:.1f} ({100 * (b / ms - 1):+.1f} %, {100 * (b / b2b - 1):+.1f} % back "
                  "to back)")


if __name__ == "__main__":
    main()
