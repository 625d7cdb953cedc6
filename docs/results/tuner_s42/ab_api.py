"""Paired rounds in one process (session 42): the legacy cuDNN API against the graph
(backend) API (minicaffe.cudnn.backend_api) on NET at K under `none`, CUDNN, the solver's
whole step.  Each convolution layer keeps both sets of bound convolutions, built and searched
once each; rounds alternate which set the layers use, so the host's drifting pace falls on
both alike.  Prints each round's median step (wall ms and the process's CPU ms), the paired
differences, and what the graph API's searches chose.  Usage: python3 ab_api.py NET K
ROUNDS ITERS"""
import collections, os, statistics, sys, time
sys.path.insert(0, os.getcwd())
import cupy
from scripts import ps_scaling
from minicaffe import engine
from minicaffe.cudnn import backend_api
from minicaffe.solver import Solver

net, k, rounds, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
engine.set_default_engine("CUDNN")
work = "/tmp/ab_api"; os.makedirs(work, exist_ok=True)
solver = Solver(ps_scaling.write_solver(work, ps_scaling.write_net(work, net, k, "constant"),
                                        100000, False), mode="GPU", verbose=False)
convs = [l for l in solver.net.layers if hasattr(l, "_bound_cudnn")]


def timed(n):
    wall, cpu = [], []
    for _ in range(n):
        cupy.cuda.Device().synchronize()
        t, c = time.perf_counter(), time.process_time()
        solver.step(1)
        cupy.cuda.Device().synchronize()
        wall.append(1e3 * (time.perf_counter() - t))
        cpu.append(1e3 * (time.process_time() - c))
    return statistics.median(wall), statistics.median(cpu)


sets = {}
for api in ("legacy", "graph"):
    os.environ[backend_api.ENV_API] = api
    for l in convs:
        l._bound = None
    t = time.perf_counter()
    timed(3)                                  # binds and searches
    print(f"{api}: first 3 steps (with the searches) {time.perf_counter() - t:.1f} s, "
          f"{len(backend_api.search_log())} graph searches so far", flush=True)
    sets[api] = {id(l): l._bound for l in convs}
    assert all(c.api == api for l in convs for _, _, c in l._bound[2])


def use(api):
    for l in convs:
        l._bound = sets[api][id(l)]


for api in ("legacy", "graph"):
    use(api); timed(5)
res = {"legacy": [], "graph": []}
for r in range(rounds):
    for api in (("graph", "legacy") if r % 2 else ("legacy", "graph")):
        use(api)
        res[api].append(timed(iters))
    print(f"round {r}: legacy {res['legacy'][-1][0]:.1f} ms (cpu {res['legacy'][-1][1]:.1f}), "
          f"graph {res['graph'][-1][0]:.1f} ms (cpu {res['graph'][-1][1]:.1f})", flush=True)
d = [a[0] - b[0] for a, b in zip(res["legacy"], res["graph"])]
med = {a: statistics.median(x[0] for x in v) for a, v in res.items()}
cpu = {a: statistics.median(x[1] for x in v) for a, v in res.items()}
print(f"{net} at {k}: legacy median {med['legacy']:.2f} ms (cpu {cpu['legacy']:.2f}), graph "
      f"{med['graph']:.2f} ms (cpu {cpu['graph']:.2f}); legacy - graph per round: median "
      f"{statistics.median(d):.2f} ms (min {min(d):.2f}, max {max(d):.2f}, "
      f"{sum(x > 0 for x in d)} of {len(d)} rounds faster graph)")
log = [r for r in backend_api.search_log() if r["x"][0] in (k,) or True]
used = [r for r in log if r["engine"] is not None and r["legacy_ms"] is not None
        and r["graph_ms"] <= r["legacy_ms"] * backend_api.LEGACY_MARGIN]
timed_ = [r for r in log if r["graph_ms"] is not None]
print(f"searches {len(log)}: {len(used)} on the graph API, {len(timed_) - len(used)} kept "
      f"legacy (slower plan), {len(log) - len(timed_)} without a plan "
      f"({sum(r['error'] is not None for r in log)} errors)")
by_dir = collections.defaultdict(lambda: [0.0, 0.0, 0])
for r in timed_:
    e = by_dir[r["direction"]]
    e[0] += r["legacy_ms"]; e[1] += min(r["graph_ms"], r["legacy_ms"]); e[2] += 1
for dname, (lg, gr, n) in sorted(by_dir.items()):
    print(f"  {dname}: {n} searched, device ms summed: legacy {lg:.2f}, as chosen {gr:.2f}")
why = collections.Counter(w.split(" (")[0].split(" B")[0] for r in log
                          for w in r["left_out"].values())
print("left out:", dict(why.most_common(8)))
errs = [r["error"] for r in log if r["error"]]
if errs:
    print("first error:", errs[0][:300])
