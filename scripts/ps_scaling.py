#!/usr/bin/env python3
"""Parameter-server scaling (issue 6): throughput, speedup and the
computation/communication split of data-parallel training on 1, 2, 4 GPUs.

    python3 scripts/ps_scaling.py                                  # ResNet-101/152, 1,2,4 GPUs
    python3 scripts/ps_scaling.py --nets resnet101 --gpus 1,2 --comms ps
    python3 scripts/ps_scaling.py --profile resnet101=r101.json --accudnn-batch resnet101=96
    python3 scripts/ps_scaling.py --quick                          # CPU, tiny net, < 1 minute
    python3 scripts/ps_scaling.py --nets resnet152 --append        # add rows to the CSV
    python3 scripts/ps_scaling.py --overlap on,off                 # with and without overlap
    python3 scripts/ps_scaling.py --dry-run                        # the configurations only

The paper's Table 2 (section 6) trains on 8 servers of one GPU each and
compares Caffe_PS (Caffe at its largest minibatch under the 12 GB budget) with
AccUDNN_PS (the dynamic swap plan at the tuned k*).  Every configuration here
starts real processes on this host, as ``scripts/launch_ps.py`` does: S server
shards (``python -m ps server``) and W workers (``minicaffe train --ps ...
--rank r --world-size W --gpu r``), or W NCCL ranks (``--comm nccl``).

Modes (each with the ZeroMQ parameter server, with and without link
emulation, and with ``--comm nccl``; each with gradient communication that
overlaps backward, ``--overlap on``, the workers' default, and/or after
backward, ``--overlap off``: ``minicaffe train --no-overlap``, ps/overlap.py):

* ``caffe_ps``: workers run ``--swap none --budget B`` at ``--caffe-batch``
  (default: the largest k whose ``none`` plan fits 90 % of the budget, the
  rest left to CuPy's transients and cuDNN workspaces);
* ``accudnn_ps``: workers run ``--swap dynamic --budget B --batch k --profile
  P`` (``--accudnn-batch``, ``--profile``).  Without a profile the workers run
  ``--swap naive`` instead, and the output says so on every such row.

Measured, per configuration, from the workers' ``--ps-stats`` JSON lines
(``ps/worker.py``: per iteration ``compute_s``, forward + backward, from the
end of one synchronisation to the start of the next, so with NCCL the local
update too, and ``delta_s``, the
synchronisation: device-to-host copies, push/pull or the NCCL barrier and
all-reduce, host-to-device copies, waiting for the slowest peer included):

* images/s = W x k / median over the timed iterations of the iteration period
  (compute + delta; per iteration the slowest rank's);
* speedup = images/s / images/s of the same (net, mode, comm, link) at W = 1;
  efficiency = speedup / W;
* vs alone (``eff_alone``) = images/s / (W x k / compute_s at W = 1): against W GPUs
  that each compute as fast as one alone and never communicate, the issue's scaling
  efficiency (for NCCL, whose W = 1 communication is under a millisecond, about the
  efficiency; for the parameter server, whose W = 1 round still crosses the loopback,
  the honest one);
* vs together (``eff_together``) = images/s / images/s of ``--comm alone`` at the same
  net, mode and W: W GPUs of one host that train by themselves at the same time (each
  an NCCL world of one).  Its ratio to "vs alone" is what running together costs (the
  host's memory, PCIe and CPUs are shared); "vs together" is what communicating costs;
* server ms: per round, the busiest shard's time summing, updating and handing its
  answers to ZeroMQ (``python -m ps server --stats``), median over the timed rounds;
* server_tail_s, rank_spread_s (CSV only): per round, the latest shard's time from the
  last gradient's arrival to its last answer, and the most any bucket waited from its
  first rank's push to its last rank's (the ranks' skew); medians over the timed rounds;
  lagging_ranks: how many timed rounds each rank pushed last ("rank:rounds;...");
  host_ahead_s: how long a GPU worker's update waited for backward's kernels (median);
  host_cpu_s, host_vcsw, host_ivcsw: the worker's main thread during compute, its CPU time
  and its voluntary and involuntary context switches (medians; Linux's per-thread rusage);
  host_ahead_s_per_rank, host_cpu_s_per_rank: the first two per rank ("r0;r1;..."), beside
  compute_s_per_rank, to tell a rank slowed by its host from one slowed by its device;
  gpu_backlog_s, gpu_backlog_max_s (GPU workers under a swap plan, CSV only;
  ``swap.runtime.Backlog``): how far the device ran behind the host's launches through an
  iteration, median and largest over the probes of an iteration (medians over ranks and
  iterations; per rank in gpu_backlog_s_per_rank): near zero where the host is the bottleneck
  (a CPU time that grows with it is work), up to the launch queue's depth where the device
  is (a CPU time that grows with it is the wait for room in the queue);
  cuda_graph (CSV only): the fraction of the timed (rank, iteration) records whose forward and
  backward ran as one CUDA graph launch (``--cuda-graph``: swap/graph.py); empty when the
  workers did not report it;
  round_cpu_s, copy_cpu_s (CSV only): the CPU time of a worker's round thread and forward
  copy thread per iteration (medians), who holds the GIL while the main thread waits;
  read_lag_s: from the start of a worker's last push of a round to the moment the last shard
  read its last gradient (``time.monotonic()``, one clock for every process of a host; median
  over ranks and timed rounds): how long the shards' queue held the end of backward;
  gpu_*_per_rank (GPU runs, CSV only; scripts/_telemetry.py): rank r's GPU sampled by
  ``nvidia-smi`` every 100 ms over the whole configuration, its busy samples only: median
  SM clock, power and temperature, the fraction with a slowdown reason (power cap, thermal,
  power brake) and the reasons seen; host_steal_pct: the host's CPU time stolen by the
  hypervisor meanwhile (``/proc/stat``), to tell a slow rank's GPU or host apart;
* push_s, pull_wait_s, copy_up_s (CSV only): the parts of a parameter-server worker's
  Delta (``ps.worker.SyncRecord.parts``), medians over every (rank, timed iteration);
  early_mb: MB of answers back before the update; with ``--copy-up forward``,
  fwd_wait_s: the next forward's host wait for the copy thread, copy_thread_s: that
  thread's time per round (both in compute, not Delta);
* computation/communication = median compute_s / median delta_s over every
  (rank, timed iteration).

Data: the DummyData net of ``scripts/gen_prototxt.py`` at batch k.  By default
the images are a constant, filled once at setup (``--data constant``): with a
Gaussian filler each worker would draw W batches of k x 3 x 224 x 224 host
normals per iteration (a rank keeps every W-th batch, ``ps.worker.RankSlicer``),
and the benchmark would measure the data generator.  The solver has a fixed
learning rate, no test and no snapshot.

Every configuration is bounded by ``--timeout`` (its processes are killed
then); a failed one is recorded with the tail of its log and the run goes on.
The exit status is 1 if any configuration failed.  Output: a table on stdout,
``--csv`` and ``--md`` (device, date, the exact command, the paper's 8-GPU
speedups), and every process's log under ``--work-dir``.  The default matrix
is 36 configurations (2 nets x 2 modes x 3 communications x 3 world sizes);
where one command's time is limited, measure it in parts (``--nets``,
``--modes``, ``--comms``) with ``--append``, which keeps the other rows.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from scripts._telemetry import GpuSampler, cpu_times, physical_gpus, steal_pct  # noqa: E402
from scripts.launch_ps import free_port, wait_endpoint  # noqa: E402

MODES = ("caffe_ps", "accudnn_ps")
COMMS = ("ps", "nccl", "alone")
DEFAULT_COMMS = "ps,nccl"
# how a worker reaches a shard: none = TCP on the loopback as it is, emulated = the same with
# --link-gbps / --link-latency-ms, ipc = ZeroMQ's ipc:// (Unix-domain sockets, one host only),
# shm = TCP on the loopback for the messages, shared memory for the values (--ps-shm)
LINKS = ("none", "emulated", "ipc", "shm")
DEFAULT_LINKS = "none,emulated"
OVERLAPS = ("on", "off")

# Table 2 of the paper: speedup of 8 workers over one (one M40 per server).
PAPER_8GPU = {("resnet101", "caffe_ps"): 4.4, ("resnet101", "accudnn_ps"): 7.2,
              ("resnet152", "caffe_ps"): 4.0, ("resnet152", "accudnn_ps"): 7.7}

QUICK = dict(nets="cifar10_quick", gpus="1,2", caffe_batch="cifar10_quick=4",
             accudnn_batch="cifar10_quick=4", warmup=3, iters=10, timeout=60.0, ps_timeout=20.0)

CSV_COLUMNS = ["net", "mode", "swap", "comm", "link", "link_gbps", "link_latency_ms", "overlap",
               "world_size", "batch_per_worker", "shards", "status", "images_per_s", "iter_s",
               "speedup", "efficiency", "eff_alone", "eff_together", "compute_s", "comm_s",
               "comp_comm_ratio",
               "compute_s_per_rank", "comm_s_per_rank", "mb_pushed_per_iter",
               "mb_pulled_per_iter", "server_busy_s", "server_update_s", "server_tail_s",
               "rank_spread_s", "push_s",
               "pull_wait_s", "copy_up_s", "early_mb", "fwd_wait_s", "copy_thread_s",
               "host_ahead_s", "host_cpu_s", "host_vcsw", "host_ivcsw", "read_lag_s",
               "gpu_backlog_s", "gpu_backlog_max_s", "round_cpu_s", "copy_cpu_s",
               "cuda_graph", "host_ahead_s_per_rank", "host_cpu_s_per_rank", "gpu_backlog_s_per_rank",
               "lagging_ranks", "gpu_sm_mhz_per_rank", "gpu_power_w_per_rank",
               "gpu_temp_c_per_rank",
               "gpu_slowdown_per_rank", "gpu_reasons_per_rank", "gpu_busy_samples",
               "host_steal_pct",
               "timed_iterations",
               "wall_s", "note", "error", "device", "date", "command"]
FLOAT_COLUMNS = ("link_gbps", "link_latency_ms", "images_per_s", "iter_s", "speedup",
                 "efficiency", "eff_alone", "eff_together", "compute_s", "comm_s",
                 "comp_comm_ratio",
                 "mb_pushed_per_iter", "mb_pulled_per_iter", "server_busy_s", "server_update_s",
                 "server_tail_s", "rank_spread_s",
                 "push_s", "pull_wait_s", "copy_up_s", "early_mb", "fwd_wait_s", "copy_thread_s",
                 "host_ahead_s", "host_cpu_s", "host_vcsw", "host_ivcsw", "read_lag_s",
                 "gpu_backlog_s", "gpu_backlog_max_s", "round_cpu_s", "copy_cpu_s", "cuda_graph",
                 "wall_s")
PART_COLUMNS = ("push_s", "pull_wait_s", "copy_up_s", "early_mb", "fwd_wait_s", "copy_thread_s",
                "host_ahead_s", "host_cpu_s", "host_vcsw", "host_ivcsw", "gpu_backlog_s",
                "gpu_backlog_max_s", "round_cpu_s", "copy_cpu_s")
INT_COLUMNS = ("world_size", "batch_per_worker", "shards", "timed_iterations")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--nets", default=None, help="comma-separated names of scripts/gen_prototxt."
                                                 "py (default resnet101,resnet152)")
    ap.add_argument("--gpus", default=None, help="world sizes W (default 1,2,4); rank r uses GPU r")
    ap.add_argument("--modes", default=",".join(MODES), help="caffe_ps, accudnn_ps")
    ap.add_argument("--comms", default=DEFAULT_COMMS,
                    help="ps (ZeroMQ parameter server), nccl, alone (W single-GPU trainings "
                         "at once, the baseline without communication); nccl and alone are "
                         "skipped, with a note, for CPU workers (default ps,nccl)")
    ap.add_argument("--links", default=DEFAULT_LINKS,
                    help="for --comm ps: none (TCP on the loopback as it is), emulated "
                         "(the same with --link-gbps, --link-latency-ms) and/or ipc "
                         "(ZeroMQ's ipc://, Unix-domain sockets: the shards bind a socket "
                         "file; one host only) and/or shm (the workers' --ps-shm: values "
                         "through shared memory, headers on the loopback; one host only); "
                         "default none,emulated")
    ap.add_argument("--overlap", default="on",
                    help="on (communication overlaps backward, the workers' default) and/or off "
                         "(after backward: --no-overlap); default on")
    ap.add_argument("--bucket-mb", type=float, default=None,
                    help="with overlap: the workers' largest bucket (MiB; default theirs: an "
                         "NCCL all-reduce 25, a parameter-server push 8)")
    ap.add_argument("--copy-up", default=None, choices=("backward", "update", "forward"),
                    help="--comm ps with overlap: when the workers copy the answers into the net "
                         "(default theirs: forward on a GPU; ps/copyup.py)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="the workers run each iteration's forward and backward under the swap "
                         "plan as one CUDA graph (minicaffe train --cuda-graph; swap/graph.py)")
    ap.add_argument("--tail-mb", type=float, default=None,
                    help="--comm ps with overlap: the workers' last MB of parameters in 1 MiB "
                         "buckets (default theirs: 8)")
    ap.add_argument("--link-gbps", type=float, default=10.0, help="emulated bandwidth (Gb/s)")
    ap.add_argument("--link-latency-ms", type=float, default=0.1, help="emulated latency (ms)")
    ap.add_argument("--shards", default="W",
                    help="server shards: a number, or W for one per worker (the paper's servers "
                         "each hold one; default W)")
    ap.add_argument("--caffe-batch", default=None, metavar="NET=k,...",
                    help="per-worker minibatch of caffe_ps (default: the largest k whose 'none' "
                         "plan fits 90%% of --budget)")
    ap.add_argument("--accudnn-batch", default=None, metavar="NET=k,...",
                    help="per-worker minibatch of accudnn_ps (k*, from minicaffe plan --profile "
                         "P); required with --profile; without one, the caffe_ps minibatch")
    ap.add_argument("--profile", default=None, metavar="NET=P.json,...",
                    help="saved AccUDNN profiles (minicaffe train --save-profile); a net without "
                         "one runs accudnn_ps with --swap naive, noted in the output")
    ap.add_argument("--budget", default="12G", help="device memory budget of every worker")
    ap.add_argument("--host-budget", default=None,
                    help="pinned host memory of each accudnn_ps worker (minicaffe train "
                         "--host-budget)")
    ap.add_argument("--engine", choices=["CAFFE", "CUDNN"], default=None,
                    help="layer engine of the workers (default: minicaffe's)")
    ap.add_argument("--data", choices=["constant", "gaussian"], default="constant",
                    help="DummyData images: constant (filled once) or gaussian (drawn on the "
                         "host every forward, W times per worker)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed iterations (default 5)")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations (default 20)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds one configuration may take, start to end (default 600)")
    ap.add_argument("--ps-timeout", type=float, default=None,
                    help="workers' and shards' wait for the slowest peer (default 120)")
    ap.add_argument("--cpu", action="store_true", help="CPU workers (one BLAS thread each)")
    ap.add_argument("--pin", type=int, default=0, metavar="N",
                    help="give worker r the r-th block of N CPUs and the shards the rest "
                         "(Linux affinity; default 0: the scheduler places every process)")
    ap.add_argument("--quick", action="store_true",
                    help="CPU smoke run: cifar10_quick at batch 4, W = 1, 2, ZeroMQ only, "
                         f"{QUICK['warmup']}+{QUICK['iters']} iterations")
    ap.add_argument("--csv", default=os.path.join(ROOT, "docs", "results", "ps_scaling.csv"))
    ap.add_argument("--md", default=os.path.join(ROOT, "docs", "results", "ps_scaling.md"))
    ap.add_argument("--append", action="store_true",
                    help="keep the rows of --csv that this run does not measure again (same net, "
                         "mode, comm, link, overlap and W), so that the matrix can be measured in "
                         "several runs; each row keeps its device, date and command")
    ap.add_argument("--work-dir", default=None,
                    help="nets, solvers, logs and stats of every configuration (default: a new "
                         "temporary directory, kept)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the children")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the configurations and rank 0's command of each; start nothing")
    ap.add_argument("--redraw", nargs="+", default=None, metavar="CSV",
                    help="no run: draw the speedups of these saved CSVs into --md's .png")
    args = ap.parse_args(argv)
    defaults = dict(nets="resnet101,resnet152", gpus="1,2,4",
                    caffe_batch=None, accudnn_batch=None, warmup=5, iters=20, timeout=600.0,
                    ps_timeout=120.0)
    if args.quick:
        args.cpu = True
        defaults.update(QUICK)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def _names(text, known, what):
    out = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in out if t not in known]
    if bad or not out:
        raise SystemExit(f"{what}: unknown {', '.join(bad) or '(none given)'} (known: "
                         f"{', '.join(known)})")
    return out


def parse_net_map(text, what, kind=str) -> dict:
    """``resnet101=32,resnet152=16`` -> {'resnet101': 32, 'resnet152': 16}."""
    out = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise SystemExit(f"{what}: expected NET=VALUE[,NET=VALUE...], got {part!r}")
        net, value = (s.strip() for s in part.split("=", 1))
        try:
            out[net] = kind(value)
        except ValueError:
            raise SystemExit(f"{what}: {net}={value!r} is not a {kind.__name__}") from None
        if kind is int and out[net] <= 0:
            raise SystemExit(f"{what}: {net}={value} must be positive")
    return out


# ------------------------------------------------------------ configurations
@dataclass
class Config:
    net: str
    mode: str            # caffe_ps | accudnn_ps
    comm: str            # ps | nccl
    link: str            # none | emulated
    world: int
    batch: int
    swap: list           # minicaffe train options of the mode
    note: str = ""
    overlap: str = "on"  # on | off

    @property
    def swap_name(self) -> str:
        return self.swap[1]

    @property
    def tag(self) -> str:
        return (f"{self.net}_{self.mode}_{self.comm}_{self.link}_W{self.world}"
                + ("" if self.overlap == "on" else "_nooverlap"))


def auto_caffe_batch(net: str, budget: int, fraction: float = 0.9, engine=None) -> int:
    """The largest k whose ``none`` plan (Caffe's allocation) fits ``fraction`` of the budget.

    Sizes are linear in k (swap.plan.max_batch), so the net is built once on the
    CPU at batch 1 to be sized.  The remaining 10 % is left to what the plan does
    not hold: CuPy's transient allocations and cuDNN's workspaces.
    """
    from minicaffe.log import set_quiet
    from minicaffe.net import TRAIN, Net
    from scripts.gen_prototxt import build
    from swap.gmap import build_gmap
    from swap.plan import max_batch
    set_quiet(True)
    if engine:      # the workers' engine decides the convolutions' scratch
        from minicaffe.engine import set_default_engine
        set_default_engine(engine)
    gmap = build_gmap(Net(build(net, batch=1, data="dummy"), TRAIN, mode="CPU"))
    k = max_batch(gmap, "none", int(fraction * budget))
    if k < 1:
        raise SystemExit(f"{net}: not even minibatch 1 fits {fraction:.0%} of the budget under "
                         "--swap none; give --caffe-batch or a larger --budget")
    return k


def plan_configs(args) -> tuple:
    """(configurations in run order, notes for the output)."""
    from scripts.gen_prototxt import NETWORKS
    from swap.memory import parse_bytes
    nets = _names(args.nets, list(NETWORKS), "--nets")
    modes = _names(args.modes, MODES, "--modes")
    comms = _names(args.comms, COMMS, "--comms")
    links = _names(args.links, LINKS, "--links")
    overlaps = _names(args.overlap, OVERLAPS, "--overlap")
    try:
        worlds = sorted({int(w) for w in args.gpus.split(",") if w.strip()})
    except ValueError:
        raise SystemExit(f"--gpus: comma-separated world sizes, got {args.gpus!r}") from None
    if not worlds or worlds[0] < 1:
        raise SystemExit(f"--gpus: world sizes must be >= 1, got {args.gpus!r}")
    budget = parse_bytes(args.budget)
    caffe_k = parse_net_map(args.caffe_batch, "--caffe-batch", int)
    accudnn_k = parse_net_map(args.accudnn_batch, "--accudnn-batch", int)
    profiles = parse_net_map(args.profile, "--profile")
    for what, m in (("--caffe-batch", caffe_k), ("--accudnn-batch", accudnn_k),
                    ("--profile", profiles)):
        extra = sorted(set(m) - set(nets))
        if extra:
            raise SystemExit(f"{what} names {', '.join(extra)}, which is not in --nets")
    notes = []
    for gpu_only in ("nccl", "alone"):
        if gpu_only in comms and args.cpu:
            comms = [c for c in comms if c != gpu_only]
            notes.append(f"--comm {gpu_only} skipped: CPU workers (NCCL is for the GPUs of one "
                         "host).")
    if not comms:
        raise SystemExit("no communication left to measure (--comms)")
    variants = [(c, lk) for c in comms for lk in (links if c == "ps" else ["none"])]
    budget_args = ["--budget", args.budget]
    configs = []

    def caffe_batch(net):
        if net not in caffe_k:
            caffe_k[net] = auto_caffe_batch(net, budget, engine=args.engine)
            notes.append(f"{net}: caffe_ps minibatch {caffe_k[net]} per worker, the largest "
                         f"whose --swap none plan fits 90% of {args.budget}.")
        return caffe_k[net]

    for net in nets:
        for mode in modes:
            note = ""
            if mode == "caffe_ps":
                k = caffe_batch(net)
                swap = ["--swap", "none", *budget_args]
            elif net in profiles:
                if net not in accudnn_k:
                    raise SystemExit(
                        f"accudnn_ps on {net}: --profile needs --accudnn-batch {net}=k (k*: "
                        f"minicaffe plan --model prototxt/{net}/dummy.prototxt --budget "
                        f"{args.budget} --profile {profiles[net]})")
                k = accudnn_k[net]
                swap = ["--swap", "dynamic", *budget_args, "--batch", str(k), "--profile",
                        os.path.abspath(profiles[net])]
                if args.host_budget:
                    swap += ["--host-budget", args.host_budget]
            else:
                k = accudnn_k[net] if net in accudnn_k else caffe_batch(net)
                swap = ["--swap", "naive", *budget_args]
                note = ("no AccUDNN profile (--profile): the workers run --swap naive, not "
                        "the dynamic plan")
                notes.append(f"{net}: accudnn_ps has no --profile {net}=P.json, so its workers "
                             f"run --swap naive (every feature map offloaded) at minibatch {k}, "
                             "NOT AccUDNN's dynamic plan: those rows measure naive swapping.")
            for comm, link in variants:
                for overlap in overlaps:
                    for w in worlds:
                        configs.append(Config(net, mode, comm, link, w, k, swap, note, overlap))
    return configs, notes


# --------------------------------------------------------------- files
SOLVER = """\
net: "{net}"
base_lr: 0.001
lr_policy: "fixed"
momentum: 0.9
weight_decay: 0.0001
max_iter: {max_iter}
display: 0
snapshot: 0
snapshot_after_train: false
snapshot_prefix: "{prefix}"
random_seed: 1
solver_mode: {mode}
"""


def write_net(work, net, batch, data) -> str:
    """The DummyData net at ``batch`` (written once per net and batch)."""
    from minicaffe.proto import caffe_pb2
    from scripts.gen_prototxt import build, to_text
    path = os.path.join(work, f"{net}_k{batch}_{data}.prototxt")
    if os.path.exists(path):
        return path
    param = build(net, batch=batch, data="dummy")
    if data == "constant":
        for layer in param.layer:
            if layer.type == "DummyData":
                # filled once at setup (Caffe's refill_ is false for constant fillers)
                layer.dummy_data_param.data_filler[0].CopyFrom(
                    caffe_pb2.FillerParameter(type="constant", value=1.0))
    with open(path, "w") as f:
        f.write(to_text(param))
    return path


def write_solver(run_dir, net_path, max_iter, cpu) -> str:
    path = os.path.join(run_dir, "solver.prototxt")
    with open(path, "w") as f:
        f.write(SOLVER.format(net=net_path, max_iter=max_iter, mode="CPU" if cpu else "GPU",
                              prefix=os.path.join(run_dir, "snap")))
    return path


# --------------------------------------------------------------- processes
class Proc:
    """One child, its output in ``run_dir/NAME.log``."""

    def __init__(self, name, cmd, run_dir, env, cpus=None):
        self.name = name
        self.cmd = cmd
        self.log_path = os.path.join(run_dir, f"{name}.log")
        with open(self.log_path, "w") as log:
            log.write("$ " + shlex.join(cmd) + "\n")
            log.flush()
            if cpus:
                log.write(f"# CPUs {cpu_list(cpus)}\n")
                log.flush()
            self.popen = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        self.ended = None          # monotonic time the exit was seen

    def tail(self, lines=15) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                text = f.read().strip().splitlines()
        except OSError:
            return ""
        return "\n".join(f"[{self.name}] {ln}" for ln in text[-lines:])

    def kill(self):
        if self.popen.poll() is None:
            self.popen.kill()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass


def cpu_list(cpus) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def pin_plan(n_per_worker: int, world: int, allowed=None) -> tuple:
    """``--pin N``: ([CPUs of worker r], CPUs of the shards): worker r takes the r-th block of
    N CPUs this process may use, the shards share the rest, so that a shard's threads never
    run on a worker's cores.  ([None] * world, None) when off; ValueError when too few CPUs
    are left."""
    if not n_per_worker:
        return [None] * world, None
    allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    need = n_per_worker * world
    if need >= len(allowed):
        raise ValueError(f"--pin {n_per_worker}: {world} worker(s) need {need} CPUs and the "
                         f"shards at least one more; this process may use {len(allowed)}")
    blocks = [set(allowed[r * n_per_worker:(r + 1) * n_per_worker]) for r in range(world)]
    return blocks, set(allowed[need:])


def child_env(cpu: bool) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("NCCL_NVLS_ENABLE", "0")     # NVLink multicast off (docs/PS.md)
    if cpu:
        # W workers share the cores: one BLAS thread each, as one GPU each
        for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(v, "1")
    return env


def wait_group(procs, deadline, grace=5.0):
    """Wait for every process; returns None, or (why it failed, the process whose
    log tells most: the first to fail, or a rank still running at the deadline).

    After the first non-zero exit the other workers get ``grace`` seconds to
    end by themselves (they usually name the culprit), then every process still
    running is killed (shards at once when no worker is left: they would only
    wait for their own timeout).  At the deadline every process still running
    is killed.
    """
    first_bad = None
    until = deadline
    while True:
        now = time.monotonic()
        running = []
        for p in procs:
            if p.popen.poll() is None:
                running.append(p)
            elif p.ended is None:
                p.ended = now
                if p.popen.returncode != 0 and first_bad is None:
                    first_bad = p
                    until = min(deadline, now + grace)
        if not running:
            break
        if first_bad is not None and not any(p.name.startswith("rank") for p in running):
            until = now
        if now >= until:
            for p in running:
                p.kill()
            if first_bad is None:
                ranks = [p for p in running if p.name.startswith("rank")]
                return ("timed out: still running after the configuration's timeout: "
                        + ", ".join(p.name for p in running), (ranks or running)[0])
            break
        time.sleep(0.05)
    if first_bad is not None:
        return f"{first_bad.name} exited with status {first_bad.popen.returncode}", first_bad
    return None


def n_shards(cfg: Config, args) -> int:
    return cfg.world if args.shards == "W" else int(args.shards)


def link_args(cfg: Config, args) -> list:
    if cfg.link != "emulated":
        return []
    return ["--link-gbps", str(args.link_gbps), "--link-latency-ms", str(args.link_latency_ms)]


def worker_cmd(cfg: Config, args, rank, solver, ps_arg, run_dir) -> list:
    """``minicaffe train`` of one rank: its GPU (or the CPU), the mode's swap
    options, the link, and the statistics file the summary reads."""
    # alone: rank r trains by itself on GPU r, an NCCL world of one (its all-reduce of one
    # rank is under a millisecond), at the same time as the others
    alone = cfg.comm == "alone"
    cmd = [args.python, "-m", "minicaffe", "train", "--solver", solver, "--ps", ps_arg,
           "--rank", "0" if alone else str(rank), "--world-size", "1" if alone else str(cfg.world),
           "--comm", "nccl" if alone else cfg.comm,
           *(["--cpu"] if args.cpu else ["--gpu", str(rank)]), "--ps-timeout",
           str(args.ps_timeout), "--ps-stats", os.path.join(run_dir, f"rank{rank}.jsonl"),
           *link_args(cfg, args), *cfg.swap]
    if cfg.overlap == "off":
        cmd.append("--no-overlap")
    elif args.bucket_mb:
        cmd += ["--bucket-mb", str(args.bucket_mb)]
    if cfg.overlap != "off" and cfg.comm == "ps" and args.copy_up:
        cmd += ["--copy-up", args.copy_up]
    if cfg.overlap != "off" and cfg.comm == "ps" and args.tail_mb is not None:
        cmd += ["--tail-mb", str(args.tail_mb)]
    if cfg.comm == "ps" and cfg.link == "shm":
        cmd.append("--ps-shm")
    if args.engine:
        cmd += ["--engine", args.engine]
    if getattr(args, "cuda_graph", False):
        cmd.append("--cuda-graph")
    return cmd


def distinct_free_ports(n: int) -> list:
    """``n`` loopback ports that are free now and differ from one another (the OS may hand
    out a port it just released again)."""
    ports: list = []
    for _ in range(100 * n):
        p = free_port("127.0.0.1")
        if p not in ports:
            ports.append(p)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"could not find {n} distinct free loopback ports")


def run_config(cfg: Config, args, work) -> dict:
    """Start the shards (or the NCCL rendezvous) and the W workers of one
    configuration, wait for them, and summarise their statistics."""
    run_dir = os.path.join(work, cfg.tag)
    os.makedirs(run_dir, exist_ok=True)
    for f in os.listdir(run_dir):          # a rerun into the same work dir starts clean
        if f.endswith((".jsonl", ".endpoint")):
            os.unlink(os.path.join(run_dir, f))
    net_path = write_net(work, cfg.net, cfg.batch, args.data)
    solver = write_solver(run_dir, net_path, args.warmup + args.iters, args.cpu)
    env = child_env(args.cpu)
    shards = n_shards(cfg, args)
    link = link_args(cfg, args)
    row = base_row(cfg, args, shards)
    procs = []
    sock_dir = None
    worker_cpus, shard_cpus = pin_plan(args.pin, cfg.world)
    # rank r runs on CUDA device r (worker_cmd's --gpu r): physical_gpus maps it for nvidia-smi
    sampler = None if args.cpu else GpuSampler(os.path.join(run_dir, "gpu_samples.csv")).start()
    cpu_before = cpu_times()
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    failure = None
    try:
        if cfg.comm == "ps":
            # the shards bind free ports (or socket files) and report them (--endpoint-file)
            if cfg.link == "ipc":
                # a short directory of its own: a Unix socket's path holds at most 107 bytes
                sock_dir = tempfile.mkdtemp(prefix="mcps-")
            for s in range(shards):
                bind = (f"ipc://{sock_dir}/shard{s}" if cfg.link == "ipc"
                        else "tcp://127.0.0.1:*")
                procs.append(Proc(f"shard{s}", [
                    args.python, "-m", "ps", "server", "--shard", str(s), "--world-size",
                    str(cfg.world), "--bind", bind, "--timeout",
                    str(args.ps_timeout), "--endpoint-file",
                    os.path.join(run_dir, f"shard{s}.endpoint"), "--stats",
                    os.path.join(run_dir, f"shard{s}.jsonl"), *link], run_dir, env,
                    shard_cpus))
            endpoints = []
            for s, p in enumerate(procs):
                try:
                    endpoints.append(wait_endpoint(
                        p, os.path.join(run_dir, f"shard{s}.endpoint"), deadline))
                except RuntimeError as e:
                    failure = (str(e), p)
                    break
            ps_arg = ",".join(endpoints)
        elif cfg.comm == "nccl":
            ps_arg = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
        if failure is None:
            ports = distinct_free_ports(cfg.world) if cfg.comm == "alone" else []
            for r in range(cfg.world):
                if ports:                   # alone: a rendezvous of its own for each rank
                    ps_arg = f"tcp://127.0.0.1:{ports[r]}"
                procs.append(Proc(f"rank{r}", worker_cmd(cfg, args, r, solver, ps_arg, run_dir),
                                  run_dir, env, worker_cpus[r]))
            failure = wait_group(procs, deadline)
    except OSError as e:      # a child that cannot start (--python, a full disk ...)
        failure = (f"cannot start a process: {e}", procs[-1] if procs else None)
    finally:
        for p in procs:
            p.kill()
        gpu_stats = (sampler.stop(physical_gpus(cfg.world, env)) if sampler is not None
                     else {})
        if sock_dir is not None:
            shutil.rmtree(sock_dir, ignore_errors=True)
    row["wall_s"] = time.monotonic() - t0
    row["host_steal_pct"] = steal_pct(cpu_before, cpu_times())
    row.update(gpu_stats)
    if sampler is not None and sampler.note:
        row["note"] = "; ".join(x for x in (row["note"], sampler.note) if x)
    if failure is None:
        try:
            records = [read_stats(os.path.join(run_dir, f"rank{r}.jsonl"))
                       for r in range(cfg.world)]
            row.update(summarise(records, args.warmup, args.iters, cfg.batch,
                                 together=cfg.comm != "alone"))
            if cfg.comm == "ps":
                shard_records = [read_stats(os.path.join(run_dir, f"shard{s}.jsonl"))
                                 for s in range(shards)]
                row.update(summarise_shards(shard_records, args.warmup, args.iters))
                row.update(read_lag(records, shard_records, args.warmup, args.iters))
            row["status"] = "ok"
            return row
        except ValueError as e:
            failure = (f"statistics: {e}", procs[-1])
    reason, culprit = failure
    tail = culprit.tail() if culprit is not None else ""
    row["status"] = "failed"
    row["error"] = f"{reason} (logs: {run_dir})" + (f"\n{tail}" if tail else "")
    return row


def base_row(cfg: Config, args, shards) -> dict:
    row = {c: "" for c in CSV_COLUMNS}
    row.update(net=cfg.net, mode=cfg.mode, swap=cfg.swap_name, comm=cfg.comm, link=cfg.link,
               overlap=cfg.overlap, world_size=cfg.world, batch_per_worker=cfg.batch, note=cfg.note,
               shards=shards if cfg.comm == "ps" else 0)
    if cfg.link == "emulated":
        row.update(link_gbps=args.link_gbps, link_latency_ms=args.link_latency_ms)
    return row


# --------------------------------------------------------------- statistics
def read_stats(path) -> list:
    """The JSON lines of ``--ps-stats`` (ps.worker.SyncRecord)."""
    if not os.path.exists(path):
        raise ValueError(f"{path} was not written")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarise(records_by_rank, warmup: int, iters: int, batch: int,
              together: bool = True) -> dict:
    """Throughput and the compute/communication split of one configuration.

    records_by_rank[r]: rank r's records (``iteration``, ``compute_s``,
    ``delta_s``, ``bytes_pushed``, ``bytes_pulled``), one per iteration.  The
    first ``warmup`` are dropped, the next ``iters`` timed.  compute + delta of
    one record is the time between two synchronisation ends, i.e. one
    iteration; a BSP round lasts as long as its slowest rank's.  With
    ``together=False`` (``--comm alone``) the ranks do not wait for one another:
    images/s is the sum of every rank's k / its median iteration, and iter_s the
    period that gives W x k images at that rate.
    """
    world = len(records_by_rank)
    timed = []
    for r, recs in enumerate(records_by_rank):
        kept = sorted(recs, key=lambda x: x["iteration"])[warmup:warmup + iters]
        if not kept:
            raise ValueError(f"rank {r} recorded {len(recs)} iteration(s), none after the "
                             f"{warmup} warm-up one(s)")
        timed.append({x["iteration"]: x for x in kept})
    common = sorted(set.intersection(*(set(t) for t in timed)))
    if not common:
        raise ValueError("the ranks share no timed iteration")
    if together:
        iter_s = statistics.median(max(t[i]["compute_s"] + t[i]["delta_s"] for t in timed)
                                   for i in common)
    else:
        rate = sum(batch / statistics.median(t[i]["compute_s"] + t[i]["delta_s"]
                                             for i in common) for t in timed)
        iter_s = world * batch / rate
    comp = [t[i]["compute_s"] for t in timed for i in common]
    comm = [t[i]["delta_s"] for t in timed for i in common]
    compute_s, comm_s = statistics.median(comp), statistics.median(comm)
    n = len(common) * world
    # the parts of Delta a parameter-server worker times (ps.worker.SyncRecord.parts)
    parts = {}
    for key in PART_COLUMNS:
        got = [t[i]["parts"][key] for t in timed for i in common
               if key in t[i].get("parts", {})]
        if got:
            parts[key] = statistics.median(got)
    flags = [t[i]["parts"]["graph"] for t in timed for i in common
             if "graph" in t[i].get("parts", {})]
    if flags:
        parts["cuda_graph"] = sum(flags) / len(flags)
    # per rank, where a rank computes slower than the others: was its host behind (ahead ~0,
    # CPU time ~ compute) or its device (the host waited)?
    for key in ("host_ahead_s", "host_cpu_s", "gpu_backlog_s"):
        if all(key in t[i].get("parts", {}) for t in timed for i in common):
            parts[key + "_per_rank"] = ";".join(
                f"{statistics.median(t[i]['parts'][key] for i in common):.6g}" for t in timed)
    return {
        **parts,
        "iter_s": iter_s,
        "images_per_s": world * batch / iter_s,
        "compute_s": compute_s,
        "comm_s": comm_s,
        "comp_comm_ratio": compute_s / comm_s if comm_s > 0 else float("inf"),
        "compute_s_per_rank": ";".join(
            f"{statistics.median(t[i]['compute_s'] for i in common):.6g}" for t in timed),
        "comm_s_per_rank": ";".join(
            f"{statistics.median(t[i]['delta_s'] for i in common):.6g}" for t in timed),
        "mb_pushed_per_iter": sum(t[i]["bytes_pushed"] for t in timed for i in common) / n / 1e6,
        "mb_pulled_per_iter": sum(t[i]["bytes_pulled"] for t in timed for i in common) / n / 1e6,
        "timed_iterations": len(common),
    }


def summarise_shards(records_by_shard, warmup: int, iters: int) -> dict:
    """The servers' own time per round (``python -m ps server --stats``): summing and
    updating, and that plus handing the answers to ZeroMQ, of the busiest shard of each
    timed round (the rounds after ``warmup``); medians over the rounds."""
    kept = [{x["iteration"]: x for x in sorted(recs, key=lambda x: x["iteration"])
             [warmup:warmup + iters]} for recs in records_by_shard]
    common = sorted(set.intersection(*(set(k) for k in kept))) if kept else []
    if not common:
        return {}
    return {
        "server_update_s": statistics.median(max(k[i]["update_s"] for k in kept)
                                             for i in common),
        "server_busy_s": statistics.median(max(k[i]["update_s"] + k[i]["send_s"] for k in kept)
                                           for i in common),
        **{col: statistics.median(max(k[i][key] for k in kept) for i in common)
           for col, key in (("server_tail_s", "tail_s"), ("rank_spread_s", "spread_s"))
           if all(key in k[i] for k in kept for i in common)},
        **_lagging(kept, common),
    }


def read_lag(records_by_rank, records_by_shard, warmup: int, iters: int) -> dict:
    """``read_lag_s``: per timed round and rank, from the start of the worker's last push
    (``parts["last_push_t"]``) to the latest moment a shard read that rank's last gradient of
    the round (its ``start_t + rank_done_s[rank]``), both ``time.monotonic()``; the median.
    Empty where the workers or the shards do not record them (no overlap, older runs)."""
    shards = [{x["iteration"]: x for x in recs} for recs in records_by_shard]
    lags = []
    for rank, recs in enumerate(records_by_rank):
        for x in sorted(recs, key=lambda x: x["iteration"])[warmup:warmup + iters]:
            pushed = x.get("parts", {}).get("last_push_t")
            rounds = [s.get(x["iteration"]) for s in shards]
            if pushed is None or not rounds or any(
                    r is None or "start_t" not in r or len(r.get("rank_done_s", ())) <= rank
                    for r in rounds):
                continue
            read = max(r["start_t"] + r["rank_done_s"][rank] for r in rounds)
            lags.append(read - pushed)
    return {"read_lag_s": statistics.median(lags)} if lags else {}


def _lagging(kept, common) -> dict:
    """``lagging_ranks``: per timed round, the rank whose last push came last to the shard that
    heard last from anyone ("rank:rounds;..."); empty without the shards' ``rank_done_s``."""
    if not all(k[i].get("rank_done_s") for k in kept for i in common):
        return {}
    counts: dict = {}
    for i in common:
        done = max((k[i]["rank_done_s"] for k in kept), key=max)
        r = done.index(max(done))
        counts[r] = counts.get(r, 0) + 1
    return {"lagging_ranks": ";".join(f"{r}:{n}" for r, n in sorted(counts.items()))}


