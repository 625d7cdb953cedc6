"""Dynamic information (paper, section 3.2): per-step compute and per-transfer times at several k.

The paper profiles one iteration in each of the first five epochs, at k = 1/8, 1/4, 1/2, 2/3 and 1
of the largest trainable minibatch, under the naive strategy, with nvprof; those iterations still
train.  :func:`profile_solver` does the same inside real ``Solver.step`` iterations:

* for each k: resize the train net to k (:func:`set_batch_size`), install the naive plan under
  the budget (:func:`swap.runtime.install`), run ``warmup`` iterations (first-call costs: CuPy
  kernel compilation, allocator warm-up) and ``iterations`` measured ones.  All of them are
  ordinary training iterations (``solver.step(1)``: they update the weights and count in
  ``solver.iter``);
* compute: each step's forward or backward on the compute stream.  GPU: two timing CUDA events
  around ``Net.forward_layer`` / ``backward_layer`` on the current (compute) stream, recorded
  after the executor has made the compute stream wait for the step's prefetches, so a wait is not
  counted as compute; read once per iteration after one synchronization; and ``perf_counter``
  around the call, the host's time to issue the step.  CPU: ``perf_counter`` around the call
  (NumPy is synchronous);
* transfers: each offload and prefetch.  GPU: two timing events on the copy's own stream
  around the copy (after its waits were enqueued), so the time is the copy's; start times
  relative to an event recorded at the start of the iteration tell which copies overlapped one
  the other way (``concurrent``: both copy engines busy).  CPU: ``perf_counter`` around the
  synchronous copy;
* the whole ``Solver.step`` of each measured iteration (:class:`SolverStepSample`): the
  iteration starts on an idle device (GPU: one synchronization before it, as in a timed step)
  and three marks on the compute stream give the time before the forward pass (clearing the
  parameter diffs), the forward and backward pass, and the time after the last backward step
  (the solver update).  The pass alone is the iteration's ``iterations`` entry, the time origin
  of its compute and transfer samples;
* optionally (GPU, on by default there) a microbenchmark of the pinned copy bandwidth host to
  device, device to host and both at once (:func:`measure_bandwidth`).

Nothing here changes what the executor does: the hooks are instance attributes set on the net,
the executor and its streams for the duration of the profile and removed afterwards.

**Resizing the net** (:func:`set_batch_size`).  The net is not rebuilt: its parameters, the
solver's history and the test nets that share the weights must stay the same objects.  The
batch dimension lives in the source layers (no bottoms): ``Input`` tops are reshaped (the caller
writes their data, new rows start at zero), ``DummyData`` tops are reshaped and its constant tops
refilled, ``MemoryData`` uses its ``set_batch_size``, ``HDF5Data`` takes the new ``batch_size``,
and ``Data`` gets the new batch size in the layer and its loader, with the prefetch thread
restarted from the first record not yet consumed (the batches it had read ahead at the old size
are dropped and read again).  A layer with a ``set_batch_size(k)`` method is always resized
through it.  Then ``Net.reshape()`` propagates the shapes through every layer (internals
included); storage is reallocated lazily.  Only tops whose first axis was the old batch size are
resized.  The executor of the previous k must be closed first (``Executor.close``).

Profiles are JSON (:meth:`Profile.save` / :meth:`Profile.load`), schema ``minicaffe.swap.profile``
version 1: net, device, mode, date, k_base, the profiled ks, the steps (layer name, type, phase),
compute samples (k, step, FLOPs, start, seconds, host seconds), transfer samples (k, offload | prefetch,
buffer, bytes, start, seconds, concurrent), the time of each iteration's forward and backward
pass, measured bandwidths, and (since the solver-step marks; absent from older files, which
load with none) the solver steps (k, seconds, head, tail).
"""
from __future__ import annotations

import datetime
import gzip
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field

import numpy as np

# re-exported: scripts and tests take it from here
from minicaffe.kernels.device_wait import device_wait  # noqa: F401

from .gmap import BACKWARD, FORWARD, GMAP, build_gmap, net_batch_size
from .plan import OFFLOAD, PREFETCH, SWAP_IN, SWAP_OUT, BudgetError

SCHEMA = "minicaffe.swap.profile"
VERSION = 1
PROFILE_FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 2 / 3, 1.0)
# a fraction of a revised k_max counts as profiled where a k already profiled lies within this
# share of it (profile_solver): GoogLeNet's first point, 1/8 of a first k_max of 611, was 76;
# k_max became 1236 and 1/8 of it, 154, was never profiled, so the model interpolated 180
# between 76 and 309 and missed it by 8 % (H200, 2026-11-22)
PROFILE_COVERED = 0.25
ENV_COPY_CALIBRATION = "MINICAFFE_COPY_CALIBRATION"   # "0" / "1": profile_solver's default
# recorded iterations of the copy calibration at least (each step's median): one step of one
# iteration took 95 ms instead of 0.4 ms in a ResNet-152 calibration (H200, session 25), and
# with a single iteration that wrecked the fit
COPY_CALIBRATION_ITERATIONS = 3
# the copy calibration's kept run starts each recorded pass behind a device-side wait of this
# many times the host's least time to issue a pass so far, at most ..._CAP seconds
# (head_start_seconds): ResNet-152 at 49 (H200, session 30) kept its steps 7 % slower than the
# naive plan did beside its copies (res5's backward convolutions 0.33 against 0.67 ms), twice,
# where the host issued a whole iteration in 90 to 120 ms against the device's 142 ms
COPY_CALIBRATION_HEAD_START = 1.5
COPY_CALIBRATION_HEAD_START_CAP = 1.0


def profile_ks(k_max: int, fractions=PROFILE_FRACTIONS) -> tuple:
    """The minibatches to profile: ``fractions`` of ``k_max``, rounded, at least 1, distinct."""
    if k_max < 1:
        raise ValueError(f"k_max must be at least 1, got {k_max}")
    return tuple(sorted({max(1, min(k_max, int(round(f * k_max)))) for f in fractions}))


# ------------------------------------------------------------------ records
# layer types that make a net's input (no bottoms): interchangeable in a profile
SOURCE_TYPES = frozenset({"Input", "DummyData", "Data", "ImageData", "HDF5Data", "MemoryData",
                          "WindowData"})


@dataclass(frozen=True)
class StepInfo:
    step: int
    layer: str
    type: str
    phase: str

    @property
    def name(self) -> str:         # the ComputeModel keys steps like swap.gmap.Step
        return self.layer


@dataclass(frozen=True)
class ComputeSample:
    """One step's compute at minibatch k: FLOPs (eq. 1) and measured seconds; start: seconds
    from the start of the iteration (for observed timelines); host: seconds the host took to
    issue the step (its Python and kernel launches; on the CPU the step itself; None in
    profiles from before it was recorded).  Under the naive plan the host runs ahead of a
    device that waits for prefetches, so the step's device time does not show it; without
    those waits a step whose host time exceeds its device time leaves the device idle."""
    k: int
    step: int
    flops: float
    time: float
    start: float = 0.0
    host: float | None = None


@dataclass(frozen=True)
class TransferSample:
    """One offload (device to host) or prefetch (host to device) at minibatch k."""
    k: int
    kind: str
    buffer: str
    nbytes: int
    time: float
    start: float = 0.0
    concurrent: bool = False

    @property
    def bandwidth(self) -> float:
        return self.nbytes / self.time if self.time > 0 else math.inf


@dataclass(frozen=True)
class SolverStepSample:
    """One measured ``Solver.step`` at minibatch k: what lies outside the layer steps.

    seconds: the whole step, from its start on an idle device to the end of the solver update.
    head: from the step's start to the start of the forward and backward pass (the time origin
    of the iteration's samples): clearing the parameter diffs, host work before the first step.
    tail: from the end of the pass (after the last backward step) to the end of the step: the
    solver update (SGD with momentum over every parameter) and the loss bookkeeping."""
    k: int
    seconds: float
    head: float
    tail: float


