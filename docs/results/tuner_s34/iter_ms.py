"""Median milliseconds per iteration of `minicaffe train --display 1` logs, from the glog
timestamps of the "Iteration N" lines (iterations 10 and later: warm-up, cuDNN searches and the
first plan's setup left out).  Usage: python3 iter_ms.py LOG..."""
import re
import statistics
import sys

LINE = re.compile(r"^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*Iteration (\d+)")
for path in sys.argv[1:]:
    t = {}
    for ln in open(path, errors="replace"):
        m = LINE.match(ln)
        if m:
            h, mi, s, it = int(m[1]), int(m[2]), float(m[3]), int(m[4])
            t.setdefault(it, h * 3600 + mi * 60 + s)
    its = sorted(i for i in t if i >= 10)
    d = [1e3 * (t[b] - t[a]) / (b - a) for a, b in zip(its, its[1:])]
    if d:
        print(f"{path}: {statistics.median(d):.1f} ms per iteration (median of {len(d)}, "
              f"{min(d):.1f}-{max(d):.1f})")
    else:
        print(f"{path}: no iterations logged")
