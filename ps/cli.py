"""Command line of the parameter server.

    minicaffe ps server --shard S --world-size W [--bind tcp://127.0.0.1:*] [--snapshot F]
    minicaffe ps keys --curve-dir DIR [--clients N]
    minicaffe train --solver S --ps tcp://h1:p1,tcp://h2:p2 --rank R --world-size W [--gpu G]
                    [--comm ps|nccl] [--link-gbps G --link-latency-ms L] [--curve-dir DIR]
                    [--no-overlap] [--bucket-mb MB] [--copy-up MODE] [--tail-mb MB] [--ps-shm]

``python -m ps server ...`` is the same as ``minicaffe ps server ...``.
This module imports neither ZeroMQ nor the framework's heavy parts until a
command runs, because ``minicaffe``'s parser registers these options on
every start.
"""
from __future__ import annotations

import argparse
import sys

from .copyup import COPY_UP_MODES
from .protocol import DEFAULT_MAX_FRAME_BYTES


def _positive(kind):
    def parse(text):
        v = kind(text)
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return v
    return parse


def _link_args(p):
    p.add_argument("--link-gbps", type=_positive(float), default=None, metavar="GBPS",
                   help="emulate links of this bandwidth (Gb/s): each message is delayed by "
                        "bytes/bandwidth on the sending side")
    p.add_argument("--link-latency-ms", type=float, default=0.0, metavar="MS",
                   help="emulated one-way latency added to every message (ms)")


# -------------------------------------------------------------- train options
def add_train_options(t):
    """The data-parallel options of ``minicaffe train``."""
    g = t.add_argument_group("data-parallel training (ps/, docs/PS.md)")
    g.add_argument("--ps", metavar="ENDPOINTS", default=None,
                   help="comma-separated server shards (tcp://host:port,...), in shard order; "
                        "with --comm nccl: the rendezvous endpoint that rank 0 binds")
    g.add_argument("--rank", type=int, default=0, help="this worker's rank (0..W-1)")
    g.add_argument("--world-size", type=int, default=1, help="number of workers W")
    g.add_argument("--comm", choices=["ps", "nccl"], default="ps",
                   help="ps: ZeroMQ parameter server; nccl: NCCL all-reduce between GPUs of one "
                        "host (parameters replicated, every rank updates)")
    g.add_argument("--ps-timeout", type=_positive(float), default=120.0, metavar="S",
                   help="seconds to wait for the slowest peer before the round fails "
                        "(must exceed an iteration, a test pass and a snapshot)")
    g.add_argument("--curve-dir", default=None,
                   help="CURVE keys (minicaffe ps keys): encrypt and authenticate the links")
    g.add_argument("--ps-stats", default=None, metavar="FILE",
                   help="append per-iteration compute and sync (Delta) times as JSON lines")
    g.add_argument("--no-overlap", dest="overlap", action="store_const", const=False,
                   default=None,
                   help="communicate after the whole backward pass instead of overlapping it "
                        "(default: overlap, unless MINICAFFE_PS_OVERLAP=0 or, with --comm "
                        "nccl, the solver says layer_wise_reduce: false)")
    g.add_argument("--bucket-mb", type=_positive(float), default=None, metavar="MB",
                   help="with overlap: the largest bucket of gradients communicated at once, "
                        "in MiB (--comm nccl: an all-reduce, default 25; --comm ps: one "
                        "push and its answer, default 8)")
    g.add_argument("--copy-up", choices=COPY_UP_MODES, default=None,
                   help="--comm ps with overlap: when the new parameters go into the net: as "
                        "they come back during backward, at the update, or during the next "
                        "forward, layer by layer (default: forward on a GPU, backward on the "
                        "CPU, or MINICAFFE_PS_COPY_UP; docs/PS.md)")
    g.add_argument("--tail-mb", type=float, default=None, metavar="MB",
                   help="--comm ps with overlap: the last MB of parameters backward finishes go "
                        "in buckets of at most 1 MiB, which come back sooner (default 8; 0: "
                        "none)")
    g.add_argument("--ps-shm", action="store_true",
                   help="--comm ps, workers and shards on one host: gradients and parameters "
                        "go through shared memory (registered with CUDA on a GPU) instead of "
                        "the sockets, which carry the headers (docs/PS.md)")
    _link_args(g)


