"""Solvers: Caffe's Solver loop (test, forward/backward, update, snapshot) and
its update rules (SGD with momentum, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam).

The loop is Caffe's ``Solver::Step`` line by line: clear param diffs, test
when ``iter % test_interval == 0`` (at iteration 0 only if
``test_initialization``), ``iter_size`` forward/backward passes, the smoothed
loss over ``average_loss`` iterations, display, ``ApplyUpdate`` (learning
rate, gradient clipping, normalisation by ``iter_size``, weight decay,
the rule's update, ``data -= diff``), then snapshot.

Losses stay on the device until a display line needs them, so a GPU run does
not synchronise every iteration.

With ``cuda_graph`` (``minicaffe train --cuda-graph``, ``MINICAFFE_CUDA_GRAPH=1``)
each iteration's clear-diffs, forward, backward and SGD update are replayed as
one CUDA graph (:class:`minicaffe.graph.IterationGraph`); test, display and
snapshots stay here.  Where the iteration cannot be captured (CPU mode, a
solver other than plain SGD, an Accuracy layer...) the reasons are logged once and the
iteration runs eagerly.  A net under a swap plan replays its forward and backward, the
plan's copies included, as a graph of its executor's (:mod:`swap.graph`); the update runs
eagerly after it.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import time
from collections import deque

import numpy as np

from . import common
from .backend import (explicit_mode, gpu_available, normalize_mode, set_device, to_numpy, GPU,
                      CPU)
from .kernels import cuda_fused
from .log import log
from .net import TEST, TRAIN, Net
from .proto import (caffe_pb2, net_needs_upgrade, read_binary, read_net_param,
                    read_solver_param, upgrade_solver, write_binary)
from .rng import set_random_seed, host_rng

MINICAFFE_STATE_VERSION = 1
ENV_CUDA_GRAPH = "MINICAFFE_CUDA_GRAPH"


def cuda_graph_from_env(env=None) -> bool:
    """``$MINICAFFE_CUDA_GRAPH``: 1/true/yes/on, or 0/false/no/off (default)."""
    env = os.environ if env is None else env
    v = env.get(ENV_CUDA_GRAPH, "").strip().lower()
    if v in ("", "0", "false", "no", "off"):
        return False
    if v in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"${ENV_CUDA_GRAPH}={env[ENV_CUDA_GRAPH]!r}: use 1 or 0")


def resolve_path(path: str, base_dir: str | None) -> str:
    """Caffe resolves paths against the working directory; when that finds
    nothing, try the solver file's folder too (the file can then be run from
    anywhere)."""
    if not path or os.path.isabs(path) or os.path.exists(path) or base_dir is None:
        return path
    alt = os.path.join(base_dir, path)
    return alt if os.path.exists(alt) else path


# ------------------------------------------------------------ lr policies
def _c_pow(base: float, exponent: float) -> float:
    """C's ``pow`` as sgd_solver.cpp calls it: a negative base to a fractional exponent is
    NaN (Python's ``**`` would give a complex number), an integral exponent keeps the sign
    rule. ``poly`` past max_iter (pycaffe's step() is not bounded by it) and ``inv`` with
    a negative gamma reach such bases; Caffe trains on with the NaN rate."""
    if base < 0 and not float(exponent).is_integer():
        return math.nan
    if base == 0 and exponent < 0:
        return math.inf   # C's pow(0, -y); Python's ** raises ZeroDivisionError
    try:
        return float(base ** exponent)
    except OverflowError:   # C's pow overflows to +-inf
        return math.copysign(math.inf, base) if float(exponent).is_integer() and \
            int(exponent) % 2 else math.inf


def learning_rate(p, it: int, current_step: int = 0) -> float:
    """Caffe's SGDSolver::GetLearningRate for iteration ``it``."""
    policy = p.lr_policy or "fixed"
    base = p.base_lr
    if policy == "fixed":
        return base
    if policy == "step":
        if p.stepsize <= 0:
            raise ValueError("lr_policy 'step' needs stepsize > 0")
        return base * _c_pow(p.gamma, it // p.stepsize)
    if policy == "exp":
        return base * _c_pow(p.gamma, it)
    if policy == "inv":
        # sgd_solver.cpp: pow(Dtype(1) + this->param_.gamma() * this->iter_, -power): gamma()
        # is a float field and iter_ an int, so C++ multiplies them in float and only the
        # sum is Dtype; a double product gave a rate up to 6e-8 away (a float64 net's
        # weights 1e-10 apart after a few iterations at iter ~1000)
        return base * _c_pow(1 + float(np.float32(p.gamma) * np.float32(it)), -p.power)
    if policy == "multistep":
        return base * _c_pow(p.gamma, current_step)
    if policy == "poly":
        return base * _c_pow(1.0 - it / float(p.max_iter), p.power)
    if policy == "sigmoid":
        try:
            e = math.exp(-p.gamma * (it - p.stepsize))
        except OverflowError:   # C's exp overflows to inf, and the rate to base * 1/inf = 0
            e = math.inf
        return base * (1.0 / (1.0 + e))
    raise ValueError(
        f"Unknown learning rate policy: {policy} (known: {', '.join(LR_POLICIES)})")


LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


# ----------------------------------------------------------------- solver
class Solver:
    """Caffe's Solver with an SGD-family update rule.

    Args:
        param: a SolverParameter or the path of a solver prototxt.
        mode: "CPU"/"GPU" to override ``solver_mode``; None: the mode of
            ``caffe.set_mode_cpu/gpu`` where one was called (pycaffe, whose solvers never
            read ``solver_mode``), else the file's (falling back to CPU with a warning
            when no GPU is present).
        net_param: overrides the train net (used by ``minicaffe train NET``).
        cuda_graph: run each iteration as one CUDA graph where it can be captured
            (see the module doc); None follows ``$MINICAFFE_CUDA_GRAPH``.
        level, stages: the train net's NetState as Caffe's ``caffe train -level -stage``
            sets it: ``level`` (not None) replaces the file's ``train_state.level``, the
            stages are added to its ``train_state.stage``; the test nets keep theirs.
        overrides: {SolverParameter field: value} replacing the file's fields (``minicaffe
            train -solver S --max-iter N``), each logged; ``test_iter`` replaces every test
            net's count.
    """

    # the update rule a subclass imposes (pycaffe's SGDSolver, AdamSolver ...); None: the
    # file's ``type``
    update_type: str | None = None

    def __init__(self, param, mode=None, device_id=None, net_param=None, dtype=np.float32,
                 verbose=True, cuda_graph=None, level=None, stages=(), weights=None,
                 overrides=None):
        self.source_dir = None
        if isinstance(param, (str, os.PathLike)):
            self.source = os.fspath(param)
            self.source_dir = os.path.dirname(os.path.abspath(self.source))
            param = read_solver_param(self.source)
            # UpgradeSnapshotPrefixProperty (src/caffe/util/upgrade_proto.cpp), as Caffe reads a
            # solver file: a snapshot_prefix naming an existing directory gets the solver file's
            # stem appended (an unset one becomes the file's path less its extension: _prefix)
            if param.snapshot_prefix and os.path.isdir(param.snapshot_prefix):
                stem = os.path.splitext(os.path.basename(self.source))[0]
                param.snapshot_prefix = os.path.join(param.snapshot_prefix, stem)
        else:
            self.source = None
        self.param = upgrade_solver(param)
        if level is not None:   # caffe.cpp train: -level replaces train_state's, -stage adds
            self.param.train_state.level = int(level)
        self.param.train_state.stage.extend(stages)
        if weights is not None:  # caffe.cpp train: -weights replaces them, -snapshot clears them
            self.param.ClearField("weights")
            self.param.weights.extend([weights] if isinstance(weights, str) else weights)
        if self.update_type is not None:     # pycaffe's typed classes: the class decides
            self.param.type = self.update_type
        self.verbose = verbose
        self._override(overrides or {})
        self.type = self.param.type or "SGD"
        if self.type not in UPDATE_RULES:
            raise ValueError(
                f"{self.source or 'solver'}: unknown solver type {self.type!r} "
                f"(known: {', '.join(sorted(UPDATE_RULES))})")
        if self.param.average_loss < 1:   # Solver::Init's CHECK_GE, its message as it is
            raise ValueError(f"{self.source or 'solver'}: average_loss should be non-negative. "
                             f"(Caffe's Solver::Init checks average_loss >= 1; got "
                             f"{self.param.average_loss})")
        if self.param.iter_size < 1:
            # Caffe does not check: 0 divides the loss and the gradients by 0 (NaN weights
            # from the first update on); a negative count runs no pass at all
            raise ValueError(f"{self.source or 'solver'}: iter_size must be at least 1 (the "
                             "forward/backward passes whose gradients each iteration "
                             f"accumulates; 1 is the default), got {self.param.iter_size}")
        self._check_lr_policy()
        self._check_snapshot_prefix()
        self.mode = self._choose_mode(mode)
        if self.mode == GPU:
            set_device(self.param.device_id if device_id is None else device_id)
        self.dtype = dtype
        # Caffe's Solver::Init reseeds only for random_seed >= 0 (the default is -1): else the
        # process seed (caffe.set_random_seed) stands, as Caffe's solver tests rely on; each
        # solver of a multi-GPU run offsets it by its rank (caffe.set_solver_rank)
        if self.param.random_seed >= 0:
            set_random_seed(self.param.random_seed + common.solver_rank())
        self.iter = 0
        self.current_step = 0
        # Caffe's Solver::SetActionFunction: asked after every iteration and test batch for
        # "none", "snapshot" or "stop" (the CLI's SIGINT/SIGHUP effects); None: never asked
        self.action_function = None
        self.requested_early_exit = False
        # what swap.tuner.train_dynamic decided for this run (minibatch k*, learning rate,
        # schedule, images so far: a dict), kept in the snapshots' minicaffe state so that a
        # resumed run can go on with it; None: no decision
        self.swap_decision = None
        self._build_nets(net_param)
        self._regularization()      # an unknown type fails now, not after the first pass
        self.history = [self.net.xp.zeros_like(p.data) for p in self.net.learnable_params]
        self.rule = UPDATE_RULES[self.type](self)
        self._losses: deque = deque(maxlen=max(1, self.param.average_loss))
        self.smoothed_loss = float("nan")
        self.last_loss = None     # the last iteration's loss, a device scalar (float() syncs)
        self.callbacks = []       # objects with on_start(solver) / on_gradients_ready(solver)
        self.last_snapshot = None
        self._sgd_fused = None    # kernels.cuda_fused.MultiTensorSGD, built on first update
        self.cuda_graph = cuda_graph_from_env() if cuda_graph is None else bool(cuda_graph)
        self.graph = None         # the IterationGraph that runs the iterations, once built
        self.graph_refused = ""   # why the net's iterations cannot be captured ("" : not known)
        self._graph_logged = ""   # the reasons for running eagerly that were logged last

    def _override(self, overrides: dict):
        """Replace the solver's fields with ``overrides`` (see the class doc), logging each."""
        p = self.param
        for field, value in overrides.items():
            if field not in p.DESCRIPTOR.fields_by_name:
                raise ValueError(f"{self.source or 'solver'}: SolverParameter has no field "
                                 f"{field!r}")
            if field == "test_iter":
                was = list(p.test_iter)
                p.ClearField("test_iter")
                p.test_iter.extend([int(value)] * max(1, len(was)))
            else:
                was = getattr(p, field) if p.HasField(field) else None
                setattr(p, field, value)
            if self.verbose:
                def show(v):   # float fields are float32: six digits, as Caffe prints them
                    return f"{v:.6g}" if isinstance(v, float) else repr(v)
                log(f"{field}: {show(value)} from the command line"
                    + (f" (the solver file has {show(was)})" if was not in (None, []) else ""))

    def _check_lr_policy(self):
        """SGDSolver::GetLearningRate's LOG(FATAL) for an unknown policy and CHECK on
        step's stepsize, made when the solver is built rather than at its first iteration."""
        p, where = self.param, self.source or "solver"
        if p.lr_policy and p.lr_policy not in LR_POLICIES:
            raise ValueError(f"{where}: Unknown learning rate policy: {p.lr_policy} (known: "
                             f"{', '.join(LR_POLICIES)})")
        if p.lr_policy == "step" and p.stepsize <= 0:
            raise ValueError(f"{where}: lr_policy 'step' needs stepsize > 0")

    def _check_snapshot_prefix(self):
        """Caffe's Solver::CheckSnapshotWritePermissions, for solvers that snapshot every
        ``snapshot`` iterations: a prefix whose folder cannot be made or written fails now,
        not at the first snapshot after hours of training. (The folder may be missing:
        snapshot() makes it. Nothing is written here.)"""
        if not self.param.snapshot or not common.root_solver():
            return
        prefix = self._prefix()
        d = os.path.abspath(os.path.dirname(prefix) or ".")
        while not os.path.exists(d) and os.path.dirname(d) != d:
            d = os.path.dirname(d)
        if not os.path.isdir(d):
            why = f"{d} is not a directory"
        elif not os.access(d, os.W_OK | os.X_OK):
            why = f"{d} is not writable"
        else:
            return
        raise ValueError(f"{self.source or 'solver'}: Cannot write to snapshot prefix "
                         f"'{prefix}' ({why}). Make sure that the directory exists and is "
                         "writable.")

    def _choose_mode(self, mode):
        if mode is not None:
            return normalize_mode(mode)
        chosen = explicit_mode()
        if chosen is not None:   # pycaffe: Caffe::mode decides; solver_mode is the tool's
            return chosen
        wanted = GPU if self.param.solver_mode == caffe_pb2.SolverParameter.GPU else CPU
        if wanted == GPU and not gpu_available():
            log("solver_mode is GPU but no CUDA device is visible: running on CPU")
            return CPU
        return wanted

    # ----------------------------------------------------------- nets
    def _net_params(self, net_param):
        p = self.param
        where = self.source or "solver"
        if net_param is not None:
            return net_param, None
        given = [f for f in ("net", "net_param", "train_net", "train_net_param") if p.HasField(f)]
        if len(given) != 1:
            raise ValueError(
                f"{where}: give exactly one of net, net_param, train_net, train_net_param "
                f"(found {given or 'none'})")
        f = given[0]
        if f in ("net", "train_net"):
            path = self._net_file(f, getattr(p, f))
            return read_net_param(path), path
        self._warn_inline_legacy(f, getattr(p, f))
        return getattr(p, f), None

    def _net_file(self, field: str, name: str) -> str:
        """The path of the file (a net, or ``weights``) that the solver's ``field`` names; a
        missing one is Caffe's "File not found" with the solver file and the field in front."""
        path = resolve_path(name, self.source_dir)
        if not os.path.exists(path):
            tried = [os.path.abspath(name)]
            if self.source_dir and not os.path.isabs(name):
                tried.append(os.path.join(self.source_dir, name))
            raise FileNotFoundError(
                f"{self.source or 'solver'}: {field}: File not found: {name} (looked at "
                f"{', '.join(dict.fromkeys(tried))})")
        return path

    def _warn_inline_legacy(self, field, net_param):
        """Caffe upgrades only the nets it reads from files (ReadNetParamsFromTextFileOrDie):
        Solver::InitTrainNet / InitTestNets copy an inline net as it is, and Net::Init reads
        only its ``layer`` blocks, so a V1 net given inline (the 2014 lenet_consolidated_solver
        of Caffe's examples/mnist) builds there with no layers at all.  minicaffe upgrades it
        and says that Caffe would not."""
        if net_needs_upgrade(net_param):
            log(f"{self.source or 'solver'}: {field} {net_param.name!r} is written in a legacy "
                "format (V1 'layers', 'input_dim', ...); BVLC Caffe does not upgrade nets "
                "given inline in a solver and would build it without those parts; minicaffe "
                "upgrades it", level="W")

    def _build_nets(self, net_param):
        p = self.param
        train_param, train_path = self._net_params(net_param)
        # Caffe's Solver::InitTrainNet: the solver's default (phase TRAIN), then the net
        # file's own ``state { }``, then train_state, each merged over the one before
        state = caffe_pb2.NetState(phase=TRAIN)
        state.MergeFrom(train_param.state)
        state.MergeFrom(p.train_state)
        self.net = Net(train_param, TRAIN, mode=self.mode, dtype=self.dtype, state=state,
                       source=train_path)
        self.test_nets = []
        if not common.root_solver():
            # Solver::Init builds the test nets on the root solver only (rank 0): the other
            # solvers of a multi-GPU run neither test nor snapshot
            self._load_weights()
            return
        # Caffe's Solver::InitTestNets numbers the test nets test_net_param first, then
        # test_net files, then the general net's copies: test_iter[i] and test_state[i] go
        # to the i-th of that order
        test_params, test_paths = [], []
        for tp in p.test_net_param:
            self._warn_inline_legacy("test_net_param", tp)
        test_params.extend(p.test_net_param)
        test_paths += [None] * len(p.test_net_param)
        for path in p.test_net:
            test_paths.append(self._net_file("test_net", path))
            test_params.append(read_net_param(test_paths[-1]))
        # Caffe's Solver::InitTestNets: a general net (net, net_param, or minicaffe train NET)
        # makes one more test net for each test_iter past those of test_net/test_net_param;
        # with train_net there is no general net, and the counts must be equal
        n_test = len(p.test_iter)
        general = net_param is not None or p.HasField("net") or p.HasField("net_param")
        if n_test != len(test_params) and (n_test < len(test_params) or not general):
            how = ("" if general or test_params else
                   "; train_net makes no test net: give test_net (or test_net_param) too, or "
                   "net: for both phases, or remove test_iter")
            raise ValueError(
                f"{self.source or 'solver'}: test_iter must be specified for each test network "
                f"({len(test_params)} test nets from test_net/test_net_param, {n_test} "
                f"test_iter){how}")
        test_paths += [train_path] * (n_test - len(test_params))
        test_params = test_params + [train_param] * (n_test - len(test_params))
        if test_params and p.test_interval <= 0 and self.source:
            # Solver::InitTestNets: CHECK_GT(param_.test_interval(), 0) once any test net is
            # asked for (a test_iter without a test_interval).  A solver built in code (no
            # file; minicaffe's own tools, which call test() themselves) keeps its test nets
            raise ValueError(
                f"{self.source or 'solver'}: Check failed: param_.test_interval() > 0 "
                f"({p.test_interval} vs. 0): {len(test_params)} test net(s) asked for "
                "(test_iter, test_net...) need a test_interval; remove test_iter to train "
                "without testing")
        if len(p.test_state) and len(p.test_state) != len(test_params):
            raise ValueError(f"{self.source or 'solver'}: test_state must be unspecified or "
                             f"specified once per test net ({len(p.test_state)} test_state "
                             f"for {len(test_params)} test nets)")
        for i, tp in enumerate(test_params):
            # Caffe's Solver::InitTestNets: phase TEST, then the net file's ``state { }``,
            # then this net's test_state
            state = caffe_pb2.NetState(phase=TEST)
            state.MergeFrom(tp.state)
            if len(p.test_state):
                state.MergeFrom(p.test_state[i])
            net = Net(tp, TEST, mode=self.mode, dtype=self.dtype, state=state,
                      source=test_paths[i])
            net.debug_info = bool(p.debug_info)   # test_nets_[i]->set_debug_info(debug_info)
            net.share_trained_layers_with(self.net)
            self.test_nets.append(net)
        self._load_weights()

    def _load_weights(self):
        """Solver::InitTrainNet / InitTestNets (src/caffe/solver.cpp): each ``weights`` entry,
        a comma-separated list of models, is copied into the train net and into every test net
        (LoadNetWeights, CopyTrainedLayersFrom by layer name)."""
        # every file found before any is copied: a missing second one fails the same way
        found = [(name.strip(), self._net_file("weights", name.strip()))
                 for entry in self.param.weights for name in entry.split(",")]
        for name, path in found:
            self._log(f"Finetuning from {name}")
            self.net.copy_from(path)
            for net in self.test_nets:
                net.copy_from(path)   # a test-only layer's params too
                net.share_trained_layers_with(self.net)

    # ------------------------------------------------------- the loop
    def _log(self, msg):
        # Caffe's solver logs with LOG_IF(INFO, Caffe::root_solver())
        if self.verbose and common.root_solver():
            log(msg)

    # ------------------------------------------------------- pycaffe's extras
    def add_callback(self, on_start, on_gradients_ready=None):
        """pycaffe's ``solver.add_callback(on_start, on_gradients_ready)``: two functions of no
        argument, called in each iteration of :meth:`step`, ``on_start`` after the test
        (before forward) and ``on_gradients_ready`` after backward, before the update.
        (pycaffe's other form, ``add_callback(nccl)``, needs a build with NCCL.)"""
        from .common import NCCL
        if isinstance(on_start, NCCL) or on_gradients_ready is None:
            raise TypeError("solver.add_callback(on_start, on_gradients_ready) takes two "
                            "functions; add_callback(nccl) needs a build with NCCL, and "
                            "caffe.has_nccl() is False here")
        for name, fn in (("on_start", on_start), ("on_gradients_ready", on_gradients_ready)):
            if not callable(fn):
                raise TypeError(f"solver.add_callback: {name} must be callable, got "
                                f"{type(fn).__name__}")
        self.callbacks.append(_PyCallback(on_start, on_gradients_ready))

    def share_weights(self, net: Net):
        """pycaffe's ``solver.share_weights(net)``: ``net`` shares this solver's train net's
        parameters, by layer name (``net->ShareTrainedLayersWith(solver->net())``)."""
        net.share_trained_layers_with(self.net)

    def _iteration_graph(self):
        """The IterationGraph that runs this iteration, or None to run it eagerly
        (``cuda_graph`` off, or the iteration cannot be captured: the reasons are
        logged once, and again only when they change)."""
        if not getattr(self, "cuda_graph", False):  # subclasses may skip __init__ (ps/)
            return None
        ex = getattr(self.net, "executor", None)
        if ex is not None:
            # under a swap plan the executor replays forward and backward as a graph of its
            # own (swap.graph); the update and the callbacks run eagerly around it
            if not ex.graph_wanted and ex.graph_refused is None:
                ex.use_graph()
            return None
        reasons = []
        if self.callbacks:
            reasons.append("solver callbacks (on_gradients_ready runs between backward and the "
                           "update)")
        if self.net.has_callbacks:
            reasons.append("net callbacks (net.before_forward ... after_backward run between "
                           "layers)")
        if "apply_update" in vars(self) or type(self).apply_update is not Solver.apply_update:
            reasons.append("apply_update is replaced (a parameter-server or NCCL worker)")
        if not reasons and self.graph is None:
            if not self.graph_refused:
                from .graph import IterationGraph, NotCapturable
                try:
                    self.graph = IterationGraph(self)
                except NotCapturable as e:
                    self.graph_refused = str(e)  # the net's own reasons: not asked again
            if self.graph_refused:
                reasons.append(self.graph_refused)
        if reasons:
            msg = "; ".join(reasons)
            if msg != self._graph_logged:
                self._graph_logged = msg
                log(f"cuda_graph: iterations run eagerly: {msg}", level="W")
            return None
        return self.graph

    def step(self, iters: int):
        """Run ``iters`` iterations (Caffe's Solver::Step; none for ``iters`` <= 0, as
        there)."""
        if isinstance(iters, bool) or not isinstance(iters, numbers.Integral):
            # pycaffe's step(int) refuses anything else (boost.python's ArgumentError); a
            # float ran up to its ceiling, a string failed inside the loop
            raise TypeError(f"solver.step(iters) takes an int number of iterations, got "
                            f"{iters!r} ({type(iters).__name__})")
        p = self.param
        stop_iter = self.iter + int(iters)
        self._losses = deque(maxlen=max(1, p.average_loss))
        timer = time.perf_counter()
        iter_last = self.iter
        while self.iter < stop_iter:
            graph = self._iteration_graph()  # None: this iteration runs eagerly
            if graph is None:
                self.clear_param_diffs()
            if p.test_interval and self.iter % p.test_interval == 0 and (
                    self.iter > 0 or p.test_initialization):
                self.test_all()
                if self.requested_early_exit:    # stop was asked for while testing
                    break
            for cb in self.callbacks:
                getattr(cb, "on_start", lambda s: None)(self)
            display = p.display and self.iter % p.display == 0
            # Solver::Step: net_->set_debug_info(display && param_.debug_info())
            self.net.debug_info = bool(display and p.debug_info)
            if graph is not None:
                # clear diffs, forward, backward and the SGD update: one CUDA graph launch
                loss = graph.step(advance=False)
            else:
                loss = 0.0
                for _ in range(max(1, p.iter_size)):
                    loss = loss + self.net.forward_backward()
                loss = loss / max(1, p.iter_size)
            self._losses.append(loss)  # device scalar: no sync here
            self.last_loss = loss
            if display:
                self.smoothed_loss = float(sum(float(x) for x in self._losses) / len(self._losses))
                lapse = time.perf_counter() - timer
                # Solver::Step: per_s = (iter_ - iterations_last_) / (lapse ? lapse : 1), both
                # floats streamed with six significant digits; the line ends at the loss
                per_s = (self.iter - iter_last) / (lapse if lapse else 1.0)
                self._log(f"Iteration {self.iter} ({per_s:.6g} iter/s, {lapse:.6g}s/{p.display} "
                          f"iters), loss = {self.smoothed_loss:.6g}")
                timer = time.perf_counter()
                iter_last = self.iter
                self._log_outputs(self.net, "Train")
            if graph is None:
                for cb in self.callbacks:
                    getattr(cb, "on_gradients_ready", lambda s: None)(self)
                self.apply_update(display)
            elif display:  # the update ran in the graph; log its rate as apply_update does
                self._log(f"Iteration {self.iter}, lr = {graph.last_rate:.6g}")
            self.iter += 1
            request = self.requested_action()
            if ((p.snapshot and self.iter % p.snapshot == 0 and common.root_solver())
                    or request == "snapshot"):
                self.snapshot()
            if request == "stop":
                self.requested_early_exit = True
                break

    def requested_action(self) -> str:
        """Caffe's Solver::GetRequestedAction: "none", "snapshot" or "stop", from
        :attr:`action_function` (the CLI sets it from SIGINT and SIGHUP)."""
        if self.action_function is None:
            return "none"
        request = self.action_function()
        if request not in ("none", "snapshot", "stop"):
            raise ValueError(f"the solver's action function gave {request!r}; expected "
                             "'none', 'snapshot' or 'stop'")
        return request

    def solve(self, resume_file: str | None = None):
        """Train to ``max_iter`` (Caffe's Solver::Solve)."""
        p = self.param
        self._log(f"Solving {self.net.name}")
        self._log(f"Learning Rate Policy: {p.lr_policy or 'fixed'}")
        # Solver::Solve: "Initialize to false every time we start solving." (a stop asked for
        # in an earlier step() or solve() does not end this one)
        self.requested_early_exit = False
        if resume_file:
            self._log(f"Restoring previous solver status from {resume_file}")
            self.restore(resume_file)
        self.step(p.max_iter - self.iter)
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self.requested_early_exit:      # Caffe: the snapshot above, then no final test
            self._log("Optimization stopped early.")
            return
        if p.display and self.iter % p.display == 0:
            # Solver::Solve: UpdateSmoothedLoss(loss, ...) first, so that this line reports
            # the average over average_loss iterations as Step's display lines do
            self._losses.append(float(self.net.forward_from_to()))
            loss = sum(float(x) for x in self._losses) / len(self._losses)
            self._log(f"Iteration {self.iter}, loss = {loss:.6g}")
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        self._log("Optimization Done.")

    def _log_outputs(self, net, kind, scores=None, scale=1.0):
        idx = 0
        for name in net.outputs:
            weight = self._output_loss_weight(net, name)
            values = scores[name] if scores is not None else to_numpy(net.blobs[name].data).ravel()
            for v in np.asarray(values).ravel():
                v = float(v) * (scale if scores is not None else 1.0)
                extra = f" (* {weight:g} = {weight * v:.6g} loss)" if weight else ""
                self._log(f"    {kind} net output #{idx}: {name} = {v:.6g}{extra}")
                idx += 1

    @staticmethod
    def _output_loss_weight(net, name):
        for li, names in enumerate(net.layer_top_names):
            if name in names:
                return net.layers[li].loss_weight(names.index(name))
        return 0.0

    def test_all(self):
        results = []
        for i in range(len(self.test_nets)):
            if self.requested_early_exit:   # Solver::TestAll stops at a requested stop
                break
            results.append(self.test(i))
        return results

    def test(self, test_net_id: int = 0) -> dict:
        """Caffe's Solver::Test: mean of every output over test_iter batches."""
        net = self.test_nets[test_net_id]
        n = self.param.test_iter[test_net_id]
        self._log(f"Iteration {self.iter}, Testing net (#{test_net_id})")
        sums = {}
        loss = 0.0
        for _ in range(n):
            # Solver::Test: snapshots and stops asked for while testing are handled per batch
            request = self.requested_action()
            while request != "none":
                if request == "snapshot":
                    self.snapshot()
                else:
                    self.requested_early_exit = True
                request = self.requested_action()
            if self.requested_early_exit:
                break
            batch_loss = net.forward_from_to()
            if self.param.test_compute_loss:
                loss = loss + batch_loss
            for name in net.outputs:
                v = net.blobs[name].data.reshape(-1)
                sums[name] = v.copy() if name not in sums else sums[name] + v
        if self.requested_early_exit:       # Caffe reports nothing of a partial test
            self._log("Test interrupted.")
            return {}
        means = {k: to_numpy(v) / n for k, v in sums.items()}
        if self.param.test_compute_loss:
            # test_iter 0 (HED's solver): Caffe's float loss /= 0 logs nan, it does not stop
            self._log(f"Test loss: {float(loss) / n if n else float('nan'):.6g}")
        if means:  # test_iter 0: Caffe's test_score is empty, and nothing is logged
            self._log_outputs(net, "Test", means)
        return {k: (float(v[0]) if v.size == 1 else v) for k, v in means.items()}

    # ------------------------------------------------------ update
    def get_learning_rate(self) -> float:
        p = self.param
        if not p.lr_policy and self.source:
            # caffe.proto gives lr_policy no default, and SGDSolver::GetLearningRate
            # LOG(FATAL)s on anything it does not know, "" included; a solver built in
            # code (no file) keeps minicaffe's "fixed"
            raise ValueError(
                f"{self.source}: Unknown learning rate policy: '' (lr_policy has no default "
                "in Caffe; give one of fixed, step, exp, inv, multistep, poly, sigmoid)")
        if p.lr_policy == "step" and p.stepsize > 0:
            # sgd_solver.cpp GetLearningRate: the step policy keeps current_step_ = iter /
            # stepsize, which the solver state records
            self.current_step = self.iter // p.stepsize
        if (p.lr_policy == "multistep" and self.current_step < len(p.stepvalue)
                and self.iter >= p.stepvalue[self.current_step]):
            self.current_step += 1
            self._log(f"MultiStep Status: Iteration {self.iter}, step = {self.current_step}")
        return learning_rate(p, self.iter, self.current_step)

    def apply_update(self, display: bool = False):
        """Caffe's SGDSolver::ApplyUpdate, for every learnable parameter.

        GPU fast path: with the plain SGD rule and no gradient clipping, every
        parameter is updated by one kernel launch (:meth:`fused_sgd`), with the
        arithmetic of the loop below, one rounding per step."""
        p = self.param
        rate = self.get_learning_rate()
        if display:
            self._log(f"Iteration {self.iter}, lr = {rate:.6g}")
        net = self.net
        xp = net.xp
        params = net.learnable_params
        reg = self._regularization()
        clipping = p.HasField("clip_gradients") and p.clip_gradients >= 0
        if not clipping:
            fused = self.fused_sgd()
            if fused is not None:
                fused.update(rate, p.momentum, p.weight_decay, max(1, p.iter_size), reg == "L1")
                return
        if clipping:
            sumsq = sum(xp.sum(q.diff * q.diff) for q in params)
            norm = xp.sqrt(sumsq)
            # Caffe reads the norm on the host; we keep it on the device.
            factor = xp.where(norm > p.clip_gradients, p.clip_gradients / norm, 1.0)
            # sgd_solver.cpp ClipGradients logs every clipping, not only on display
            # iterations (reading the norm syncs a GPU run, as Caffe's host-side norm does)
            if self.verbose and common.root_solver():
                n = float(norm)
                if n > p.clip_gradients:
                    self._log(f"Gradient clipping: scaling down gradients (L2 norm {n:.6g} > "
                              f"{p.clip_gradients:g}) by scale factor {p.clip_gradients / n:.6g}")
            for q in params:
                q.diff *= factor.astype(q.dtype)

        self.for_each_param(params, lambda i, q: self.update_param(i, q, rate, reg))

    def _regularization(self) -> str:
        """``regularization_type``; Caffe's SGDSolver::Regularize reads it only for a param
        with weight decay, and stops at an unknown one there ("Unknown regularization
        type"): without any decay an unknown type runs, as in Caffe."""
        p = self.param
        reg = p.regularization_type or "L2"
        if reg not in ("L1", "L2") and p.weight_decay and any(self.net.param_decay_mult):
            raise ValueError(f"{self.source or 'solver'}: Unknown regularization type: {reg} "
                             "(known: L1, L2)")
        return reg

    def update_param(self, i, q, rate, reg):
        """ApplyUpdate's work on learnable parameter ``i`` (blob ``q``) at learning rate
        ``rate``: iter_size normalisation, weight decay, the rule, ``data -= diff``."""
        p = self.param
        net = self.net
        if p.iter_size > 1:
            q.diff *= 1.0 / p.iter_size
        decay = p.weight_decay * net.param_decay_mult[i]
        if decay:
            if reg == "L2":
                q.diff += decay * q.data
            else:
                q.diff += decay * net.xp.sign(q.data)
        self.rule.compute_update(i, q, rate * net.param_lr_mult[i])
        q.data -= q.diff

    def clear_param_diffs(self):
        """Zero every learnable parameter's diff (Caffe's Net::ClearParamDiffs): one launch
        where the fused SGD update applies, whose tables already point at every diff (a
        deep net has hundreds of parameters, and a launch each costs the host more than the
        device's memset), else :meth:`Net.clear_param_diffs`."""
        fused = self.fused_sgd()
        if fused is not None:
            fused.zero("diff")
        else:
            self.net.clear_param_diffs()

    def for_each_param(self, params, fn):
        """``fn(i, q)`` for every parameter, in order.  Each call touches parameter ``i`` and
        its own history only, so a parameter-server shard runs them on a thread pool
        (:class:`ps.update.ShardSolver`)."""
        for i, q in enumerate(params):
            fn(i, q)

    def fused_sgd(self):
        """The one-launch SGD update of every parameter, or None where it does not
        apply: not GPU mode, fused kernels off or not compiled, a rule other than
        plain SGD (Nesterov, Adam), parameters of mixed dtypes.  Its tables point at
        the parameters' current storage and are rebuilt (a small synchronous
        upload) whenever that storage moved."""
        current = getattr(self, "_sgd_fused", None)  # subclasses may skip __init__ (ps/)
        if current is False:
            return None
        net = self.net
        params, history = net.learnable_params, self.history
        if current is None:
            ok = (type(self.rule) is SGDRule and bool(params)
                  and cuda_fused.enabled_for(net.xp, params[0].dtype)
                  and cuda_fused.MultiTensorSGD.supports(params, history))
            if not ok:
                self._sgd_fused = False
                return None
        elif current.matches(params, history):
            return current
        self._sgd_fused = cuda_fused.MultiTensorSGD(params, history, net.param_lr_mult,
                                                    net.param_decay_mult, xp=net.xp)
        return self._sgd_fused

    # ---------------------------------------------------- snapshots
    def _prefix(self) -> str:
        prefix = self.param.snapshot_prefix
        if not prefix:
            base = self.source or "solver"
            prefix = os.path.splitext(base)[0]
        return prefix

    def snapshot(self) -> tuple[str, str]:
        """Caffe's Solver::Snapshot: the weights, then the solver state, each written
        atomically. ``snapshot_format: BINARYPROTO`` (the default) writes
        ``<prefix>_iter_N.caffemodel`` and ``.solverstate``; ``HDF5`` writes
        ``<prefix>_iter_N.caffemodel.h5`` (Net::ToHDF5, diffs too with ``snapshot_diff``)
        and ``.solverstate.h5`` (SGDSolver::SnapshotSolverStateToHDF5)."""
        if not common.root_solver():     # Solver::Snapshot: CHECK(Caffe::root_solver())
            raise RuntimeError(f"only the root solver snapshots: this is solver rank "
                               f"{common.solver_rank()} (caffe.set_solver_rank)")
        hdf5 = self.param.snapshot_format == caffe_pb2.SolverParameter.HDF5
        prefix = self._prefix()
        d = os.path.dirname(prefix)
        try:
            if d:
                os.makedirs(d, exist_ok=True)
            return self._snapshot_files(prefix, hdf5)
        except OSError as e:    # the folder went away or filled up since _check_snapshot_prefix
            raise OSError(e.errno, f"{self.source or 'solver'}: Cannot write to snapshot prefix "
                          f"'{prefix}' ({e}). Make sure that the directory exists and is "
                          "writable; the snapshots written before are intact") from e

    def _snapshot_files(self, prefix: str, hdf5: bool) -> tuple[str, str]:
        if hdf5:
            model = f"{prefix}_iter_{self.iter}.caffemodel.h5"
            self._log(f"Snapshotting to HDF5 file {model}")
            self.net.save_hdf5(model, write_diff=self.param.snapshot_diff)
            path = f"{prefix}_iter_{self.iter}.solverstate.h5"
            self._log(f"Snapshotting solver state to HDF5 file {path}")
            self._snapshot_state_hdf5(model, path)
        else:
            model = f"{prefix}_iter_{self.iter}.caffemodel"
            self._log(f"Snapshotting to binary proto file {model}")
            self.net.save(model, write_diff=self.param.snapshot_diff)
            path = f"{prefix}_iter_{self.iter}.solverstate"
            self._log(f"Snapshotting solver state to binary proto file {path}")
            self._snapshot_state_binary(model, path)
        self.last_snapshot = (model, path)
        return model, path

    def _snapshot_state_binary(self, model: str, path: str):
        """SGDSolver::SnapshotSolverStateToBinaryProto, plus minicaffe's extra state in
        SolverState field 1000 (``minicaffe_state``, which Caffe skips as unknown)."""
        state = caffe_pb2.SolverState(iter=self.iter, learned_net=model,
                                      current_step=self.current_step)
        for h in self.rule.state_blobs():
            bp = state.history.add()
            bp.shape.dim.extend(h.shape)
            # Blob<double>::ToProto writes double_data: a float64 solver resumes exactly
            values = bp.double_data if h.dtype == np.float64 else bp.data
            values.extend(to_numpy(h).astype(h.dtype if h.dtype == np.float64 else np.float32)
                          .ravel().tolist())
        state.minicaffe_state = json.dumps(self._extra_state()).encode()
        write_binary(state, path)

    def _snapshot_state_hdf5(self, model: str, path: str):
        """SGDSolver::SnapshotSolverStateToHDF5: int datasets ``iter`` and
        ``current_step``, string ``learned_net`` (the weights file), and group ``history``
        with dataset ``"i"`` for history blob i, shaped as its param, in the solver's
        dtype. The history list is the rule's: one blob per learnable param, and for
        AdaDelta and Adam a second run of them after the first (Caffe's PreSolve appends
        them to history_, so their indices continue at n_params).

        minicaffe's extra state (RNG and data-reader positions, as in the binary
        ``minicaffe_state``) goes into group ``minicaffe``, dataset ``state`` (JSON);
        Caffe's RestoreSolverStateFromHDF5 opens only the datasets it names, so it
        ignores the group."""
        from .hdf5_util import save_int, save_string, write_atomic
        # host copies first (each one syncs with the device where the solver runs on a GPU)
        history = [to_numpy(h).astype(np.float64 if h.dtype == np.float64 else np.float32,
                                      copy=False)
                   for h in self.rule.state_blobs()]
        extra = json.dumps(self._extra_state())

        def fill(f):
            save_int(f, "iter", self.iter)
            save_string(f, "learned_net", model)
            save_int(f, "current_step", self.current_step)
            group = f.create_group("history")
            for i, h in enumerate(history):
                group.create_dataset(str(i), data=h)
            ours = f.create_group("minicaffe")
            ours.attrs["version"] = MINICAFFE_STATE_VERSION
            save_string(ours, "state", extra)

        write_atomic(path, fill)

    def training_state(self) -> dict:
        """Everything an iteration changes, copied to the host: the train net's layer blobs
        (weights, biases, BatchNorm's statistics; a shared blob once), the update rule's
        state, the iteration and step counts, the loss average and what
        :meth:`_extra_state` keeps (the RNGs, the data layers' positions).
        :meth:`restore_training_state` puts it back, in place, so that the run goes on as if
        the iterations between had not been (``swap.tuner._Untrained``)."""
        xp = self.net.xp
        host = (lambda a: a.copy()) if xp is np else xp.asnumpy
        seen, blobs = set(), []
        for layer_blobs in self.net.params.values():
            for b in layer_blobs:
                if id(b) not in seen:
                    seen.add(id(b))
                    blobs.append(b)
        return {"blobs": [(b, host(b.data)) for b in blobs],
                "rule": [(a, host(a)) for a in self.rule.state_blobs()],
                "counts": (self.iter, self.current_step, self.smoothed_loss, self.last_loss,
                           list(self._losses)),
                "extra": self._extra_state()}

    def restore_training_state(self, state: dict):
        """Put back what :meth:`training_state` copied."""
        xp = self.net.xp
        for b, saved in state["blobs"]:
            b.data[...] = xp.asarray(saved)
        for a, saved in state["rule"]:
            a[...] = xp.asarray(saved)
        self.iter, self.current_step, self.smoothed_loss, self.last_loss, losses = state["counts"]
        self._losses.clear()
        self._losses.extend(losses)
        self._load_extra_state(state["extra"])

    def _extra_state(self) -> dict:
        """What Caffe does not save but an identical resume needs: the RNG
        states, the data layers' read positions and, under ``--swap dynamic``, the tuner's
        decision (``swap_dynamic``: :attr:`swap_decision`)."""
        layers = {}
        for tag, net in [("train", self.net)] + [(f"test{i}", n) for i, n in enumerate(self.test_nets)]:
            for name, layer in zip(net.layer_names, net.layers):
                if hasattr(layer, "state_dict"):
                    layers[f"{tag}/{name}"] = layer.state_dict()
        state = {"version": MINICAFFE_STATE_VERSION,
                 "host_rng": host_rng().bit_generator.state, "layers": layers}
        if self.swap_decision is not None:
            state["swap_dynamic"] = dict(self.swap_decision)
        return state

    def _load_extra_state(self, extra: dict):
        host_rng().bit_generator.state = extra["host_rng"]
        self.swap_decision = extra.get("swap_dynamic")
        nets = [("train", self.net)] + [(f"test{i}", n) for i, n in enumerate(self.test_nets)]
        for tag, net in nets:
            for name, layer in zip(net.layer_names, net.layers):
                key = f"{tag}/{name}"
                if key in extra["layers"] and hasattr(layer, "load_state_dict"):
                    layer.load_state_dict(extra["layers"][key])

    @staticmethod
    def _learned_net_path(model: str, state_path: str) -> str:
        """The weights a state names; where that path is gone (a moved snapshot
        directory), the file of that name beside the state.  Neither there: an error naming
        both files, before anything is restored (Caffe's ReadNetParamsFromBinaryFileOrDie)."""
        if model and not os.path.exists(model):
            alt = os.path.join(os.path.dirname(state_path), os.path.basename(model))
            if not os.path.exists(alt):
                raise FileNotFoundError(
                    f"{state_path}: its weights (learned_net) {model} not found: a snapshot "
                    "is the .solverstate and the .caffemodel written beside it, and restore "
                    "needs both")
            model = alt
        return model

    def restore(self, path: str):
        """Resume from a solver state (Caffe's Solver::Restore): a name ending in ``.h5``
        is read as HDF5 (RestoreSolverStateFromHDF5), any other as a binary
        ``.solverstate``."""
        path = os.fspath(path)
        if path.endswith((".caffemodel", ".caffemodel.h5")):
            raise ValueError(f"{path}: a .caffemodel holds weights, not a solver state: resume "
                             "from its .solverstate, or finetune from it with -weights")
        if not os.path.exists(path):
            raise FileNotFoundError(f"snapshot: File not found: {path}")
        if path.endswith(".h5"):
            return self._restore_hdf5(path)
        state = read_binary(path, caffe_pb2.SolverState)
        # every check before anything changes: a state from another net leaves this one as
        # it was (Caffe's SGDSolver::RestoreSolverStateFromBinaryProto CHECKs the count)
        blobs = self.rule.state_blobs()
        if len(state.history) != len(blobs):
            raise ValueError(
                f"{path}: Incorrect length of history blobs: the solver state has "
                f"{len(state.history)}, this solver needs {len(blobs)} (a state from another "
                "net or solver type?)")
        history = []
        for i, (h, bp) in enumerate(zip(blobs, state.history)):
            values = (np.asarray(bp.double_data, dtype=np.float64) if len(bp.double_data)
                      else np.asarray(bp.data, dtype=np.float32))
            if values.size != h.size:
                name = self._history_name(i)
                raise ValueError(
                    f"{path}: history blob {i}{name} has {values.size} values, this net's "
                    f"parameter has shape {tuple(h.shape)} ({h.size} values): a state from "
                    "another net?")
            history.append(values)
        model = self._learned_net_path(state.learned_net, path)
        if model:
            try:
                self.net.copy_from(model)
            except ValueError as e:
                raise ValueError(f"{path}: its weights {e}") from e
        self.iter = state.iter
        self.current_step = state.current_step
        xp = self.net.xp
        for h, values in zip(blobs, history):
            h[...] = xp.asarray(values.reshape(h.shape), dtype=h.dtype)
        if state.minicaffe_state:
            self._load_extra_state(json.loads(state.minicaffe_state.decode()))

    def _history_name(self, i: int) -> str:
        """`` (layer 'ip' param 0)`` for history blob ``i`` (slot after slot over the
        learnable parameters), or "" when it cannot be told."""
        params = self.net.learnable_params
        if not params:
            return ""
        blob = params[i % len(params)]
        for li, layer in enumerate(self.net.layers):
            for pi, b in enumerate(layer.blobs):
                if b is blob:
                    return f" (layer {self.net.layer_names[li]!r} param {pi})"
        return ""

    def _restore_hdf5(self, path: str):
        """SGDSolver::RestoreSolverStateFromHDF5: ``iter``, the weights named by
        ``learned_net`` where that dataset exists (Net::CopyTrainedLayersFrom, which reads
        HDF5 or binary weights), ``current_step``, and group ``history`` that must hold
        exactly as many datasets as this solver has history blobs, each shaped as its
        blob. The whole file is read and checked before anything is changed."""
        import h5py
        from .hdf5_util import load_int, load_string
        blobs = self.rule.state_blobs()
        try:
            f = h5py.File(path, "r")
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no such solver state file") from None
        except OSError as e:
            raise ValueError(f"{path}: not a readable HDF5 solver state ({e})") from None
        try:
            with f:
                it = load_int(f, "iter")
                model = load_string(f, "learned_net") if "learned_net" in f else ""
                step = load_int(f, "current_step")
                if not isinstance(f.get("history"), h5py.Group):
                    raise ValueError("no 'history' group")
                group = f["history"]
                if len(group) != len(blobs):
                    raise ValueError(
                        f"solver state has {len(group)} history blobs, this solver needs "
                        f"{len(blobs)} (different net or solver type?)")
                values = []
                for i, h in enumerate(blobs):
                    if str(i) not in group:
                        raise ValueError(f"history dataset {i!r} is missing")
                    v = group[str(i)][...]
                    if tuple(v.shape) != tuple(h.shape):
                        raise ValueError(f"history blob {i} has shape {tuple(v.shape)}, "
                                         f"this solver's is {tuple(h.shape)}")
                    values.append(v)
                extra = None
                if isinstance(f.get("minicaffe"), h5py.Group) and "state" in f["minicaffe"]:
                    extra = json.loads(load_string(f["minicaffe"], "state"))
        except (KeyError, OSError, ValueError) as e:
            # h5py reports a missing dataset as KeyError, unreadable (truncated) data as
            # OSError; either way the message names the file
            msg = e.args[0] if e.args else type(e).__name__
            raise ValueError(f"{path}: bad HDF5 solver state: {msg}") from None
        model = self._learned_net_path(model, path)
        if model:
            self.net.copy_from(model)
        self.iter = it
        self.current_step = step
        xp = self.net.xp
        for h, v in zip(blobs, values):
            h[...] = xp.asarray(v, dtype=h.dtype)     # host to device where on a GPU
        if extra is not None:
            self._load_extra_state(extra)


class _PyCallback:
    """A pair of pycaffe callbacks (``solver.add_callback``) in the form :meth:`Solver.step`
    calls: ``on_start(solver)`` and ``on_gradients_ready(solver)``."""

    def __init__(self, on_start, on_gradients_ready):
        self._on_start, self._on_gradients_ready = on_start, on_gradients_ready

    def on_start(self, solver):
        self._on_start()

    def on_gradients_ready(self, solver):
        self._on_gradients_ready()


# ------------------------------------------------------------- update rules
class SGDRule:
    """history = local_rate * diff + momentum * history; diff = history."""

    def __init__(self, solver):
        self.solver = solver
        self.history = solver.history

    def history_slots(self) -> list:
        """The rule's per-parameter state, one list of arrays per slot (swap.gmap's
        ``("history", i, slot)``): the history, then a second one where the rule keeps it."""
        return [self.history]

    def state_blobs(self):
        """Every slot's arrays, slot after slot (the solver state's order, as Caffe's)."""
        return [a for slot in self.history_slots() for a in slot]

    def compute_update(self, i, q, local_rate):
        h = self.history[i]
        h *= self.solver.param.momentum
        h += local_rate * q.diff
        q.diff[...] = h


class NesterovRule(SGDRule):
    """Caffe's NesterovSolver: diff = (1+m) * h_new - m * h_old."""

    def compute_update(self, i, q, local_rate):
        m = self.solver.param.momentum
        h = self.history[i]
        old = h.copy()
        h *= m
        h += local_rate * q.diff
        q.diff[...] = (1 + m) * h - m * old


class AdamRule(SGDRule):
    """Caffe's AdamSolver (momentum = beta1, momentum2 = beta2, delta = eps)."""

    def __init__(self, solver):
        super().__init__(solver)
        xp = solver.net.xp
        self.second = [xp.zeros_like(h) for h in self.history]

    def history_slots(self) -> list:
        return [self.history, self.second]

    def compute_update(self, i, q, local_rate):
        p = self.solver.param
        b1, b2, eps = p.momentum, p.momentum2, p.delta
        t = self.solver.iter + 1
        m, v = self.history[i], self.second[i]
        m *= b1
        m += (1 - b1) * q.diff
        v *= b2
        v += (1 - b2) * q.diff * q.diff
        correction = math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        q.diff[...] = local_rate * correction * m / (self.solver.net.xp.sqrt(v) + eps)


class AdaGradRule(SGDRule):
    """Caffe's AdaGradSolver: history += diff^2; diff = local_rate * diff / (sqrt(history)
    + delta).  Caffe refuses momentum ("Momentum cannot be used with AdaGrad.")."""

    name = "AdaGrad"

    def __init__(self, solver):
        super().__init__(solver)
        _no_momentum(solver, self.name)

    def compute_update(self, i, q, local_rate):
        xp = self.solver.net.xp
        h = self.history[i]
        h += q.diff * q.diff
        q.diff[...] = local_rate * (q.diff / (xp.sqrt(h) + self.solver.param.delta))


class RMSPropRule(AdaGradRule):
    """Caffe's RMSPropSolver: history = rms_decay * history + (1 - rms_decay) * diff^2;
    diff = local_rate * diff / (sqrt(history) + delta); no momentum, 0 <= rms_decay < 1."""

    name = "RMSProp"

    def __init__(self, solver):
        super().__init__(solver)
        d = solver.param.rms_decay
        if not 0 <= d < 1:
            raise ValueError(f"{_solver_where(solver)}: rms_decay should lie between 0 and 1, "
                             f"got {d}")

    def compute_update(self, i, q, local_rate):
        xp = self.solver.net.xp
        d = self.solver.param.rms_decay
        h = self.history[i]
        h *= d
        h += (1 - d) * (q.diff * q.diff)
        q.diff[...] = local_rate * (q.diff / (xp.sqrt(h) + self.solver.param.delta))


class AdaDeltaRule(SGDRule):
    """Caffe's AdaDeltaSolver (momentum is the decay rho): history of squared gradients
    h = m h + (1 - m) diff^2; update = diff * sqrt((u + delta) / (h + delta)), with u the
    history of squared updates, then u = m u + (1 - m) update^2; diff = local_rate * update.
    The update histories follow the gradient ones in the solver state, as in Caffe."""

    def __init__(self, solver):
        super().__init__(solver)
        xp = solver.net.xp
        self.updates = [xp.zeros_like(h) for h in self.history]

    def history_slots(self) -> list:
        return [self.history, self.updates]

    def compute_update(self, i, q, local_rate):
        xp = self.solver.net.xp
        m, delta = self.solver.param.momentum, self.solver.param.delta
        h, u = self.history[i], self.updates[i]
        h *= m
        h += (1 - m) * (q.diff * q.diff)
        step = q.diff * xp.sqrt((u + delta) / (h + delta))
        u *= m
        u += (1 - m) * (step * step)
        q.diff[...] = local_rate * step


def _solver_where(solver) -> str:
    return getattr(solver, "source", None) or "solver"


def _no_momentum(solver, name: str):
    if solver.param.momentum != 0:
        raise ValueError(f"{_solver_where(solver)}: momentum cannot be used with {name} (Caffe's "
                         f"{name}Solver checks momentum == 0), got {solver.param.momentum}")


UPDATE_RULES = {"SGD": SGDRule, "Nesterov": NesterovRule, "AdaGrad": AdaGradRule,
                "RMSProp": RMSPropRule, "AdaDelta": AdaDeltaRule, "Adam": AdamRule}


def get_solver(path_or_param, **kwargs) -> Solver:
    """pycaffe's ``caffe.get_solver``: a solver of the class that the file's ``type``
    names (``caffe.SGDSolver``, ``caffe.AdamSolver`` ...).  pycaffe's get_solver calls
    ``GetSolverFromFile`` (python/caffe/_caffe.cpp), whose registry builds the typed C++
    solver, and Boost.Python hands it back as that class's Python object."""
    solver = Solver(path_or_param, **kwargs)
    typed = {c.update_type: c for c in (SGDSolver, NesterovSolver, AdaGradSolver,
                                        RMSPropSolver, AdaDeltaSolver, AdamSolver)}
    solver.__class__ = typed[solver.type]  # the rule is already the type's: only the class
    return solver


class SGDSolver(Solver):
    """pycaffe's ``caffe.SGDSolver``: SGD whatever the file's ``type`` says (as each of
    pycaffe's solver classes is one C++ solver class); ``get_solver`` follows the file."""

    update_type = "SGD"


class NesterovSolver(Solver):
    update_type = "Nesterov"


class AdaGradSolver(Solver):
    update_type = "AdaGrad"


class RMSPropSolver(Solver):
    update_type = "RMSProp"


class AdaDeltaSolver(Solver):
    update_type = "AdaDelta"


class AdamSolver(Solver):
    update_type = "Adam"
