"""cProfile of the host's issue of steady-state iterations: ResNet-152, --swap dynamic, k=72, one GPU
(no parameter server). Usage: python3 dv/cprof.py OUTDIR"""
import cProfile, io, os, pstats, sys, time
sys.path.insert(0, os.getcwd())
from scripts import ps_scaling
from minicaffe import cli
from minicaffe import solver as S

out = sys.argv[1]
work = "/tmp/cp"; os.makedirs(work, exist_ok=True)
net = ps_scaling.write_net(work, "resnet152", 72, "constant")
sol = ps_scaling.write_solver(work, net, 40, False)

def solve(self, resume_file=None):
    self.step(6)
    import cupy; cupy.cuda.Device().synchronize()
    pr = cProfile.Profile()
    t = time.perf_counter(); c = time.process_time()
    pr.enable(); self.step(10); pr.disable()
    cupy.cuda.Device().synchronize()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    s = io.StringIO(); st = pstats.Stats(pr, stream=s)
    s.write(f"10 iterations: wall {wall:.3f} s, process CPU {cpu:.3f} s\n")
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats(45)
    open(os.path.join(out, "cprof.txt"), "w").write(s.getvalue())
    st.dump_stats(os.path.join(out, "cprof.prof"))
    # without the profiler: the same 10 iterations' wall and CPU
    t = time.perf_counter(); c = time.process_time(); self.step(10)
    cupy.cuda.Device().synchronize()
    open(os.path.join(out, "cprof.txt"), "a").write(
        f"\nunprofiled 10 iterations: wall {time.perf_counter()-t:.3f} s, CPU {time.process_time()-c:.3f} s\n")
S.Solver.solve = solve
cli.main(["train", "--solver", sol, "--gpu", "0", "--swap", "dynamic", "--budget", "12G", "--batch", "72",
          "--profile", "dv/p/resnet152_profile.json", "--quiet"])
