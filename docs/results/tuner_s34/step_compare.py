"""Per-step compute of two `minicaffe train --memory-trace` runs side by side (session 34, call
c: VGG-16 at 221, every map kept under a 130 GiB budget against the dynamic plan under 12 GiB).

Each step's wait is t_ready - t_start (prefetches, regions, recomputations before it) and its
compute t_end - t_ready; medians over the iterations from the sixth on.  Prints both sums and
the steps whose compute differs most.  Usage: python3 step_compare.py A.csv[.gz] B.csv[.gz]"""
import collections
import csv
import gzip
import statistics
import sys


def load(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = list(csv.DictReader(f))
    its = sorted({int(r["iteration"]) for r in rows})
    wait, comp = collections.defaultdict(list), collections.defaultdict(list)
    for r in rows:
        if int(r["iteration"]) < its[5]:
            continue
        key = (r["layer"], r["phase"])
        wait[key].append(float(r["t_ready_ms"]) - float(r["t_start_ms"]))
        comp[key].append(float(r["t_end_ms"]) - float(r["t_ready_ms"]))
    med = lambda d: {k: statistics.median(v) for k, v in d.items()}  # noqa: E731
    return med(wait), med(comp)


wa, ca = load(sys.argv[1])
wb, cb = load(sys.argv[2])
print(f"A: wait {sum(wa.values()):.1f} ms, compute {sum(ca.values()):.1f} ms; "
      f"B: wait {sum(wb.values()):.1f} ms, compute {sum(cb.values()):.1f} ms")
diff = sorted((cb.get(k, 0) - ca.get(k, 0), k) for k in set(ca) | set(cb))
for d, k in diff[::-1][:8] + diff[:3]:
    print(f"{d:+.2f} ms {k[0]} {k[1]}: A {ca.get(k, 0):.2f}, B {cb.get(k, 0):.2f}")
