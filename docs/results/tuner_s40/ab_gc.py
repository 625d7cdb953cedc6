"""Paired host A/B in one process (session 40): does Python's cyclic garbage collector move the
host's pace?  NET at K under `none`, CUDNN, the solver's whole step; rounds alternate the
collector as it is ("gc") and frozen and off during the steps ("nogc": gc.freeze() then
gc.disable(), collected again between rounds), so the host's drifting pace falls on both
alike.  Also counts each generation's collections and the seconds they took in the "gc" rounds
(gc.callbacks).  Usage: python3 ab_gc.py NET K ROUNDS ITERS"""
import gc, os, statistics, sys, time
sys.path.insert(0, os.getcwd())
import cupy
from scripts import ps_scaling
from minicaffe import engine
from minicaffe.solver import Solver

net, k, rounds, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
engine.set_default_engine("CUDNN")
work = "/tmp/ab"; os.makedirs(work, exist_ok=True)
solver = Solver(ps_scaling.write_solver(work, ps_scaling.write_net(work, net, k, "constant"),
                                        100000, False), mode="GPU", verbose=False)
spent = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
_t0 = [0.0]


def on_gc(phase, info):
    if phase == "start":
        _t0[0] = time.perf_counter()
    else:
        s = spent[info["generation"]]
        s[0] += 1
        s[1] += time.perf_counter() - _t0[0]


def timed(n):
    out = []
    for _ in range(n):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        solver.step(1)
        cupy.cuda.Device().synchronize()
        out.append(1e3 * (time.perf_counter() - t))
    return statistics.median(out)


def run(variant, n):
    if variant == "nogc":
        gc.collect(); gc.freeze(); gc.disable()
        try:
            return timed(n)
        finally:
            gc.enable(); gc.unfreeze()
    gc.callbacks.append(on_gc)
    try:
        return timed(n)
    finally:
        gc.callbacks.remove(on_gc)


print(f"gc thresholds {gc.get_threshold()}, tracked objects {len(gc.get_objects())}", flush=True)
for v in ("gc", "nogc", "gc"):
    run(v, 10)                                  # warm-up (cuDNN searches)
for s in spent.values():
    s[0], s[1] = 0, 0.0
res = {"gc": [], "nogc": []}
for r in range(rounds):
    for v in (("nogc", "gc") if r % 2 else ("gc", "nogc")):
        res[v].append(run(v, iters))
    print(f"round {r}: gc {res['gc'][-1]:.2f} ms, nogc {res['nogc'][-1]:.2f} ms", flush=True)
d = [a - b for a, b in zip(res["gc"], res["nogc"])]
steps = rounds * iters
print(f"{net} at {k}: gc median {statistics.median(res['gc']):.2f} ms, nogc "
      f"{statistics.median(res['nogc']):.2f} ms; gc - nogc per round: median "
      f"{statistics.median(d):.2f} ms (min {min(d):.2f}, max {max(d):.2f}, "
      f"{sum(x > 0 for x in d)} of {len(d)} rounds faster without); collections in the "
      + ", ".join(f"gen{g} {c} ({1e3 * t / steps:.3f} ms/step)" for g, (c, t) in spent.items())
      + f" over {steps} gc steps", flush=True)
