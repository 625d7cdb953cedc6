"""The SGD update of one shard, by minicaffe's own Solver code.

A shard applies exactly the update a single-process :class:`minicaffe.solver.Solver`
would apply to the same blobs: learning-rate policy (``learning_rate`` and the
multistep bookkeeping of ``get_learning_rate``), ``iter_size`` normalisation,
weight decay scaled by ``decay_mult``, the rate scaled by ``lr_mult``, the
update rule's history (SGD momentum, Nesterov, Adam) and ``data -= diff``
(Caffe's convention: after the rule, ``diff`` holds the update).

Rather than restating that arithmetic, :class:`ShardSolver` *is* a Solver
whose "net" is the shard's blobs: ``Solver.apply_update`` and the update rules
run unchanged, so the parameter server cannot drift from the solver's
semantics.  Only the construction differs (a shard has no layers to build).

Gradient clipping needs the norm over *all* parameters, which no single shard
sees; workers refuse it with several shards (one shard holds everything and
clips exactly like the solver).
"""
from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from minicaffe.blob import Blob
from minicaffe.log import log
from minicaffe.proto import caffe_pb2, read_binary, upgrade_solver, write_binary
from minicaffe.solver import UPDATE_RULES, Solver

from . import env_count

# Threads of a shard's elementwise work (the gradients' sum and the update, per parameter):
# NumPy releases the GIL on large arrays.  One thread summed and updated ResNet-152's quarter
# (60 MB) in 80 to 100 ms on a 2-core machine, on the BSP round's critical path.
ENV_THREADS = "MINICAFFE_PS_THREADS"
# below this many bytes in a shard a pool costs more than it saves
PARALLEL_MIN_BYTES = 8 << 20
# A blob larger than this is summed and updated in flat slices of it, each a task of its own:
# ResNet-152's largest blobs (9.4 MB) would otherwise run on one thread while the others wait,
# and a slice's arrays stay in the cache through the sum and the update.
UNIT_BYTES = 1 << 20


def default_threads() -> int:
    """``$MINICAFFE_PS_THREADS``, else the CPUs this process may use, at most 8."""
    n = env_count(ENV_THREADS)
    if n is not None:
        return n
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


SHARD_STATE_KIND = "minicaffe-ps-shard"
SHARD_STATE_VERSION = 1

# SolverParameter fields that decide the update; all workers must agree on them.
UPDATE_FIELDS = ("type", "base_lr", "lr_policy", "gamma", "power", "stepsize", "stepvalue",
                 "max_iter", "momentum", "momentum2", "delta", "rms_decay", "weight_decay",
                 "regularization_type", "clip_gradients", "iter_size", "snapshot",
                 "snapshot_after_train")


def update_fields(p) -> dict:
    """The update-relevant fields of a SolverParameter, for comparison and logs."""
    out = {}
    for f in UPDATE_FIELDS:
        if f not in p.DESCRIPTOR.fields_by_name:
            continue
        v = getattr(p, f)
        out[f] = list(v) if f == "stepvalue" else v
    return out


class _ShardNet:
    """The slice of ``Net`` that ``Solver.apply_update`` reads."""

    def __init__(self, blobs, lr_mult, decay_mult):
        self.xp = np
        self.learnable_params = blobs
        self.param_lr_mult = list(lr_mult)
        self.param_decay_mult = list(decay_mult)


class _Slice:
    """A flat slice of a blob's data and diff, which the update rules update like a blob
    (they work element by element, so slicing changes no result)."""

    __slots__ = ("data", "diff")

    def __init__(self, data, diff):
        self.data = data
        self.diff = diff

    @property
    def dtype(self):
        return self.data.dtype


