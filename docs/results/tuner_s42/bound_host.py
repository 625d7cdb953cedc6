"""The host's time per call of BoundConv's own path (session 42), legacy API against graph
API (the legacy margin lifted so that the plan runs), at ResNet's shapes: the median of 5
blocks of N calls, each block after a device synchronize.  Usage: python3 bound_host.py [N]"""
import math, statistics, sys, time
import numpy as np
import cupy
from minicaffe.cudnn import backend_api as B
from minicaffe.cudnn import ops

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
B.LEGACY_MARGIN = math.inf
SHAPES = [("1x1 1024->256 14x14", (16, 1024, 14, 14), (256, 1024, 1, 1), 0, 1),
          ("3x3 256->256 14x14", (16, 256, 14, 14), (256, 256, 3, 3), 1, 1),
          ("1x1 256->1024 14x14", (16, 256, 14, 14), (1024, 256, 1, 1), 0, 1),
          ("3x3 64->64 56x56", (16, 64, 56, 56), (64, 64, 3, 3), 1, 1),
          ("7x7/2 3->64 224x224", (16, 3, 224, 224), (64, 3, 7, 7), 3, 2)]


def per_call(fn):
    out = []
    for _ in range(5):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        out.append(1e6 * (time.perf_counter() - t0) / N)
    cupy.cuda.Device().synchronize()
    return statistics.median(out)


for name, xs, wsh, pad, stride in SHAPES:
    row = []
    for api in ("legacy", "graph"):
        c = ops.BoundConv(xs, wsh, pad, stride, api=api)
        x = cupy.random.rand(*xs, dtype=np.float32)
        w = cupy.random.rand(*wsh, dtype=np.float32)
        y = cupy.empty(c.geom.y_shape, np.float32)
        dy = cupy.random.rand(*c.geom.y_shape, dtype=np.float32)
        dx, dw = cupy.empty(xs, np.float32), cupy.zeros(wsh, np.float32)
        calls = {"fwd": lambda: c.forward(x, w, None, y),
                 "bwd_data": lambda: c.backward_data(w, dy, dx),
                 "bwd_filter": lambda: c.backward_filter(x, dy, dw)}
        for d, f in calls.items():
            f()
            row.append(f"{api} {d} {per_call(f):.1f}")
    recs = B.search_log()[-3:]
    dev = "; ".join(f"{r['direction']} graph {r['graph_ms'] * 1e3:.0f} us legacy "
                    f"{r['legacy_ms'] * 1e3:.0f} us" for r in recs if r["graph_ms"] is not None)
    print(f"{name}: host us per call: " + ", ".join(row) + f" | device: {dev}", flush=True)
