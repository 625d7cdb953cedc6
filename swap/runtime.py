"""The runtime memory manager: replay a Plan around the Net's forward/backward (section 5).

:class:`Executor` owns one device arena of exactly the budget (:class:`swap.arena.DeviceArena`)
and one host arena for offloaded data, both allocated once.  Every buffer of the plan has an
explicit residency state::

    FREED --allocate--> ON_DEVICE --offload--> OFFLOADING --release--> ON_HOST
      ^                  |   ^                                          |
      +-----release------+   +--ready-- PREFETCHING <--prefetch---------+

(``discard`` drops a host copy nobody will read, ON_HOST -> FREED); any other transition raises
:class:`ResidencyError`.  A step computes only when every buffer it touches is ON_DEVICE (a
PREFETCHING buffer becomes ON_DEVICE once the compute stream has waited on its copy's event).

Blobs see arena memory through ``Blob.bind_data`` / ``bind_diff`` (typed views of their region),
bound just before the step that needs them and released after their last use; a released
storage stays marked external, so a layer touching memory the plan did not bring raises instead
of silently allocating outside the budget.

Streams.  GPU mode runs three CUDA streams, as the paper: compute (the current stream, on which
layers and the solver run), swap-out (offload, the release that follows it) and swap-in
(prefetch), ordered only by events: an offload waits for the event of the step that last
wrote its buffer, a prefetch for the offload that filled its host copy, every allocation and
prefetch for the events of its region's previous occupant (last reader done, offload done), and
a step for the prefetches of the buffers it reads.  One event per op and per step is created
once and re-recorded every iteration.  CPU mode runs the same code with synchronous copies and
no events: the accounting is identical.

``MemoryTrace`` (``--memory-trace out.csv``) records per step the bytes allocated and released on
each stream, with timestamps (host clock in CPU mode; CUDA events, read once per iteration, in
GPU mode).
"""
from __future__ import annotations

import csv
import time

import numpy as np

from .arena import DeviceArena, HostArena
from .gmap import FORWARD, build_gmap, net_batch_size
from .plan import (ALLOCATE, BEFORE, COMPUTE, OFFLOAD, PREFETCH, RELEASE, SETUP,
                   SWAP_IN, SWAP_OUT, BudgetError, Plan, make_plan)

# ------------------------------------------------------------- residency
FREED = "FREED"
ON_DEVICE = "ON_DEVICE"
OFFLOADING = "OFFLOADING"
ON_HOST = "ON_HOST"
PREFETCHING = "PREFETCHING"

TRANSITIONS = {
    (FREED, "allocate"): ON_DEVICE,
    (ON_DEVICE, "release"): FREED,
    (ON_DEVICE, "offload"): OFFLOADING,
    (OFFLOADING, "release"): ON_HOST,       # the device copy goes once the offload is done
    (ON_HOST, "prefetch"): PREFETCHING,
    (PREFETCHING, "ready"): ON_DEVICE,      # compute waited on the prefetch's event
    (ON_HOST, "discard"): FREED,            # a host copy nobody will read
}


class ResidencyError(RuntimeError):
    """An operation illegal in a buffer's current residency state."""


class Residency:
    """The explicit state of every buffer of a plan."""

    def __init__(self, names):
        self.names = list(names)
        self.state = [FREED] * len(self.names)

    def __getitem__(self, bid: int) -> str:
        return self.state[bid]

    def apply(self, bid: int, event: str) -> str:
        cur = self.state[bid]
        new = TRANSITIONS.get((cur, event))
        if new is None:
            legal = sorted(e for (s, e) in TRANSITIONS if s == cur)
            raise ResidencyError(
                f"buffer {self.names[bid]!r}: cannot {event} while {cur} "
                f"(legal from {cur}: {', '.join(legal) or 'nothing'})")
        self.state[bid] = new
        return new


# --------------------------------------------------------------- streams
class HostStreams:
    """CPU mode: copies complete when issued; there are no events to wait on."""

    gpu = False

    def event(self, timing=False):
        return None

    def record(self, event, stream: str):
        pass

    def wait(self, stream: str, events):
        pass

    def copy(self, dst, src, stream: str):
        dst[...] = src           # synchronous

    def synchronize(self):
        pass


