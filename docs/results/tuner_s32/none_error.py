"""Session 32: the model's `none` (compute + time outside the steps) against `none` measured at every
point of the runs, under three copy-slowdown corrections of the profile: as fitted, none, one
slowdown for both directions.  Run from the repository root: python3 docs/results/tuner_s32/none_error.py"""
import json, gzip, sys
import numpy as np
import swap.model as M
from swap.profiler import Profile
from swap.gmap import gmap_from_dict
from swap.tuner import profile_models

import os
R = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..") + "/"
CASES = [  # net, profile, [run jsons]
 ("googlenet", "tuner_s32/c/googlenet/tuner/googlenet_profile.json.gz", ["tuner_s32/c/googlenet/tuner/googlenet.json", "tuner_s32/g/googlenet/tuner/googlenet.json"]),
 ("resnet34", "tuner_s32/c/resnet34/tuner/resnet34_profile.json.gz", ["tuner_s32/c/resnet34/tuner/resnet34.json"]),
 ("resnet50", "tuner_s32/b/resnet50/tuner/resnet50_profile.json.gz", ["tuner_s32/b/resnet50/tuner/resnet50.json"]),
 ("resnet101", "tuner_s32/a/resnet101/tuner/resnet101_profile.json.gz", ["tuner_s32/a/resnet101/tuner/resnet101.json"]),
 ("resnet152", "tuner_s31/a/resnet152_profile.json.gz", ["tuner_s31/a/resnet152/tuner/resnet152.json", "tuner_s31/c/resnet152/tuner/resnet152.json", "tuner_s31/d/resnet152/tuner/resnet152.json"]),
 ("vgg16", "tuner_s31/v/vgg16_profile.json.gz", ["tuner_s31/v/vgg16/tuner/vgg16.json", "tuner_s32/c1/vgg16/tuner/vgg16.json"]),
]
orig = M.copy_slowdown
def single(profile):
    cal = profile.meta.get("copy_calibration")
    k = int(cal["k"]); kept = np.asarray(cal["kept"], float)
    comp, o, i = M.copy_overlaps(profile, k)
    n = len(profile.steps); cnt = np.zeros(n); naive = np.zeros(n); b = np.zeros(n)
    for c, oo, ii in zip(comp, o, i):
        cnt[c.step] += 1; naive[c.step] += c.time; b[c.step] += oo + ii
    ok = (cnt > 0) & np.isfinite(kept); cnt = np.maximum(cnt, 1)
    ok &= ~M.host_bound_steps(profile, naive / cnt)
    g = M.nonnegative_fit((naive / cnt - kept)[ok], (b / cnt)[ok])[0]
    s = g / (1 - g)
    return (s, s)
VARIANTS = {"fit": orig, "zero": lambda p: None, "single": single}
rows = []
for net, pf, runs in CASES:
    p = Profile.load(R + pf) if not pf.endswith(".gz") else None
    if p is None:
        import tempfile, os
        t = tempfile.NamedTemporaryFile(suffix=".json", delete=False); t.write(gzip.open(R + pf).read()); t.close()
        p = Profile.load(t.name)
    g = gmap_from_dict(p.meta["gmap"])
    pts = []
    for r in runs:
        d = json.load(open(R + r))
        for row in d["dynamic"]:
            rs = row.get("no_stall_rounds") or []
            nm = [x["none_ms"] for x in rs if x.get("none_ms")]
            if nm:
                pts.append((row["k"], float(np.median(nm)), row["ms"], row.get("pred_ms")))
    line = [net]
    for name, fn in VARIANTS.items():
        M.copy_slowdown = fn
        model, pcie = profile_models(p, g, "segment")
        tf = model.times_fn(g)
        errs = []
        for k, none_ms, dyn_ms, _ in pts:
            pred = 1e3 * (tf(k).sum() + model.overhead_at(k))
            errs.append(100 * (pred / none_ms - 1))
        sl = fn(p) if name != "zero" else None
        line.append(f"{name}{'' if sl is None else ' (%.3f,%.3f)' % tuple(sl)}: " + " ".join(f"{k}:{e:+.1f}" for (k, *_), e in zip(pts, errs)))
    M.copy_slowdown = orig
    print(" | ".join(line))
