"""The ``minicaffe`` command, modelled on Caffe's ``caffe`` tool.

    minicaffe train --solver S [--weights W | --snapshot S] [--gpu N | --cpu] [--cuda-graph]
    minicaffe train NET.prototxt [--base-lr ...]        (a default SGD solver)
    minicaffe test --model M --weights W --iterations N
    minicaffe time --model M --iterations N
    minicaffe device_query [--gpu N]
    minicaffe mem --model M [--batch k] [--budget 12G]   (memory per swap strategy, swap/)
    minicaffe train ... --swap {none,naive,vdnn,recompute} [--budget 12G] [--memory-trace out.csv]
    minicaffe train ... --swap dynamic --budget 12G [--auto-batch | --batch k] [--lr-rule eq9]
    minicaffe plan --model M --budget 12G [--batch k] [--profile P] [--plot out.png]
    minicaffe ps server|keys ...                         (parameter server, docs/PS.md)
    minicaffe draw NET.prototxt OUT.png [--rankdir LR] [--phase TRAIN]   (pycaffe's draw_net.py)
    minicaffe train --solver S --ps tcp://h:p,... --rank R --world-size W

Caffe's command lines work as typed: train, test, time and device_query each take
every flag of tools/caffe.cpp (-gpu, -solver, -model, -phase, -level, -stage, -snapshot,
-weights, -iterations, -sigint_effect, -sighup_effect) as -flag v, -flag=v, --flag v or
--flag=v, before or after the command, and ignore, with a note, those they do not read,
as gflags' global flags are.  README.md (Usage) names where minicaffe differs.
User mistakes (a bad prototxt, a missing file, a shape mismatch) end with one
line naming the file, layer or blob, and exit status 1, never a traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np

from .log import log


def _add(p, *names, **kw):
    """An option under its GNU name and Caffe's single-dash name."""
    extra = [f"-{n[2:]}" for n in names if n.startswith("--") and "-" not in n[2:]]
    p.add_argument(*names, *extra, **kw)


SIGNAL_EFFECTS = ("snapshot", "stop", "none")

# tools/caffe.cpp defines its flags with gflags, and gflags flags are global: every command
# accepts all of them, and a command ignores those it does not read (`caffe time -weights W`
# times the net's filler weights).  name: (type, choices, Caffe's default, help).  Each
# parses to None when not given; _caffe_defaults then puts in Caffe's default (phase: the
# command's), so that a flag given to a command that ignores it can be named.
CAFFE_FLAGS = {
    "gpu": (str, None, None,
            "GPU device ids separated by ',', or 'all' (Caffe's -gpu); test and time use the "
            "first; train takes one (data-parallel training is --ps, docs/PS.md)"),
    "solver": (str, None, None, "the solver definition prototxt"),
    "model": (str, None, None, "the model definition prototxt"),
    "phase": (str, ("TRAIN", "TEST"), None,
              "the net's phase (time: default TRAIN; test: default TEST, a flag Caffe's test "
              "ignores)"),
    "level": (int, None, 0, "the net's NetState level (default 0)"),
    "stage": (str, None, "", "NetState stages separated by ',' (e.g. deploy or 'a,b'); "
                             "given twice, the last one counts, as in gflags"),
    "snapshot": (str, None, None, "a .solverstate to resume training from"),
    "weights": (str, None, None, "pretrained .caffemodel(s), separated by ','"),
    "iterations": (int, None, 50, "the number of iterations to run (default 50)"),
    "sigint_effect": (str, SIGNAL_EFFECTS, "stop",
                      "what Ctrl-C does: snapshot, stop (after the running iteration, with the "
                      "final snapshot) or none (default stop)"),
    "sighup_effect": (str, SIGNAL_EFFECTS, "snapshot",
                      "what SIGHUP does: snapshot, stop or none (default snapshot)"),
}
# The flags each command reads (tools/caffe.cpp); test also reads -phase, which Caffe's does not.
CAFFE_FLAGS_READ = {
    "train": {"gpu", "solver", "level", "stage", "snapshot", "weights", "sigint_effect",
              "sighup_effect"},
    "test": {"gpu", "model", "phase", "level", "stage", "weights", "iterations"},
    "time": {"gpu", "model", "phase", "level", "stage", "iterations"},
    "device_query": {"gpu"},
}


def _caffe_flags(p, command: str):
    """Every Caffe flag on ``command``'s parser, spelt -flag, --flag (either with =value or
    the value next), and for sigint_effect, sighup_effect also --sigint-effect.  Flags the
    command ignores are hidden from its help."""
    reads = CAFFE_FLAGS_READ[command]
    for name, (kind, choices, _default, text) in CAFFE_FLAGS.items():
        names = [f"--{name}", f"-{name}"]
        if "_" in name:
            names.append(f"--{name.replace('_', '-')}")
        where = p
        if name == "gpu" and command != "device_query":
            where = p.add_mutually_exclusive_group()
            where.add_argument("--cpu", action="store_true",
                               help="force CPU mode (where a solver file says GPU)")
        where.add_argument(*names, dest=name, type=kind, choices=choices, default=None,
                           help=text if name in reads else argparse.SUPPRESS)


def _caffe_defaults(args):
    """Caffe's defaults for the flags not given, and a note for each given flag that the
    command does not read (Caffe ignores them silently)."""
    reads = CAFFE_FLAGS_READ[args.command]
    for name, (_kind, _choices, default, _text) in CAFFE_FLAGS.items():
        if getattr(args, name) is None:
            if name == "phase":
                default = {"test": "TEST", "time": "TRAIN"}.get(args.command)
            setattr(args, name, default)
        elif name not in reads:
            log(f"-{name} is not used by {args.command}: ignored, as Caffe ignores it")


def _command_first(argv: list) -> list:
    """gflags reads flags anywhere on the line (`caffe -gpu 0 train -solver S`): where Caffe
    flags come before the command, move the command to the front for argparse."""
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-h", "--help"):
        name = argv[i].lstrip("-").split("=", 1)[0].replace("-", "_")
        if name not in CAFFE_FLAGS:
            return argv                  # argparse names the unknown flag
        i += 1 if "=" in argv[i] else 2
    if 0 < i < len(argv):
        return [argv[i]] + argv[:i] + argv[i + 1:]
    return argv


def _stages(args) -> list:
    """Caffe's get_stages_from_flags: -stage split at commas (an empty flag: none)."""
    return args.stage.split(",") if args.stage else []


def _engine_args(p):
    p.add_argument("--engine", choices=["CAFFE", "CUDNN"], default=None,
                   help="engine of layers left on DEFAULT (default: CUDNN on the GPU when cuDNN "
                        "loads, CAFFE otherwise); a layer's own engine field still wins")
    p.add_argument("--cudnn-api", choices=["legacy", "graph"], default=None,
                   help="how cuDNN convolutions are called: legacy (cudnnConvolutionForward "
                        "and its siblings) or graph (cuDNN's backend API, execution plans "
                        "found once per shape: a third of the host's time per call); default "
                        "$MINICAFFE_CUDNN_API, else graph")


def _set_engine(args):
    if getattr(args, "engine", None):
        from .engine import set_default_engine
        set_default_engine(args.engine)
    if getattr(args, "cudnn_api", None):
        # read by every convolution as it binds its shape (and by child processes)
        from .cudnn.backend_api import ENV_API
        os.environ[ENV_API] = args.cudnn_api


def _gpus(text) -> list:
    """Caffe's get_gpus: ``all`` -> every visible device, ``0,1`` -> [0, 1], not given -> []."""
    if not text:
        return []
    if text == "all":
        from .backend import cupy_module
        try:
            cupy = cupy_module()
        except RuntimeError as e:
            raise RuntimeError(f"-gpu all: {e}") from None
        return list(range(cupy.cuda.runtime.getDeviceCount()))
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"-gpu {text!r}: give device ids separated by ',' (0, or 0,1) "
                         "or 'all'") from None