def add_scaling(rows):
    """speedup = images/s over the same (net, mode, comm, link, overlap) at W = 1;
    efficiency = speedup / W.  eff_alone = images/s over W GPUs that compute alone, as
    fast as that W = 1 run computes (k / its compute time): the loss to communication and
    to running together, the issue's scaling efficiency.  eff_together = images/s over
    the ``--comm alone`` row of the same net, mode and W (W GPUs training by themselves at
    the same time): the loss to communication alone.  Left empty where a baseline failed
    or was not run."""
    base = {(r["net"], r["mode"], r["comm"], r["link"], r["overlap"]): r
            for r in rows if r["status"] == "ok" and int(r["world_size"]) == 1}
    together = {(r["net"], r["mode"], int(r["world_size"])): r
                for r in rows if r["status"] == "ok" and r["comm"] == "alone"}
    for r in rows:
        r["speedup"] = r["efficiency"] = r["eff_alone"] = r["eff_together"] = ""
        b = base.get((r["net"], r["mode"], r["comm"], r["link"], r["overlap"]))
        if r["status"] == "ok" and b:
            w = int(r["world_size"])
            r["speedup"] = r["images_per_s"] / b["images_per_s"]
            r["efficiency"] = r["speedup"] / w
            if b["compute_s"]:
                r["eff_alone"] = r["images_per_s"] / (w * int(b["batch_per_worker"])
                                                      / b["compute_s"])
        a = together.get((r["net"], r["mode"], int(r["world_size"])))
        if r["status"] == "ok" and a and r["comm"] != "alone":
            r["eff_together"] = r["images_per_s"] / a["images_per_s"]
    return rows