@dataclass(frozen=True)
class Profile:
    """Dynamic information of one net on one device (module doc for the JSON schema)."""
    net: str
    device: str
    mode: str
    k_base: int
    ks: tuple
    steps: tuple
    compute: tuple
    transfers: tuple
    iterations: tuple = ()          # (k, seconds) per measured iteration: its forward and backward
    bandwidth: dict | None = None   # {"h2d": B/s, "d2h": B/s, "both": B/s}
    date: str = ""
    meta: dict = field(default_factory=dict)
    solver_steps: tuple = ()        # SolverStepSample per measured iteration (none in old files)
    # ComputeSample per step of iterations at small k under the plan "none", for the host's
    # issue time (profile_host_issue; none in old files): not compute samples, since at those
    # k a step's events hold the host's launch gaps
    host_samples: tuple = ()
    # ``(layer, phase, k) -> seconds or None``: cuDNN's search at a k ``meta["searched"]``
    # lacks, from the device the profile was taken on (search_probe; never saved)
    search_probe: object = field(default=None, repr=False, compare=False)

    def step_times(self, k: int) -> np.ndarray:
        """Mean measured seconds of every step at ``k`` (NaN where not measured)."""
        out = np.full(len(self.steps), np.nan)
        acc: dict = {}
        for c in self.compute:
            if c.k == k:
                acc.setdefault(c.step, []).append(c.time)
        for j, v in acc.items():
            out[j] = float(np.mean(v))
        return out

    def transfers_at(self, k: int) -> tuple:
        return tuple(t for t in self.transfers if t.k == k)

    # ---- JSON
    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "version": VERSION,
            "net": self.net, "device": self.device, "mode": self.mode, "date": self.date,
            "k_base": self.k_base, "ks": list(self.ks),
            "steps": [asdict(s) for s in self.steps],
            "compute": [asdict(c) for c in self.compute],
            "transfers": [asdict(t) for t in self.transfers],
            "iterations": [list(x) for x in self.iterations],
            "solver_steps": [asdict(x) for x in self.solver_steps],
            "host_samples": [asdict(c) for c in self.host_samples],
            "bandwidth": self.bandwidth, "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d, where: str = "profile") -> "Profile":
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            found = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"{where}: not a minicaffe swap profile (schema {SCHEMA!r} expected, "
                             f"found {found!r})")
        if d.get("version") != VERSION:
            raise ValueError(f"{where}: profile schema version {d.get('version')} is not supported "
                             f"(this minicaffe reads version {VERSION}); profile again")
        try:
            return cls(net=d["net"], device=d["device"], mode=d["mode"], date=d.get("date", ""),
                       k_base=int(d["k_base"]), ks=tuple(int(k) for k in d["ks"]),
                       steps=tuple(StepInfo(**s) for s in d["steps"]),
                       compute=tuple(ComputeSample(**c) for c in d["compute"]),
                       transfers=tuple(TransferSample(**t) for t in d["transfers"]),
                       iterations=tuple((int(k), float(s)) for k, s in d.get("iterations", [])),
                       solver_steps=tuple(SolverStepSample(**x)
                                          for x in d.get("solver_steps", [])),
                       host_samples=tuple(ComputeSample(**c)
                                          for c in d.get("host_samples", [])),
                       bandwidth=d.get("bandwidth"), meta=d.get("meta", {}))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: malformed profile ({e})") from None

    def save(self, path):
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> "Profile":
        """A saved profile; gzipped where the name ends in ``.gz`` (as the saved profiles in
        docs/results are)."""
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt") as f:
            try:
                d = json.load(f)
            except (json.JSONDecodeError, EOFError, OSError) as e:
                raise ValueError(f"{path}: not JSON ({e})") from None
        return cls.from_dict(d, where=str(path))

    def check_net(self, gmap: GMAP):
        """Raise unless this profile's steps are ``gmap``'s (same layers, types and phases; the
        layers that make the net's input may differ in type: a profile taken with an Input
        layer serves the same net reading DummyData or a database)."""
        def key(layer, type_, phase):
            return (layer, "(source)" if type_ in SOURCE_TYPES else type_, phase)
        mine = [key(s.layer, s.type, s.phase) for s in self.steps]
        theirs = [key(s.name, s.type, s.phase) for s in gmap.steps]
        if mine != theirs:
            diff = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                        min(len(mine), len(theirs)))
            at = (f": {mine[diff]} in the profile, {theirs[diff]} in the net"
                  if diff < min(len(mine), len(theirs)) else "")
            raise ValueError(f"the profile of net {self.net!r} ({len(mine)} steps) does not match "
                             f"net {gmap.net_name!r} ({len(theirs)} steps): first difference at "
                             f"step {diff}{at}")


def saved_profile(folder, name: str) -> str | None:
    """The path of ``NAME_profile.json`` in ``folder`` (as tuner_table.py saves them), or of
    ``NAME_profile.json.gz`` (as docs/results keeps them); None where neither is there."""
    for ext in ("", ".gz"):
        path = os.path.join(folder, f"{name}_profile.json{ext}")
        if os.path.exists(path):
            return path
    return None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def step_infos(gmap: GMAP) -> tuple:
    return tuple(StepInfo(s.index, s.name, s.type, s.phase) for s in gmap.steps)


def chunk_rules_now(net, k: int) -> dict:
    """``{layer: [limit, bytes per image, multiple, calls at k]}`` for each cuDNN convolution
    of ``net`` that may cut a minibatch into several calls
    (:meth:`minicaffe.layers.conv.ConvolutionLayer.chunk_rule`), as it stands now."""
    from minicaffe import engine as engines
    out = {}
    for layer in net.layers:
        rule_of = getattr(layer, "chunk_rule", None)
        if rule_of is None or getattr(layer, "engine", None) != engines.CUDNN:
            continue
        rule = rule_of()
        if rule is not None:
            out[layer.name] = [*rule, len(layer._chunks_at(k))]
    return out


def cudnn_api_now() -> str:
    """The API the bound cuDNN convolutions take now (``$MINICAFFE_CUDNN_API``: "legacy" or
    "graph", the default), kept in a GPU profile's ``meta["cudnn_api"]``: the graph API's plans run
    other engines, so a profile's step times belong to the API it was measured on."""
    from minicaffe.cudnn.backend_api import api_choice
    return api_choice()


def search_times_now(net, k: int, layers=None) -> dict:
    """``{layer: [forward seconds, backward seconds]}``: cuDNN's own search times of the
    algorithms each cuDNN convolution of ``net`` (or of those named in ``layers``) runs at a
    minibatch of ``k``, summed over its calls there (:meth:`ConvolutionLayer._chunks_at`);
    backward is the filter's and, where the net propagates to the layer's bottom, the data's
    (times the layer's bottoms).  Each shape is searched once and cached (the choice the layer
    itself then runs); at the net's own k that is a cache hit.  Layers without a timed search
    (``find`` off, or a time cuDNN did not give) are left out.  The performance model prices
    these steps by them (:class:`swap.model.ComputeModel` ``searched``)."""
    from minicaffe import engine as engines
    from minicaffe.cudnn import ops as cudnn_ops
    out = {}
    for li, layer in enumerate(net.layers):
        if layer.type != "Convolution" or getattr(layer, "engine", None) != engines.CUDNN:
            continue
        o = getattr(layer, "_cudnn", None)
        if o is None or not o.find or (layers is not None and layer.name not in layers):
            continue
        need_w = bool(layer.param_propagate_down and layer.param_propagate_down[0])
        n = len(net.bottom_vecs[li])
        n_x = sum(bool(b) for b in net.bottom_need_backward[li])
        times = {cudnn_ops.FWD: 0.0, cudnn_ops.BWD_FILTER: 0.0, cudnn_ops.BWD_DATA: 0.0}
        for _, c in layer.call_choices(k):
            for d in times:
                # a heuristic choice has no time (-1): the layer is left out
                times[d] += c[d].time_ms if (c[d].time_ms or 0) > 0 else float("nan")
        fwd = n * times[cudnn_ops.FWD]
        bwd = (n * times[cudnn_ops.BWD_FILTER] if need_w else 0.0) + \
            n_x * times[cudnn_ops.BWD_DATA]
        if fwd > 0 and (bwd > 0 or not (need_w or n_x)):     # NaN or a missing time: left out
            out[layer.name] = [fwd / 1e3, bwd / 1e3 if bwd > 0 else None]
    return out


def search_probe(net, meta: dict):
    """``(layer, phase, k) -> seconds or None`` from :func:`search_times_now` on ``net``
    (searching the shapes of k now, a few milliseconds per shape, cached), each answer kept
    in ``meta["searched"]`` (so a profile saved after a decision replays it on the CPU):
    :class:`Profile`'s ``search_probe``, the tuner's model's ``probe``.  None while an
    executor is installed (its scratch reserve would have to hold the search's operands);
    the model then prices that k by its curves."""
    rec = meta.setdefault("searched", {})

    def probe(layer: str, phase: str, k: int):
        rows = rec.setdefault(layer, [])
        row = next((r for r in rows if r[0] == k), None)
        if row is None:
            from . import runtime
            if runtime._INSTALLED:
                # an executor's scratch reserve would have to hold the search's operands:
                # not searched (the model prices this k by its curves)
                return None
            t0 = time.perf_counter()
            try:
                now = search_times_now(net, k, layers=(layer,)).get(layer)
                row = [int(k), *now] if now else [int(k), None, None]
            except (RuntimeError, MemoryError) as e:
                # cuDNN refused the shape, or its operands did not fit (CuPy's OutOfMemoryError
                # is a MemoryError): this k is priced by the curves, and the row says why
                row = [int(k), None, None, f"{type(e).__name__}: {e}"[:200]]
            rows.append(row)
            if net.mode == "GPU":       # the search's operands, out of CuPy's pool
                import cupy
                cupy.get_default_memory_pool().free_all_blocks()
            probe.ks.add(int(k))
            probe.seconds += time.perf_counter() - t0
        return row[1] if phase == "forward" else row[2]
    probe.ks = set()            # the ks searched through it, and the seconds that took
    probe.seconds = 0.0
    return probe


def settle_chunk_rules(seen, log=None) -> tuple:
    """``(rules, counts)`` for the profile's meta from :func:`chunk_rules_now` at each profiled
    k (``seen``: ``[(k, rules now), ...]``): a layer's rule where every k had the same one and
    its calls there were the rule's (``minicaffe.cudnn.ops.chunk_count``), else none (the
    model then prices its steps per image, as before chunk rules were recorded, and ``log``
    says why); and ``[[k, {layer: calls}], ...]`` where some layer made more than one call."""
    from minicaffe.cudnn.ops import chunk_count
    rules, bad = {}, set()
    for k, now in seen:
        for name, (limit, per, multiple, calls) in now.items():
            rule = [int(limit), int(per), int(multiple)]
            if rules.setdefault(name, rule) != rule or chunk_count(k, *rule) != calls:
                bad.add(name)
    everywhere = set.intersection(*(set(now) for _, now in seen)) if seen else set()
    for name in sorted(rules):
        if name in bad or name not in everywhere:
            del rules[name]
            if log is not None:
                log(f"Convolution {name!r}: its chunks of images were not the same rule at "
                    "every profiled minibatch; the model prices its steps per image")
    counts = [[k, {n: c[3] for n, c in now.items() if c[3] > 1}] for k, now in seen]
    return rules, [c for c in counts if c[1]]