def wrap_solver(args, solver):
    """The worker that trains ``solver`` data-parallel, per ``args``.

    Returns an object with ``solve(resume_file)``, like the solver.
    """
    from .overlap import DEFAULT_BUCKET_MB, overlap_default
    from .worker import PSConfig, PSWorker, parse_endpoints
    endpoints = parse_endpoints(args.ps)
    overlap = getattr(args, "overlap", None)
    bucket_mb = getattr(args, "bucket_mb", None)
    if args.comm == "nccl":     # overlap None: the environment's, else layer_wise_reduce
        from .nccl import NcclWorker
        if len(endpoints) != 1:
            raise ValueError("--comm nccl takes one --ps endpoint: the rendezvous that rank 0 "
                             "binds")
        if solver.mode != "GPU":
            raise ValueError("--comm nccl needs GPU mode (--gpu N)")
        if args.link_gbps or args.link_latency_ms:
            raise ValueError("link emulation (--link-gbps/--link-latency-ms) applies to --comm ps")
        if (getattr(args, "copy_up", None) or getattr(args, "tail_mb", None)
                or getattr(args, "ps_shm", False)):
            raise ValueError("--copy-up, --tail-mb and --ps-shm apply to --comm ps (NCCL "
                             "all-reduces on the device)")
        return NcclWorker(solver, endpoints[0], args.rank, args.world_size,
                          timeout=args.ps_timeout, curve_dir=args.curve_dir,
                          stats_path=args.ps_stats, overlap=overlap,
                          bucket_mb=DEFAULT_BUCKET_MB if bucket_mb is None else bucket_mb)
    overlap = overlap_default() if overlap is None else overlap
    if bucket_mb is not None and not overlap:
        raise ValueError("--bucket-mb applies with overlap (without it the parameter server "
                         "gets one message per shard after backward)")
    copy_up = getattr(args, "copy_up", None)
    tail_mb = getattr(args, "tail_mb", None)
    if tail_mb is not None and not overlap:
        raise ValueError("--tail-mb applies with overlap")
    if copy_up is not None and not overlap:
        raise ValueError("--copy-up applies with overlap (without it every answer comes after "
                         "backward and is copied at the update)")
    cfg = PSConfig(endpoints=endpoints, rank=args.rank, world_size=args.world_size,
                   timeout=args.ps_timeout, link_gbps=args.link_gbps,
                   link_latency_ms=args.link_latency_ms, curve_dir=args.curve_dir,
                   stats_path=args.ps_stats, overlap=overlap, bucket_mb=bucket_mb,
                   copy_up=copy_up, tail_mb=tail_mb, shm=getattr(args, "ps_shm", False))
    return PSWorker(solver, cfg)


def worker_device_bytes(args, solver) -> int:
    """Device bytes a data-parallel worker allocates through CuPy beside the layers, which
    a memory plan must leave room for in its scratch reserve: with ``--comm nccl``, twice the
    parameters (the flat all-reduce buffer, and as much again at its first pack: the dry run
    of a ResNet-152 worker on 4 H200s measured 461 MiB of transients for 230 MiB of
    parameters, 2026-11-22); 0 without ``--ps`` or with the parameter server (its buffers are
    in host memory)."""
    if not getattr(args, "ps", None) or getattr(args, "comm", "ps") != "nccl":
        return 0
    return 2 * sum(int(p.nbytes) for p in solver.net.learnable_params)


def check_train_args(args):
    """Options that make no sense without --ps (a ValueError says why)."""
    if args.ps:
        return
    if args.world_size != 1 or args.rank != 0:
        raise ValueError("--rank/--world-size need --ps (the server shards, or the NCCL "
                         "rendezvous)")
    if args.comm != "ps":
        raise ValueError("--comm nccl needs --ps tcp://host:port (the rendezvous endpoint)")


