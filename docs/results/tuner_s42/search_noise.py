"""Prepared in session 41, not yet run: how much cuDNN's own search times move from one search
to the next at the same shape (session 41: against ResNet-152's graph iterations, the search
pricing sits 6 to 9 ms high at k = 16 and 36 and fits at 63 and 72; STATUS "What remains" 2).
NET at each K: the sum over its cuDNN convolutions of the searched forward and backward
seconds (`swap.profiler.search_times_now`, what the model's search pricing reads), searched
REPS times from a cleared cache.  Usage: python3 search_noise.py NET K1,K2,... REPS"""
import os, statistics, sys
sys.path.insert(0, os.getcwd())
from scripts import ps_scaling
from minicaffe import engine
from minicaffe.cudnn import ops as cudnn_ops
from minicaffe.solver import Solver
from swap.profiler import search_times_now

net_name, ks, reps = sys.argv[1], [int(k) for k in sys.argv[2].split(",")], int(sys.argv[3])
engine.set_default_engine("CUDNN")
work = "/tmp/search_noise"; os.makedirs(work, exist_ok=True)
solver = Solver(ps_scaling.write_solver(work, ps_scaling.write_net(work, net_name, 16, "constant"),
                                        100000, False), mode="GPU", verbose=False)
net = solver.net
solver.step(2)
for k in ks:
    sums = []
    for _ in range(reps):
        cudnn_ops.clear_cache()
        t = search_times_now(net, k)
        sums.append((1e3 * sum(v[0] for v in t.values()), 1e3 * sum(v[1] for v in t.values())))
    f = [s[0] for s in sums]; b = [s[1] for s in sums]
    print(f"{net_name} k={k}: searched forward ms {' '.join(f'{x:.2f}' for x in f)} "
          f"(spread {100 * (max(f) - min(f)) / statistics.median(f):.1f} %); backward ms "
          f"{' '.join(f'{x:.2f}' for x in b)} (spread {100 * (max(b) - min(b)) / statistics.median(b):.1f} %)",
          flush=True)
