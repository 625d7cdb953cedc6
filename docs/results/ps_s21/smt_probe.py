"""Which vCPUs slow each other down (SMT siblings hidden by the hypervisor?).
For a few base CPUs: a fixed Python loop pinned there, alone and with a busy loop on each
other CPU in turn; prints the CPUs that slow it by more than 15 %."""
import os, sys, time, signal, statistics, json

def loop(n=300000):
    t = time.perf_counter(); x = 0
    for i in range(n):
        x += i * i
    return time.perf_counter() - t

def timed(base, reps=3):
    return statistics.median(loop() for _ in range(reps))

cpus = sorted(os.sched_getaffinity(0))
out = {}
for base in [int(b) for b in sys.argv[1:]] or [0, 1, 17, 40]:
    os.sched_setaffinity(0, {base})
    alone = statistics.median(timed(base) for _ in range(3))
    slow = {}
    for j in cpus:
        if j == base:
            continue
        pid = os.fork()
        if pid == 0:
            os.sched_setaffinity(0, {j})
            while True:
                pass
        time.sleep(0.005)
        t = timed(base)
        os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)
        slow[j] = t / alone
    worst = sorted(slow.items(), key=lambda kv: -kv[1])[:4]
    out[base] = {"alone_ms": alone * 1e3, "worst": worst,
                 "over_15pct": [j for j, r in slow.items() if r > 1.15]}
    print(base, json.dumps(out[base]), flush=True)
os.sched_setaffinity(0, set(cpus))
