"""A worker process for the tests, through the Python API.

Feeds the net's Input tops with rows ``rank*k:(rank+1)*k`` of a big batch of
``W*k`` rows that depends only on the iteration (``ps_batches.hook_batch``),
trains to max_iter, and saves the final parameters to an .npz (no pickle).

    worker_proc.py SOLVER ENDPOINTS RANK WORLD_SIZE OUT.npz TIMEOUT [--snapshot F]
                   [--curve-dir D] [--link-latency-ms L] [--link-gbps G] [--stats F]
                   [--no-overlap] [--bucket-mb MB] [--shm]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import numpy as np  # noqa: E402

from ps_batches import hook_batch  # noqa: E402
from minicaffe.backend import to_numpy  # noqa: E402
from minicaffe.solver import Solver  # noqa: E402
from ps.overlap import overlap_default  # noqa: E402
from ps.worker import PSConfig, PSWorker, parse_endpoints  # noqa: E402


def feed(solver, rank, world_size):
    net = solver.net
    k = net.blobs["data"].shape[0]
    data, target = hook_batch(solver.iter, world_size * k)
    net.blobs["data"].data[...] = data[rank * k:(rank + 1) * k]
    net.blobs["target"].data[...] = target[rank * k:(rank + 1) * k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("solver")
    ap.add_argument("endpoints")
    ap.add_argument("rank", type=int)
    ap.add_argument("world_size", type=int)
    ap.add_argument("out")
    ap.add_argument("timeout", type=float)
    ap.add_argument("--snapshot")
    ap.add_argument("--curve-dir")
    ap.add_argument("--link-latency-ms", type=float, default=0.0)
    ap.add_argument("--link-gbps", type=float, default=None)
    ap.add_argument("--stats")
    ap.add_argument("--no-overlap", dest="overlap", action="store_const", const=False,
                    default=overlap_default())
    ap.add_argument("--bucket-mb", type=float, default=None)
    ap.add_argument("--copy-up", default=None)
    ap.add_argument("--tail-mb", type=float, default=None)
    ap.add_argument("--shm", action="store_true")
    ap.add_argument("--copy-delay", type=float, default=0.0,
                    help="copy-up forward: the copy thread sleeps this long per bucket")
    a = ap.parse_args()
    solver = Solver(a.solver)
    cfg = PSConfig(endpoints=parse_endpoints(a.endpoints), rank=a.rank, world_size=a.world_size,
                   timeout=a.timeout, curve_dir=a.curve_dir, link_latency_ms=a.link_latency_ms,
                   link_gbps=a.link_gbps, stats_path=a.stats, overlap=a.overlap,
                   bucket_mb=a.bucket_mb, copy_up=a.copy_up,
                   tail_mb=a.tail_mb, shm=a.shm)
    worker = PSWorker(solver, cfg, data_hook=feed)
    if a.copy_delay:
        worker._copy.delay_s = a.copy_delay
    try:
        worker.solve(resume_file=a.snapshot)
    except Exception as e:  # the message is what the tests read
        print(f"worker error: {e}", file=sys.stderr, flush=True)
        return 1
    np.savez(a.out, *[to_numpy(q.data) for q in solver.net.learnable_params])
    return 0


if __name__ == "__main__":
    sys.exit(main())