# --------------------------------------------------------------- synthetic
def synthetic_profile(gmap: GMAP, ks, compute_model, pcie, *, noise: float = 0.0,
                      seed: int = 0, device: str = "synthetic", gap: float = 0.0,
                      update: float = 0.0) -> Profile:
    """A profile whose times come from a model instead of a device: step times from
    ``compute_model`` (eq. 2), one offload and one prefetch per feature map from ``pcie``
    (eq. 5), each multiplied by ``exp(noise * N(0, 1))``.  For tests, and for planning a device
    one has not profiled (``minicaffe plan`` without ``--profile``).

    gap: seconds between consecutive steps on the compute stream; update: seconds of the solver
    step after the last backward step (its tail).  Both are outside eq. (2): the iteration's
    overhead :class:`swap.model.IterationOverhead` fits ``(steps - 1) * gap + update``."""
    from .arena import align
    from .model import D2H, H2D
    rng = np.random.default_rng(seed)

    def jitter(x):
        return x * float(np.exp(noise * rng.standard_normal())) if noise else x

    compute, transfers, iters, solver_steps = [], [], [], []
    for k in ks:
        g = gmap.at(k)
        t = compute_model.step_times(g)
        start = 0.0
        for s, tj in zip(g.steps, t):
            tj = jitter(float(tj))
            if s.index:
                start += gap
            compute.append(ComputeSample(k, s.index, float(s.flops), tj, start))
            start += tj
        for b in g.feature_maps():
            nb = align(g.nbytes(b))
            name = g.buffers[b].name
            for kind, direction in (("offload", D2H), ("prefetch", H2D)):
                t_copy = jitter(pcie.seconds(nb, direction))
                transfers.append(TransferSample(k, kind, name, nb, t_copy))
        iters.append((k, start))
        solver_steps.append(SolverStepSample(k, start + update, 0.0, update))
    bw = {"h2d": pcie.h2d, "d2h": pcie.d2h, "both": pcie.both}
    return Profile(net=gmap.net_name, device=device, mode="model", k_base=gmap.k0,
                   ks=tuple(ks), steps=step_infos(gmap), compute=tuple(compute),
                   transfers=tuple(transfers), iterations=tuple(iters), bandwidth=bw,
                   date=_now(), meta={"synthetic": True, "noise": noise},
                   solver_steps=tuple(solver_steps))


# ------------------------------------------------------------- net resizing
def set_batch_size(net, k: int):
    """Resize ``net``'s minibatch to ``k`` in place (module doc) and reshape it.

    The net must not run under an executor (close it first)."""
    k = int(k)
    if k <= 0:
        raise ValueError(f"minibatch size must be positive, got {k}")
    if getattr(net, "executor", None) is not None:
        raise RuntimeError(f"net {net.name!r} runs under a memory plan: close its executor before "
                           "resizing it")
    old = net_batch_size(net)
    if old == k:
        return
    for li, layer in enumerate(net.layers):
        if net.bottom_vecs[li]:
            continue
        tops = net.top_vecs[li]
        if hasattr(layer, "set_batch_size"):
            layer.set_batch_size(k)
        elif layer.type in ("Input", "DummyData"):
            for t in tops:
                if t.ndim >= 1 and t.shape[0] == old:
                    t.reshape((k,) + tuple(t.shape[1:]))
            if layer.type == "DummyData":
                _refill_constant_tops(layer, tops)
        elif layer.type == "HDF5Data":
            layer.batch_size = k
        elif layer.type == "Data":
            _resize_data_layer(layer, k)
        elif hasattr(layer, "batch_size"):
            layer.batch_size = k
        else:
            raise ValueError(f"layer {net.layer_names[li]!r} ({layer.type}) makes the net's input "
                             "but minicaffe does not know how to change its batch size (known: "
                             "Input, DummyData, Data, HDF5Data, MemoryData, or any layer with "
                             "set_batch_size(k))")
    net.reshape()


def _refill_constant_tops(layer, tops):
    """DummyData fills its constant tops once, at setup: fill the resized ones again."""
    from minicaffe.fillers import fill
    for i in layer.persistent_tops(len(tops)):
        fill(tops[i], layer.fillers[layer._filler_index(i)], where=f"{layer.where}: ")


def _resize_data_layer(layer, k: int):
    """Caffe's DataLayer has no batch-size setter.  Stop its prefetch thread (the batches it
    read ahead have the old size), rewind to the first record not yet consumed, and start a new
    thread at the new size; the layer's state_dict/load_state_dict make the rewind exact."""
    import weakref

    from minicaffe.layers import data as data_mod
    resume = layer.state_dict()
    pf = getattr(layer, "_prefetcher", None)
    if pf is not None:
        if getattr(layer, "_finalizer", None) is not None:
            layer._finalizer.detach()
        if not pf.stop():
            raise RuntimeError(f"{layer.where}: the prefetch thread did not stop; cannot change "
                               "the batch size")
        layer._prefetcher = data_mod._Prefetcher(layer._loader, layer.prefetch_count, layer.where)
        layer._finalizer = weakref.finalize(layer, data_mod._shutdown, layer._prefetcher,
                                            layer._reader)
    layer.batch_size = k
    layer._loader.batch_size = k
    layer._top_shape = (k,) + tuple(layer._top_shape[1:])
    layer.load_state_dict(resume)


# -------------------------------------------------------------- bandwidth
def measure_bandwidth(xp, nbytes: int = 64 << 20, repeats: int = 5) -> dict | None:
    """Pinned copy bandwidth (bytes/s): host to device, device to host, and both at once (total).

    GPU only (None on the CPU, where copies are memcpy and synchronous).  Two non-blocking
    streams, timing events around ``repeats`` copies of ``nbytes``; the median is kept."""
    if getattr(xp, "__name__", "") != "cupy":
        return None
    cp = xp      # pragma: no cover - GPU machine only
    pinned_a = cp.cuda.alloc_pinned_memory(nbytes)
    pinned_b = cp.cuda.alloc_pinned_memory(nbytes)
    host_a = np.frombuffer(pinned_a, dtype=np.uint8, count=nbytes)
    host_b = np.frombuffer(pinned_b, dtype=np.uint8, count=nbytes)
    dev_a = cp.empty(nbytes, dtype=cp.uint8)
    dev_b = cp.empty(nbytes, dtype=cp.uint8)
    s_in = cp.cuda.Stream(non_blocking=True)
    s_out = cp.cuda.Stream(non_blocking=True)

    def timed(fn_list):
        times = []
        for _ in range(repeats):
            evs = []
            for fn, s in fn_list:
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(s)
                fn(s)
                e1.record(s)
                evs.append((e0, e1))
            for _, e1 in evs:
                e1.synchronize()
            # from the first start to the last end (the copies were issued back to back)
            t0 = evs[0][0]
            times.append(max(cp.cuda.get_elapsed_time(t0, e1) for _, e1 in evs) / 1e3)
        return float(np.median(times))

    def h2d(s):
        dev_a.set(host_a, stream=s)

    def d2h(s):
        dev_b.get(stream=s, out=host_b, blocking=False)

    t_in = timed([(h2d, s_in)])
    t_out = timed([(d2h, s_out)])
    t_both = timed([(h2d, s_in), (d2h, s_out)])
    return {"h2d": nbytes / t_in, "d2h": nbytes / t_out, "both": 2 * nbytes / t_both}


def device_name(net) -> str:
    if getattr(net, "mode", "CPU") == "GPU":   # pragma: no cover - GPU machine only
        import cupy
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    return f"CPU ({platform.processor() or platform.machine()}, NumPy {np.__version__})"


# ------------------------------------------------------------- instrument
def head_start_seconds(host_pass: float, factor: float = COPY_CALIBRATION_HEAD_START,
                       cap: float = COPY_CALIBRATION_HEAD_START_CAP) -> float:
    """Seconds of device-side wait ahead of a timed pass, where the host has issued a pass
    in ``host_pass`` seconds at least: ``factor`` times that, at most ``cap``; 0 before any
    pass.

    Why a wait: a step is timed by CUDA events around its kernels, so where the host issues
    them more slowly than the device runs them the step's time is the host's.  Behind the
    wait the host queues the pass while the device is busy, and the device then runs it back
    to back (:mod:`scripts.gpu_idle` times its units the same way).  CUDA's launch queue is
    finite (about a thousand launches): beyond it the host blocks until the device frees a
    slot, and stays that far ahead.  The timed pass's hooks cost the host more than the
    pass before it took (a warm-up runs without them), hence a factor over 1."""
    if host_pass <= 0:
        return 0.0
    return float(min(cap, factor * host_pass))


