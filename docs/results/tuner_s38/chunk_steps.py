"""Session 38: VGG-16's profile (call b) per step and per image at each profiled k: the
convolutions' time per image is not smooth in k.  Usage: python3 chunk_steps.py PROFILE.json"""
import collections
import json
import sys

p = json.load(open(sys.argv[1]))
names = {s["step"]: (s["layer"], s["phase"]) for s in p["steps"]}
t = collections.defaultdict(dict)
for c in p["compute"]:
    t[c["step"]][c["k"]] = c["time"]
ks = sorted(p["ks"])
print("step".ljust(22), " ".join(f"{k:>6}" for k in ks), "  (us per image)")
for st in sorted(t):
    row = t[st]
    if sum(row.values()) < 0.01:
        continue
    print(f"{names[st][0]} {names[st][1][:3]}".ljust(22), " ".join(f"{1e6 * row[k] / k:6.1f}" for k in ks))
tot = {k: sum(t[s].get(k, 0.0) for s in t) for k in ks}
print("all steps".ljust(22), " ".join(f"{1e6 * tot[k] / k:6.0f}" for k in ks))
