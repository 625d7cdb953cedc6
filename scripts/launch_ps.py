#!/usr/bin/env python3
"""Start data-parallel training on this node: S server shards and the local workers.

    python scripts/launch_ps.py --solver S --shards 2 --gpus 0,1          # one node, 2 GPUs
    python scripts/launch_ps.py --solver S --shards 2 --cpu-workers 4     # 4 CPU workers
    python scripts/launch_ps.py --solver S --gpus 0,1,2,3 --nodes 2 \\
        --bind 0.0.0.0 --advertise node0.example --curve-dir keys --make-keys
    python scripts/launch_ps.py --solver S --gpus 0,1 --comm nccl          # NCCL all-reduce
    python scripts/launch_ps.py --solver S --gpus 0,1 --resume auto        # latest common snapshot
    python scripts/launch_ps.py --solver S --gpus 0,1 -- --max-iter 200 --swap dynamic \\
        --budget 12G --profile P --batch k                     # flags for every worker's train

This node runs the shards and ranks 0..L-1 (L local workers); with
``--nodes N`` the world is N x L workers and the command each other node must
run is printed.  Everything binds to loopback unless ``--bind`` says
otherwise; for a real network add CURVE keys (``--curve-dir``), which the
other nodes need too (``server.key`` and a client pair, not the server's
secret).  Output lines are prefixed with the process (``[shard0]``,
``[rank1]``) and copied to ``--log-dir``.

On one node the workers move gradients and parameters through shared memory
(``--ps-shm``, ps/shm.py; ``--no-shm`` sends every value through the sockets).

When any process fails, the others usually fail by themselves within a second
(naming the culprit); after 5 s the launcher sends the rest SIGTERM (they tell
their peers, other nodes' too) and kills what still runs 10 s later.  Its exit
status is the first failure's, or 0.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_args(argv=None):
    """The launcher's options; what follows a ``--`` goes, as given, to every worker's
    ``minicaffe train`` (``args.train``), on this node and in the commands for the others."""
    argv = list(sys.argv[1:] if argv is None else argv)
    train = []
    if "--" in argv:
        i = argv.index("--")
        argv, train = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 usage="%(prog)s --solver S [options] [-- minicaffe train flags]",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--solver", required=True)
    ap.add_argument("--comm", choices=["ps", "nccl"], default="ps")
    ap.add_argument("--shards", type=int, default=1, help="server shards on this node (ps)")
    who = ap.add_mutually_exclusive_group()
    who.add_argument("--gpus", default=None,
                     help="local GPU ids, one worker each (default: every visible GPU)")
    who.add_argument("--cpu-workers", type=int, default=None, help="N workers in CPU mode")
    ap.add_argument("--nodes", type=int, default=1,
                    help="nodes in all, each with as many workers as this one")
    ap.add_argument("--bind", default="127.0.0.1",
                    help="interface to bind (default loopback; 0.0.0.0 for other nodes)")
    ap.add_argument("--advertise", default=None,
                    help="host name the other nodes use to reach this one (default: the bind "
                         "address, or this host's name when binding 0.0.0.0)")
    ap.add_argument("--port-base", type=int, default=None,
                    help="shard s binds port PORT_BASE+s (default: free ports)")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds any process waits for the slowest peer")
    ap.add_argument("--curve-dir", default=None, help="CURVE keys for every link")
    ap.add_argument("--make-keys", action="store_true",
                    help="create the CURVE keys in --curve-dir when missing")
    ap.add_argument("--link-gbps", type=float, default=None, help="emulated link bandwidth")
    ap.add_argument("--link-latency-ms", type=float, default=0.0, help="emulated link latency")
    shm = ap.add_mutually_exclusive_group()
    shm.add_argument("--shm", dest="shm", action="store_const", const=True, default=None,
                     help="the workers' --ps-shm: gradients and parameters through shared "
                          "memory in /dev/shm, the sockets carry the headers (the default for "
                          "--comm ps on one node without link emulation)")
    shm.add_argument("--no-shm", dest="shm", action="store_const", const=False,
                     help="every value through the sockets")
    ap.add_argument("--resume", default=None,
                    help="snapshot iteration to resume every process from, or 'auto' (latest "
                         "iteration with a snapshot of every shard and local rank)")
    ap.add_argument("--log-dir", default=None, help="also write each process's output here")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, start nothing")
    ap.add_argument("--python", default=sys.executable, help="interpreter for local processes")
    args = ap.parse_args(argv)
    args.train = train
    return args


# ----------------------------------------------------------------- planning
def local_workers(args) -> list:
    """[('--gpu', id) or ('--cpu', None)] for the workers of this node."""
    if args.cpu_workers is not None:
        if args.cpu_workers < 1:
            raise SystemExit("--cpu-workers must be >= 1")
        return [("--cpu", None)] * args.cpu_workers
    if args.gpus:
        return [("--gpu", int(g)) for g in args.gpus.split(",") if g.strip()]
    from minicaffe.backend import gpu_available
    if not gpu_available():
        raise SystemExit("no GPU visible: give --cpu-workers N (or --gpus)")
    import cupy
    return [("--gpu", i) for i in range(cupy.cuda.runtime.getDeviceCount())]


def snapshot_prefix(solver_path: str) -> str:
    """The solver's snapshot prefix, resolved as minicaffe's Solver does."""
    from minicaffe.proto import read_solver_param
    p = read_solver_param(solver_path)
    return p.snapshot_prefix or os.path.splitext(solver_path)[0]


def snapshot_files(prefix, it, shards, ranks, comm):
    servers = [f"{prefix}_shard{s}_iter_{it}.solverstate" for s in range(shards)] \
        if comm == "ps" else []
    workers = [f"{prefix}{'' if r == 0 else f'_rank{r}'}_iter_{it}.solverstate" for r in ranks]
    return servers, workers


def latest_common_iteration(prefix, shards, ranks, comm) -> int:
    """The largest N with a snapshot of every local shard and rank."""
    found = set()
    for path in glob.glob(f"{prefix}*_iter_*.solverstate"):
        m = re.search(r"_iter_(\d+)\.solverstate$", path)
        if m:
            found.add(int(m.group(1)))
    for it in sorted(found, reverse=True):
        s, w = snapshot_files(prefix, it, shards, ranks, comm)
        if all(os.path.exists(f) for f in s + w):
            return it
    raise SystemExit(f"--resume auto: no iteration has snapshots of every shard and rank under "
                     f"{prefix}_*")


def free_port(host) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ running
class Child:
    """A process whose output lines are prefixed and copied to a log file."""

    def __init__(self, name, cmd, log_dir):
        self.name = name
        self.cmd = cmd
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        self.log = open(os.path.join(log_dir, f"{name}.log"), "w") if log_dir else None
        self.popen = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self):
        for line in self.popen.stdout:
            sys.stdout.write(f"[{self.name}] {line}")
            sys.stdout.flush()
            if self.log:
                self.log.write(line)
                self.log.flush()

    def finish(self):
        self.thread.join(5)
        if self.log:
            self.log.close()


def wait_endpoint(child, path, deadline: float) -> str:
    """The endpoint a shard bound (its ``--endpoint-file``, written atomically), waiting until
    ``deadline`` (``time.monotonic()``); RuntimeError when the shard exits or the deadline
    passes first.  ``child`` has ``.name`` and ``.popen``."""
    while not os.path.exists(path):
        if child.popen.poll() is not None:
            raise RuntimeError(f"{child.name} exited with status {child.popen.returncode} "
                               "before binding")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{child.name} did not bind before its deadline")
        time.sleep(0.02)
    with open(path) as f:
        return f.read().strip()


def advertised(endpoint, host):
    """``tcp://0.0.0.0:5555`` -> ``tcp://HOST:5555``."""
    return re.sub(r"^(tcp://)[^:]+(:\d+)$", rf"\g<1>{host}\g<2>", endpoint)