class _Instrument:
    """Timing hooks on one executor for the duration of a profile (module doc).

    ``head_start``: each recorded pass on the GPU starts behind a device-side wait of
    :func:`head_start_seconds` of the host's least time to issue a pass so far (the copy
    calibration's kept run); ``head_starts`` and ``host_passes`` list, per recorded pass,
    the wait and the host's time to issue it."""

    def __init__(self, executor, k: int, head_start: bool = False):
        self.ex = executor
        self.head_start = head_start
        self.head_starts: list = []
        self.host_passes: list = []
        self._host_pass = 0.0
        self.net = executor.net
        self.g = executor.gmap
        self.k = k
        self.gpu = executor.streams.gpu
        self.recording = False
        self.compute: list = []
        self.transfers: list = []
        self.iterations: list = []
        self.solver_steps: list = []
        self._in_step = False       # between begin_step and end_step of a recorded iteration
        self._passed = False        # that step ran its full forward and backward pass
        self._pass_end = 0.0        # CPU: seconds from the pass's start to its end
        self._ev_end = None         # GPU: the pass's end on the compute stream
        self._ev_step = None        # GPU: the solver step's start
        self._t_step = 0.0
        self._j = 0
        self._cur = None
        self._t0 = 0.0
        self._pending = []          # GPU: (kind, payload, e0, e1) read after the iteration
        self._ev0 = None
        if self.gpu:                # pragma: no cover - GPU machine only
            self.cp = executor.streams.cp
        self._install()

    # ---- hooks
    def _install(self):
        net, ex = self.net, self.ex
        self._orig_fwd = net.forward_layer
        self._orig_bwd = net.backward_layer
        self._orig_run = ex._run
        self._orig_issue = dict(ex._issue)
        self._orig_copy = ex.streams.copy
        net.forward_layer = self._wrap_layer(self._orig_fwd, FORWARD)
        net.backward_layer = self._wrap_layer(self._orig_bwd, BACKWARD)
        ex._run = self._run
        for kind in (OFFLOAD, PREFETCH):        # the transfers: timed (the executor's tables
            ex._issue[kind] = self._wrap_transfer(self._orig_issue[kind])   # call these)
        ex._build_issue_tables()
        ex.streams.copy = self._copy

    def remove(self):
        for obj, name in ((self.net, "forward_layer"), (self.net, "backward_layer"),
                          (self.ex, "_run"), (self.ex.streams, "copy")):
            obj.__dict__.pop(name, None)
        self.ex._issue.update(self._orig_issue)
        self.ex._build_issue_tables()

    def _now(self):
        return time.perf_counter() - self._t0

    def _event(self, stream=None):   # pragma: no cover - GPU machine only
        e = self.cp.cuda.Event()
        e.record(stream)
        return e

    def _run(self, last_step):
        full = last_step == self.g.n_steps - 1
        rec = self.recording and full
        self._j = 0
        self._active = rec
        wait = head_start_seconds(self._host_pass) if self.head_start and rec else 0.0
        if wait > 0 and self.gpu:    # pragma: no cover - GPU machine only
            device_wait(self.cp, wait)
        self._t0 = time.perf_counter()
        if rec and self.gpu:         # pragma: no cover - GPU machine only
            self._ev0 = self._event()
        try:
            return self._orig_run(last_step)
        finally:
            host = time.perf_counter() - self._t0
            # the least so far: behind a wait the host blocks once CUDA's launch queue is
            # full, and then takes the device's time (ResNet-152 at 49, H200: 643.5 ms
            # behind a wait of 533.6, against 80 to 90 ms to issue a pass unblocked)
            self._host_pass = min(self._host_pass, host) if self._host_pass > 0 else host
            if rec and self.head_start:
                self.head_starts.append(wait if self.gpu else 0.0)
                self.host_passes.append(host)
            if rec:
                self._end_pass()
                if not self._in_step:       # no solver-step marks: read the pass now
                    self._finish_iteration()
            self._active = False

    def _end_pass(self):
        """The forward and backward pass has been issued: mark its end on the compute stream."""
        if self.gpu:                 # pragma: no cover - GPU machine only
            self._ev_end = self._event()
        else:
            self._pass_end = self._now()
        self._passed = True

    # ---- the solver step around the pass (profile_solver calls these)
    def begin_step(self):
        """Before ``Solver.step(1)`` of a recorded iteration: the step starts on an idle device
        (the previous iteration's kernels and copies finished, as in a timed step), so what it
        does before its forward pass is timed without them."""
        if not self.recording:
            return
        if self.gpu:                 # pragma: no cover - GPU machine only
            self.ex.streams.synchronize()    # sync: the step starts with all streams idle
            self._ev_step = self._event()
        self._t_step = time.perf_counter()
        self._in_step = True
        self._passed = False

    def end_step(self):
        """After ``Solver.step(1)``: read the iteration (one sync on the GPU) and record its
        :class:`SolverStepSample`."""
        if not self._in_step:
            return
        self._in_step = False
        if not self._passed:         # the step ran no full pass under this executor
            return
        if self.gpu:                 # pragma: no cover - GPU machine only
            self._finish_iteration(step_end=self._event())
            return
        t1 = time.perf_counter()
        self._finish_iteration()
        self.solver_steps.append(SolverStepSample(
            self.k, t1 - self._t_step, self._t0 - self._t_step, t1 - self._t0 - self._pass_end))

    def _wrap_layer(self, fn, phase):
        def timed(li):
            if not getattr(self, "_active", False):
                return fn(li)
            j = self._j
            self._j += 1
            if self.gpu:             # pragma: no cover - GPU machine only
                e0 = self._event()
                h = time.perf_counter()
                out = fn(li)
                h = time.perf_counter() - h
                e1 = self._event()
                self._pending.append(("compute", (j, h), e0, e1))
                return out
            a = self._now()
            out = fn(li)
            t = self._now() - a
            self.compute.append(ComputeSample(self.k, j, float(self.g.steps[j].flops), t, a, t))
            return out
        return timed

    def _wrap_transfer(self, issue):
        """An offload's or prefetch's issue method, timed while profiling (GPU: its copy is
        timed by events, see _copy)."""
        def timed(i):
            if not getattr(self, "_active", False):
                return issue(i)
            op = self.ex.plan.ops[i]
            self._cur = i
            try:
                if self.gpu:             # pragma: no cover - GPU machine only
                    return issue(i)
                a = self._now()
                out = issue(i)
                self._record_transfer(op, a, self._now() - a)
                return out
            finally:
                self._cur = None
        return timed

    def _copy(self, dst, src, stream):
        if not (self.gpu and self._cur is not None):
            return self._orig_copy(dst, src, stream)
        s = self.ex.streams.streams[stream]  # pragma: no cover - GPU machine only
        e0 = self._event(s)
        out = self._orig_copy(dst, src, stream)
        e1 = self._event(s)
        self._pending.append(("transfer", self._cur, e0, e1))
        return out

    def _record_transfer(self, op, start, seconds, concurrent=False):
        kind = "offload" if op.kind == OFFLOAD else "prefetch"
        self.transfers.append(TransferSample(self.k, kind, self.g.buffers[op.buffer].name,
                                             int(op.nbytes), float(seconds), float(start),
                                             bool(concurrent)))

    def _finish_iteration(self, step_end=None):
        """Read the recorded pass: its time, its compute and transfer samples (GPU: after one
        synchronization), and with ``step_end`` (the solver step's end event) its step."""
        if not self.gpu:
            self.iterations.append((self.k, self._pass_end))
            return
        cp = self.cp                  # pragma: no cover - GPU machine only
        end = self._ev_end
        self.ex.streams.synchronize()     # one sync per profiled iteration (all three streams)
        el = cp.cuda.get_elapsed_time
        if step_end is not None:
            step_end.synchronize()        # the current stream: done with the streams' sync
            self.solver_steps.append(SolverStepSample(
                self.k, el(self._ev_step, step_end) / 1e3, el(self._ev_step, self._ev0) / 1e3,
                el(end, step_end) / 1e3))
        spans = []
        for kind, x, e0, e1 in self._pending:
            a, b = el(self._ev0, e0) / 1e3, el(self._ev0, e1) / 1e3
            spans.append((kind, x, a, b))
        self._pending = []
        copies = [(self.ex.plan.ops[x], a, b) for kind, x, a, b in spans if kind == "transfer"]
        for kind, x, a, b in spans:
            if kind == "compute":
                j, h = x
                self.compute.append(ComputeSample(self.k, j, float(self.g.steps[j].flops),
                                                  b - a, a, h))
        for op, a, b in copies:
            other = SWAP_OUT if op.stream == SWAP_IN else SWAP_IN
            overlap = sum(max(0.0, min(b, b2) - max(a, a2)) for op2, a2, b2 in copies
                          if op2.stream == other)
            self._record_transfer(op, a, b - a, concurrent=overlap > 0.5 * (b - a))
        self.iterations.append((self.k, el(self._ev0, end) / 1e3))


# ---------------------------------------------------------------- scratch
def scratch_estimate(gmap: GMAP):
    """``k -> bytes``: a conservative guess of the transient allocations (CuPy temporaries)
    at minibatch k before any is measured: the most batch-scaled bytes one step touches (its
    declared scratch, the internals with ``saved=False`` that scale with ``min(k, cap)``,
    included).  Layer temporaries are chunks of what the layer reads and writes (im2col and
    top-diff chunks, BatchNorm/Scale temporaries linear in k).  On the H200, ResNet-50 CAFFE
    engine at k = 122: 1.10 GiB estimated, 938 MiB measured."""
    steps = []
    for s in gmap.steps:
        steps.append([gmap.buffers[b] for b in s.touches if gmap.buffers[b].size.scaled])

    def estimate(k: int) -> int:
        return max((sum(b.nbytes(int(k)) for b in bs) for bs in steps), default=0)
    return estimate


