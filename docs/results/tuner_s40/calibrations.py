"""Session 40: every distinct copy calibration in the saved profiles (docs/results/**), sorted by
how far the device set the pace at its k (naive steps per iteration over the host's least issue
time: swap.profiler.COPY_CALIBRATION_DEVICE_MARGIN's ratio), with the fitted slowdowns
(swap.model.copy_slowdown_fit), and the same fit with a constant per step (on the steps with a
copy beside them); then call g's ResNet-34 profile replayed at its own fit and at 4 %.
Usage: python3 docs/results/tuner_s40/calibrations.py"""
import collections, glob, os

import numpy as np

import swap.model as M
from swap.profiler import Profile

CAP = M.COPY_SLOWDOWN_CAP / (1 + M.COPY_SLOWDOWN_CAP)


def per_step(prof, cal):
    """naive, kept, beside-offload, beside-prefetch seconds per step, and the fit's mask."""
    d = M.calibration_steps(prof, cal)
    if d is None:
        return None
    naive, kept, bo, bi, ok = d
    return naive, kept, bo, bi, ok & (naive - kept <= CAP * (bo + bi) +
                                      M.COPY_CALIBRATION_NOISE * kept)


seen, rows = set(), []
for p in sorted(glob.glob("docs/results/**/*_profile.json*", recursive=True)):
    prof = Profile.load(p)
    cal = prof.meta.get("copy_calibration")
    if not cal or (prof.net, cal["k"], tuple(cal["kept"][:5])) in seen:
        continue
    seen.add((prof.net, cal["k"], tuple(cal["kept"][:5])))
    k = int(cal["k"])
    at = [c for c in prof.compute if c.k == k]
    n = max(1, sum(1 for c in at if c.step == 0))
    least = min((float(s["host"]) for s in prof.meta.get("host_sums", ())), default=0.0)
    ratio = sum(c.time for c in at) / n / least if least else float("nan")
    fit, why = M.copy_slowdown_fit(prof, cal)
    icpt = ""
    d = per_step(prof, cal)
    if fit and d is not None:
        naive, kept, bo, bi, ok = d
        w = ok & ((bo + bi) > 0)
        g = M.nonnegative_fit((naive - kept)[w], bo[w], bi[w], np.ones(w.sum()))
        icpt = (f"with a constant: {100 * g[0] / (1 - g[0]):.1f} / {100 * g[1] / (1 - g[1]):.1f} %"
                f" + {1e6 * g[2]:.1f} us per step")
    rows.append((ratio, p, k, f"{100 * fit[0]:.1f} / {100 * fit[1]:.1f} %" if fit else why, icpt))
for ratio, p, k, fit, icpt in sorted(rows):
    print(f"{ratio:5.2f}x  k {k:4d}  {fit:16s} {icpt:42s} {p}")
print(len(rows), "distinct calibrations")

G = "docs/results/tuner_s40/g/resnet34/tuner/resnet34_profile.json.gz"
if os.path.exists(G):
    prof = Profile.load(G)
    flops = collections.defaultdict(dict)
    for c in prof.compute:
        flops[c.step][c.k] = c.flops
    measured = {384: 144.4, 401: 167.0, 192: 77.2, 109: 48.5}     # call g, back to back
    for slow in ("", "0.043,0.04"):
        os.environ["MINICAFFE_COPY_SLOWDOWN"] = slow
        m = M.ComputeModel.from_profile(prof, granularity="segment", host=False)
        cells = []
        for k, ms in measured.items():
            t = sum(m.step_time(s, next(iter(flops[s.step].values())) * k /
                                next(iter(flops[s.step])))
                    for s in prof.steps if flops.get(s.step))
            cells.append(f"{k}: {1e3 * t:.1f} ms ({100 * (1e3 * t / ms - 1):+.1f} %)")
        print(f"ResNet-34 (call g) steps, slowdown {slow or 'its own fit'}: " + ", ".join(cells))