class CudaStreams:  # pragma: no cover - exercised on the GPU machine only
    """GPU mode: compute is the current stream; swap-out and swap-in are non-blocking streams."""

    gpu = True

    def __init__(self, cupy):
        self.cp = cupy
        self.streams = {COMPUTE: cupy.cuda.get_current_stream(),
                        SWAP_OUT: cupy.cuda.Stream(non_blocking=True),
                        SWAP_IN: cupy.cuda.Stream(non_blocking=True)}

    def event(self, timing=False):
        return self.cp.cuda.Event(disable_timing=not timing)

    def record(self, event, stream: str):
        event.record(self.streams[stream])

    def wait(self, stream: str, events):
        s = self.streams[stream]
        for e in events:
            if e is not None:
                s.wait_event(e)

    def copy(self, dst, src, stream: str):
        """Asynchronous copy between a device region and a pinned host region (uint8)."""
        s = self.streams[stream]
        if isinstance(dst, np.ndarray):          # device -> host, into pinned memory
            src.get(stream=s, out=dst, blocking=False)
        else:                                     # host -> device, from pinned memory
            dst.set(src, stream=s)

    def synchronize(self):
        for s in self.streams.values():
            s.synchronize()


# ----------------------------------------------------------------- trace
class MemoryTrace:
    """CSV rows per step: bytes allocated / released per stream, offloaded, prefetched, held."""

    FIELDS = ("iteration", "step", "layer", "phase", "t_start_ms", "t_end_ms",
              "allocated_compute", "allocated_swap_in", "released_compute", "released_swap_out",
              "offloaded", "prefetched", "in_use", "high_water")

    def __init__(self, path):
        self.path = path
        self._f = open(path, "w", newline="")
        self._w = csv.writer(self._f)
        self._w.writerow(self.FIELDS)

    def write(self, rows):
        self._w.writerows(rows)
        self._f.flush()

    def close(self):
        if not self._f.closed:
            self._f.close()