class ScratchModel:
    """S(k): the scratch reserve planned at minibatch k (Algorithm 2's M_ws).

    Before any measurement: ``estimate(k)`` (:func:`scratch_estimate`).  Once transient peaks
    have been measured (:meth:`add`; the profiler's dry runs), the line ``a + b k`` above every
    measured point, with the slope of a least-squares fit (one point: through the origin):
    conservative for larger k, where per-layer chunks stop growing at their cap.  Then
    ``margin`` of it plus ``slack`` bytes plus ``extra`` bytes, and at least ``floor``
    (``$MINICAFFE_SCRATCH``).

    ``extra``: bytes that the training loop allocates through CuPy beside the layers'
    transients, which a profile taken without it did not measure: an NCCL worker's flat
    gradient buffers (``ps.cli.worker_device_bytes``; on 4 H200s a ResNet-152 worker planned
    from a single-GPU profile stopped at its dry run with 461 MiB of such transients against a
    64 MiB reserve, issue 6, 2026-11-22)."""

    def __init__(self, estimate=None, *, margin: float = 0.10, slack: int = 64 << 20,
                 floor: int = 0, extra: int = 0):
        self.estimate = estimate if estimate is not None else (lambda k: 0)
        self.margin = float(margin)
        self.slack = int(slack)
        self.floor = int(floor or 0)
        self.extra = int(extra or 0)
        self.points: dict = {}

    @classmethod
    def from_gmap(cls, gmap: GMAP, **kw) -> "ScratchModel":
        return cls(scratch_estimate(gmap), **kw)

    @classmethod
    def from_profile(cls, profile, **kw) -> "ScratchModel | None":
        """The model of the transients ``profile`` measured (``meta["transients"]``), None
        where it measured none: what ``minicaffe plan`` reserves from a profile."""
        points = (profile.meta or {}).get("transients") if profile is not None else None
        if not points:
            return None
        model = cls(**kw)
        for k, peak in points:
            model.add(k, peak)
        return model

    def add(self, k: int, peak: int):
        """A measured transient peak (bytes) at minibatch k."""
        k, peak = int(k), int(peak)
        self.points[k] = max(self.points.get(k, 0), peak)

    @property
    def measured(self) -> bool:
        return bool(self.points)

    def fit(self) -> tuple | None:
        """(a, b) of the line above the measured points, None before any."""
        if not self.points:
            return None
        ks = np.array(sorted(self.points), dtype=np.float64)
        ys = np.array([self.points[int(k)] for k in ks], dtype=np.float64)
        if len(ks) == 1:
            b = ys[0] / ks[0]
        else:
            b = max(0.0, float(np.polyfit(ks, ys, 1)[0]))
        a = max(0.0, float(np.max(ys - b * ks)))
        return a, float(b)

    def expected(self, k: int) -> int:
        """The transient bytes the model predicts at k: the least-squares line through the
        measured peaks (one point: through the origin), before any margin; the estimate
        before any measurement.  This is the prediction that eq. (4) plus S(k) is checked
        with; :meth:`need` is the line above every point, what the reserve must hold.  On the
        H200 profiles (issue 5, 2026-11-21) it predicts the measured peak at k* within 1.9 %
        of the total where the upper line was 2 to 5 % high (``scripts/model_overhead.py``)."""
        if not self.points:
            return int(self.estimate(int(k)))
        ks = np.array(sorted(self.points), dtype=np.float64)
        ys = np.array([self.points[int(x)] for x in ks], dtype=np.float64)
        if len(ks) == 1:
            return int(math.ceil(ys[0] / ks[0] * int(k)))
        b, a = np.polyfit(ks, ys, 1)
        return int(max(0.0, math.ceil(a + b * int(k))))

    def need(self, k: int) -> int:
        """Transient bytes the reserve must hold at k (the line above every measured
        point, before the margin)."""
        f = self.fit()
        if f is None:
            return int(self.estimate(int(k)))
        return int(math.ceil(f[0] + f[1] * int(k)))

    def __call__(self, k: int) -> int:
        from .arena import align
        return align(max(self.floor, int(self.need(k) * (1 + self.margin)) + self.slack
                         + self.extra))

    def describe(self) -> str:
        from .memory import fmt_bytes
        f = self.fit()
        if f is None:
            base = "estimated from the declared scratch"
        else:
            base = (f"{fmt_bytes(int(f[0]))} + {fmt_bytes(int(f[1]))} x k fitted to the "
                    f"transients measured at k = {', '.join(map(str, sorted(self.points)))}")
        return (base + f", plus {100 * self.margin:g}% and {fmt_bytes(self.slack)}"
                + (f", plus {fmt_bytes(self.extra)} for the training loop's own buffers"
                   if self.extra else "")
                + (f", at least {fmt_bytes(self.floor)}" if self.floor else ""))


def max_batch_scratch(gmap: GMAP, budget: int, scratch=None, strategy: str = "naive",
                      k_limit: int = 1 << 20, host_budget: int | None = None,
                      test_dynamic: int = 0) -> int:
    """The largest k whose ``strategy`` plan fits ``budget - scratch(k)`` (0 if not even
    k = 1); scratch None: :func:`swap.plan.max_batch` on the whole budget.  test_dynamic:
    the test nets' per-pass bytes, which the plan's resident regions leave room for
    (:func:`swap.plan.arena_need`).

    host_budget: bytes of pinned host memory the plan's offloaded buffers may take (None: no
    bound).  The paper's k_max is bounded by the GPU alone; on a GPU with a small per-image
    footprint under a 12 GB budget, naive swapping at that k would pin more than the host has
    (ResNet-152: about 0.24 GiB per image), so k is bounded by both."""
    from .plan import largest_k, max_batch, plan_bytes_at
    if host_budget is not None:
        k_limit = min(k_limit, largest_k(
            lambda k: plan_bytes_at(gmap, strategy, k)[1] <= host_budget, k_limit))
        if k_limit < 1:
            return 0
    if scratch is None:
        return max_batch(gmap, strategy, budget, k_limit=k_limit, test_dynamic=test_dynamic)
    return largest_k(lambda k: plan_bytes_at(gmap, strategy, k, test_dynamic=test_dynamic)[0]
                     <= budget - scratch(k), k_limit)


ENV_HOST_BUDGET = "MINICAFFE_HOST_BUDGET"


def default_host_budget() -> int | None:
    """Pinned host memory the swap plans may take: ``$MINICAFFE_HOST_BUDGET`` (bytes, 64G ...)
    if set, else half of the machine's physical memory (None where it cannot be read)."""
    import os
    v = os.environ.get(ENV_HOST_BUDGET, "").strip()
    if v:
        from .memory import parse_bytes
        return parse_bytes(v)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return None


# ---------------------------------------------------------------- profile
# retries of one profile point whose transients outgrow its scratch reserve
PROFILE_RETRIES = 3


def _recorded_steps(inst, solver, warmup: int, iterations: int):
    """``warmup + iterations`` training iterations under ``inst``, the last ``iterations``
    recorded."""
    for it in range(warmup + iterations):
        inst.recording = it >= warmup
        inst.begin_step()
        solver.step(1)
        inst.end_step()


def _host_iteration_times(ex, solver, n: int) -> list:
    """Host seconds of ``n`` whole training iterations, ``perf_counter`` around
    ``Solver.step(1)`` with no timing hooks installed, each begun on an idle device."""
    out = []
    for _ in range(n):
        if ex.streams.gpu:           # pragma: no cover - GPU machine only
            ex.streams.synchronize()
        t = time.perf_counter()
        solver.step(1)
        out.append(time.perf_counter() - t)
    return out


def _install_plain(solver, budget, scratch=None):
    """The plan "none" with the convolutions lowered as the swap plans lower them (chunks of
    images, not Caffe's one image): the host's per-step work of the dynamic plan."""
    from .runtime import install
    return install(solver, "none", budget, scratch=scratch, lowering="chunked")


def _smaller_fit(e: BudgetError, k: int) -> int | None:
    """The largest k below ``k`` that a BudgetError says fits, or None."""
    return e.max_k if e.max_k is not None and 1 <= e.max_k < k else None


def _install_plain_fitting(solver, budget, k, scratch, done, log):
    """(executor, k) of :func:`_install_plain` at minibatch ``k``, or where nothing swapped
    does not fit the budget there, at the largest k that fits (once, unless ``done`` has it);
    (None, k) when neither can be installed."""
    for _ in range(2):
        set_batch_size(solver.net, k)
        try:
            return _install_plain(solver, budget, scratch(k) if scratch is not None else None), k
        except BudgetError as e:
            fits = _smaller_fit(e, k)
            if log is not None:
                log(f"Host issue time at minibatch {k}: the plan none does not fit the "
                    f"budget" + (f"; minibatch {fits} instead" if fits else ""))
            if fits is None or fits in done:
                return None, k
            k = fits
    return None, k


def _install_naive(solver, budget, strategy="naive", scratch=None, **kw):
    """Install ``strategy`` for profiling (``kw``: more of :func:`swap.runtime.install`'s)."""
    from .runtime import install
    if scratch is None:
        return install(solver, strategy, budget, **kw)
    return install(solver, strategy, budget, scratch=scratch, **kw)


