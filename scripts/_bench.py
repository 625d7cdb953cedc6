"""Small helpers the benchmark scripts share: CUDA-event timing and their raw CSV output."""
from __future__ import annotations

import csv
import statistics


def median_ms(fn, reps: int, warmup: int = 1) -> float:
    """Median of ``reps`` timings of ``fn()`` on the current stream with CUDA events, in
    milliseconds, after ``warmup`` untimed calls and a device synchronization."""
    import cupy as cp
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return statistics.median(times)


def write_rows(path: str, rows: list) -> None:
    """Write ``rows`` (dicts with the same keys) to ``path`` as CSV, the columns those of the
    first row; nothing to write leaves an empty file."""
    with open(path, "w", newline="") as f:
        if not rows:
            return
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