# --------------------------------------------------------------- executor
class Executor:
    """Runs ``net``'s forward and backward passes under ``plan`` inside a budget-sized arena.

    Args:
        net: the built Net the plan was made for (same layers, same minibatch).
        plan: a :class:`swap.plan.Plan`.
        budget: arena capacity in bytes (default: the plan's budget, else its ``arena_bytes``).
        solver: optional Solver whose history blobs move into the arena too.
        trace: optional path of a CSV memory trace.
        poison: CPU mode: fill every freshly allocated or released region with 0xFF bytes (NaN,
            -1), so that reading memory the plan does not guarantee shows up in the results.

    Install with :func:`install` (or set ``net.executor``); ``Net.forward_backward`` then
    delegates here.
    """

    def __init__(self, net, plan: Plan, *, budget: int | None = None, solver=None,
                 trace: str | None = None, poison: bool = False):
        g = plan.gmap
        if g.n_layers != len(net.layers) or g.layer_names != tuple(net.layer_names):
            raise ValueError(f"the plan was made for net {g.net_name!r} with {g.n_layers} layers, "
                             f"not for net {net.name!r} with {len(net.layers)} layers")
        if g.k != net_batch_size(net):
            raise ValueError(f"the plan is for minibatch {g.k}, net {net.name!r} has minibatch "
                             f"{net_batch_size(net)}")
        budget = budget if budget is not None else (plan.budget or plan.arena_bytes)
        if plan.arena_bytes > budget:
            raise BudgetError(f"plan {plan.strategy!r} needs an arena of {plan.arena_bytes} "
                              f"bytes, the budget is {budget}", budget=budget,
                              min_budget=plan.arena_bytes, strategy=plan.strategy, k=g.k)
        self.net = net
        self.plan = plan
        self.gmap = g
        self.budget = int(budget)
        self.solver = solver
        self.poison = poison and net.mode != "GPU"
        xp = net.xp
        self.streams = CudaStreams(xp) if net.mode == "GPU" else HostStreams()
        # The two arenas, allocated once (section 5).
        self.device = DeviceArena(self.budget, xp, backing_bytes=plan.arena_bytes)
        self.host = HostArena(plan.host_bytes, xp)
        self.residency = Residency(b.name for b in g.buffers)
        self.iterations = 0
        self.trace = MemoryTrace(trace) if trace else None

        ops = plan.ops
        n = g.n_steps
        self._setup = [i for i, op in enumerate(ops) if op.step == SETUP]
        # resident for the whole run: the setup allocations (parameters ..., or all for none)
        self._resident = frozenset(ops[i].buffer for i in self._setup)
        self._before = [[] for _ in range(n)]
        self._after = [[] for _ in range(n)]
        for i, op in enumerate(ops):
            if op.step != SETUP:
                (self._before if op.when == BEFORE else self._after)[op.step].append(i)
        self._touches = [s.touches for s in g.steps]
        self._raw = [b.nbytes(g.k) for b in g.buffers]
        self._dtype = [np.dtype(b.dtype) for b in g.buffers]
        # events, created once and re-recorded every iteration (GPU); None in CPU mode
        self._op_event = [self.streams.event() if op.kind in (OFFLOAD, PREFETCH) else None
                          for op in ops]
        self._step_event = [self.streams.event() for _ in range(n)]
        self._start_event = self.streams.event()
        self._prefetch_event = {}          # buffer -> event of its in-flight prefetch
        self._offset = {}                  # buffer -> offset of the region it holds now
        self._targets = [self._resolve(b) for b in g.buffers]
        self._detach_dynamic()
        for i in self._setup:
            self._do(i, setup=True)

    # ------------------------------------------------------------ binding
    def _resolve(self, b):
        """What a buffer backs in the net: (blob, "data"|"diff"), ("history", list, i), None."""
        ref = b.ref
        net = self.net
        if not ref:
            return None                                  # a Caffe reservation: backs nothing
        if ref[0] in ("data", "diff"):
            return (net.blobs[ref[1]], ref[0])
        if ref[0] == "param":
            return (net.learnable_params[ref[1]], "data")
        if ref[0] == "param_diff":
            return (net.learnable_params[ref[1]], "diff")
        if ref[0] == "internal":
            return (net.layers[ref[1]].internals[ref[2]].blob, "data")
        if ref[0] == "history":
            if self.solver is None:
                return None
            rule = self.solver.rule
            lists = [rule.history] + ([rule.second] if hasattr(rule, "second") else [])
            return ("history", lists[ref[2]], ref[1])
        raise ValueError(f"unknown buffer reference {ref!r}")

    @staticmethod
    def _storage(target):
        blob, which = target
        return blob.data_storage if which == "data" else blob.diff_storage

    def _detach_dynamic(self):
        """Drop the net's own arrays of every per-iteration buffer: from now on they exist only
        while the plan holds them (an access outside raises, see ``Blob``)."""
        for b, t in zip(self.gmap.buffers, self._targets):
            if t is None or b.persistent or t[0] == "history":
                continue
            st = self._storage(t)
            st.array = None
            st.external = True

    def _bind(self, bid: int, offset: int, copy_in: bool = False):
        t = self._targets[bid]
        if t is None:
            return
        view = self.device.view(offset, self._raw[bid], self._dtype[bid])
        if t[0] == "history":
            _, lst, i = t
            old = lst[i]
            new = view.reshape(old.shape)
            if copy_in:
                new[...] = old
            lst[i] = new
            return
        blob, which = t
        if copy_in:
            st = self._storage(t)
            if st.array is not None:
                view[...] = st.array[:view.size]
            else:
                view[...] = 0
        (blob.bind_data if which == "data" else blob.bind_diff)(view)

    def _unbind(self, bid: int):
        t = self._targets[bid]
        if t is None or t[0] == "history":
            return
        blob, which = t
        (blob.release_data if which == "data" else blob.release_diff)()

    # ---------------------------------------------------------------- ops
    def _free_event(self, i: int):
        """The event after which the region released by op ``i`` may be reused."""
        op = self.plan.ops[i]
        if op.kind == OFFLOAD:
            return self._op_event[i]
        if op.stream == SWAP_OUT:                        # a release after an offload
            return self._op_event[op.after[0]]
        return self._step_event[op.wait_step]

    def _do(self, i: int, setup: bool = False):
        op = self.plan.ops[i]
        bid = op.buffer
        st = self.streams
        if op.kind == ALLOCATE:
            self.device.allocate(op.nbytes, op.offset)
            self._offset[bid] = op.offset
            # compute is in order with itself: wait only on regions freed by swap-out
            st.wait(COMPUTE, [self._free_event(d) for d in op.after
                              if self.plan.ops[d].stream != COMPUTE])
            self.residency.apply(bid, "allocate")
            if self.poison:
                self.device.fill(op.offset, op.nbytes)
            self._bind(bid, op.offset, copy_in=setup)
        elif op.kind == PREFETCH:
            self.device.allocate(op.nbytes, op.offset)
            self._offset[bid] = op.offset
            st.wait(SWAP_IN, [self._free_event(d) for d in op.after])
            self.residency.apply(bid, "prefetch")
            st.copy(self.device.buffer[op.offset:op.offset + op.nbytes],
                    self.host.view(op.host_offset, op.nbytes), SWAP_IN)
            st.record(self._op_event[i], SWAP_IN)
            self._prefetch_event[bid] = self._op_event[i]
            self._bind(bid, op.offset)
        elif op.kind == OFFLOAD:
            st.wait(SWAP_OUT, [self._step_event[op.wait_step]])
            self.residency.apply(bid, "offload")
            st.copy(self.host.view(op.host_offset, op.nbytes),
                    self.device.buffer[op.offset:op.offset + op.nbytes], SWAP_OUT)
            st.record(self._op_event[i], SWAP_OUT)
        elif op.kind == RELEASE:
            self.device.free(op.offset)
            del self._offset[bid]
            self.residency.apply(bid, "release")
            self._unbind(bid)
            if self.poison:
                self.device.fill(op.offset, op.nbytes)
        else:
            raise ValueError(f"unknown op kind {op.kind!r}")

    def _ready(self, j: int):
        """Before step j computes: its buffers are on the device (waiting on prefetches)."""
        res = self.residency
        for bid in self._touches[j]:
            s = res[bid]
            if s == PREFETCHING:
                self.streams.wait(COMPUTE, [self._prefetch_event.pop(bid, None)])
                res.apply(bid, "ready")
            elif s != ON_DEVICE:
                raise ResidencyError(
                    f"{self.gmap.steps[j]} needs buffer {res.names[bid]!r}, which is {s}: the "
                    f"plan {self.plan.strategy!r} did not bring it onto the device")

    # ------------------------------------------------------------ passes
    def _run(self, last_step: int):
        g = self.gmap
        net = self.net
        st = self.streams
        st.record(self._start_event, COMPUTE)
        st.wait(SWAP_IN, [self._start_event])       # the previous iteration is done with
        st.wait(SWAP_OUT, [self._start_event])      # every region (solver update included)
        tracing = self.trace is not None
        rows, t_events = [], []
        t0 = time.perf_counter()
        loss = 0.0
        for j in range(last_step + 1):
            step = g.steps[j]
            if tracing:
                a = time.perf_counter()
                if st.gpu:
                    ev0 = st.event(timing=True)
                    st.record(ev0, COMPUTE)
            for i in self._before[j]:
                self._do(i)
            self._ready(j)
            if step.phase == FORWARD:
                loss = loss + net.forward_layer(step.layer)
            else:
                net.backward_layer(step.layer)
            st.record(self._step_event[j], COMPUTE)
            for i in self._after[j]:
                self._do(i)
            if tracing:
                if st.gpu:
                    ev1 = st.event(timing=True)
                    st.record(ev1, COMPUTE)
                    t_events.append((ev0, ev1))
                rows.append(self._trace_row(j, (a - t0) * 1e3, (time.perf_counter() - t0) * 1e3))
        if tracing:
            if st.gpu:                                  # one sync per traced iteration
                t_events[-1][1].synchronize()
                for row, (e0, e1) in zip(rows, t_events):
                    row[4] = self.streams.cp.cuda.get_elapsed_time(t_events[0][0], e0)
                    row[5] = self.streams.cp.cuda.get_elapsed_time(t_events[0][0], e1)
            self.trace.write(rows)
        return loss

    def _trace_row(self, j, t_start, t_end):
        ops = self.plan.ops
        by = {"allocated_compute": 0, "allocated_swap_in": 0, "released_compute": 0,
              "released_swap_out": 0, "offloaded": 0, "prefetched": 0}
        for i in self._before[j] + self._after[j]:
            op = ops[i]
            if op.kind in (ALLOCATE, PREFETCH):
                by["allocated_" + op.stream] += op.nbytes
                if op.kind == PREFETCH:
                    by["prefetched"] += op.nbytes
            elif op.kind == RELEASE:
                by["released_" + op.stream] += op.nbytes
            else:
                by["offloaded"] += op.nbytes
        step = self.gmap.steps[j]
        return [self.iterations, j, step.name, step.phase, round(t_start, 4), round(t_end, 4),
                by["allocated_compute"], by["allocated_swap_in"], by["released_compute"],
                by["released_swap_out"], by["offloaded"], by["prefetched"], self.device.in_use,
                self.device.high_water]

    def forward_backward(self):
        """One training pass under the plan; returns the loss (a device scalar)."""
        loss = self._run(self.gmap.n_steps - 1)
        self._check_all_freed()
        self.iterations += 1
        return loss

    def forward(self):
        """A forward-only pass (Solver.solve's last display, pycaffe's ``net.forward()``):
        the forward steps of the plan, then everything per-iteration is dropped."""
        loss = self._run(self.gmap.n_forward - 1)
        self.streams.synchronize()     # nothing may still read or write a region we drop
        res = self.residency
        for b in self.gmap.buffers:
            s = res[b.id]
            if b.id in self._resident or s == FREED:
                continue
            if s == PREFETCHING:
                res.apply(b.id, "ready")
                s = ON_DEVICE
            if s in (ON_DEVICE, OFFLOADING):
                self.device.free(self._offset.pop(b.id))
                res.apply(b.id, "release")
                self._unbind(b.id)
            if res[b.id] == ON_HOST:
                res.apply(b.id, "discard")
        self._prefetch_event.clear()
        self.iterations += 1
        return loss

    def _check_all_freed(self):
        res = self.residency
        stray = [res.names[b.id] for b in self.gmap.buffers
                 if b.id not in self._resident and res[b.id] != FREED]
        if stray:
            raise ResidencyError(f"plan {self.plan.strategy!r} left buffers held after the "
                                 f"iteration: {', '.join(stray[:5])}")

    # ------------------------------------------------------------ reports
    @property
    def high_water(self) -> int:
        """Highest arena byte ever handed out (measured)."""
        return self.device.high_water

    @property
    def peak_in_use(self) -> int:
        return self.device.peak_in_use

    def report(self) -> str:
        from .memory import fmt_bytes
        p = self.plan
        off, pre = p.transfer_bytes()
        return (f"swap {p.strategy!r}: budget {fmt_bytes(self.budget)}, arena high-water mark "
                f"{fmt_bytes(self.high_water)} (peak in use {fmt_bytes(self.peak_in_use)}; "
                f"planned peak {fmt_bytes(p.peak)}), host {fmt_bytes(p.host_bytes)}"
                + (", pinned" if self.host.pinned else "")
                + f"; per iteration offload {fmt_bytes(off)}, prefetch {fmt_bytes(pre)}")

    def close(self):
        """Give the net back its own arrays (persistent contents copied out of the arena)."""
        self.streams.synchronize()
        xp = self.net.xp
        for b, t in zip(self.gmap.buffers, self._targets):
            if t is None:
                continue
            if t[0] == "history":
                _, lst, i = t
                lst[i] = lst[i].copy()
                continue
            st = self._storage(t)
            if b.persistent and st.array is not None:
                st.array = xp.array(st.array, copy=True)
            else:
                st.array = None
            st.external = False
        if getattr(self.net, "executor", None) is self:
            self.net.executor = None
        if self.trace is not None:
            self.trace.close()


def install(target, strategy: str = "naive", budget: int | None = None, *,
            trace: str | None = None, poison: bool = False, pinned=frozenset()) -> Executor:
    """Plan ``strategy`` for a Solver's train net (or a Net) and make it run under the plan.

    Builds the GMAP at the net's minibatch, the plan under ``budget`` (bytes; None: the
    smallest that works), and an Executor, and sets ``net.executor``.  A budget too small fails
    here, before the first iteration, with :class:`swap.plan.BudgetError` naming the smallest
    budget that works and the largest minibatch that fits.
    """
    solver = target if hasattr(target, "net") and hasattr(target, "rule") else None
    net = solver.net if solver is not None else target
    net.reshape()                         # every layer's internals exist at their sizes
    g = build_gmap(net, solver_type=solver.type if solver is not None else "SGD")
    plan = make_plan(g, strategy, budget, pinned)
    ex = Executor(net, plan, budget=budget, solver=solver, trace=trace, poison=poison)
    net.executor = ex
    return ex
