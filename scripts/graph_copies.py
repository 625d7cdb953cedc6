#!/usr/bin/env python3
"""Do copies to and from pinned host memory slow the kernels beside them more when they are
captured in a CUDA graph than when they are issued eagerly?  (Issue 5, RESULTS "Session 23".)

Under ``--cuda-graph`` ResNet-152's dynamic plan ran 1.016, 1.052 and 1.096 times `none` with
17, 25 and 28 % of its feature maps offloaded, where the planner predicted no stall and the
same plans run eagerly within 1.03.  This benchmark isolates the copies: one stream runs a
chain of kernels, two others copy device to host and host to device (pinned, as the swap
executor does: ``cudaMemcpyAsync`` on non-blocking streams forked from and joined back to
the compute stream with events), the copies issued after every few kernels as the plan issues
an offload after the step that wrote the map.  Four ways, side by side in one run, each
timed with CUDA events after warm-up, the median of ``--repeats``:

* ``eager alone`` / ``eager + copies``: the kernels, without and with the copies;
* ``graph alone`` / ``graph + copies``: the same captured once and launched.

Two kernels: ``spin`` (arithmetic, SM-bound) and ``stream`` (a read and a write of a large
array, HBM-bound).  The copies' cost on the kernels is ``(with - alone) / alone`` per way; a
graph whose copies cost more than eager ones explains the plan's slowdown under the graph.
The copies take less time than the kernels (checked, and printed), so a join that waits
for them would show as a cost too: ``copy ms`` is their time alone.

Usage (GPU):  python3 scripts/graph_copies.py [--copy-mb 2048] [--kernels 64] [--out CSV]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from scripts._bench import write_rows  # noqa: E402

SPIN = r'''
extern "C" __global__ void spin(float* x, long long n, int iters) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        for (int j = 0; j < iters; ++j) v = v * 0.9999999f + 1e-7f;
        x[i] = v;
    }
}
'''
STREAM = r'''
extern "C" __global__ void stream(const float* x, float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long step = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += step) y[i] = x[i] * 1.0001f;
}
'''


class Bench:
    """The buffers, streams and kernels of one configuration."""

    def __init__(self, cp, kind: str, kernels: int, copy_bytes: int, pieces: int,
                 spin_iters: int, stream_mb: int):
        self.cp, self.kind, self.kernels, self.pieces = cp, kind, kernels, pieces
        rt = cp.cuda.runtime
        self.rt = rt
        self.d2h = getattr(rt, "memcpyDeviceToHost", 2)      # cudaMemcpyKind values
        self.h2d = getattr(rt, "memcpyHostToDevice", 1)
        self.compute = cp.cuda.Stream(non_blocking=True)
        self.out = cp.cuda.Stream(non_blocking=True)
        self.into = cp.cuda.Stream(non_blocking=True)
        self.piece = max(1, copy_bytes // pieces)
        self.dev_src = cp.empty(self.piece * pieces, dtype=cp.uint8)
        self.dev_dst = cp.empty(self.piece * pieces, dtype=cp.uint8)
        self.host = cp.cuda.alloc_pinned_memory(self.piece * pieces)
        self.host_in = cp.cuda.alloc_pinned_memory(self.piece * pieces)
        if kind == "spin":
            self.x = cp.ones(1 << 22, dtype=cp.float32)
            self.k = cp.RawKernel(SPIN, "spin")
            self.iters = spin_iters
        else:
            n = (stream_mb << 20) // 4
            self.x = cp.ones(n, dtype=cp.float32)
            self.y = cp.empty_like(self.x)
            self.k = cp.RawKernel(STREAM, "stream")
        self.fork = cp.cuda.Event(disable_timing=True)
        self.joins = (cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True))
        self.graphs = {}

    def _kernel(self):
        cp = self.cp
        if self.kind == "spin":
            n = self.x.size
            self.k(((n + 255) // 256,), (256,), (self.x, cp.int64(n), cp.int32(self.iters)),
                   stream=self.compute)
        else:
            n = self.x.size
            self.k((1024,), (512,), (self.x, self.y, cp.int64(n)), stream=self.compute)

    def issue(self, copies: bool):
        """The chain on the compute stream; with ``copies``, after every
        ``kernels / pieces`` kernels one piece goes out and one comes in on the copy
        streams (each after an event on the compute stream), joined back at the end."""
        cp, rt = self.cp, self.rt
        every = max(1, self.kernels // self.pieces)
        done = 0
        if copies:
            self.fork.record(self.compute)
            self.out.wait_event(self.fork)
            self.into.wait_event(self.fork)
        for i in range(self.kernels):
            self._kernel()
            if copies and (i + 1) % every == 0 and done < self.pieces:
                e = cp.cuda.Event(disable_timing=True)
                e.record(self.compute)
                self.out.wait_event(e)
                self.into.wait_event(e)
                off = done * self.piece
                rt.memcpyAsync(self.host.ptr + off, self.dev_src.data.ptr + off, self.piece,
                               self.d2h, self.out.ptr)
                rt.memcpyAsync(self.dev_dst.data.ptr + off, self.host_in.ptr + off, self.piece,
                               self.h2d, self.into.ptr)
                done += 1
        if copies:
            self.joins[0].record(self.out)
            self.joins[1].record(self.into)
            self.compute.wait_event(self.joins[0])
            self.compute.wait_event(self.joins[1])

    def graph(self, copies: bool):
        g = self.graphs.get(copies)
        if g is None:
            mode = getattr(self.rt, "streamCaptureModeRelaxed", 2)
            self.compute.begin_capture(mode)
            try:
                self.issue(copies)
            finally:
                g = self.compute.end_capture()
            g.upload(self.compute)
            self.graphs[copies] = g
        return g

    def time(self, way: str, repeats: int, warmup: int = 2) -> float:
        """Median ms of one run of ``way`` (eager/graph, alone/copies)."""
        cp = self.cp
        graph, copies = way.startswith("graph"), way.endswith("copies")
        t = []
        for r in range(warmup + repeats):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(self.compute)
            if graph:
                self.graph(copies).launch(self.compute)
            else:
                self.issue(copies)
            b.record(self.compute)
            b.synchronize()
            if r >= warmup:
                t.append(cp.cuda.get_elapsed_time(a, b))
        return statistics.median(t)

    def copy_ms(self, repeats: int) -> float:
        """The copies alone, both directions at once, eagerly."""
        cp, rt = self.cp, self.rt
        t = []
        for _ in range(repeats):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(self.compute)
            self.fork.record(self.compute)
            self.out.wait_event(self.fork)
            self.into.wait_event(self.fork)
            rt.memcpyAsync(self.host.ptr, self.dev_src.data.ptr, self.piece * self.pieces,
                           self.d2h, self.out.ptr)
            rt.memcpyAsync(self.dev_dst.data.ptr, self.host_in.ptr, self.piece * self.pieces,
                           self.h2d, self.into.ptr)
            self.joins[0].record(self.out)
            self.joins[1].record(self.into)
            self.compute.wait_event(self.joins[0])
            self.compute.wait_event(self.joins[1])
            b.record(self.compute)
            b.synchronize()
            t.append(cp.cuda.get_elapsed_time(a, b))
        return statistics.median(t)


WAYS = ("eager alone", "eager + copies", "graph alone", "graph + copies")


def run(args) -> list[dict]:
    try:
        import cupy as cp
        cp.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise SystemExit(f"graph_copies.py needs a CUDA device with CuPy: {e}")
    rows = []
    for kind in args.kinds.split(","):
        b = Bench(cp, kind, args.kernels, args.copy_mb << 20, args.pieces, args.spin_iters,
                  args.stream_mb)
        copy = b.copy_ms(args.repeats)
        for rnd in range(args.rounds):
            ms = {w: b.time(w, args.repeats) for w in WAYS}
            row = {"kernel": kind, "round": rnd, "copy_mb": args.copy_mb,
                   "pieces": args.pieces, "kernels": args.kernels, "copy_ms": copy,
                   **{w: ms[w] for w in WAYS},
                   "eager_cost": ms["eager + copies"] / ms["eager alone"] - 1.0,
                   "graph_cost": ms["graph + copies"] / ms["graph alone"] - 1.0}
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default="spin,stream", help="kernels: spin (SM), stream (HBM)")
    ap.add_argument("--kernels", type=int, default=64, help="kernels per run")
    ap.add_argument("--copy-mb", type=int, default=2048, help="MiB each way per run")
    ap.add_argument("--pieces", type=int, default=32, help="copies per direction per run")
    ap.add_argument("--spin-iters", type=int, default=4000, help="loop length of spin")
    ap.add_argument("--stream-mb", type=int, default=1024, help="array of stream, MiB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="the whole set again (noise)")
    ap.add_argument("--quick", action="store_true", help="small sizes (the GPU test)")
    ap.add_argument("--out", default=None, help="CSV of the rows")
    args = ap.parse_args(argv)
    if args.quick:
        args.kernels, args.copy_mb, args.pieces, args.spin_iters = 8, 16, 4, 200
        args.stream_mb, args.repeats, args.rounds = 16, 2, 1
    rows = run(args)
    print(f"{'kernel':8} {'copy ms':>8} " + " ".join(f"{w:>15}" for w in WAYS)
          + f" {'eager cost':>10} {'graph cost':>10}")
    for r in rows:
        print(f"{r['kernel']:8} {r['copy_ms']:8.2f} " + " ".join(f"{r[w]:15.2f}" for w in WAYS)
              + f" {100 * r['eager_cost']:+9.1f}% {100 * r['graph_cost']:+9.1f}%")
        if r["copy_ms"] >= r["eager alone"]:
            print(f"  note: the copies alone ({r['copy_ms']:.1f} ms) take as long as the "
                  "kernels: the join, not the kernels, sets the time with copies")
    if args.out:
        write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