# ------------------------------------------------------------------ output
def _fmt(v, digits=6):
    if isinstance(v, float):
        return "inf" if v == float("inf") else f"{v:.{digits}g}"
    return str(v)


def _write_text(path, text: str):
    """``text`` to ``path`` atomically (a temporary file beside it, then a rename): the
    tables are rewritten after every configuration, and a run killed while writing keeps the
    previous version whole."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def write_csv(path, rows):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS)
    w.writeheader()
    for r in rows:
        w.writerow({c: _fmt(r.get(c, "")) for c in CSV_COLUMNS})
    _write_text(path, buf.getvalue())


def read_csv_rows(path) -> list:
    """Rows written by :func:`write_csv`, numbers as numbers (empty cells stay "").
    Rows written before the overlap column were measured without overlap: "off"."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for c in CSV_COLUMNS:
            r.setdefault(c, "")
        r["overlap"] = r["overlap"] or "off"
        for c in FLOAT_COLUMNS:
            if r[c] != "":
                r[c] = float(r[c])
        for c in INT_COLUMNS:
            if r[c] != "":
                r[c] = int(r[c])
    return rows


def row_key(r) -> tuple:
    return r["net"], r["mode"], r["comm"], r["link"], r["overlap"], int(r["world_size"])


def merge_rows(old, new) -> list:
    """``old`` rows not measured again in ``new``, then ``new``; ordered by net (as first
    seen), mode, comm, link, overlap and W."""
    keys = {row_key(r) for r in new}
    rows = [r for r in old if row_key(r) not in keys] + list(new)
    nets = list(dict.fromkeys(r["net"] for r in rows))
    order = {m: i for i, m in enumerate(MODES + COMMS + LINKS + OVERLAPS)}
    return sorted(rows, key=lambda r: (nets.index(r["net"]), order.get(r["mode"], 99),
                                       order.get(r["comm"], 99), order.get(r["link"], 99),
                                       order.get(r["overlap"], 99), int(r["world_size"])))


