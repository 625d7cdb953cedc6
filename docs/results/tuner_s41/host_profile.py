"""Session 41: where the host's time goes in one eager iteration (ResNet-152 at K under `none`,
CUDNN, the solver's whole step).  Part 1: per-iteration wall time, the main thread's CPU time
(time.thread_time), its context switches and the CPU it ran on, for ITERS iterations (is a slow
iteration a slower CPU, or a preempted thread?).  Part 2: cProfile over PROF iterations, the
functions by own time and by file.  Usage: python3 host_profile.py NET K ITERS PROF OUTDIR"""
import collections, cProfile, os, pstats, resource, statistics, sys, time
sys.path.insert(0, os.getcwd())
import cupy
from scripts import ps_scaling
from minicaffe import engine
from minicaffe.solver import Solver

net, k, iters, prof, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
os.makedirs(out, exist_ok=True)
engine.set_default_engine("CUDNN")
work = "/tmp/hp"; os.makedirs(work, exist_ok=True)
solver = Solver(ps_scaling.write_solver(work, ps_scaling.write_net(work, net, k, "constant"),
                                        100000, False), mode="GPU", verbose=False)
dev = cupy.cuda.Device()
solver.step(5); dev.synchronize()


def cpu_mhz(cpu):
    try:
        return int(open(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq").read()) // 1000
    except OSError:
        for line in open("/proc/cpuinfo"):
            pass
        return -1


rows = []
for i in range(iters):
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    c0 = time.thread_time(); t0 = time.perf_counter()
    solver.step(1)
    t1 = time.perf_counter(); c1 = time.thread_time()
    dev.synchronize(); t2 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    cpu = os.sched_getcpu() if hasattr(os, "sched_getcpu") else -1
    rows.append((i, 1e3 * (t1 - t0), 1e3 * (c1 - c0), 1e3 * (t2 - t0), r1.ru_nvcsw - r0.ru_nvcsw,
                 r1.ru_nivcsw - r0.ru_nivcsw, cpu, cpu_mhz(cpu)))
with open(f"{out}/pace.txt", "w") as f:
    f.write("iter host_ms thread_cpu_ms wall_ms vcsw ivcsw cpu mhz\n")
    for r in rows:
        f.write("%d %.2f %.2f %.2f %d %d %d %d\n" % r)
h = [r[1] for r in rows]; c = [r[2] for r in rows]
print(f"{net} {k}: host ms median {statistics.median(h):.1f} min {min(h):.1f} max {max(h):.1f}; "
      f"thread cpu median {statistics.median(c):.1f} min {min(c):.1f} max {max(c):.1f}; "
      f"cpus {sorted(set(r[6] for r in rows))}")

pr = cProfile.Profile()
pr.enable(); solver.step(prof); dev.synchronize(); pr.disable()
with open(f"{out}/cprofile.txt", "w") as f:
    st = pstats.Stats(pr, stream=f); st.sort_stats("tottime").print_stats(60)
    st.sort_stats("cumulative").print_stats(80)
    byfile = collections.Counter()
    for (fn, line, name), (cc, nc, tt, ct, callers) in st.stats.items():
        byfile[fn] += tt
    f.write("\nown time by file (s, over %d iterations)\n" % prof)
    for fn, tt in byfile.most_common(40):
        f.write("%8.3f  %s\n" % (tt, fn))
print(open(f"{out}/cprofile.txt").read()[:6000])