class ShardSolver(Solver):
    """A Solver over a shard's parameter blobs instead of a net.

    ``Solver.__init__`` is deliberately not called: it builds nets, seeds the
    RNG and picks a device, none of which a shard has.  The attributes set
    here are exactly those that ``apply_update``, ``get_learning_rate`` and
    the update rules read.

    Args:
        param: the workers' SolverParameter.
        shapes: shape of each blob of the shard, in shard order.
        lr_mult, decay_mult: each blob's ParamSpec multipliers.
        dtype: the blobs' dtype (the workers' net dtype).
        data: optional arrays the blobs' values live in, one per blob of its shape (the
            shard's shared-memory segment, ps/shm.py); default: the blobs' own.
    """

    def __init__(self, param, shapes, lr_mult, decay_mult, dtype=np.float32, verbose=True,
                 log_where="ps.server", threads: int | None = None,
                 unit_bytes: int = UNIT_BYTES, data=None):
        self.param = upgrade_solver(param)
        self.source = None
        self.source_dir = None
        self.verbose = verbose
        self.type = self.param.type or "SGD"
        if self.type not in UPDATE_RULES:
            raise ValueError(f"unknown solver type {self.type!r} "
                             f"(known: {', '.join(sorted(UPDATE_RULES))})")
        # The workers' Solver checks its policy when it is built; the shard takes the
        # policy from INIT, so it checks too, before the join answers, rather than raise
        # from get_learning_rate at the first round (a fuzzed INIT did: tests/ps/
        # test_protocol_fuzz.py).
        self._check_lr_policy()
        self.log_where = log_where
        self.dtype = np.dtype(dtype)
        self.iter = 0
        self.current_step = 0
        blobs = []
        for i, shape in enumerate(shapes):
            b = Blob(tuple(shape), xp=np, dtype=self.dtype, name=f"shard/param{i}")
            if data is not None:
                a = data[i]
                if a.shape != tuple(shape) or a.dtype != self.dtype:
                    raise ValueError(f"blob {i}: storage {a.dtype}{list(a.shape)} for "
                                     f"{self.dtype}{list(shape)}")
                b.bind_data(a.reshape(-1))
            b.data[...] = 0
            b.diff[...] = 0
            blobs.append(b)
        self._blobs = blobs
        # The solver's parameters are units: a blob, or a flat slice of a large one.  With
        # clipping the norm sums per parameter, so the blobs stay whole (the solver's order).
        clipping = self.param.HasField("clip_gradients") and self.param.clip_gradients >= 0
        step = None if clipping else max(1, int(unit_bytes) // self.dtype.itemsize)
        units, lr, decay = [], [], []
        self._units_of = []            # per blob: [(unit index, start, stop) or (unit, None, None)]
        for k, b in enumerate(blobs):
            n = b.data.size
            if step is None or n <= step:
                parts = [(len(units), None, None)]
                units.append(b)
            else:
                data, diff = b.data.reshape(-1), b.diff.reshape(-1)
                parts = []
                for a in range(0, n, step):
                    parts.append((len(units), a, min(n, a + step)))
                    units.append(_Slice(data[a:a + step], diff[a:a + step]))
            self._units_of.append(parts)
            lr += [lr_mult[k]] * len(parts)
            decay += [decay_mult[k]] * len(parts)
        self.net = _ShardNet(units, lr, decay)
        self.history = [np.zeros_like(u.data) for u in units]
        self.rule = UPDATE_RULES[self.type](self)
        self._local = threading.local()      # per thread: the in-place SGD's scratch
        self._unit_max = max((u.data.size for u in units), default=0)
        self.threads = default_threads() if threads is None else int(threads)
        nbytes = sum(b.nbytes for b in blobs)
        self._pool = (ThreadPoolExecutor(self.threads, thread_name_prefix="shard")
                      if self.threads > 1 and len(units) > 1 and nbytes >= PARALLEL_MIN_BYTES
                      else None)

    def for_each_param(self, params, fn):
        """``fn(i, q)`` for every parameter, on the shard's thread pool when it has one (each
        call touches its own parameter and history only, so the results are bit for bit the
        sequential loop's)."""
        self._each(list(enumerate(params)), fn)

    def _each(self, items, fn):
        if self._pool is None or len(items) < 2:
            for i, q in items:
                fn(i, q)
            return
        for f in [self._pool.submit(fn, i, q) for i, q in items]:
            f.result()                          # in order: the first failure is raised

    def close(self):
        """Stop the thread pool."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    @property
    def blobs(self):
        """The shard's parameter blobs, whole (the solver updates :attr:`units`)."""
        return self._blobs

    @property
    def units(self):
        return self.net.learnable_params

    def _log(self, msg):
        if self.verbose:
            log(msg, where=self.log_where)

    def update(self, display: bool = False):
        """Apply the update for ``self.iter`` (the blobs' diffs hold the averaged
        gradient) and move to the next iteration."""
        self.apply_update(display)
        self.iter += 1

    # A round by buckets: begin_round, reduce_bucket for each bucket as soon as every
    # worker's gradients are in (buckets in any order), end_round.  Each parameter gets exactly
    # apply_update's arithmetic, so the result is bit for bit :meth:`update`'s.
    def begin_round(self, display: bool = False) -> float:
        """The learning rate of ``self.iter`` (one call per round: it keeps the multistep
        bookkeeping); refuses what needs every gradient at once (clipping)."""
        p = self.param
        if p.HasField("clip_gradients") and p.clip_gradients >= 0:
            raise ValueError("clip_gradients needs the norm over every parameter of the shard "
                             "at once: it cannot be applied bucket by bucket")
        rate = self.get_learning_rate()
        if display:
            self._log(f"Iteration {self.iter}, lr = {rate:.6g}")
        return rate

    def reduce_bucket(self, positions, grads, rate: float | None):
        """The blobs at ``positions`` (indices into :attr:`blobs`) get the average of the
        workers' gradients ``grads`` (one list of arrays per worker, in rank order, in the
        order of ``positions``), summed in rank order and scaled by 1/W (Caffe's
        multi-GPU rule); then, unless ``rate`` is None, their update at ``rate``.

        One task per blob on the thread pool: a blob is summed, scaled and updated while
        it is in the cache, and the blobs run in parallel."""
        reg = self._regularization()
        workers = len(grads)
        units = self.units
        where = {}                     # unit -> (position in the bucket, start, stop)
        for j, k in enumerate(positions):
            for u, a, b in self._units_of[k]:
                where[u] = (j, a, b)

        in_place = rate is not None and self.type == "SGD" and reg == "L2"

        def one(u, q):
            j, a, b = where[u]
            gs = [g[j] if a is None else g[j].reshape(-1)[a:b] for g in grads]
            if workers == 1:
                if in_place:               # the update reads the worker's gradient itself
                    self._sgd_in_place(u, q, gs[0], rate)
                    return
                np.copyto(q.diff, gs[0])
            else:
                np.add(gs[0], gs[1], out=q.diff)
                for g in gs[2:]:
                    q.diff += g
                q.diff *= q.dtype.type(1.0 / workers)
            if in_place:
                self._sgd_in_place(u, q, q.diff, rate)
            elif rate is not None:
                self.update_param(u, q, rate, reg)
        self._each([(u, units[u]) for u in where], one)

    def _sgd_in_place(self, u, q, grad, rate: float):
        """:meth:`update_param` of the SGD rule with L2 decay for unit ``u`` whose gradient
        (summed and averaged) is ``grad``, bit for bit, without temporaries.

        ``update_param`` computes ``diff += decay * data``, ``h = m * h + local_rate * diff``,
        ``diff = h``, ``data -= diff``: each product a new array (two per unit, 1 MiB each) and
        eight passes over the unit.  Here the same float32 operations, in the same order, run
        into a scratch buffer of the thread's, six passes, and ``diff`` is left holding the
        regularized gradient instead of the update (nothing reads a shard's diff after its
        update).  ``grad`` is only read (with one worker it is the worker's own array)."""
        p = self.param
        tmp = self._scratch(q.data.size).reshape(q.data.shape)
        g = grad
        if p.iter_size > 1:
            np.multiply(g, 1.0 / p.iter_size, out=q.diff)
            g = q.diff
        decay = p.weight_decay * self.net.param_decay_mult[u]
        if decay:
            np.multiply(q.data, decay, out=tmp)
            np.add(g, tmp, out=q.diff)
            g = q.diff
        h = self.history[u]
        h *= p.momentum
        np.multiply(g, rate * self.net.param_lr_mult[u], out=tmp)
        h += tmp
        np.subtract(q.data, h, out=q.data)

    def _scratch(self, n: int):
        """A scratch array of at least ``n`` elements, one per thread, kept."""
        buf = getattr(self._local, "scratch", None)
        if buf is None or buf.size < n:
            buf = self._local.scratch = np.empty(max(n, self._unit_max), self.dtype)
        return buf[:n]

    def end_round(self):
        self.iter += 1

    # ------------------------------------------------------- shard state
    def save_state(self, path: str, meta: dict):
        """Parameters, solver history and position in one atomic write.

        One file (a SolverState: ``history`` holds the parameter blobs, then
        the rule's state blobs) so that a snapshot is either complete or
        absent; ``minicaffe_state`` names the blobs and their owner shard.
        """
        state = caffe_pb2.SolverState(iter=self.iter, current_step=self.current_step)
        for arr in [b.data for b in self.blobs] + [
                np.concatenate([s.reshape(-1) for s in parts]).reshape(b.shape)
                if len(parts) > 1 else parts[0]
                for parts, b in self._state_parts()]:
            bp = state.history.add()
            bp.shape.dim.extend(arr.shape)
            if arr.dtype == np.float64:  # float64 nets (numerical checks) keep every bit
                bp.double_data.extend(arr.ravel().tolist())
            else:
                bp.data.extend(np.asarray(arr, dtype=np.float32).ravel().tolist())
        doc = {"kind": SHARD_STATE_KIND, "version": SHARD_STATE_VERSION,
               "num_params": len(self.blobs), "solver_type": self.type, **meta}
        state.minicaffe_state = json.dumps(doc).encode()
        write_binary(state, path)

    def _state_parts(self):
        """Per blob and state array of the rule (history, Adam's second moments): the
        units' arrays that make it up, in order, and the blob."""
        states = list(self.rule.state_blobs())
        n = len(self.units)
        out = []
        for g in range(len(states) // n if n else 0):
            for parts, b in zip(self._units_of, self.blobs):
                out.append(([states[g * n + u] for u, _, _ in parts], b))
        return out

    def load_state(self, state, path: str):
        """Restore what :meth:`save_state` wrote (shapes must match)."""
        doc = read_shard_meta(state, path)
        parts = [[b.data] for b in self.blobs] + [p for p, _ in self._state_parts()]
        blobs = [b.data for b in self.blobs] + [b.data for _, b in self._state_parts()]
        if doc["num_params"] != len(self.blobs) or len(state.history) != len(blobs):
            raise ValueError(f"{path}: holds {doc['num_params']} parameters and "
                             f"{len(state.history)} blobs in all; this shard has {len(self.blobs)} "
                             f"parameters and {len(blobs)} blobs with solver {self.type!r}")
        if doc.get("solver_type") != self.type:
            raise ValueError(f"{path}: written by a {doc.get('solver_type')!r} solver, the workers "
                             f"run {self.type!r}")
        for k, (arr, bp) in enumerate(zip(blobs, state.history)):
            if tuple(bp.shape.dim) != arr.shape:
                raise ValueError(f"{path}: blob {k} has shape {tuple(bp.shape.dim)}, expected "
                                 f"{arr.shape}")
            values = bp.double_data if len(bp.double_data) else bp.data
            if len(values) != arr.size:
                raise ValueError(f"{path}: blob {k} holds {len(values)} values, expected "
                                 f"{arr.size}")
            flat = np.asarray(values, dtype=arr.dtype)
            at = 0
            for part in parts[k]:          # the units' state arrays of this blob
                part.reshape(-1)[...] = flat[at:at + part.size]
                at += part.size
        self.iter = state.iter
        self.current_step = state.current_step


def read_shard_state(path: str):
    """A shard snapshot and its metadata (checked to be one)."""
    state = read_binary(path, caffe_pb2.SolverState)
    return state, read_shard_meta(state, path)


def read_shard_meta(state, path: str) -> dict:
    try:
        doc = json.loads(state.minicaffe_state.decode() or "{}")
    except ValueError:
        doc = {}
    if doc.get("kind") != SHARD_STATE_KIND:
        raise ValueError(f"{path}: not a parameter-server shard snapshot (a worker's or a plain "
                         "solver's .solverstate?)")
    if doc.get("version") != SHARD_STATE_VERSION:
        raise ValueError(f"{path}: shard snapshot version {doc.get('version')}, this server reads "
                         f"{SHARD_STATE_VERSION}")
    return doc