def _link_words(r) -> str:
    if r["link"] in ("ipc", "shm"):
        return r["link"]
    if r["link"] != "emulated":
        return "loopback" if r["comm"] == "ps" else "-"
    if r["link_gbps"] == "":
        return "emulated"
    return f"{_fmt(r['link_gbps'], 3)} Gb/s, {_fmt(r['link_latency_ms'], 3)} ms"


def table_lines(rows) -> list:
    """The md/printed table: one line per row, with the speedup over one GPU in Caffe mode
    (:func:`paper_baseline`; "-" without one) beside the paper's at W = 8."""
    head = ["net", "mode", "swap", "comm", "link", "overlap", "W", "k", "images/s", "speedup",
            "efficiency", "vs alone", "vs together", "over one Caffe GPU", "paper (8 M40s)",
            "compute ms", "comm ms", "comp/comm", "server ms", "MB pushed", "status"]
    out = [head]
    bases = {net: paper_baseline(rows, net) for net in dict.fromkeys(r["net"] for r in rows)}
    for r in rows:
        ok = r["status"] == "ok"
        base = bases[r["net"]]
        over_caffe = (f"{r['images_per_s'] / base['images_per_s']:.2f}x"
                      if ok and base and r["comm"] != "alone" else "-")
        paper = PAPER_8GPU.get((r["net"], r["mode"])) if int(r["world_size"]) == 8 else None

        def num(key, scale=1.0, fmt="{:.3g}"):
            v = r.get(key, "")
            if not ok or v == "":
                return "-"
            return "inf" if v == float("inf") else fmt.format(v * scale)
        out.append([r["net"], r["mode"], r["swap"], r["comm"], _link_words(r), r["overlap"],
                    str(r["world_size"]), str(r["batch_per_worker"]),
                    num("images_per_s", fmt="{:.1f}"), num("speedup", fmt="{:.2f}x"),
                    num("efficiency", fmt="{:.0%}"), num("eff_alone", fmt="{:.0%}"),
                    num("eff_together", fmt="{:.0%}"), over_caffe,
                    "-" if paper is None else f"{paper:.1f}x",
                    num("compute_s", 1e3, "{:.1f}"), num("comm_s", 1e3, "{:.1f}"),
                    num("comp_comm_ratio", fmt="{:.2f}"), num("server_busy_s", 1e3, "{:.1f}"),
                    num("mb_pushed_per_iter", fmt="{:.3g}"), r["status"]])
    return out