def main(argv=None) -> int:
    args = parse_args(argv)
    solver = os.path.abspath(args.solver)
    workers = local_workers(args)
    L = len(workers)
    world = L * args.nodes
    if args.nodes < 1:
        raise SystemExit("--nodes must be >= 1")
    if args.nodes > 1 and args.bind in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("other nodes cannot reach a loopback address: pass --bind 0.0.0.0 "
                         "(or this node's address), and --curve-dir on a real network")
    if args.comm == "nccl" and (args.nodes > 1 or workers[0][0] != "--gpu"):
        raise SystemExit("--comm nccl is for the GPUs of one node")
    if args.comm == "ps" and args.shards < 1:
        raise SystemExit("--shards must be >= 1")
    host = args.advertise or (socket.gethostname() if args.bind in ("0.0.0.0", "*")
                              else args.bind)
    if args.curve_dir and args.make_keys and not os.path.exists(
            os.path.join(args.curve_dir, "server.key")):
        from ps.transport import create_keys
        create_keys(args.curve_dir)
        print(f"made CURVE keys in {args.curve_dir}")
    if args.comm == "nccl" and (args.link_gbps or args.link_latency_ms):
        raise SystemExit("link emulation (--link-*) applies to --comm ps only")
    if args.shm and (args.comm != "ps" or args.nodes > 1):
        raise SystemExit("--shm is for --comm ps on one node (shared memory does not cross "
                         "hosts)")
    if args.shm and (args.link_gbps or args.link_latency_ms):
        raise SystemExit("--shm moves the values through shared memory, which link emulation "
                         "cannot delay: drop --link-*")
    if args.shm is None:   # one host's workers and shards: the faster data path (ps/shm.py)
        from ps.shm import available
        args.shm = (args.comm == "ps" and args.nodes == 1 and not args.link_gbps
                    and not args.link_latency_ms and available())
    if args.shm:
        print("gradients and parameters go through shared memory (--ps-shm; --no-shm for the "
              "sockets)")
    local_ranks = list(range(L))
    resume_servers, resume_workers = [], []
    it = None
    if args.resume:
        prefix = snapshot_prefix(solver)
        it = (latest_common_iteration(prefix, args.shards, local_ranks, args.comm)
              if args.resume == "auto" else int(args.resume))
        resume_servers, resume_workers = snapshot_files(prefix, it, args.shards, local_ranks,
                                                        args.comm)
        missing = [f for f in resume_servers + resume_workers if not os.path.exists(f)]
        if missing:
            raise SystemExit(f"--resume {it}: missing {', '.join(missing)}")
        print(f"resuming every local process from iteration {it}")
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    common = ["--ps-timeout", str(args.timeout), *args.train]
    link = []
    if args.link_gbps:
        link += ["--link-gbps", str(args.link_gbps)]
    if args.link_latency_ms:
        link += ["--link-latency-ms", str(args.link_latency_ms)]
    curve = ["--curve-dir", os.path.abspath(args.curve_dir)] if args.curve_dir else []

    children = []
    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        # ---- servers (or the NCCL rendezvous endpoint)
        if args.comm == "ps":
            endpoints = []
            # endpoint files: the servers report the free ports they bound
            run_dir = None if args.dry_run else tempfile.mkdtemp(prefix="launch_ps_")
            for s in range(args.shards):
                port = str(args.port_base + s) if args.port_base else "*"
                ep_file = os.path.join(run_dir or "RUN_DIR", f"shard{s}.endpoint")
                cmd = [args.python, "-m", "ps", "server", "--shard", str(s), "--world-size",
                       str(world), "--bind", f"tcp://{args.bind}:{port}", "--timeout",
                       str(args.timeout), "--endpoint-file", ep_file, *curve, *link]
                if resume_servers:
                    cmd += ["--snapshot", resume_servers[s]]
                if args.dry_run:
                    print(" ".join(shlex.quote(c) for c in cmd))
                    endpoints.append(f"tcp://{host}:{port if port != '*' else 'PORT'}")
                    continue
                child = Child(f"shard{s}", cmd, args.log_dir)
                children.append(child)
                try:
                    endpoints.append(advertised(
                        wait_endpoint(child, ep_file, time.monotonic() + 60), host))
                except RuntimeError as e:
                    raise SystemExit(str(e)) from None
                os.unlink(ep_file)
            if run_dir:
                os.rmdir(run_dir)
            ps_arg = ",".join(endpoints)
        else:
            ps_arg = f"tcp://{host}:{args.port_base or free_port(args.bind)}"
        # ---- local workers
        for r, (flag, dev) in enumerate(workers):
            cmd = [args.python, "-m", "minicaffe", "train", "--solver", solver, "--ps", ps_arg,
                   "--rank", str(r), "--world-size", str(world), "--comm", args.comm,
                   flag, *([str(dev)] if dev is not None else []), *common, *curve, *link,
                   *(["--ps-shm"] if args.shm else [])]
            if resume_workers:
                cmd += ["--snapshot", resume_workers[r]]
            if args.dry_run:
                print(" ".join(shlex.quote(c) for c in cmd))
                continue
            children.append(Child(f"rank{r}", cmd, args.log_dir))
        # ---- what the other nodes run
        for n in range(1, args.nodes):
            print(f"# on node {n}:")
            for i, (flag, dev) in enumerate(workers):
                r = n * L + i
                cmd = ["minicaffe", "train", "--solver", args.solver, "--ps", ps_arg, "--rank",
                       str(r), "--world-size", str(world), flag,
                       *([str(dev)] if dev is not None else []), *common, *curve, *link]
                if it is not None:
                    cmd += ["--snapshot", snapshot_files(snapshot_prefix(solver), it, 0, [r],
                                                         args.comm)[1][0]]
                print("  " + " ".join(shlex.quote(c) for c in cmd) + " &")
        if args.dry_run:
            return 0
        return supervise(children, args.timeout, stop)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for c in children:
            if c.popen.poll() is None:
                c.popen.kill()
            c.finish()


