"""Session 40: the copy fit with a constant per step, replayed on the CPU against the measured
points of sessions 32 to 40 (each tuner run's JSON beside its profile).  For every measured
dynamic point, the run's own time error ("cur"), and the error after changing its predicted
time by the change in the summed steps (today's model, no host bound) when the copy slowdowns
come from the fit with a constant (A), and when that constant is also taken out of every
naive sample with a copy beside it (B: the naive plan's events, as `none` and kept maps have
none).  Usage: python3 docs/results/tuner_s40/intercept_replay.py"""
import glob, json, os, collections, dataclasses, numpy as np
import swap.model as M
from swap.profiler import Profile
CAP = M.COPY_SLOWDOWN_CAP / (1 + M.COPY_SLOWDOWN_CAP)
orig_slow, orig_wc = M.copy_slowdown, M.without_copies

def icpt_fit(prof):
    cal = prof.meta.get("copy_calibration")
    if not cal: return None
    f = M.copy_slowdown_fit(prof, cal)
    if not f[0]: return None
    naive, kept, bo, bi, ok = M.calibration_steps(prof, cal)
    ok = ok & (naive - kept <= CAP * (bo + bi) + M.COPY_CALIBRATION_NOISE * kept)
    w = ok & ((bo + bi) > 0)
    g = M.nonnegative_fit((naive - kept)[w], bo[w], bi[w], np.ones(w.sum()))
    return (g[0] / (1 - g[0]), g[1] / (1 - g[1])), g[2]

def steps_sum(prof, k, variant, fit):
    if variant == "cur":
        M.copy_slowdown, M.without_copies = orig_slow, orig_wc
    else:
        slow, c = fit
        M.copy_slowdown = lambda p: slow
        if variant == "B":
            def wc(p, s):
                go, gi = s[0] / (1 + s[0]), s[1] / (1 + s[1])
                fixed = {}
                for kk in sorted({x.k for x in p.compute}):
                    comp, out_s, in_s = M.copy_overlaps(p, kk)
                    for x, o, i in zip(comp, out_s, in_s):
                        sub = go * o + gi * i + (c if o + i > 0 else 0.0)
                        fixed[id(x)] = dataclasses.replace(x, time=max(x.time - sub, 0.5 * x.time))
                return tuple(fixed.get(id(x), x) for x in p.compute)
            M.without_copies = wc
        else:
            M.without_copies = orig_wc
    m = M.ComputeModel.from_profile(prof, granularity="segment", host=False)
    fl = collections.defaultdict(dict)
    for x in prof.compute: fl[x.step][x.k] = x.flops
    t = 0.0
    for s in prof.steps:
        f = fl.get(s.step)
        if f:
            k0, x0 = next(iter(f.items()))
            t += m.step_time(s, x0 * k / k0)
    M.copy_slowdown, M.without_copies = orig_slow, orig_wc
    return 1e3 * t

errs = collections.defaultdict(list)
for j in sorted(glob.glob("docs/results/tuner_s3[2-9]/**/tuner/*.json", recursive=True) + glob.glob("docs/results/tuner_s40/**/tuner/*.json", recursive=True)):
    if j.endswith("_profile.json"): continue
    d = os.path.dirname(j); net = os.path.basename(j)[:-5]
    pp = [x for x in glob.glob(os.path.join(d, net + "_profile.json*"))]
    if not pp: continue
    prof = Profile.load(pp[0]); fit = icpt_fit(prof)
    if fit is None: continue
    t = json.load(open(j))
    for p in t.get("dynamic", []):
        ms = p.get("ms_b2b") or p.get("ms")
        if not ms or not p.get("pred_ms"): continue
        base = steps_sum(prof, p["k"], "cur", fit)
        row = [f"{j[13:60]:48s} k {p['k']:5d} off {p['offload_fraction']:.2f} cur {100*(p['pred_ms']/ms-1):+5.1f}"]
        errs["cur"].append(abs(p['pred_ms']/ms-1))
        for v in ("A", "B"):
            alt = steps_sum(prof, p["k"], v, fit)
            e = (p["pred_ms"] + alt - base) / ms - 1
            errs[v].append(abs(e)); row.append(f"{v} {100*e:+5.1f}")
        print(" ".join(row), f"(fit {100*fit[0][0]:.1f}/{100*fit[0][1]:.1f} + {1e6*fit[1]:.1f}us)")
for v, e in errs.items():
    e = np.array(e); print(v, "n", len(e), "mean |err| %.2f %%" % (100*e.mean()), "max %.1f" % (100*e.max()), "over 5 %%: %d" % (e > 0.05).sum())
