"""Session 38: call b's VGG-16 profile (which predates the chunk record) replayed on the CPU
with and without chunk rules for conv1_2 to conv4_3 (calls of at most 16 images, the whole
probes the 1.5 GiB cap leaves them, as `chunk_steps.txt` suggests): the model's steps at k.
Usage: python3 chunk_replay.py PROFILE.json K [K ...]
       python3 chunk_replay.py PROFILE.json --write OUT.json   (the profile with the rule
       assumed, for `minicaffe plan --profile OUT.json`)"""
import collections
import dataclasses
import sys

from swap.model import ComputeModel
from swap.profiler import Profile

prof = Profile.load(sys.argv[1])
limit = 1536 << 20
per = limit // 20                     # 20 images fit, down to a multiple of the probe's 16
names = [f"conv{b}_{i}" for b, n in ((1, 2), (2, 2), (3, 3), (4, 3)) for i in range(1, n + 1)]
names.remove("conv1_1")
ruled = dataclasses.replace(prof, meta={**prof.meta, "chunks": {n: [limit, per, 16] for n in names}})
if sys.argv[2] == "--write":
    ruled.save(sys.argv[3])
    sys.exit(0)
per_k = collections.defaultdict(dict)
for c in prof.compute:
    per_k[c.step][c.k] = c.flops
for label, p in (("per image (as fitted in session 38)", prof), ("per call (chunk rules)", ruled)):
    m = ComputeModel.from_profile(p, granularity="segment", host=False)
    for k in map(int, sys.argv[2:]):
        total = 0.0
        for s in p.steps:
            f = per_k.get(s.step)
            if not f:
                continue
            k0, x0 = next(iter(f.items()))
            total += m.step_time(s, x0 * k / k0)
        print(f"{label}: steps at {k}: {1e3 * total:.1f} ms")