# after a process fails, the others get this long to fail by themselves, naming the culprit
# (a worker's failure during training reaches every peer through the shards within a
# second); then they are sent SIGTERM, which they pass on to their peers (other nodes' too)
# before exiting, and killed END_GRACE seconds later.  A worker that fails before it joins
# tells nobody: the shards would wait out the whole --timeout (120 s) for its join.
FAIL_GRACE = 5.0
END_GRACE = 10.0


def supervise(children, timeout, stop) -> int:
    """Wait for every child.  After a failure, give the others :data:`FAIL_GRACE` seconds
    (at most ``timeout``) to fail by themselves and say why, then SIGTERM them (they tell
    their peers), and kill those still running :data:`END_GRACE` seconds later; after a
    signal, SIGTERM at once."""
    first_bad = None
    term_at = kill_at = None
    while True:
        codes = [c.popen.poll() for c in children]
        if all(code is not None for code in codes):
            break
        for c, code in zip(children, codes):
            if code not in (None, 0) and first_bad is None:
                first_bad = (c.name, code)
                term_at = time.monotonic() + min(FAIL_GRACE, timeout)
        if stop["signal"] is not None and kill_at is None:
            term_at = time.monotonic()
            first_bad = first_bad or ("launcher", 128 + stop["signal"])
        now = time.monotonic()
        if term_at is not None and now >= term_at and kill_at is None:
            for c in children:
                if c.popen.poll() is None:
                    if stop["signal"] is None:
                        print(f"[launcher] stopping {c.name} after the failure of "
                              f"{first_bad[0]}", flush=True)
                    c.popen.send_signal(signal.SIGTERM)   # they tell their peers, then exit
            kill_at = now + END_GRACE
        if kill_at is not None and now > kill_at:
            for c in children:
                if c.popen.poll() is None:
                    print(f"[launcher] ending {c.name}, still running after the failure of "
                          f"{first_bad[0]}", flush=True)
                    c.popen.kill()
        time.sleep(0.1)
    for c in children:
        c.finish()
    if first_bad is not None:
        print(f"[launcher] {first_bad[0]} failed (status {first_bad[1]})", flush=True)
        return first_bad[1] if first_bad[1] > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
