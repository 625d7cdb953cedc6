"""The host's memory copy bandwidth with N processes at once (issue 8).

Eight workers and eight shards on one host share its memory: every byte of a
parameter-server round crosses it several times (loopback TCP, the shards' sums,
the staging copies).  This measures what that memory gives, copying with NumPy
(``numpy.copyto`` of one array into another, both ``--mib`` MiB) in 1, 2, 4 ...
processes at once, each for ``--seconds``.  A copy reads and writes each byte,
so the memory traffic is twice the GB/s printed.

    python3 scripts/host_membw.py --procs 1,4,8,16,32
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np


def _copier(q, nbytes: int, seconds: float) -> None:
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)                      # pages touched before the clock starts
    n, t0 = 0, time.perf_counter()
    while True:
        np.copyto(dst, src)
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            break
    q.put(n * src.nbytes / dt)


def measure(procs: int, mib: int = 256, seconds: float = 2.0) -> list:
    """Bytes copied per second by each of ``procs`` processes copying at once."""
    q = mp.Queue()
    ps = [mp.Process(target=_copier, args=(q, mib << 20, seconds)) for _ in range(procs)]
    for p in ps:
        p.start()
    rates = [q.get(timeout=60 + 10 * seconds) for _ in ps]
    for p in ps:
        p.join()
    return rates


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", default="1,4,8,16,32", help="comma-separated process counts")
    ap.add_argument("--mib", type=int, default=256, help="MiB per array")
    ap.add_argument("--seconds", type=float, default=2.0, help="copying time per process")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.procs.split(",") if x.strip()]
    if not counts or min(counts) < 1 or args.mib < 1 or args.seconds <= 0:
        raise SystemExit("--procs: counts >= 1; --mib >= 1; --seconds > 0")
    for n in counts:
        rates = measure(n, args.mib, args.seconds)
        print(f"{n:3d} processes: {sum(rates) / 1e9:7.1f} GB/s copied in all "
              f"({min(rates) / 1e9:.1f}-{max(rates) / 1e9:.1f} each; twice that in memory "
              f"traffic)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