def print_table(rows):
    lines = table_lines(rows)
    widths = [max(len(x[i]) for x in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)))


def device_words(cpu: bool) -> str:
    """``4 x NVIDIA H100 80GB HBM3`` from nvidia-smi, or the CPU's model."""
    if not cpu:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout
            names = [n.strip() for n in out.splitlines() if n.strip()]
            if names:
                return f"{len(names)} x {names[0]}" + ("" if len(set(names)) == 1
                                                       else f" (and {', '.join(set(names))})")
        except (OSError, subprocess.SubprocessError):
            pass
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU {model} ({os.cpu_count()} cores)"


def write_md(path, rows, args, notes):
    ok = [r for r in rows if r["status"] == "ok"]
    runs = list(dict.fromkeys((r["device"], r["date"], r["command"]) for r in rows))
    if len(runs) == 1:
        device, date, command = runs[0]
        lines = [f"Parameter-server scaling (issue 6), {device}, {date}", "", f"`{command}`", ""]
    else:
        lines = ["Parameter-server scaling (issue 6), rows of several runs (--append); "
                 "speedups compare rows of one net, mode, comm, link and overlap, which may come "
                 "from different runs:", ""]
        lines += [f"- {date}, {device}: `{command}`" for device, date, command in runs] + [""]
    lines += [f"Settings of the last run. Per worker: "
              f"{'CPU' if args.cpu else 'one GPU (rank r on GPU r)'}, budget "
              f"{args.budget}, DummyData images {args.data}; {args.warmup} warm-up and "
              f"{args.iters} timed iterations; server shards: "
              f"{'one per worker' if args.shards == 'W' else args.shards}; emulated links "
              f"{args.link_gbps:g} Gb/s and {args.link_latency_ms:g} ms each way.", ""]
    body = table_lines(rows)
    lines.append("| " + " | ".join(body[0]) + " |")
    lines.append("|" + "---|" * len(body[0]))
    for b in body[1:]:
        lines.append("| " + " | ".join(b) + " |")
    lines += ["", "images/s: W x k over the median iteration period (per BSP round, the slowest "
              "rank's compute + sync). speedup: over the same net, mode, comm, link and overlap "
              "at W = 1; efficiency = speedup / W; vs alone: images/s over W x k / (compute "
              "time at W = 1), against GPUs that never communicate; vs together: over the "
              "'alone' row of the same W (W GPUs training by themselves at the same time). "
              "alone: images/s summed over ranks that do not wait for one another. "
              "compute: forward + "
              "backward; server ms: the busiest shard's summing, updating and sending per "
              "round (--stats); comm: the "
              "synchronisation (copies, push/pull or NCCL barrier and all-reduce, waiting for the "
              "slowest peer; with overlap on, only what backward did not hide); "
              "both medians over every rank and timed iteration (ps/worker.py, --ps-stats). "
              "Link emulation delays each worker-shard link on its own; it does not model a "
              "network card shared by several links (docs/PS.md). link ipc: ZeroMQ ipc:// "
              "sockets; link shm: the workers' --ps-shm, values through shared memory (MB "
              "pushed then counts the headers only)."]
    paper = any(r["net"] == net for net, _ in PAPER_8GPU for r in rows)
    most = max(int(r["world_size"]) for r in rows)
    lines += ["", "Paper (Table 2, 8 servers with one GPU each, speedup over one): ResNet-101 "
              "Caffe_PS 4.4x, AccUDNN_PS 7.2x; ResNet-152 Caffe_PS 4.0x, AccUDNN_PS 7.7x. "
              + (f"Measured here: up to W = {most}." if paper
                 else "(None of these nets was measured here.)")]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines += ["", f"{len(failed)} of {len(rows)} configuration(s) failed:", ""]
        for r in failed:
            lines += [f"{r['net']} {r['mode']} {r['comm']} {r['link']} overlap {r['overlap']} "
                      f"W={r['world_size']}:",
                      "```", r["error"], "```"]
    lines.append(f"\n{len(ok)} of {len(rows)} configuration(s) measured.")
    _write_text(path, "\n".join(lines) + "\n")


