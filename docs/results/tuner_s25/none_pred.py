"""Session 25, a CPU re-analysis: `none` predicted from calls b's and c's ResNet-152 profiles
with the curves fitted on the raw naive steps (MINICAFFE_COPY_SLOWDOWN=0) and on the steps
cleaned of the copies' cost (the calibration), against `none` as measured in the same calls.
The GMAP is built on the CPU (CAFFE engine): the step times need only each step's FLOPs.

    python3 docs/results/tuner_s25/none_pred.py
"""
import gzip
import json
import os
import sys

sys.path.insert(0, ".")
from scripts.swap_budgets import _solver  # noqa: E402
from swap.gmap import build_gmap  # noqa: E402
from swap.model import ComputeModel  # noqa: E402
from swap.profiler import Profile  # noqa: E402
from swap.runtime import set_lowering  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
solver = _solver("resnet152", 16, "CAFFE", "CPU")
set_lowering(solver.net, "chunked", 12 << 30)
solver.net.reshape()
g = build_gmap(solver.net, solver_type=solver.type)
for call in ("b", "c"):
    with gzip.open(os.path.join(HERE, f"{call}_resnet152_profile.json.gz"), "rt") as f:
        prof = Profile.from_dict(json.load(f))
    with open(os.path.join(HERE, f"{call}_resnet152.json")) as f:
        run = json.load(f)
    for env, label in (("0", "raw"), ("", "cleaned")):
        os.environ["MINICAFFE_COPY_SLOWDOWN"] = env
        m = ComputeModel.from_profile(prof, granularity="segment")
        steps = m.times_fn(g)
        for p in run["dynamic"]:
            k = p["k"]
            pred = 1e3 * m.iteration(float(steps(k).sum()), k)
            meas = p["none_ms"]
            print(f"call {call} {label:7s} k {k:3d}: none predicted {pred:.1f} ms, measured "
                  f"{meas:.1f} ms, {100 * (pred - meas) / meas:+.1f} %")
