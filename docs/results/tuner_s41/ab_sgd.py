"""Session 41: paired host A/B in one process, MultiTensorSGD.matches with its identity fast
path (c3fd82a, "new") against the address key alone (before, "old"), NET at K under `none`,
CUDNN, the solver's whole step, each step waited for; rounds alternate which goes first, so
the host's drifting pace falls on both alike.  Also the time of one matches() call each way.
Usage: python3 ab_sgd.py NET K ROUNDS ITERS"""
import os, statistics, sys, time
sys.path.insert(0, os.getcwd())
import cupy
from scripts import ps_scaling
from minicaffe import engine
from minicaffe.kernels import cuda_fused as cf
from minicaffe.solver import Solver

net, k, rounds, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
engine.set_default_engine("CUDNN")
work = "/tmp/ab_sgd"; os.makedirs(work, exist_ok=True)
solver = Solver(ps_scaling.write_solver(work, ps_scaling.write_net(work, net, k, "constant"),
                                        100000, False), mode="GPU", verbose=False)
new_matches = cf.MultiTensorSGD.matches


def old_matches(self, params, history):
    return self.storage_key(params, history) == self.key


def use(v):
    cf.MultiTensorSGD.matches = new_matches if v == "new" else old_matches


def timed(n):
    out = []
    for _ in range(n):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        solver.step(1)
        cupy.cuda.Device().synchronize()
        out.append(1e3 * (time.perf_counter() - t))
    return statistics.median(out)


for v in ("new", "old", "new"):
    use(v); timed(5)
tables = solver.fused_sgd()
params, history = solver.net.learnable_params, solver.history
for v in ("new", "old"):
    use(v)
    t = time.perf_counter()
    for _ in range(200):
        assert tables.matches(params, history)
    print(f"matches() {v}: {1e6 * (time.perf_counter() - t) / 200:.1f} us per call "
          f"({len(params)} parameter blobs)", flush=True)
res = {"new": [], "old": []}
for r in range(rounds):
    for v in (("old", "new") if r % 2 else ("new", "old")):
        use(v)
        res[v].append(timed(iters))
    print(f"round {r}: new {res['new'][-1]:.1f} ms, old {res['old'][-1]:.1f} ms", flush=True)
d = [o - n for n, o in zip(res["new"], res["old"])]
print(f"{net} at {k}: new median {statistics.median(res['new']):.2f} ms, old "
      f"{statistics.median(res['old']):.2f} ms; old - new per round: median "
      f"{statistics.median(d):.2f} ms (min {min(d):.2f}, max {max(d):.2f}, "
      f"{sum(x > 0 for x in d)} of {len(d)} rounds faster new)")