# the host's issue time is profiled at these fractions of the smallest profiled k (module doc)
HOST_FRACTIONS = (1 / 16, 1 / 8, 1 / 4)


def host_issue_ks(k_min: int, fractions=HOST_FRACTIONS) -> tuple:
    """The small minibatches at which :func:`profile_host_issue` times the host: ``fractions``
    of ``k_min`` (the smallest k of the compute profile), rounded down, at least 1, distinct."""
    return tuple(sorted({max(1, int(k_min * f)) for f in fractions}))


def profile_host_issue(solver, budget: int, ks, *, warmup: int = 2, iterations: int = 3,
                       scratch: ScratchModel | None = None, log=None) -> tuple:
    """The host's time to issue each step, at small minibatches ``ks`` under the plan "none".

    The compute profile's host times are taken under the naive plan, whose iterations are
    transfer-bound: the host runs hundreds of launches ahead of the device, a launch into the
    full queue blocks until the device retires one, and a step's host time holds the device's
    time (:class:`swap.model.HostModel`).  At a small k with nothing swapped the device is
    done with each step before the host has issued the next, the queue never fills, and
    ``perf_counter`` around a step is what the host itself costs: Python, the layer's code,
    the launches (one per column chunk in a chunked convolution).  Each k runs ``warmup +
    iterations`` real training iterations (they count in ``solver.iter``), as the compute
    profile's do.  A k whose scratch reserve overflows is skipped with a log line: the host
    model then rests on the others (or on the compute profile's host times, where none is
    left).

    Each k then runs ``iterations`` more iterations with the hooks removed, timed whole on
    the host (:func:`_host_iteration_times`): ``"whole"`` in the sums, the host's time for
    everything an iteration issues (the steps, the executor's work between them, the solver
    update), which :class:`swap.model.HostModel` takes as the host bound where it has it.
    Both estimates move with the host's speed over time: ResNet-152 (CUDNN, H200,
    2026-11-28) gave hooked sums of 110.9-161.3 ms at k = 3-9 in one process and 67.8-108.7 ms
    in another, with whole iterations of 70.3-90.8 ms at the same k in the second.

    Returns ``(samples, runs, meta)``: the :class:`ComputeSample` of every measured step (its
    ``time`` holds the host's launch gaps at these k, so it is not a compute sample), the
    ``[k, iterations run]`` of each k, and per k the mean sums of the host and event times
    and the median host time of a whole iteration without the hooks.
    """
    from .runtime import ScratchOverflow
    samples, runs, sums = [], [], []
    done = set()
    for k in ks:
        ex, k = _install_plain_fitting(solver, budget, k, scratch, done, log)
        if ex is None:
            continue
        done.add(k)
        it0 = solver.iter
        inst = _Instrument(ex, k)
        try:
            _recorded_steps(inst, solver, warmup, iterations)
            inst.remove()
            whole = _host_iteration_times(ex, solver, iterations)
        except ScratchOverflow as e:
            if log is not None:
                log(f"Host issue time at minibatch {k} not profiled: {e}")
            continue
        finally:
            inst.remove()
            ex.close()
            runs.append([k, solver.iter - it0])
        samples += inst.compute
        n = max(1, sum(1 for c in inst.compute if c.step == 0))
        host = sum(c.host for c in inst.compute) / n
        dev = sum(c.time for c in inst.compute) / n
        sums.append({"k": k, "host": host, "events": dev, "whole": float(np.median(whole))})
        if log is not None:
            log(f"Host issue time at minibatch {k} (plan none): {1e3 * host:.3f} ms per "
                f"iteration for the steps ({1e3 * dev:.3f} ms between their events); "
                f"{1e3 * sums[-1]['whole']:.3f} ms on the host for a whole iteration without "
                f"the timing hooks")
    return samples, runs, {"host_ks": [s["k"] for s in sums], "host_sums": sums}


def host_whole_now(solver, budget: int, k: int, *, warmup: int = 2, iterations: int = 3,
                   scratch: ScratchModel | None = None) -> tuple:
    """The host's seconds for a whole iteration of the plan "none" at ``k``, timed now as
    :func:`profile_host_issue` times it (``warmup`` iterations, then the median of
    ``iterations`` timed whole without hooks): the host bound measured again beside a later
    measurement.  Returns ``(seconds, training iterations run)``; seconds is None where that
    plan does not fit ``budget`` at ``k``.  The net is left at ``k`` with no executor."""
    ex, kk = _install_plain_fitting(solver, budget, k, scratch, set(), None)
    if ex is None or kk != k:
        if ex is not None:
            ex.close()
        return None, 0
    it0 = solver.iter
    try:
        for _ in range(warmup):
            solver.step(1)
        whole = _host_iteration_times(ex, solver, iterations)
    finally:
        ex.close()
    return float(np.median(whole)), solver.iter - it0


# a calibration that swap.model.copy_slowdown_fit finds disturbed (the host slowed down between
# the naive run and the kept one: ResNet-152 at 49, H200, session 28, kept 178.5 ms against
# 136.2 in the session's other run) runs again this many times
COPY_CALIBRATION_RETRIES = 1

# copy_calibration_ks: the calibration's k is one whose naive steps take at least this many
# times the host's time to issue an iteration (swap.model.COPY_CALIBRATION_HOST_MARGIN, per step).
# At 2.0, ResNet-34 calibrated at 41 (H200, session 40: naive steps 30.6 ms, 2.1x the host's
# least 14.5 ms; the instrumented passes took the host 90 ms): its steps beside the naive plan's
# copies ran 15 to 70 % slower than kept, the fit made a prefetch cost 23 % of the compute beside
# it, and the model under-predicted k* = 384 by 5.9 % and 401 by 8.8 %; with 4 % (the fits at
# larger k) the same profile's steps come to +1.6 / -1.2 % of the measured iterations.  Session
# 32's ResNet-34 at 75 (2.04x): 11.5 %.  Of the 48 saved calibrations those two are the only fits
# over 7 %; the 21 at 2.5x and over fitted 0 to 5.3 %
# (docs/results/tuner_s40/calibrations.py).  Where no naive k reaches the margin (ResNet-101 and
# -152 at 12 GiB: their smallest at 1.5-2.0x) the smallest is taken, as before.
COPY_CALIBRATION_DEVICE_MARGIN = 3.0


def copy_calibration_ks(compute, naive_ks, host_sums=()) -> list:
    """The minibatches to try the copy calibration at, in order.

    With every map kept the device has no copy to wait for, so at a k whose steps take the
    device not much longer than the host takes to issue them, the kept steps run at the
    host's pace and say nothing about the copies (GoogLeNet at 76 on an H200, session 26: the
    kept steps 19.6 % slower than the naive ones).  So: the smallest naive k whose naive steps
    (``compute``'s samples at that k, per iteration) take at least
    :data:`COPY_CALIBRATION_DEVICE_MARGIN` times the least host issue time of ``host_sums``
    (:func:`profile_host_issue`'s), then the smallest naive k (every map kept may not fit at
    the larger one); the smallest alone where no host time was profiled or none qualifies."""
    smallest = min(naive_ks)
    host = min((float(s["host"]) for s in host_sums), default=0.0)
    if host <= 0.0:
        return [smallest]
    for k in sorted(set(naive_ks)):
        at_k = [c for c in compute if c.k == k]
        n = max(1, sum(1 for c in at_k if c.step == 0))
        if sum(c.time for c in at_k) / n >= COPY_CALIBRATION_DEVICE_MARGIN * host:
            return [k] if k == smallest else [k, smallest]
    return [smallest]


# low_profile_k: the device's time per iteration at least this many times the host's
LOW_K_MARGIN = 1.5


def low_profile_k(compute, done, host_sums, margin: float = LOW_K_MARGIN,
                  covered: float = PROFILE_COVERED) -> int | None:
    """A k to profile below the smallest profiled one, or None: the smallest k whose device
    time per iteration is at least ``margin`` times the host's least time to issue one
    (``host_sums``' ``"whole"``, else ``"host"``, :func:`profile_host_issue`), with the
    device's time per image that of the smallest profiled k (``compute``'s samples there, per
    iteration), where that k lies below ``(1 - covered)`` times the smallest; None without
    host sums.

    Why: the fractions of k_max start at k_max / 8, and Caffe's k and the points between it
    and k* often lie below that (ResNet-152 at 12 GiB: 49; k_none 16, the middle point 43),
    where the model extends its first segment.  Measured on the H200 (session 28): every map
    kept took 2.78 ms per image at 49 and 2.77 at 43, the extended segment 3.3 % more at 43,
    and the model missed 43 by +5.0 % (ResNet-50 at 36: +6.1 %).  Above ``margin`` the host
    runs ahead of the device and the steps' times are the device's."""
    sums = [float(s.get("whole") or s.get("host") or 0.0) for s in host_sums]
    sums = [h for h in sums if h > 0]
    if not sums or not done:
        return None
    k0 = min(done)
    at = [c for c in compute if c.k == k0]
    n = sum(1 for c in at if c.step == 0)
    if not at or n == 0:
        return None
    per_image = sum(c.time for c in at) / n / k0
    if per_image <= 0:
        return None
    k = int(math.ceil(margin * min(sums) / per_image))
    if k < 2 or k >= (1.0 - covered) * k0:
        return None
    return k


