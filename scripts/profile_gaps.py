#!/usr/bin/env python3
"""Do the profile's steps that begin on an idle device run slower?  A CPU analysis of a saved
swap profile (issue 5; nothing is measured here).

The compute profile runs the naive plan, which is transfer-bound at every profiled k: the
compute stream waits for prefetches, and the host may fall behind it.  A step whose first
event comes after the previous step's last by a gap began on an idle device.  This groups the
steps of the smallest profiled k by that gap and compares each step's time per image with its
time per image at the next profiled k (``ratio``: 1 where a step scales with k; the small-k
steps' own efficiency loss shows in the steps that began on a busy device).  Groups of steps
whose ratio rises with the gap carry a cost of the gap itself (clocks, caches, the host's
launches) that the fitted curves then carry into every prediction.

    python3 scripts/profile_gaps.py docs/results/tuner_s24/b_resnet152_profile.json.gz
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# gap groups, seconds: [lo, hi)
BOUNDS = (0.0, 5e-6, 50e-6, 500e-6, float("inf"))
MIN_STEP_S = 20e-6   # steps shorter than this at the smaller k are left out (launch noise)


def gaps_before(profile, k: int) -> dict:
    """step -> seconds between the previous step's end and this step's start at ``k`` (the
    first step: infinity, it follows the iteration's head)."""
    cs = sorted((c for c in profile.compute if c.k == k), key=lambda c: c.start)
    out, prev = {}, None
    for c in cs:
        out[c.step] = float("inf") if prev is None else max(0.0, c.start - (prev.start + prev.time))
        prev = c
    return out


def groups(profile, k_small: int | None = None, k_next: int | None = None) -> list[dict]:
    """One row per gap group (module doc): steps, the median and time-weighted ratio of time
    per image at ``k_small`` over ``k_next``, and the group's time at ``k_next``."""
    ks = sorted(profile.ks)
    a = ks[0] if k_small is None else k_small
    b = ks[1] if k_next is None else k_next
    by = {}
    for c in profile.compute:
        if c.k in (a, b):
            by.setdefault(c.k, {})[c.step] = c
    gap = gaps_before(profile, a)
    rows = []
    for lo, hi in zip(BOUNDS, BOUNDS[1:]):
        sel = [j for j in by.get(a, {}) if j in by.get(b, {})
               and lo <= gap[j] and (gap[j] < hi or hi == float("inf"))
               and by[a][j].time > MIN_STEP_S]
        if not sel:
            continue
        w = [by[b][j].time for j in sel]
        r = [(by[a][j].time / a) / (by[b][j].time / b) for j in sel]
        ratio = sorted(r)
        rows.append({"k": a, "k_next": b, "gap_lo_us": 1e6 * lo, "gap_hi_us": 1e6 * hi,
                     "steps": len(sel), "median_ratio": ratio[len(ratio) // 2],
                     "weighted_ratio": sum(x * y for x, y in zip(r, w)) / sum(w),
                     "ms_at_next": 1e3 * sum(w), "ms_at_k": 1e3 * sum(by[a][j].time for j in sel)})
    return rows


def main(argv=None) -> int:
    from swap.profiler import Profile
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profiles", nargs="+", help="saved profiles (.json or .json.gz)")
    args = ap.parse_args(argv)
    for path in args.profiles:
        p = Profile.load(path)
        rows = groups(p)
        print(f"{path} ({p.net}, {p.device}, {p.date}): steps at k = {rows[0]['k'] if rows else '-'}"
              f" against k = {rows[0]['k_next'] if rows else '-'}")
        print(f"{'gap before the step':>22} {'steps':>6} {'ms at k':>8} {'ratio median':>13} "
              f"{'ratio weighted':>15}")
        for r in rows:
            hi = "inf" if r["gap_hi_us"] == float("inf") else f"{r['gap_hi_us']:.0f}"
            print(f"{'[' + format(r['gap_lo_us'], '.0f') + ', ' + hi + ') us':>22} "
                  f"{r['steps']:>6} {r['ms_at_k']:>8.1f} {r['median_ratio']:>13.3f} "
                  f"{r['weighted_ratio']:>15.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