def _mode(args, default=None):
    """(mode, device id) from --cpu and Caffe's -gpu; ``default`` where neither is given.
    Caffe's test and time run on the first of several GPUs; its train runs one solver per
    GPU through NCCL, which minicaffe has not (as Caffe built without USE_NCCL, it stops)."""
    _set_engine(args)
    if getattr(args, "cpu", False):
        return "CPU", None
    gpus = _gpus(args.gpu)
    if not gpus:
        return default, None
    if len(gpus) > 1 and args.command == "train":
        raise UsageError(f"-gpu {args.gpu} names {len(gpus)} GPUs, and minicaffe trains on "
                         "one (Caffe runs one solver per GPU through NCCL; built without it, "
                         "it stops: 'Multi-GPU execution not available - rebuild with "
                         "USE_NCCL'): give one id, or train data-parallel with --ps "
                         "(docs/PS.md)")
    from .backend import cupy_module
    try:
        cupy_module()
    except RuntimeError as e:
        raise RuntimeError(f"-gpu {args.gpu}: {e}") from None
    return "GPU", gpus[0]


class SignalActions:
    """Caffe's SignalHandler (tools/caffe.cpp, util/signal_handler.cpp) for ``train``: SIGINT
    and SIGHUP only set a flag; the solver asks after every iteration and test batch
    (:attr:`Solver.action_function`) and gets the signal's effect, SIGHUP's first.  So Ctrl-C
    (``stop``, the default) ends training after the running iteration, with the final
    snapshot, and SIGHUP (``snapshot``) writes one and goes on.  Unlike Caffe, a second
    Ctrl-C before the solver has taken the first interrupts at once (KeyboardInterrupt)."""

    def __init__(self, sigint_effect: str = "stop", sighup_effect: str = "snapshot"):
        self.effects = {"SIGINT": sigint_effect, "SIGHUP": sighup_effect}
        self.pending = {"SIGINT": False, "SIGHUP": False}
        self._old = {}

    def install(self):
        import signal
        for name in self.effects:
            signum = getattr(signal, name, None)
            if signum is not None:
                self._old[signum] = signal.signal(signum, self._got)
        return self

    def restore(self):
        import signal
        for signum, handler in self._old.items():
            signal.signal(signum, handler)
        self._old = {}

    def _got(self, signum, frame):
        import signal
        name = signal.Signals(signum).name
        if name == "SIGINT" and self.pending[name]:
            raise KeyboardInterrupt
        self.pending[name] = True
        effect = self.effects[name]
        if effect != "none":
            log(f"{name}: {effect} after this iteration"
                + (" (Ctrl-C again interrupts at once)" if name == "SIGINT" else ""))

    def __call__(self) -> str:
        for name in ("SIGHUP", "SIGINT"):
            if self.pending[name]:
                self.pending[name] = False
                return self.effects[name]
        return "none"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="minicaffe", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a net from a solver (or a net with a default solver)")
    t.add_argument("net", nargs="?", help="a net prototxt to train with a default SGD solver")
    _caffe_flags(t, "train")
    _engine_args(t)
    # the solver's fields: with a net, the default solver's (SOLVER_FLAGS' defaults); with
    # -solver, each one given replaces the file's field (logged)
    for field, default in SOLVER_FLAGS:
        kind = type(default) if default is not None else str
        extra = (" (test batches every --test-interval iterations; 0: no testing)"
                 if field == "test_iter" else "")
        t.add_argument("--" + field.replace("_", "-"), type=kind, default=None,
                       help=f"solver field {field}: with a net, default {default!r}; with "
                            f"-solver, replaces the file's{extra}")
    t.add_argument("--quiet", action="store_true", help="only warnings and errors")
    t.add_argument("--cuda-graph", action="store_true",
                   help="replay each training iteration as one CUDA graph (GPU mode, plain SGD; "
                        "where the iteration cannot be captured the reasons are logged and it "
                        "runs eagerly); default $MINICAFFE_CUDA_GRAPH")
    # --- swap/ options (begin): run the train net under a memory plan
    t.add_argument("--swap", choices=["none", "naive", "vdnn", "recompute", "superneurons",
                                      "dynamic"], default=None,
                   help="run the train net under a memory plan inside one arena of --budget "
                        "bytes: none (Caffe: all resident), naive (offload every feature map), "
                        "vdnn (offload convolution inputs), recompute or superneurons "
                        "(SuperNeurons: offload convolution outputs, recompute cheap layers), "
                        "dynamic (AccUDNN: profile, then pin the feature maps whose transfers "
                        "would stall compute; docs/SWAP.md)")
    t.add_argument("--budget", default=None,
                   help="device memory budget for --swap, e.g. 12G (binary units); default: "
                        "the smallest that works")
    t.add_argument("--memory-trace", default=None, metavar="CSV",
                   help="with --swap: write per-step allocated/released bytes per stream")
    # --swap dynamic (swap/profiler, model, planner, tuner, lr)
    t.add_argument("--auto-batch", action="store_true",
                   help="with --swap dynamic: profile the first iterations at 1/8..1 of the "
                        "largest trainable minibatch, then train with the efficiency-optimal k* "
                        "(Algorithm 2), its plan and learning rate, for the same number of images")
    t.add_argument("--batch", type=int, default=None,
                   help="with --swap dynamic: train at this minibatch (only the swaps are planned)")
    t.add_argument("--max-batch", type=int, default=None, metavar="K",
                   help="with --auto-batch: k* is at most K (the profile still spans the "
                        "largest trainable minibatch); a k* over 8x the net's minibatch is "
                        "logged with a warning")
    t.add_argument("--lr-rule", choices=["eq9", "linear", "sqrt"], default=None,
                   help="learning rate for k* (default eq9: (1-(1-lr*c)^q)/c, q = k*/k_base)")
    t.add_argument("--convexity", type=float, default=None,
                   help="c of eq. (9) (default 1.0, see docs/SWAP.md)")
    t.add_argument("--profile", default=None, metavar="JSON",
                   help="with --swap dynamic: use this saved profile instead of profiling")
    t.add_argument("--save-profile", default=None, metavar="JSON",
                   help="with --swap dynamic: write the measured profile")
    t.add_argument("--search", choices=["linear", "bisect"], default="bisect",
                   help="Algorithm 2's search over k: bisection with a band checked above "
                        "its boundary (default; it agrees with the paper's walk on the seven "
                        "networks, docs/SWAP.md section 4) or linear, the paper's walk down "
                        "from k_max (minutes where k_max is large)")
    t.add_argument("--pin-rule", choices=["stall", "ratio"], default="stall",
                   help="which feature maps to pin first (docs/SWAP.md)")
    t.add_argument("--k-objective", choices=["throughput", "largest"], default="throughput",
                   help="with --auto-batch: k* is the stall-free k of the most predicted "
                        "images/s (default) or the largest stall-free k (the paper's)")
    t.add_argument("--no-fill", dest="fill", action="store_false",
                   help="with --swap dynamic: pin only what constraint (6) needs (the paper), "
                        "not also what the spare memory can hold (docs/SWAP.md)")
    t.add_argument("--granularity", choices=["type", "step", "segment"], default="segment",
                   help="with --swap dynamic: per step in segments between the profiled k "
                        "(default), one throughput curve per step, or per layer type (the "
                        "paper's)")
    t.add_argument("--recompute", default=None, metavar="LAYERS",
                   help="with --swap dynamic: comma-separated forward layers (each with its "
                        "in-place chain) run again in backward where pins alone would stall, "
                        "instead of keeping or offloading what they write, e.g. conv1_1 for "
                        "VGG-16, or 'auto': the tuner tries the best 1, 2 and 3 groups by "
                        "bytes freed per second of forward run again (docs/SWAP.md section 10)")
    t.add_argument("--host-budget", default=None,
                   help="with --swap dynamic: pinned host memory the plans may offload to, "
                        "which bounds k_max too (default $MINICAFFE_HOST_BUDGET or half the "
                        "machine's memory)")
    # --- swap/ options (end)
    # --- data-parallel training (ps/): --ps, --rank, --world-size, --comm, --link-* ...
    from ps.cli import add_train_options
    add_train_options(t)

    te = sub.add_parser("test", help="score a model over a number of batches")
    _caffe_flags(te, "test")
    _engine_args(te)

    ti = sub.add_parser("time", help="per-layer forward/backward times")
    _caffe_flags(ti, "time")
    _engine_args(ti)
    ti.add_argument("--warmup", type=int, default=1,
                    help="untimed forward-backward passes before the benchmark (default 1, "
                         "Caffe's; the first logs the initial loss)")

    _caffe_flags(sub.add_parser("device_query", help="show GPU diagnostic information"),
                 "device_query")

    from .tools.draw_net import add_arguments as add_draw_arguments  # proto only; pydot on use
    add_draw_arguments(sub.add_parser(
        "draw", help="draw a net as a graph (pycaffe's draw_net.py; png/svg need Graphviz)"))
    # --- swap/ mem command (begin)
    me = sub.add_parser("mem", help="memory breakdown per swap strategy and the largest "
                                    "trainable minibatch under a budget")
    _add(me, "--model", required=True, help="net prototxt (built in TRAIN phase to be sized)")
    _add(me, "--batch", type=int, default=None,
         help="minibatch to size for (default: the net's own)")
    _add(me, "--budget", default=None, help="device memory budget, e.g. 12G (binary units)")
    me.add_argument("--solver-type", default="SGD",
                    choices=["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"],
                    help="decides the solver history per parameter (AdaDelta and Adam keep "
                         "two)")
    me.add_argument("--strategies", default="none,naive,vdnn,recompute",
                    help="comma-separated swap strategies to report")
    # --- swap/ mem command (end)
    # --- swap/ plan command (begin)
    pl = sub.add_parser("plan", help="plan the dynamic swap strategy (AccUDNN) without training: "
                                     "k*, the plan, predicted time and memory, the timeline")
    _add(pl, "--model", default=None,
         help="net prototxt (built in TRAIN phase to be sized); may be left out with a "
              "--profile that keeps its GMAP (--layout device)")
    _add(pl, "--budget", required=True, help="device memory budget, e.g. 12G (binary units)")
    _add(pl, "--batch", type=int, default=None,
         help="plan the swaps at this minibatch (default: search k*, Algorithm 2)")
    pl.add_argument("--profile", default=None, metavar="JSON",
                    help="a profile saved by train --save-profile (default: a synthetic device, "
                         "see --peak-flops, --bandwidth)")
    pl.add_argument("--plot", default=None, metavar="PNG",
                    help="draw the predicted timeline of the three streams (matplotlib)")
    pl.add_argument("--trace", default=None, metavar="CSV",
                    help="with --plot: a --memory-trace CSV to draw the observed iteration beside")
    pl.add_argument("--search", choices=["linear", "bisect"], default="bisect",
                    help="as train's --search (default bisect; linear: the paper's walk)")
    pl.add_argument("--pin-rule", choices=["stall", "ratio"], default="stall")
    pl.add_argument("--k-objective", choices=["throughput", "largest"], default="throughput",
                    help="k* is the stall-free k of the most predicted images/s (default) or "
                         "the largest stall-free k (the paper's)")
    pl.add_argument("--no-fill", dest="fill", action="store_false",
                    help="pin only what constraint (6) needs (the paper), not also what the "
                         "spare memory can hold")
    pl.add_argument("--recompute", default=None, metavar="LAYERS",
                    help="comma-separated forward layers (each with its in-place chain) run "
                         "again in backward where pins alone would stall, instead of keeping or "
                         "offloading what they write; 'auto': the best 1, 2 or 3 groups")
    pl.add_argument("--granularity", choices=["type", "step", "segment"], default="segment",
                    help="with --profile: per step in segments between the profiled k (the "
                         "tuner's default), one curve per step, or per layer type (the paper's)")
    pl.add_argument("--layout", choices=["auto", "device", "gpu", "cpu"], default="auto",
                    help="what to plan: device: the GMAP the profile's own run decided on "
                         "(saved in profiles taken by train --swap dynamic: that device's "
                         "feature maps, cuDNN workspaces and test nets); gpu: the net built "
                         "here with the GPU's feature maps (fused BatchNorm+Scale pairs, as "
                         "train --swap dynamic runs them on a GPU); cpu: the CPU's; auto: "
                         "device where the profile has its GMAP, else the profile's kind of "
                         "device (gpu without a profile when a GPU is present)")
    pl.add_argument("--solver-type", default="SGD",
                    choices=["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"])
    pl.add_argument("--peak-flops", default="50T",
                    help="synthetic device: saturated FLOP/s (decimal units, default 50T)")
    pl.add_argument("--x-half", type=float, default=5e8,
                    help="synthetic device: FLOPs at half the peak (default 5e8: 10 us per step)")
    pl.add_argument("--bandwidth", default="55G",
                    help="synthetic device: pinned copy bytes/s each way (default 55G)")
    pl.add_argument("--both", default="101G",
                    help="synthetic device: bytes/s of both directions at once (default 101G)")
    pl.add_argument("--delta", type=float, default=0.0,
                    help="seconds between iterations (eq. 3's Delta: parameter synchronization)")
    pl.add_argument("--ops", action="store_true", help="print every op of the plan")
    # --- swap/ plan command (end)
    # --- parameter server (ps/): minicaffe ps server|keys
    from ps.cli import add_ps_parser
    add_ps_parser(sub)
    return ap