def paper_baseline(rows, net):
    """The paper's Table 2 baseline for ``net``: one GPU training in Caffe mode (caffe_ps at
    W = 1 without a parameter server: the ``alone`` row, else NCCL's world of one), or None."""
    for comm in ("alone", "nccl"):
        for r in rows:
            if (r["net"], r["mode"], r["comm"], r["status"]) == (net, "caffe_ps", comm, "ok") \
                    and int(r["world_size"]) == 1:
                return r
    return None


def plot_scaling(rows, path, title=None) -> bool:
    """Table 2 as a figure: per network, every measured series (net, mode, comm, link, overlap)
    against W, with the paper's 8-GPU speedups as stars.  Where the net has a Caffe-mode row at
    W = 1 without a parameter server (:func:`paper_baseline`), the speedups are over it, as the
    paper's (Table 1 x Table 2: 132 / 4.4 = 217 / 7.2 = 30 images/s for ResNet-101, one M40 in
    Caffe); otherwise over W = 1 of the same series, with the ideal line.  False without
    matplotlib or without a series."""
    from scripts._figures import pyplot, save
    plt = pyplot()
    if plt is None:
        return False
    ok = [r for r in rows if r["status"] == "ok" and r["comm"] != "alone"]
    nets = list(dict.fromkeys(r["net"] for r in ok))
    if not nets:
        return False
    fig, axes = plt.subplots(1, len(nets), figsize=(5.5 * len(nets), 4.2), squeeze=False)
    for ax, net in zip(axes[0], nets):
        base = paper_baseline(rows, net)
        series: dict = {}
        for r in ok:
            if r["net"] != net:
                continue
            y = (r["images_per_s"] / base["images_per_s"] if base
                 else r["speedup"] if r["speedup"] != "" else None)
            if y is None:
                continue
            label = f"{r['mode']}, {r['comm']}" + (
                f", {r['link']}" if r["comm"] == "ps" else "") + (
                ", no overlap" if r["overlap"] == "off" else "")
            series.setdefault(label, []).append((int(r["world_size"]), y))
        for label, pts in series.items():
            pts.sort()
            ax.plot([w for w, _ in pts], [v for _, v in pts], marker="o",
                    ls="-" if "accudnn" in label else "--", label=label)
        if base is None:
            most = max(w for pts in series.values() for w, _ in pts)
            ax.plot([1, most], [1, most], color="k", lw=0.8, ls=":", label="ideal")
            ax.set_ylabel("speedup over W = 1 of the same series")
        else:
            ax.set_ylabel(f"speedup over one GPU in Caffe mode\n(caffe_ps, W = 1, "
                          f"{base['comm']}: {base['images_per_s']:.0f} images/s)")
        for (n, mode), v in PAPER_8GPU.items():
            if n == net:
                ax.plot([8], [v], marker="*", ms=12, ls="none", label=f"paper {mode} (8 M40s)")
        ax.set_title(net)
        ax.set_xlabel("workers W (one GPU each)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    save(fig, path, title)
    return True


def redraw(paths, png) -> int:
    """``--redraw``: Table 2's figure from saved CSVs (a later file's row replaces an earlier
    one of the same net, mode, comm, link, overlap and W)."""
    rows: list = []
    for path in paths:
        rows = merge_rows(rows, read_csv_rows(path))
    add_scaling(rows)
    devices = sorted({r["device"] for r in rows if r.get("device")})
    if not plot_scaling(rows, png, "; ".join(devices) or None):
        print(f"nothing to draw from {', '.join(paths)} (no W > 1 series)", file=sys.stderr)
        return 1
    md = os.path.splitext(png)[0] + ".md"
    runs = list(dict.fromkeys((r["device"], r["date"], r["command"]) for r in rows))
    lines = [f"Parameter-server scaling (issue 6), redrawn from {', '.join(paths)}; the runs:", ""]
    lines += [f"- {date}, {device}: `{command}`" for device, date, command in runs] + [""]
    body = table_lines(rows)
    lines += ["| " + " | ".join(body[0]) + " |", "|" + "---|" * len(body[0])]
    lines += ["| " + " | ".join(b) + " |" for b in body[1:]]
    with open(md, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {png} and {md}")
    return 0


# -------------------------------------------------------------------- main
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = "python3 scripts/ps_scaling.py" + ("" if not argv else " " + shlex.join(argv))
    args = parse_args(argv)
    png = os.path.splitext(args.md)[0] + ".png"
    if args.redraw:
        return redraw(args.redraw, png)
    if args.warmup < 0 or args.iters < 1:
        raise SystemExit("--warmup must be >= 0 and --iters >= 1")
    if args.shards != "W" and (not args.shards.isdigit() or int(args.shards) < 1):
        raise SystemExit(f"--shards: a positive number or W, got {args.shards!r}")
    configs, notes = plan_configs(args)
    if args.dry_run:
        for n in notes:
            print(f"note: {n}")
        for cfg in configs:
            shards = {"ps": f"{n_shards(cfg, args)} shard(s)", "nccl": "NCCL",
                      "alone": f"{cfg.world} NCCL world(s) of one"}[cfg.comm]
            cmd = worker_cmd(cfg, args, 0, "WORK/" + cfg.tag + "/solver.prototxt", "ENDPOINTS",
                             "WORK/" + cfg.tag)
            print(f"{cfg.tag}: k={cfg.batch}, {shards}\n  {shlex.join(cmd)}")
        return 0
    work = os.path.abspath(args.work_dir or tempfile.mkdtemp(prefix="ps_scaling_"))
    os.makedirs(work, exist_ok=True)
    device = device_words(args.cpu)
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    print(f"{len(configs)} configuration(s) on {device}; logs under {work}", flush=True)
    for n in notes:
        print(f"note: {n}", flush=True)
    # --append's earlier rows, read once: the file is rewritten after every configuration, so
    # that a run killed midway (an outer timeout) keeps the rows it finished
    old = read_csv_rows(args.csv) if args.append and os.path.exists(args.csv) else []

    def save(done: list) -> tuple:
        """Write --csv and --md with ``done`` and --append's earlier rows: (table, kept)."""
        done = [dict(r, device=device, date=date, command=command) for r in done]
        keys = {row_key(r) for r in done}
        more = list(dict.fromkeys(f"{r['net']} {r['mode']}: {r['note']} (earlier run)"
                                  for r in old if r["note"] and row_key(r) not in keys))
        table = merge_rows(old, done) if old else done
        add_scaling(table)
        write_csv(args.csv, table)
        write_md(args.md, table, args, notes + more)
        return table, len(table) - len(keys)

    rows = []
    for i, cfg in enumerate(configs, 1):
        row = run_config(cfg, args, work)
        rows.append(row)
        if row["status"] == "ok":
            what = (f"{row['images_per_s']:.1f} images/s, compute {1e3 * row['compute_s']:.1f} "
                    f"ms, comm {1e3 * row['comm_s']:.1f} ms")
        else:
            what = "FAILED: " + row["error"].splitlines()[0]
        print(f"[{i}/{len(configs)}] {cfg.tag} (k={cfg.batch}, --swap {cfg.swap_name}): {what} "
              f"({row['wall_s']:.0f} s)", flush=True)
        if i < len(configs):
            save(rows)
    failed = [r for r in rows if r["status"] != "ok"]
    rows, kept = save(rows)
    if old:
        print(f"kept {kept} row(s) of {args.csv}")
    print()
    print_table(rows)
    drawn = plot_scaling(rows, png, device)
    print(f"\nwrote {args.csv} and {args.md}" + (f" and {png}" if drawn else ""))
    if failed:
        print(f"{len(failed)} configuration(s) failed:", file=sys.stderr)
        for r in failed:
            print(f"--- {r['net']} {r['mode']} {r['comm']} {r['link']} overlap {r['overlap']} "
                  f"W={r['world_size']}: {r['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