def _calibration_disturbed(profile, cal) -> bool:
    """Whether :func:`swap.model.copy_slowdown_fit` finds the calibration ``cal`` disturbed
    against ``profile``'s naive samples; never on the CPU, where the model uses none."""
    if profile.mode != "GPU":
        return False
    from .model import copy_slowdown_fit
    return copy_slowdown_fit(profile, cal)[1] == "disturbed"


def calibrate_copy_cost(solver, budget: int, k: int, warmup: int = 1, iterations: int = 1, *,
                        scratch: ScratchModel | None = None, log=None) -> tuple:
    """Each step's time at ``k`` with every feature map kept (the plan "dynamic" with all of
    them pinned: no copies), timed as the profile times its steps (the median of at least
    :data:`COPY_CALIBRATION_ITERATIONS` recorded iterations), for
    :func:`swap.model.copy_slowdown`: ``({"k", "kept": [seconds per step], "iterations",
    "head_start": [seconds], "host_pass": [seconds]}, training iterations run)``.  The
    calibration is None (and a log line says why) where that plan does not fit ``budget`` or
    fails: the model then treats copies as free to compute, as before.  Its iterations train
    and are counted either way.

    On the GPU each recorded pass starts behind a device-side wait (:func:`head_start_seconds`
    of the host's least time to issue a pass so far; ``"head_start"``, with the host's time to
    issue each timed pass in ``"host_pass"``): with no copy to wait for, the device would
    otherwise catch up with the host and time the host's pace at the steps it issues slowly,
    where the naive plan's copies keep the host ahead.  ResNet-152 at 49 (H200, session 30):
    without the wait its kept steps took 160 and 186 ms, more than the naive plan's 142.5 ms
    beside its copies (no fit: "disturbed"); behind it, 135.7 ms, and the fit is 4.0 % beside
    an offload and 4.0 % beside a prefetch."""
    net = solver.net
    set_batch_size(net, k)
    reserve = scratch(k) if scratch is not None else None
    try:
        ex = _install_naive(solver, budget, "dynamic", reserve, pinned="all")
    except BudgetError as e:
        if log is not None:
            log(f"Copy calibration skipped: every feature map kept at minibatch {k} does not "
                f"fit the budget ({str(e)[:120]})")
        return None, 0
    inst = _Instrument(ex, k, head_start=True)
    it0 = solver.iter
    recorded = max(iterations, COPY_CALIBRATION_ITERATIONS)
    try:
        _recorded_steps(inst, solver, warmup, recorded)
    except Exception as e:              # the profile stands without it
        if log is not None:
            log(f"Copy calibration at minibatch {k} failed: {type(e).__name__}: {str(e)[:160]}")
        return None, solver.iter - it0
    finally:
        inst.remove()
        ex.close()
    n = len(ex.gmap.steps)
    per_step = [[] for _ in range(n)]
    for c in inst.compute:
        per_step[c.step].append(c.time)
    kept = np.array([float(np.median(v)) if v else np.nan for v in per_step])
    waits = [float(w) for w in inst.head_starts]
    hosts = [float(h) for h in inst.host_passes]
    if log is not None:
        ahead = ""
        if any(w > 0 for w in waits):
            ahead = (f", each pass behind a device wait of {1e3 * float(np.median(waits)):.1f} "
                     f"ms; the host issued it in {1e3 * float(np.median(hosts)):.1f} ms")
        log(f"Copy calibration: minibatch {k} with every feature map kept, "
            f"{1e3 * float(np.nansum(kept)):.3f} ms of steps per iteration{ahead}")
    return ({"k": int(k), "kept": [float(x) for x in kept], "iterations": int(recorded),
             "head_start": waits, "host_pass": hosts}, solver.iter - it0)