# ----------------------------------------------------------------- train
# train's solver flags (--base-lr ... --random-seed): the SolverParameter field each sets and
# the default solver's value when a net is trained without a solver file
SOLVER_FLAGS = (("base_lr", 0.01), ("momentum", 0.9), ("weight_decay", 5e-4),
                ("lr_policy", "fixed"), ("gamma", 0.1), ("stepsize", 0), ("power", 0.75),
                ("max_iter", 1000), ("display", 100), ("test_iter", 0), ("test_interval", 0),
                ("snapshot_prefix", ""), ("random_seed", -1))


def solver_flags(args) -> dict:
    """{field: value} of the solver flags given on the command line."""
    return {f: getattr(args, f) for f, _ in SOLVER_FLAGS if getattr(args, f, None) is not None}


def default_solver_param(args, net_path):
    from .proto import caffe_pb2
    v = dict(SOLVER_FLAGS, **solver_flags(args))
    p = caffe_pb2.SolverParameter()
    p.net = net_path
    for field in ("base_lr", "momentum", "weight_decay", "lr_policy", "gamma", "power",
                  "max_iter", "display", "random_seed"):
        setattr(p, field, v[field])
    if v["stepsize"]:
        p.stepsize = v["stepsize"]
    if v["test_iter"]:
        p.test_iter.append(v["test_iter"])
        p.test_interval = v["test_interval"] or max(1, v["max_iter"] // 10)
    p.snapshot_prefix = v["snapshot_prefix"] or os.path.splitext(net_path)[0]
    p.solver_mode = caffe_pb2.SolverParameter.CPU
    return p


def _is_solver_file(path: str) -> bool:
    """Whether the text file ``path`` parses as a SolverParameter that names or holds a net
    (``minicaffe train solver.prototxt``, the file meant for --solver); False for anything
    else, whose own errors the net reader reports."""
    from .proto import read_solver_param
    try:
        p = read_solver_param(path)
    except Exception:       # not a solver file (a net, a missing file): the net reader says
        return False
    return any(p.HasField(f) for f in ("net", "net_param", "train_net", "train_net_param"))


def _check_file_flag(flag: str, value, base_dir: str | None = None, several: bool = False):
    """Each file that ``flag`` names (``several``: a list separated by ',', as train's
    -weights a,b) exists, else a
    FileNotFoundError naming the flag, before a net is built or any file is read: the error
    then names what the user typed (a missing -model gave only Python's "[Errno 2]", and a
    missing -weights of train was blamed on the solver file).  ``base_dir``: a second place
    to look, as the solver does for the files it names (its own folder)."""
    if not value:
        return
    names = [n.strip() for n in value.split(",")] if several else [value]
    for name in names:
        if not name or os.path.exists(name):
            continue
        tried = [os.path.abspath(name)]
        if base_dir and not os.path.isabs(name):
            if os.path.exists(os.path.join(base_dir, name)):
                continue
            tried.append(os.path.abspath(os.path.join(base_dir, name)))
        raise FileNotFoundError(f"{flag}: File not found: {name} (looked at "
                                f"{', '.join(dict.fromkeys(tried))})")


def _check_iterations(args):
    """tools/caffe.cpp test and time divide by -iterations (test prints 'Loss: nan' for 0,
    time nan ms): below 1 is a usage error, not a result."""
    if args.iterations < 1:
        raise UsageError(f"-iterations {args.iterations}: give at least 1 (the number of "
                         "batches to run)")


def cmd_train(args):
    from .log import set_quiet
    from .solver import Solver
    set_quiet(args.quiet)
    if not args.solver and not args.net:
        raise UsageError("Need a solver definition to train. (-solver S.prototxt, or a net "
                         "prototxt to train with a default SGD solver)")
    _check_swap_args(args)     # --- swap/: flags and sizes, before the net is built
    if args.solver and args.net:
        raise UsageError(f"give -solver {args.solver} or the net {args.net}, not both")
    if args.net and _is_solver_file(args.net):
        raise UsageError(f"{args.net} is a solver definition, not a net: train it with "
                         f"--solver {args.net}")
    if args.weights and args.snapshot:     # tools/caffe.cpp train()'s CHECK, word for word
        raise UsageError("Give a snapshot to resume training or weights to finetune but "
                         "not both.")
    # the solver looks for the models it copies beside its file too
    _check_file_flag("-weights", args.weights,
                     os.path.dirname(os.path.abspath(args.solver)) if args.solver else None,
                     several=True)
    from ps.cli import check_train_args
    check_train_args(args)
    mode, dev = _mode(args)
    graph = True if args.cuda_graph else None  # None: $MINICAFFE_CUDA_GRAPH decides
    state = dict(level=args.level, stages=_stages(args))
    if args.solver:
        if mode is None:
            # caffe.cpp train: without -gpu, the GPU only where the file sets solver_mode: GPU
            # (has_solver_mode(); the field's default is GPU, a file without it trains on CPU)
            from .proto import read_solver_param
            if not read_solver_param(args.solver).HasField("solver_mode"):
                mode = "CPU"
        # caffe.cpp train: -snapshot clears the solver file's `weights`, -weights replaces them
        weights = [] if args.snapshot else (args.weights or None)
        solver = Solver(args.solver, mode=mode, device_id=dev, cuda_graph=graph,
                        weights=weights, overrides=solver_flags(args), **state)
    else:
        if mode is None:
            from .backend import gpu_available
            mode = "GPU" if gpu_available() else "CPU"
        # -weights as the default solver's `weights`: each model goes into the train net and
        # every test net (a test-only layer's params too), as with a solver file
        solver = Solver(default_solver_param(args, args.net), mode=mode, device_id=dev,
                        cuda_graph=graph, weights=args.weights or None, **state)
    log(f"Using {solver.mode} mode; net {solver.net.name!r}: {len(solver.net.layers)} layers, "
        f"{sum(p.count for p in solver.net.learnable_params):,} learnable parameters")
    _eager_under_nccl_overlap(args, solver)
    signals = None
    if not args.ps:   # a data-parallel worker ends on SIGTERM and its peers' failures instead
        # from here on: --swap dynamic's profiling iterations train too, so Ctrl-C during
        # them stops with a snapshot as during training (StopBeforeTraining)
        signals = SignalActions(args.sigint_effect, args.sighup_effect).install()
        solver.action_function = _stop_raises(signals)
    try:
        try:
            executor = _install_swap(args, solver)  # --- swap/: --swap, --budget, ...
        except StopBeforeTraining:
            _stopped_before_training(solver)
            return 0
        if args.ps:  # --- data-parallel (ps/): the worker takes over the update step
            from ps.cli import wrap_solver
            solver = wrap_solver(args, solver)
        if signals is not None:
            solver.action_function = signals
        resume = args.snapshot
        if resume and not args.ps:   # restored here to say what happens to a swap decision
            log(f"Restoring previous solver status from {resume}")
            solver.restore(resume)
            _drop_swap_decision(solver, resume)
            resume = None
        solver.solve(resume_file=resume)
    finally:
        if signals is not None:
            signals.restore()
    if executor is not None:  # --- swap/: the measured high-water mark
        log(executor.report())
        executor.close()
    return 0


# --- swap/ (begin): train --swap/--budget/--memory-trace and the mem command
class StopBeforeTraining(BaseException):
    """A stop (Ctrl-C) taken after an iteration that ``--swap dynamic`` runs before training:
    its profiling iterations (they train).  A BaseException, as KeyboardInterrupt, so that the
    profiler closes its executors on the way out and its handlers that let a failed
    measurement go (``except Exception``) let this pass."""


def _stop_raises(signals):
    """The solver's action function while the swap plan is installed: ``signals``' requests,
    a stop raised as :class:`StopBeforeTraining` (the profiler's loops would go on)."""
    def action():
        request = signals()
        if request == "stop":
            raise StopBeforeTraining
        return request
    return action


def _drop_swap_decision(solver, path: str):
    """A snapshot of a --swap dynamic run resumed without --swap dynamic: say that this run
    trains at the net's own minibatch and the solver's rate, not at the tuner's, and forget
    that decision (the snapshots of this run are not trained under it)."""
    saved = solver.swap_decision
    if not saved:
        return
    from swap.gmap import net_batch_size
    k, lr = net_batch_size(solver.net), float(solver.param.base_lr)
    if (int(saved["k"]), float(saved["lr"])) != (k, lr):
        log(f"{path} was trained under --swap dynamic at minibatch {saved['k']} with learning "
            f"rate {saved['lr']:g} (its tuner's decision); this run trains at the net's "
            f"minibatch {k} with base_lr {lr:g}: resume with --swap dynamic --budget B to go "
            f"on at minibatch {saved['k']}", level="W")
    solver.swap_decision = None


def _stopped_before_training(solver):
    """End as Solver.solve ends on a stop: the final snapshot (unless the periodic one of
    this iteration was written, or snapshot_after_train is off) and Caffe's line."""
    p = solver.param
    log(f"Stopped at iteration {solver.iter}, while --swap dynamic profiled (before k*, "
        "its plan and its learning rate were decided): resuming with --snapshot profiles again")
    if p.snapshot_after_train and (not p.snapshot or solver.iter % p.snapshot != 0):
        solver.snapshot()
    log("Optimization stopped early.")


_UNIT_WORD = r"(?i)[KMGT]?(?:i?B)?"     # what a size's unit looks like on its own


def _size_flag(text, flag: str) -> int:
    """``--budget 12G`` -> bytes (swap.memory.parse_bytes: binary units; 12GiB and 12GB are
    the same); a UsageError naming the flag for what is not a size or not above 0."""
    from swap.memory import parse_bytes
    try:
        n = parse_bytes(text)
    except ValueError:
        if str(text).strip().startswith("-"):
            n = -1
        else:
            raise UsageError(f"{flag}: cannot read {text!r} as a size: give bytes or a number "
                             "with K, M, G or T (binary units), for example 12G or 1536M"
                             ) from None
    if n <= 0:
        raise UsageError(f"{flag} {text!r}: a size must be above 0 bytes, for example 12G")
    return n


def _output_file(path: str, flag: str):
    """A file a flag names for writing: its folder must exist and be writable, checked before
    the work whose result it keeps (the profiling iterations, a plan)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{flag} {path}: there is no folder {folder} to write it in")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{flag} {path}: the folder {folder} cannot be written")


def _check_swap_args(args):
    """train's swap/ flags, before anything is built: each one needs --swap (or --swap
    dynamic), and --budget and --host-budget must read as sizes (--budget parsed into
    ``args.budget_bytes``)."""
    import re
    for flag in ("budget", "host_budget"):
        text = getattr(args, flag)
        if (text is not None and args.net and re.fullmatch(_UNIT_WORD, args.net)
                and re.fullmatch(r"\s*[0-9]*\.?[0-9]+\s*", text)):
            unit = args.net.upper().replace("IB", "").replace("B", "")
            name = "--" + flag.replace("_", "-")
            raise UsageError(f"{name} {text} {args.net}: a size is one word: {name} "
                             f"{text.strip()}{unit} (binary units), or quote it")
    dynamic_only = [name for name, v in (
        ("--auto-batch", args.auto_batch), ("--batch", args.batch is not None),
        ("--max-batch", args.max_batch is not None),
        ("--lr-rule", args.lr_rule is not None), ("--convexity", args.convexity is not None),
        ("--profile", args.profile), ("--save-profile", args.save_profile),
        ("--host-budget", args.host_budget), ("--recompute", args.recompute)) if v]
    if args.swap is None:
        if args.budget is not None or args.memory_trace is not None:
            raise UsageError("--budget and --memory-trace need --swap "
                             "{none,naive,vdnn,recompute,dynamic}")
    if args.swap != "dynamic" and dynamic_only:
        verb = "needs" if len(dynamic_only) == 1 else "need"
        raise UsageError(f"{', '.join(dynamic_only)} {verb} --swap dynamic")
    for flag, path in (("--memory-trace", args.memory_trace),
                       ("--save-profile", args.save_profile)):
        if path:
            _output_file(path, flag)
    if args.profile and not os.path.isfile(args.profile):
        raise UsageError(f"--profile {args.profile}: no such file (a profile that train --swap "
                         "dynamic --save-profile wrote)")
    args.budget_bytes = (_size_flag(args.budget, "--budget") if args.budget is not None
                         else None)
    if args.host_budget is not None:
        _size_flag(args.host_budget, "--host-budget")
    if args.swap == "dynamic":
        if args.budget is None:
            raise UsageError("--swap dynamic needs --budget (the device memory to plan for, "
                             "e.g. 12G)")
        if args.auto_batch and args.batch is not None:
            raise UsageError("give --auto-batch or --batch k, not both")
        if args.batch is not None and args.batch <= 0:
            raise UsageError(f"--batch must be positive, got {args.batch}")
        if args.max_batch is not None and not args.auto_batch:
            raise UsageError("--max-batch caps the k* of --auto-batch: give --auto-batch, or "
                             "--batch k for a fixed minibatch")
        if args.max_batch is not None and args.max_batch <= 0:
            raise UsageError(f"--max-batch must be positive, got {args.max_batch}")


def _install_swap(args, solver):
    """Plan and install ``--swap`` on the train net; a budget too small fails here, before
    the first iteration, naming the smallest budget that works and the largest minibatch.
    The flags were checked by :func:`_check_swap_args`."""
    if args.swap is None:
        return None
    from swap.memory import fmt_bytes
    from swap.runtime import install
    budget = args.budget_bytes
    if args.swap == "dynamic":
        return _install_dynamic(args, solver, budget)
    ex = install(solver, args.swap, budget, trace=args.memory_trace)
    log(f"Memory plan {args.swap!r} for net {solver.net.name!r} at minibatch {ex.plan.k}: "
        f"peak {fmt_bytes(ex.plan.peak)} (eq. 4), arena {fmt_bytes(ex.budget)}, "
        f"pinned host {fmt_bytes(ex.plan.host_bytes)}")
    return ex


def _eager_under_nccl_overlap(args, solver):
    """``--cuda-graph`` off for an NCCL worker whose all-reduces overlap backward: its backward
    listener runs Python per layer and no graph hook replays it (the parameter server's
    worker has one), so every iteration would run eagerly while ``--swap dynamic`` planned
    for graph launches: on two H200s (session 45) such a plan for ResNet-152 at 85, decided
    on the graph's shorter steps, kept 70 fewer maps and its eager iterations took 270 ms
    where the plan decided eagerly took 210."""
    if not (getattr(args, "ps", None) and args.comm == "nccl" and solver.cuda_graph):
        return
    from ps.overlap import nccl_overlap_default
    if args.overlap is False or (args.overlap is None
                                 and not nccl_overlap_default(solver.param)):
        return
    log("cuda_graph: --comm nccl all-reduces each layer's gradients as backward finishes them "
        "(Python per layer, which no graph replays): the iterations run eagerly and "
        "--swap dynamic plans for that", level="W")
    solver.cuda_graph = False


def _install_dynamic(args, solver, budget):
    """``--swap dynamic``: the three stages (swap.tuner.train_dynamic): profile the first
    iterations (they train), decide k*, the plan and the learning rate, install the plan."""
    if getattr(args, "ps", None) and (args.auto_batch or not args.profile):
        raise UsageError("with --ps, --swap dynamic needs --profile P and a fixed k (--batch k, "
                         "or the net's own; not --auto-batch): every worker must train the "
                         "same k (choose it once with minicaffe plan --profile P)")
    batch, lr_rule, convexity = args.batch, args.lr_rule, args.convexity
    if args.snapshot:       # resume first: profiling iterations continue the restored run
        log(f"Restoring previous solver status from {args.snapshot}")
        solver.restore(args.snapshot)
        saved = solver.swap_decision     # the decision of the run that wrote the snapshot
        if saved:
            was = (f"{args.snapshot} was trained at minibatch {saved['k']} with learning rate "
                   f"{saved['lr']:g} (--swap dynamic's decision for the solver's minibatch "
                   f"{saved['k_base']} and {saved['base_lr']:g}, rule {saved['lr_rule']})")
            if args.auto_batch:
                log(f"{was}: --auto-batch decides again")
            elif batch is not None:
                log(f"{was}: --batch {batch} trains at {batch}")
            else:
                batch = int(saved["k"])
                log(f"{was}: going on at minibatch {batch} (--auto-batch decides again, "
                    "--batch k sets another)")
            # the same rule and convexity, unless given: the same rate at the same k
            lr_rule = lr_rule or saved.get("lr_rule")
            convexity = convexity if convexity is not None else saved.get("convexity")
        args.snapshot = None
    from ps.cli import worker_device_bytes
    from swap.memory import fmt_bytes
    from swap.tuner import train_dynamic
    extra = worker_device_bytes(args, solver)
    if extra:
        log(f"--comm nccl: the scratch reserve also holds the all-reduce buffers "
            f"({fmt_bytes(extra)})")
    ex, _ = train_dynamic(solver, budget, auto_batch=args.auto_batch, batch=batch,
                          lr_rule=lr_rule or "eq9", convexity=convexity,
                          method=args.search, rule=args.pin_rule, profile=args.profile,
                          granularity=args.granularity, save_profile=args.save_profile,
                          trace=args.memory_trace, log=log, fill=args.fill,
                          objective=args.k_objective, scratch_extra=extra,
                          recompute=_layers(args.recompute),
                          max_batch=getattr(args, "max_batch", None),
                          train_before=not getattr(args, "ps", None),
                          host_budget=("auto" if args.host_budget is None
                                       else _size_flag(args.host_budget, "--host-budget")))
    return ex


def _layers(text):
    """``--recompute conv1_1,conv1_2`` -> ("conv1_1", "conv1_2"); None -> (); ``auto`` ->
    "auto" (swap.tuner.AUTO: the tuner chooses)."""
    names = tuple(x.strip() for x in (text or "").split(",") if x.strip())
    if any(x.lower() == "auto" for x in names):
        if len(names) > 1:
            raise UsageError(f"--recompute {text!r}: 'auto' lets the tuner choose the layers; "
                             "give it alone or name the layers yourself")
        return "auto"
    return names


def _parse_rate(text, what: str) -> float:
    """``50T`` -> 5e13, ``55G`` -> 5.5e10: decimal units (FLOP/s, bytes/s)."""
    import re
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([KMGT]?)\s*(?:B/S|/S|FLOPS)?\s*",
                     str(text).upper())
    if not m:
        raise UsageError(f"cannot read {text!r} as {what}: give a number with K, M, G or T "
                         "(decimal units), e.g. 50T or 55G")
    return float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)]


def _plan_net(model: str, budget: int, layout: str, prof):
    """The TRAIN net ``plan`` sizes, built on the CPU with ``layout``'s feature maps, and the
    scratch reserve of ``prof``'s measured transients (None without them).

    "gpu": as ``train --swap dynamic`` runs on a GPU, the fused paths' buffers
    (:func:`minicaffe.kernels.cuda_fused.sized_as_gpu`) with BatchNorm+Scale pairs fused and
    the swapping plans' lowering (:func:`swap.runtime.set_lowering`).  A GPU profile planned
    on the CPU's maps has a Scale copy per pair more (ResNet-152: 621 maps, not 466) and gave
    k* 52 where the device's tuner took 90 (H200, session 29); on the GPU's, 91 with the
    copies priced as that run did.  Not sized as the CUDNN engine runs: cuDNN's convolution
    workspaces (the scratch is the chunked im2col's, one at a time), and cuDNN's max pooling
    and LRN, which keep no mask and no scale (GoogLeNet: 107 maps against the device's 93, k*
    394 against 494; docs/SWAP.md)."""
    from .net import TRAIN, Net
    from swap.runtime import lay_out_for
    from .kernels import cuda_fused
    gpu = layout == "gpu"
    ctx = cuda_fused.sized_as_gpu() if gpu else contextlib.nullcontext()
    try:
        with ctx:
            net = Net(model, TRAIN, mode="CPU")
            if gpu:
                lay_out_for(net, "dynamic", budget, "chunked")
                net.reshape()
    except (ValueError, FileNotFoundError) as e:
        raise ValueError(f"{e} (plan builds the net to size it: give one whose inputs can "
                         "be read, e.g. its DummyData version prototxt/<net>/dummy.prototxt)"
                         ) from None
    from swap.profiler import ScratchModel
    return net, ScratchModel.from_profile(prof)


def _device_gmap(model: str | None, prof, solver_type: str):
    """The GMAP ``prof``'s own run decided on (``meta["gmap"]``, :func:`swap.tuner.with_gmap`),
    the bytes its test nets took from the budget, the pinned host memory that bounded its
    k_max (None: none) and its test nets' per-pass bytes; a UsageError where the profile has none, or it is another net's than
    ``model`` (None: not checked) or another solver type's."""
    from swap.gmap import gmap_from_dict
    from .proto import read_net_param
    saved = (prof.meta or {}).get("gmap")
    if saved is None:
        raise UsageError("--layout device plans the GMAP a profile keeps, and this profile has "
                         "none (profiles saved by train --swap dynamic keep it): use --layout "
                         "gpu or cpu")
    name = saved["net_name"] if model is None else read_net_param(model).name
    if saved["net_name"] != name:
        raise UsageError(f"the profile's GMAP is of net {saved['net_name']!r}, {model} is net "
                         f"{name!r}: give the net the profile was taken on, or take a profile "
                         "of this one (train --swap dynamic --save-profile P); --layout gpu "
                         "plans the net built here on the profile's timings only where its "
                         "layers are the profile's")
    if saved.get("solver_type") not in (None, solver_type):
        raise UsageError(f"the profile's GMAP holds the history of solver type "
                         f"{saved['solver_type']!r}, not {solver_type!r}: give --solver-type "
                         f"{saved['solver_type']} or --layout gpu")
    meta = prof.meta or {}
    return (gmap_from_dict(saved), int(meta.get("test_net_bytes", 0)), meta.get("host_budget"),
            int(meta.get("test_dynamic_bytes", 0)))


def _layout_differs(gmap, prof) -> str:
    """A line saying how ``gmap``'s feature maps differ from those the profile's own run
    planned (``meta["layout"]``), where they differ; "" where they agree or it has none."""
    from swap.memory import fmt_bytes
    lay = (prof.meta or {}).get("layout")
    if not lay:
        return ""
    mine = gmap.at(int(lay["k"])).layout()
    theirs_n, theirs_b = int(lay["feature_maps"]), int(lay["feature_map_bytes"])
    if mine["feature_maps"] == theirs_n and abs(mine["feature_map_bytes"] - theirs_b) <= (
            0.005 * theirs_b):
        return ""
    return (f"note: at minibatch {lay['k']} the profile's run on {prof.device} planned "
            f"{theirs_n} feature maps of {fmt_bytes(theirs_b)}; this net, built here, has "
            f"{mine['feature_maps']} of {fmt_bytes(mine['feature_map_bytes'])}, so k* and the "
            "memory may differ from that device's decision (see --layout; docs/SWAP.md)")


def _plot_file(path: str):
    """--plot's file: a format matplotlib writes (by its extension) in a folder that can be
    written, checked before planning."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:             # plot_timeline says what to install
        return
    kinds = FigureCanvasBase.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext and ext not in kinds:      # none: matplotlib's default format (png)
        raise UsageError(f"--plot {path}: matplotlib writes {', '.join(sorted(kinds))}, chosen "
                         f"by the file's extension ({ext} here), e.g. timeline.png")
    _output_file(path, "--plot")


def cmd_plan(args):
    """Plan the dynamic strategy for a net without training (swap.tuner): k* by Algorithm 2 (or
    the swaps at --batch k), the predicted iteration time and peak memory; --plot draws the
    predicted timeline of the three streams (and the observed one of --trace beside it)."""
    from swap.gmap import build_gmap
    from swap.memory import fmt_bytes
    from swap.tuner import device_models, plan_at, profile_models, tune
    budget = _size_flag(args.budget, "--budget")
    if args.batch is not None and args.batch <= 0:
        raise UsageError(f"--batch must be positive, got {args.batch}")
    if args.trace and not args.plot:
        raise UsageError("--trace is drawn beside the predicted timeline: give --plot too")
    if args.plot:
        _plot_file(args.plot)
    if args.trace and not os.path.isfile(args.trace):
        raise ValueError(f"--trace {args.trace}: no such file (a CSV that train --memory-trace "
                         "wrote)")
    prof = None
    if args.profile:
        if not os.path.isfile(args.profile):
            raise UsageError(f"--profile {args.profile}: no such file (a profile that train "
                             "--swap dynamic --save-profile wrote)")
        from swap.profiler import Profile
        prof = Profile.load(args.profile)
    layout = args.layout
    saved = (prof.meta or {}).get("gmap") if prof is not None else None
    if layout == "auto" and saved is not None and saved.get("solver_type") in (
            None, args.solver_type):
        layout = "device"
    if layout == "auto":
        from .backend import gpu_available
        layout = ("gpu" if (prof.mode == "GPU" if prof is not None else gpu_available())
                  else "cpu")
    test_bytes, test_dynamic, k_max = 0, 0, None
    if layout == "device":
        if prof is None:
            raise UsageError("--layout device plans the GMAP a profile keeps: give --profile")
        gmap, test_bytes, host_budget, test_dynamic = _device_gmap(args.model, prof,
                                                                   args.solver_type)
        from swap.profiler import ScratchModel
        scratch = ScratchModel.from_profile(prof)
        if host_budget is not None:     # k_max as that run bounded it (swap.tuner)
            from swap.profiler import max_batch_scratch
            k_max = max_batch_scratch(gmap, budget - test_bytes, scratch,
                                      host_budget=host_budget, test_dynamic=test_dynamic)
    else:
        if args.model is None and args.layout == "auto" and saved is not None:
            # auto took the profile's kind of device because its GMAP is another solver's
            raise UsageError(f"the profile's GMAP holds the history of solver type "
                             f"{saved['solver_type']!r}, not {args.solver_type!r}: give "
                             f"--solver-type {saved['solver_type']}, or --model to size the net "
                             f"built here with {args.solver_type}'s history (--layout {layout})")
        if args.model is None:
            raise UsageError(f"--layout {layout} sizes the net built here: give --model (only a "
                             "profile that keeps its GMAP plans without one)")
        net, scratch = _plan_net(args.model, budget, layout, prof)
        gmap = build_gmap(net, solver_type=args.solver_type)
    plan_budget = budget - test_bytes
    if prof is not None:
        model, pcie = profile_models(prof, gmap, args.granularity)
        source = (f"profile {args.profile} ({prof.device}, {prof.date}; h2d "
                  f"{pcie.h2d / 1e9:.1f} GB/s, d2h {pcie.d2h / 1e9:.1f} GB/s)")
    else:
        peak = _parse_rate(args.peak_flops, "FLOP/s")
        bw = _parse_rate(args.bandwidth, "bytes/s")
        both = _parse_rate(args.both, "bytes/s")
        model, pcie = device_models(peak_flops=peak, x_half=args.x_half, h2d=bw, both=both)
        source = (f"synthetic device ({peak / 1e12:g} TFLOP/s saturating at x_half "
                  f"{args.x_half:g} FLOPs, {bw / 1e9:g} GB/s each way, {both / 1e9:g} GB/s both)")
    from swap.plan import BudgetError
    try:
        if args.batch is not None:
            dec = plan_at(gmap, args.batch, plan_budget, model, pcie, rule=args.pin_rule,
                          delta=args.delta, fill=args.fill, recompute=_layers(args.recompute),
                          scratch=scratch, test_dynamic=test_dynamic)
        else:
            dec = tune(gmap, plan_budget, model, pcie, method=args.search, rule=args.pin_rule,
                       delta=args.delta, fill=args.fill, objective=args.k_objective,
                       recompute=_layers(args.recompute), scratch=scratch, k_max=k_max,
                       test_dynamic=test_dynamic)
    except BudgetError as e:    # as --budget sees it: the test nets' bytes taken first
        raise e.given(budget, plan_budget) from None
    print(f"net {gmap.net_name!r}: {gmap.n_steps} steps, {len(gmap.feature_maps())} feature "
          f"maps ({layout} layout"
          + (f": the GMAP the profile's run decided on, at minibatch {gmap.k}"
             if layout == "device" else "")
          + (f", the scratch reserve the profile measured: {scratch.describe()}" if scratch
             else "") + f"); budget {fmt_bytes(budget)}"
          + (f" less {fmt_bytes(test_bytes)} for the test nets" if test_bytes else "")
          + (f", room kept for a test pass of {fmt_bytes(test_dynamic)}" if test_dynamic
             else "")
          + f"; model: {source}")
    print(dec.describe())
    if prof is not None and layout != "device":
        differs = _layout_differs(gmap, prof)
        if differs:
            print(differs)
    if args.ops:
        print(dec.plan.describe())
    if args.plot:
        from swap.planner import plot_timeline
        plot_timeline(dec.timeline, args.plot, trace=args.trace)
        drawn = args.plot
        if not os.path.splitext(drawn)[1]:     # matplotlib adds its default format's extension
            import matplotlib
            drawn += "." + matplotlib.rcParams["savefig.format"]
        print(f"timeline drawn to {drawn}")
    return 0


def cmd_mem(args):
    """Print the memory breakdown of every strategy and the max trainable minibatch."""
    from .net import TRAIN, Net
    from swap.gmap import build_gmap
    from swap.memory import memory_report
    from swap.plan import STRATEGIES
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in strategies:
        if s not in STRATEGIES:
            raise UsageError(f"unknown strategy {s!r} (known: {', '.join(STRATEGIES)})")
    if args.batch is not None and args.batch <= 0:
        raise UsageError(f"--batch must be positive, got {args.batch}")
    budget = _size_flag(args.budget, "--budget") if args.budget is not None else None
    try:
        net = Net(args.model, TRAIN, mode="CPU")
    except (ValueError, FileNotFoundError) as e:
        raise ValueError(f"{e} (mem builds the net to size it: give one whose inputs can "
                         "be read, e.g. its DummyData version prototxt/<net>/dummy.prototxt)"
                         ) from None
    gmap = build_gmap(net, args.batch, solver_type=args.solver_type)
    print(memory_report(gmap, budget, strategies))
    return 0
# --- swap/ (end)


# ------------------------------------------------------------------ test
def _use_device(mode, dev):
    """Caffe's test and time: log the mode and make the device current."""
    if mode == "GPU":
        from .backend import set_device
        log(f"Use GPU with device ID {dev}")
        set_device(dev)
    else:
        log("Use CPU.")


def cmd_test(args):
    """tools/caffe.cpp test(): score the net (TEST phase) over -iterations batches."""
    from .net import TEST, TRAIN, Net
    from .backend import to_numpy
    if not args.model:
        raise UsageError("Need a model definition to score. (-model NET.prototxt)")
    _check_iterations(args)
    _check_file_flag("-model", args.model)
    _check_file_flag("-weights", args.weights)
    mode, dev = _mode(args, default="CPU")
    _use_device(mode, dev)
    if not args.weights:   # Caffe stops: "Need model weights to score."
        log("no -weights: scoring the weights the net's fillers draw (Caffe's test stops "
            "here with 'Need model weights to score.')", level="W")
    phase = TRAIN if args.phase == "TRAIN" else TEST
    net = Net(args.model, phase, weights=args.weights or None, mode=mode, level=args.level,
              stages=_stages(args))
    from .solver import Solver
    log(f"Running for {args.iterations} iterations.")
    # tools/caffe.cpp test(): every element of every output per batch under the output's
    # name, the mean loss, then each element's mean with its loss weight where it has one
    sums, loss = {}, 0.0
    for i in range(args.iterations):
        loss += float(net.forward_from_to())   # a sync per batch, as Caffe's cpu_data()
        for name in net.outputs:
            v = to_numpy(net.blobs[name].data).ravel().astype(np.float64)
            for x in v:
                log(f"Batch {i}, {name} = {x:.6g}")
            sums[name] = sums.get(name, 0) + v
    log(f"Loss: {loss / max(1, args.iterations):.6g}")
    for name, s in sums.items():
        weight = Solver._output_loss_weight(net, name)
        for x in s / args.iterations:
            extra = f" (* {weight:g} = {weight * x:.6g} loss)" if weight else ""
            log(f"{name} = {x:.6g}{extra}")
    return 0


# ------------------------------------------------------------------ time
def layer_times(net, iterations: int, warmup: int = 2):
    """Mean forward and backward time per layer (ms) over ``iterations`` passes after
    ``warmup`` untimed ones, and each pass's total, as ``caffe time`` times them.

    GPU: CUDA events around each layer on the current stream, read once at
    the end (no synchronisation between layers). CPU: wall clock.
    """
    n = len(net.layers)
    for _ in range(warmup):
        net.forward_backward()
    fwd = np.zeros(n)
    bwd = np.zeros(n)
    totals = []
    if net.mode == "GPU":
        import cupy
        ev = lambda: cupy.cuda.Event()  # noqa: E731
        for _ in range(iterations):
            f_ev = [(ev(), ev()) for _ in range(n)]
            b_ev = [(ev(), ev()) for _ in range(n)]
            start, end = ev(), ev()
            start.record()
            for li in range(n):
                f_ev[li][0].record()
                net.forward_layer(li)
                f_ev[li][1].record()
            for li in range(n - 1, -1, -1):
                b_ev[li][0].record()
                net.backward_layer(li)
                b_ev[li][1].record()
            end.record()
            end.synchronize()
            for li in range(n):
                fwd[li] += cupy.cuda.get_elapsed_time(*f_ev[li])
                bwd[li] += cupy.cuda.get_elapsed_time(*b_ev[li])
            totals.append(cupy.cuda.get_elapsed_time(start, end))
    else:
        for _ in range(iterations):
            t0 = time.perf_counter()
            for li in range(n):
                a = time.perf_counter()
                net.forward_layer(li)
                fwd[li] += (time.perf_counter() - a) * 1e3
            for li in range(n - 1, -1, -1):
                a = time.perf_counter()
                net.backward_layer(li)
                bwd[li] += (time.perf_counter() - a) * 1e3
            totals.append((time.perf_counter() - t0) * 1e3)
    return fwd / max(1, iterations), bwd / max(1, iterations), totals


def cmd_time(args):
    """tools/caffe.cpp time(): one untimed forward and backward, then -iterations timed
    passes, layer by layer; Caffe's log lines (the values are ms, printed as C++ streams
    print floats: six significant digits)."""
    from .net import TEST, TRAIN, Net
    if not args.model:
        raise UsageError("Need a model definition to time. (-model NET.prototxt)")
    _check_iterations(args)
    _check_file_flag("-model", args.model)
    mode, dev = _mode(args, default="CPU")
    _use_device(mode, dev)
    phase = TRAIN if args.phase == "TRAIN" else TEST
    net = Net(args.model, phase, mode=mode, level=args.level, stages=_stages(args))
    if args.warmup > 0:
        log("Performing Forward")
        loss = float(net.forward_from_to())     # syncs (a host copy of the loss)
        log(f"Initial loss: {loss:g}")
        log("Performing Backward")
        net.backward_from_to()
    fused = ((net.conv_relu_pairs, "their Convolution's forward (Convolution + in-place ReLU "
              "pairs", "MINICAFFE_FUSE_CONV_RELU"),
             (net.bn_relu_links, "their BatchNorm+Scale pair's forward (the ReLU after a pair",
              "MINICAFFE_FUSE_BN_RELU"))
    for links, where, var in fused:
        if links:       # minicaffe's: say why those ReLU lines read about 0
            names = [net.layer_names[j] for _, j in links]
            more = ", ..." if len(names) > 4 else ""
            log(f"{len(names)} ReLU layers run in {where}: {', '.join(names[:4])}{more}); "
                f"{var}=0 times them apart")
    log("*** Benchmark begins ***")
    log(f"Testing for {args.iterations} iterations.")
    fwd, bwd, totals = layer_times(net, args.iterations, max(0, args.warmup - 1))
    for j, ms in enumerate(totals):
        log(f"Iteration: {j + 1} forward-backward time: {ms:g} ms.")
    log("Average time per layer: ")
    for name, f, b in zip(net.layer_names, fwd, bwd):
        log(f"{name:>10}\tforward: {f:g} ms.")
        log(f"{name:>10}\tbackward: {b:g} ms.")
    n = max(1, args.iterations)
    log(f"Average Forward pass: {fwd.sum():g} ms.")
    log(f"Average Backward pass: {bwd.sum():g} ms.")
    log(f"Average Forward-Backward: {sum(totals) / n:g} ms.")
    log(f"Total Time: {sum(totals):g} ms.")
    if totals:     # minicaffe's: the median is steadier than the mean on a shared machine
        log(f"Median Forward-Backward: {float(np.median(totals)):g} ms.")
    log("*** Benchmark ends ***")
    return 0


def device_query_lines(device: int, props: dict) -> list:
    """Caffe::DeviceQuery's lines (src/caffe/common.cpp) from CUDA's device properties
    (``cupy.cuda.runtime.getDeviceProperties``; a field this CuPy build leaves out, such as
    deviceOverlap before CUDA 9.2, reads n/a)."""
    def p(key, show=str):
        return show(props[key]) if key in props else "n/a"
    name = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
    three = lambda v: ", ".join(str(x) for x in v)  # noqa: E731
    yes = lambda v: "Yes" if v else "No"  # noqa: E731
    return [f"Device id:                     {device}",
            f"Major revision number:         {p('major')}",
            f"Minor revision number:         {p('minor')}",
            f"Name:                          {p('name', name)}",
            f"Total global memory:           {p('totalGlobalMem')}",
            f"Total shared memory per block: {p('sharedMemPerBlock')}",
            f"Total registers per block:     {p('regsPerBlock')}",
            f"Warp size:                     {p('warpSize')}",
            f"Maximum memory pitch:          {p('memPitch')}",
            f"Maximum threads per block:     {p('maxThreadsPerBlock')}",
            f"Maximum dimension of block:    {p('maxThreadsDim', three)}",
            f"Maximum dimension of grid:     {p('maxGridSize', three)}",
            f"Clock rate:                    {p('clockRate')}",
            f"Total constant memory:         {p('totalConstMem')}",
            f"Texture alignment:             {p('textureAlignment')}",
            f"Concurrent copy and execution: {p('deviceOverlap', yes)}",
            f"Number of multiprocessors:     {p('multiProcessorCount')}",
            f"Kernel execution timeout:      {p('kernelExecTimeoutEnabled', yes)}"]


def cmd_device_query(args):
    """tools/caffe.cpp device_query(): Caffe::DeviceQuery for each -gpu device.  Without
    -gpu Caffe queries none and prints nothing; minicaffe shows every visible device."""
    from .backend import gpu_available
    log(f"Querying GPUs {args.gpu or ''}")
    if args.gpu:
        gpus = _gpus(args.gpu)
        if gpus:
            from .backend import cupy_module
            try:
                cupy_module()
            except RuntimeError as e:
                raise RuntimeError(f"-gpu {args.gpu}: {e}") from None
    elif not gpu_available():
        print("No CUDA device visible (CPU mode only).")
        return 0
    else:
        import cupy
        gpus = list(range(cupy.cuda.runtime.getDeviceCount()))
    import cupy
    count = cupy.cuda.runtime.getDeviceCount()
    for i in gpus:
        if not 0 <= i < count:
            raise RuntimeError(f"-gpu {args.gpu}: no device {i} (devices 0..{count - 1} "
                               "are visible)")
        print("\n".join(device_query_lines(i, cupy.cuda.runtime.getDeviceProperties(i))))
    return 0


class UsageError(Exception):
    pass


def cmd_ps(args):
    """``minicaffe ps server|keys`` (the parameter server, ps/)."""
    from ps.cli import cmd_ps as run
    return run(args)


def cmd_draw(args):
    """``minicaffe draw``: pycaffe's python/draw_net.py (minicaffe/tools/draw_net.py)."""
    from .tools.draw_net import run
    return run(args, prog="minicaffe draw")


COMMANDS = {"draw": cmd_draw, "train": cmd_train, "test": cmd_test, "time": cmd_time,
            "device_query": cmd_device_query, "ps": cmd_ps,
            "mem": cmd_mem, "plan": cmd_plan}  # mem, plan: swap/


def main(argv=None) -> int:
    argv = _command_first(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    try:
        if args.command in CAFFE_FLAGS_READ:
            if getattr(args, "quiet", False):    # train --quiet: no notes either
                from .log import set_quiet
                set_quiet(True)
            _caffe_defaults(args)
        return COMMANDS[args.command](args)
    except UsageError as e:
        print(f"minicaffe {args.command}: {e}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, OSError, RuntimeError, ImportError) as e:
        if os.environ.get("MINICAFFE_TRACEBACK"):
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        notes = getattr(e, "__notes__", None)
        if notes:   # the user's own code raised it (a Python layer): its type, and where
            shown = repr(msg) if isinstance(e, KeyError) else msg
            msg = (f"{getattr(e, 'caffe_where', '')}{type(e).__name__}: {shown} "
                   f"({'; '.join(notes)})")
        print(f"minicaffe {args.command}: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
