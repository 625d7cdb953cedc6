#!/usr/bin/env python3
"""Session 30, CPU: the copy calibration taken behind a device wait (call k: ResNet-152 at
49, its own naive profile and kept run) spliced into the tuner run's profile (call a, whose
own calibration was disturbed twice and priced the copies at zero), and the points of calls
a and e that kept every map predicted again from curves cleaned by each fit.  Nothing runs
on a device.

    python3 docs/results/tuner_s30/replay.py > docs/results/tuner_s30/replay.txt
"""
import dataclasses
import gzip
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tuner_s26"))
from calibration import M, Profile, fmt, predict  # noqa: E402  (session 26's replay)


def spliced(profile, cal):
    """``profile`` with the copy calibration ``cal`` in its meta."""
    return dataclasses.replace(profile, meta={**profile.meta, "copy_calibration": cal})


def main(out=None):
    a = Profile.load(os.path.join(HERE, "a", "resnet152_profile.json.gz"))
    k = Profile.load(os.path.join(HERE, "k", "r152_49_profile.json.gz"))
    cal_k = k.meta["copy_calibration"]
    own, why = M.copy_slowdown_fit(a, a.meta["copy_calibration"])
    on_k = M.copy_slowdown_fit(k, cal_k)[0]
    s = spliced(a, cal_k)
    on_a = M.copy_slowdown_fit(s, cal_k)[0]
    print(f"call a's own calibration at {a.meta['copy_calibration']['k']}: {fmt(own)}"
          f"{' (' + why + ')' if why else ''}; call k's behind a device wait "
          f"({1e3 * min(cal_k['head_start']):.0f}-{1e3 * max(cal_k['head_start']):.0f} ms): "
          f"{fmt(on_k)} against its own naive run, {fmt(on_a)} against call a's")
    for tag in ("a", "e"):
        run = json.load(gzip.open(os.path.join(HERE, tag, "run.json.gz")))
        for d in run["dynamic"]:
            if d.get("offload_fraction", 1) > 0:
                continue
            z, f = 1e3 * predict(a, d["k"], None), 1e3 * predict(a, d["k"], on_a)
            ms, b2b = d["ms"], d["ms_b2b"]
            print(f"  call {tag}, k = {d['k']}: measured {ms:.1f} ms in the first round "
                  f"({b2b:.1f} back to back); kept iteration predicted with the copies at "
                  f"zero {z:.1f} ({100 * (z / ms - 1):+.1f} %, {100 * (z / b2b - 1):+.1f} % "
                  f"back to back), with call k's fit {f:.1f} ({100 * (f / ms - 1):+.1f} %, "
                  f"{100 * (f / b2b - 1):+.1f} %)")
    if out:
        s.save(out)
        print(f"spliced profile written to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
