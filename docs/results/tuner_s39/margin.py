"""Session 39: the steps summed by the model (no host bound) at the measured points of calls c
(VGG-16; and its k = 33, 48, 65, 96 measured in calls a and b) and g (GoogLeNet), with cuDNN's search kept for the steps whose held-out error it
brings under SEARCH_MARGIN of the segments' (1.0: any win; 0.0: never), against the measured
iterations back to back.  Usage: python3 docs/results/tuner_s39/margin.py"""
import collections

import swap.model as M
from swap.model import ComputeModel
from swap.profiler import Profile

CASES = {"docs/results/tuner_s39/g/googlenet/tuner/googlenet_profile.json.gz":
         {181: 71.1, 192: 73.7, 384: 137.7, 525: 200.2},
         "docs/results/tuner_s39/c/vgg16/tuner/vgg16_profile.json.gz":
         {88: 110.9, 92: 113.7, 176: 211.6, 237: 288.3,
          # every map kept in call a (48, 96: back to back) and `none` in call b (33, 65)
          33: 51.5, 48: 58.5, 65: 91.7, 96: 114.0}}

for path, measured in CASES.items():
    prof = Profile.load(path)
    flops = collections.defaultdict(dict)
    for c in prof.compute:
        flops[c.step][c.k] = c.flops
    for margin in (1.0, 0.75, 0.5, 0.0):
        M.SEARCH_MARGIN = margin
        m = ComputeModel.from_profile(prof, granularity="segment", host=False)
        cells = []
        for k, ms in measured.items():
            t = 0.0
            for s in prof.steps:
                f = flops.get(s.step)
                if f:
                    k0, x0 = next(iter(f.items()))
                    t += m.step_time(s, x0 * k / k0)
            cells.append(f"{k}: {1e3 * t:.1f} ({100 * (1e3 * t / ms - 1):+.1f} %)")
        print(f"{prof.net} margin {margin}: {len(m.searched)} steps searched; " + ", ".join(cells))