def profile_solver(solver, budget: int, ks, *, warmup: int = 1, iterations: int = 1,
                   strategy: str = "naive", bandwidth: bool | None = None,
                   log=None, scratch: ScratchModel | None = None,
                   plan_budget: int | None = None, fractions=None,
                   host_budget: int | None = None, host_ks="auto",
                   fit_none: bool = False, calibrate_copies: bool | None = None,
                   low_k: bool | None = None) -> Profile:
    """Profile real training iterations of ``solver`` at every k of ``ks`` (module doc).

    Each k runs ``warmup + iterations`` iterations of ``solver.step(1)`` under ``strategy``
    within ``budget`` bytes; the net is left at the last k, with no executor installed.
    bandwidth: run :func:`measure_bandwidth` (default: in GPU mode only).

    scratch: a :class:`ScratchModel`: each k is installed with a scratch reserve of
    ``scratch(k)`` and the transients its dry run measures are added to the model.  A
    :class:`swap.runtime.ScratchOverflow` adds what it measured and retries that k with the
    reserve it names, up to :data:`PROFILE_RETRIES` times, 25 % more at each further retry (a
    second overflow at the same k means the reserve held the bytes but not in one piece); with
    ``fractions`` (the automatic minibatch), k_max is then computed again
    (:func:`max_batch_scratch` on ``plan_budget``, the budget less the test nets) and the ks
    still to profile become every ``profile_ks(k_max, fractions)`` that no k profiled so far
    covers (:data:`PROFILE_COVERED`), so the profile has every fraction of the final k_max.
    ``meta`` records the ks, reserves, measured transients and iterations run.

    host_ks: the small minibatches of :func:`profile_host_issue` after the compute profile
    ("auto": :func:`host_issue_ks` of the smallest profiled k, in GPU mode only, where the host
    and the device run apart; None or (): none); their iterations are in ``meta["host_runs"]``
    and the net is left at the compute profile's last k.

    fit_none: a k below the largest (k_max, or the largest of ``ks`` without fractions) at
    which every feature map fits the budget pinned is profiled that way (the plan "dynamic"
    with all of them pinned: nothing swapped, memory laid out as the swapping plans lay it
    out) instead of under ``strategy``: there the tuner's plan offloads nothing and runs
    just so, and the naive plan's copies slow the compute it times.  GoogLeNet on the H200
    (session 13): 1x1 convolutions at 154 images took 1.6 times their time per image at 309
    under the naive plan, and the model over-predicted "none" at 180 by 7.8 %.  The largest
    k is always profiled under ``strategy``, so the transfers the PCIe model is fitted on
    are always there.  ``meta["plans"]`` says which plan each k ran under ("pinned" or
    ``strategy``).

    low_k (None: in GPU mode): after the host's issue times, one more k under ``strategy``
    where :func:`low_profile_k` finds one (the smallest k at which the device sets the pace,
    where it lies below the smallest profiled k by more than :data:`PROFILE_COVERED`); it
    comes last in ``ks``, and the net is left at the k profiled before it.

    calibrate_copies (None: ``$MINICAFFE_COPY_CALIBRATION``, "0" off, "1" on; unset: in GPU
    mode): after the host's issue times, a k profiled under ``strategy`` runs again with every
    feature map kept (no copies), where that fits the budget, with the same per-step timing
    (:func:`calibrate_copy_cost`; the k of :func:`copy_calibration_ks`: the smallest at which
    the device, not the host, sets the pace, else the smallest): ``meta["copy_calibration"]``,
    from which :func:`swap.model.copy_slowdown` fits how much the copies slow the compute
    beside them; its training iterations are in ``meta["copy_runs"]`` ([k, iterations] per k
    tried).  A calibration the model would find disturbed (the host slowed down between the
    naive run and the kept one) runs again, :data:`COPY_CALIBRATION_RETRIES` times at most.
    """
    from .runtime import ScratchOverflow
    net = solver.net
    k_base = net_batch_size(net)
    if getattr(net, "executor", None) is not None:
        net.executor.close()
    compute, transfers, iters, solver_steps = [], [], [], []
    steps = layout = None
    g0 = None
    reserves, measured, runs, plans = [], [], [], []
    chunk_seen = []         # (k, chunk_rules_now) at each profiled k
    searched: dict = {}     # search_times_now at each profiled k: {layer: [[k, fwd, bwd], ...]}
    k_max = None
    t_dyn = 0               # the test nets' per-pass bytes (runtime.test_dynamic_bytes)
    todo = list(ks)
    done = []

    def say(msg):
        if log is not None:
            log(msg)

    def slots(km):
        """The ks still to profile at k_max ``km``: every fraction of it that no k profiled
        so far covers.  A profiled k covers a fraction's k where it lies within
        :data:`PROFILE_COVERED` of it and nearer than half the way to the next fraction's k."""
        want = profile_ks(km, fractions)

        def reach(k):
            gap = min((abs(k - o) for o in want if o != k), default=k)
            return min(PROFILE_COVERED * k, gap / 2)
        return [k for k in want if not any(abs(k - d) <= reach(k) for d in done)]

    def new_k_max(why) -> bool:
        nonlocal k_max, todo
        if scratch is None or fractions is None:
            return False
        km = max_batch_scratch(g0, plan_budget, scratch, strategy, host_budget=host_budget,
                               test_dynamic=t_dyn)
        if km == k_max:
            return False
        k_max = km
        todo = slots(km)
        say(f"k_max is now {km} ({why}; scratch reserve {scratch.describe()}); minibatches "
            f"left to profile: {todo}")
        return True

    def profile_todo():
        """Profile every k of ``todo`` (it may grow or shrink as k_max moves)."""
        nonlocal steps, layout, g0, k_max, todo, plan_budget, t_dyn
        while todo:
            k = todo.pop(0)
            set_batch_size(net, k)
            if scratch is not None and g0 is None:
                g0 = build_gmap(net, solver_type=solver.type)
                from .runtime import budget_for_plan, test_dynamic_bytes
                if plan_budget is None:
                    plan_budget = budget_for_plan(solver, budget, scratch=0, gmap=g0)
                t_dyn = test_dynamic_bytes(solver, gmap=g0)
                if fractions is not None:
                    k_max = max_batch_scratch(g0, plan_budget, scratch, strategy,
                                              host_budget=host_budget, test_dynamic=t_dyn)
            reserve = scratch(k) if scratch is not None else None
            inst = None
            for attempt in range(PROFILE_RETRIES + 1):
                it0 = solver.iter
                top = k_max if k_max is not None else max(ks)
                plan = "pinned" if fit_none and k < top else strategy
                try:
                    try:
                        if plan == "pinned":
                            ex = _install_naive(solver, budget, "dynamic", reserve, pinned="all")
                        else:
                            ex = _install_naive(solver, budget, plan, reserve)
                    except BudgetError:
                        if plan == strategy:
                            raise
                        plan = strategy
                        ex = _install_naive(solver, budget, plan, reserve)
                except BudgetError as e:
                    # shaped for k, the layers need more than the GMAP of an earlier k said (cuDNN
                    # chooses other algorithms, with other workspaces, at other shapes): profile
                    # the largest k that fits instead, and nothing above it
                    fits = _smaller_fit(e, k)
                    if fits is None or fits in done or attempt == PROFILE_RETRIES:
                        raise
                    say(f"Minibatch {k} does not fit the budget under the {strategy} plan: "
                        f"{str(e)[:200]}; profiling minibatch {fits} instead")
                    if k_max is not None and fits < k_max:
                        k_max = fits
                    k = fits
                    todo = [x for x in todo if x < k]
                    set_batch_size(net, k)
                    reserve = scratch(k) if scratch is not None else None
                    continue
                if steps is None:
                    steps = step_infos(ex.gmap)
                    layout = ex.gmap.layout()
                inst = _Instrument(ex, k)
                try:
                    _recorded_steps(inst, solver, warmup, iterations)
                except ScratchOverflow as e:
                    inst.remove()
                    ex.close()
                    runs.append([k, solver.iter - it0])
                    if (scratch is None or attempt == PROFILE_RETRIES
                            or (e.scratch is None and e.peak is None)):
                        raise
                    peak = e.peak if e.peak is not None else e.scratch
                    scratch.add(k, peak)
                    measured.append([k, int(peak)])
                    old, k_old = reserve, k
                    new_k_max(f"overflow at minibatch {k}")
                    if k_max is not None and k > k_max:
                        if not todo:
                            raise
                        k = todo.pop(0)          # this profile point, at the lower k_max
                        set_batch_size(net, k)
                        reserve = scratch(k)
                    else:
                        todo = [x for x in todo if x > k]
                        # a second overflow at the same k is the reserve's fragmentation (it held
                        # the bytes, not in one piece): grow past what the error named
                        grow = 1.0 + 0.25 * attempt
                        reserve = int(max(int(e.scratch or 0), scratch(k),
                                          (old or 0) if attempt else 0) * grow)
                    from .memory import fmt_bytes
                    say(f"Scratch reserve of {fmt_bytes(old)} too small at minibatch {k_old} "
                        f"(transients {fmt_bytes(int(peak))}): profiling "
                        + (f"minibatch {k} again" if k == k_old else f"minibatch {k} instead")
                        + f" with a reserve of {fmt_bytes(reserve)}")
                    continue
                except BaseException:
                    inst.remove()
                    ex.close()
                    raise
                chunks_now = chunk_rules_now(net, k)   # under this k's plan, as it ran
                if net.mode == "GPU":
                    for name, ts in search_times_now(net, k).items():
                        searched.setdefault(name, []).append([int(k), *ts])
                inst.remove()
                ex.close()
                runs.append([k, solver.iter - it0])
                break
            done.append(k)
            chunk_seen.append((k, chunks_now))
            plans.append([k, plan])
            compute.extend(inst.compute)
            transfers.extend(inst.transfers)
            iters.extend(inst.iterations)
            solver_steps.extend(inst.solver_steps)
            tp = ex.transients
            if tp is not None:
                measured.append([k, int(tp.peak)])
            if reserve is not None:
                reserves.append([k, int(reserve)])
            t = [s for kk, s in inst.iterations if kk == k]
            extra = ""
            if reserve is not None:
                from .memory import fmt_bytes
                extra = (f", scratch reserve {fmt_bytes(reserve)}"
                         + (f", transients measured {fmt_bytes(tp.peak)}" if tp is not None else ""))
            say(f"Profiled minibatch {k} "
                + ("with every feature map pinned: " if plan == "pinned"
                   else f"under the {plan} plan: ")
                + f"{1e3 * float(np.mean(t)) if t else float('nan'):.3f} ms per iteration, "
                f"{len(inst.transfers)} transfers" + extra)
            if scratch is not None and tp is not None:
                scratch.add(k, tp.peak)
                new_k_max(f"transients measured at minibatch {k}")

    profile_todo()
    if steps is None:
        steps = step_infos(build_gmap(net))
    if isinstance(host_ks, str):
        if host_ks != "auto":
            raise ValueError(f"host_ks: minibatches, None or 'auto', not {host_ks!r}")
        host_ks = host_issue_ks(min(done)) if (done and net.mode == "GPU") else ()
    host_samples, host_meta = (), {}
    if host_ks:
        host_samples, host_runs, host_meta = profile_host_issue(
            solver, budget, host_ks, scratch=scratch, log=log)
        host_meta["host_runs"] = host_runs
        set_batch_size(net, done[-1])
    if low_k is None:
        low_k = net.mode == "GPU"
    k_low = (low_profile_k(compute, done, host_meta.get("host_sums", ()))
             if low_k and done else None)
    if k_low is not None:
        last = done[-1]
        say(f"Profiling minibatch {k_low} too: the smallest k at which the device, not the "
            f"host, sets the pace, below the smallest fraction's {min(done)}")
        todo = [k_low]
        profile_todo()
        set_batch_size(net, last)
    copy_cal, copy_runs = None, []
    if calibrate_copies is None:
        env = os.environ.get(ENV_COPY_CALIBRATION, "").strip()
        calibrate_copies = env != "0" if env else net.mode == "GPU"
    if calibrate_copies:
        naive_ks = [k for k, p in plans if p == strategy]
        if naive_ks:
            so_far = Profile(net=net.name, device=device_name(net), mode=net.mode,
                             k_base=k_base, ks=tuple(done), steps=steps,
                             compute=tuple(compute), transfers=tuple(transfers),
                             host_samples=tuple(host_samples))
            for k_c in copy_calibration_ks(compute, naive_ks, host_meta.get("host_sums", ())):
                for attempt in range(COPY_CALIBRATION_RETRIES + 1):
                    copy_cal, n = calibrate_copy_cost(solver, budget, k_c, warmup, iterations,
                                                      scratch=scratch, log=log)
                    copy_runs.append([k_c, n])
                    if copy_cal is None or attempt == COPY_CALIBRATION_RETRIES:
                        break
                    if not _calibration_disturbed(so_far, copy_cal):
                        break
                    say(f"Copy calibration at minibatch {k_c} disturbed (its steps without "
                        "copies took longer than beside the naive plan's copies): "
                        "running it again")
                if copy_cal is not None:
                    break
            set_batch_size(net, done[-1])
    bw = None
    if bandwidth or (bandwidth is None and net.mode == "GPU"):
        bw = measure_bandwidth(net.xp)
    meta = {"warmup": warmup, "iterations": iterations, "strategy": strategy, "budget": budget,
            "plans": plans, **host_meta}
    if net.mode == "GPU":
        meta["cudnn_api"] = cudnn_api_now()
    if copy_cal is not None:
        meta["copy_calibration"] = copy_cal
    if copy_runs:
        meta["copy_runs"] = copy_runs
    meta["runs"] = runs
    if searched:
        meta["searched"] = searched
    rules, counts = settle_chunk_rules(chunk_seen, say)
    if rules:
        meta["chunks"] = rules
        meta["chunk_counts"] = counts
    if layout is not None:
        meta["layout"] = layout
    if scratch is not None:
        meta.update(scratch=reserves, transients=measured)
        if k_max is not None:
            meta["k_max"] = k_max
    return Profile(net=net.name, device=device_name(net), mode=net.mode, k_base=k_base,
                   ks=tuple(done), steps=steps, compute=tuple(compute), transfers=tuple(transfers),
                   iterations=tuple(iters), bandwidth=bw, date=_now(), meta=meta,
                   solver_steps=tuple(solver_steps), host_samples=tuple(host_samples))


__all__ = ["SCHEMA", "VERSION", "PROFILE_FRACTIONS", "profile_ks", "StepInfo", "ComputeSample",
           "TransferSample", "SolverStepSample", "Profile", "synthetic_profile", "set_batch_size",
           "measure_bandwidth", "device_name", "profile_solver", "step_infos", "ScratchModel",
           "scratch_estimate", "max_batch_scratch", "default_host_budget", "HOST_FRACTIONS",
           "host_issue_ks", "profile_host_issue", "calibrate_copy_cost", "copy_calibration_ks",
           "head_start_seconds", "device_wait",
           "host_whole_now", "low_profile_k", "LOW_K_MARGIN"]
