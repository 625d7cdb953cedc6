#!/usr/bin/env python3
"""Host time of one CuPy allocation under the swap executor's scratch allocator (issue 5).

While an executor runs with a budget, every CuPy allocation (a layer's temporaries, cuBLAS
and cuDNN workspaces made through CuPy) comes from the arena's scratch reserve through
:class:`swap.runtime.ScratchAllocator`.  Deep nets at small k make thousands of them per
iteration, on the host's critical path.  This script times ``cupy.empty`` of a few sizes,
allocated and freed in a loop, with CuPy's default pool and then with an executor's
allocator installed (ResNet-like toy net, ``none`` plan, a reserve of 256 MiB):

    python3 scripts/alloc_overhead.py            # GPU only; ~10 s
"""
from __future__ import annotations

import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

SIZES = (256, 64 << 10, 4 << 20)
N = 20000


def per_alloc_us(cp, size: int, n: int = N, repeat: int = 5) -> float:
    """Median over ``repeat`` loops of the microseconds per ``cupy.empty(size)`` + free."""
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(n):
            cp.empty(size, dtype=cp.uint8)
        runs.append((time.perf_counter() - t) * 1e6 / n)
    return statistics.median(runs)


def main() -> int:
    import cupy as cp
    from scripts.executor_overhead import make_solver
    from swap.runtime import install
    rows = [("CuPy's default pool", {s: per_alloc_us(cp, s) for s in SIZES})]
    solver = make_solver("resnet50", 2, 32, "GPU")
    ex = install(solver, "none", None, scratch=256 << 20, measure=0)
    assert ex._allocator is not None and ex._allocator.installed
    try:
        rows.append(("the executor's scratch allocator", {s: per_alloc_us(cp, s) for s in SIZES}))
    finally:
        ex.close()
    print(f"Host time per cupy.empty + free, us (median of 5 loops of {N}; "
          f"`python3 scripts/alloc_overhead.py`, {time.strftime('%Y-%m-%d')})\n")
    print("| allocator | " + " | ".join(f"{s} B" for s in SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for name, r in rows:
        print(f"| {name} | " + " | ".join(f"{r[s]:.2f}" for s in SIZES) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
