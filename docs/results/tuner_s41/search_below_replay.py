"""Session 41: cuDNN's search pricing below the smallest profiled k, replayed on the CPU.
For every measured dynamic point of sessions 39-41 (each tuner run's JSON beside its saved
profile) at a k below the profile's smallest profiled k, the model's summed steps there with
the search pricing (today) and with the curves alone for those steps (the search's
measured-to-searched ratio is anchored at the profiled ks only), and the time error each way
(the prediction moved by the difference where the device, not the host, bounds it).
Usage: python3 docs/results/tuner_s41/search_below_replay.py"""
import dataclasses, glob, json, os
from swap.profiler import Profile
from swap.gmap import gmap_from_dict
from swap.tuner import profile_models

# session 41's runs on an earlier call's profile (their copies are not kept)
REUSED = {"docs/results/tuner_s41/b/googlenet": "docs/results/tuner_s40/a/googlenet/tuner",
          "docs/results/tuner_s41/b/resnet50": "docs/results/tuner_s40/b/resnet50/tuner",
          "docs/results/tuner_s41/g/resnet101": "docs/results/tuner_s40/e/resnet101/tuner",
          "docs/results/tuner_s41/f/resnet152": "docs/results/tuner_s41/a/resnet152/tuner",
          "docs/results/tuner_s41/h/resnet152": "docs/results/tuner_s41/a/resnet152/tuner",
          "docs/results/tuner_s41/h/resnet101": "docs/results/tuner_s40/e/resnet101/tuner"}
rows = []
for j in sorted(glob.glob("docs/results/tuner_s39/**/tuner/*.json", recursive=True)
                + glob.glob("docs/results/tuner_s4[01]/**/tuner/*.json", recursive=True)):
    if j.endswith("_profile.json"):
        continue
    d = os.path.dirname(j); net = os.path.basename(j)[:-5]
    pp = glob.glob(os.path.join(d, net + "_profile.json*")) or glob.glob(
        os.path.join(REUSED.get(os.path.dirname(d), "-"), net + "_profile.json*"))
    run = json.load(open(j))
    if not pp or not run.get("dynamic"):
        continue
    prof = Profile.load(pp[0])
    if "gmap" not in prof.meta:
        continue
    g = gmap_from_dict(prof.meta["gmap"])
    m, _ = profile_models(prof, g, "segment")
    if not m.searched:
        continue
    graph = (run.get("tuner") or {}).get("graph_calibration")
    if graph:
        continue                    # the graph's gap moves with the pricing: not replayed here
    mc = dataclasses.replace(m, searched=())
    lo = min(prof.ks)
    for pt in run["dynamic"]:
        k = pt["k"]
        s_now = 1e3 * float(m.times_fn(g)(k).sum()); s_curve = 1e3 * float(mc.times_fn(g)(k).sum())
        dev, pred, ms = pt["pred_device_ms"], pt["pred_ms"], pt["ms"]
        host_bound = pred > dev + 0.5 * (pred - dev) + 1.0 and pt["pred_host_ms"] > dev
        new = pred if (k >= lo) else (pred + (s_curve - s_now) if not host_bound
                                       else max(pred, pred + (s_curve - s_now)))
        rows.append((j.split("/")[2] + "/" + j.split("/")[3], net, k, lo, host_bound, ms,
                     100 * (pred - ms) / ms, 100 * (new - ms) / ms))
print(f"{'run':24} {'net':10} {'k':>5} {'lo':>4} host  meas ms   now    below-k curves")
for r in rows:
    print(f"{r[0]:24} {r[1]:10} {r[2]:5d} {r[3]:4d} {'yes ' if r[4] else 'no  '} {r[5]:7.1f} "
          f"{r[6]:+6.1f} % {r[7]:+6.1f} %{'   (below)' if r[2] < r[3] else ''}")
below = [r for r in rows if r[2] < r[3]]
for name, i in (("now", 6), ("curves below the profiled ks", 7)):
    e = [abs(r[i]) for r in rows]
    b = [abs(r[i]) for r in below]
    print(f"{name}: all {len(e)} points mean |err| {sum(e) / len(e):.2f} %, over 5 %: "
          f"{sum(x > 5 for x in e)}; the {len(b)} below: mean {sum(b) / max(1, len(b)):.2f} %")