# ----------------------------------------------------------------- ps command
def add_ps_parser(sub):
    """Register ``ps`` and its subcommands on a subparsers object."""
    ps = sub.add_parser("ps", help="parameter server: run a shard, make CURVE keys")
    _fill_ps_parser(ps)
    return ps


def _fill_ps_parser(ps):
    cmds = ps.add_subparsers(dest="ps_command", required=True)
    s = cmds.add_parser("server", help="run one server shard (BSP, SGD update on the shard)")
    s.add_argument("--shard", type=int, required=True, help="this shard's index (0..S-1)")
    s.add_argument("--world-size", type=_positive(int), required=True,
                   help="number of workers W (each round waits for all)")
    s.add_argument("--bind", default="tcp://127.0.0.1:*",
                   help="endpoint to bind (default loopback, free port); tcp://0.0.0.0:5555 for "
                        "a real network (then use --curve-dir); ipc:///path for Unix-domain "
                        "sockets on one host")
    s.add_argument("--timeout", type=_positive(float), default=120.0,
                   help="seconds a join or round waits for the slowest worker")
    s.add_argument("--snapshot", default=None,
                   help="resume from this shard snapshot (PREFIX_shard{s}_iter_N.solverstate)")
    s.add_argument("--snapshot-prefix", default=None,
                   help="where to write snapshots (default: the workers' snapshot_prefix)")
    s.add_argument("--endpoint-file", default=None,
                   help="write the bound endpoint here (useful with a free port)")
    s.add_argument("--curve-dir", default=None, help="CURVE keys: admit only authorized clients")
    s.add_argument("--max-message-bytes", type=_positive(int), default=DEFAULT_MAX_FRAME_BYTES,
                   help="largest buffer frame accepted (bytes); larger ones are rejected")
    s.add_argument("--stats", default=None, metavar="FILE",
                   help="append one JSON line per round: its time, the wait for the last "
                        "gradient, the time summing and updating, sending, bytes in and out")
    s.add_argument("--quiet", action="store_true", help="only warnings and errors")
    _link_args(s)

    k = cmds.add_parser("keys", help="make CURVE key pairs for --curve-dir")
    k.add_argument("--curve-dir", required=True)
    k.add_argument("--clients", type=_positive(int), default=1,
                   help="client key pairs to make (client, client1, ...); all are authorized")


def cmd_ps(args) -> int:
    if args.ps_command == "server":
        from minicaffe.log import set_quiet
        from .server import ServerConfig, ShardServer
        set_quiet(args.quiet)
        cfg = ServerConfig(bind=args.bind, shard=args.shard, world_size=args.world_size,
                           timeout=args.timeout, max_frame_bytes=args.max_message_bytes,
                           restore=args.snapshot, snapshot_prefix=args.snapshot_prefix,
                           endpoint_file=args.endpoint_file, curve_dir=args.curve_dir,
                           link_gbps=args.link_gbps, link_latency_ms=args.link_latency_ms,
                           stats_path=args.stats)
        return ShardServer(cfg).run()
    if args.ps_command == "keys":
        from .transport import create_keys
        names = ["client"] + [f"client{i}" for i in range(1, args.clients)]
        made = create_keys(args.curve_dir, names)
        print(f"server key pair: {made['server'][0]}, {made['server'][1]} (keep the secret on "
              "server hosts)")
        for n in names:
            print(f"client key pair: {made[n][0]}, {made[n][1]} (authorized)")
        return 0
    raise ValueError(f"unknown ps command {args.ps_command!r}")


def main(argv=None) -> int:
    """``python -m ps ...``: the ``ps`` subcommands without ``minicaffe``."""
    import os
    ap = argparse.ArgumentParser(prog="python -m ps", description="minicaffe parameter server")
    _fill_ps_parser(ap)
    args = ap.parse_args(argv)
    try:
        return cmd_ps(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        if os.environ.get("MINICAFFE_TRACEBACK"):
            raise
        print(f"python -m ps {args.ps_command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
