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

Arena layout (:class:`ArenaLayout`).  Every device byte of training lives in the one arena::

    [0, R)          the plan's resident buffers (parameters, diffs, history, outputs ...)
    [R, E)          the plan's per-iteration regions (E = plan.arena_bytes)
    [R, R + Td)     between iterations: the test nets' per-pass buffers (time-shared with the
                    plan's per-iteration regions, which are all free then)
    [P, P + Tp)     the test nets' persistent buffers (outputs, inputs, their own params);
                    P = max(E, R + Td)
    [S, capacity)   the scratch reserve: every CuPy allocation made while the executor is
                    installed (layer temporaries, cuBLAS/cuDNN workspaces made through CuPy,
                    the solver update's temporaries), S = P + Tp

GPU mode installs a CuPy allocator (``cupy.cuda.set_allocator``; :class:`ScratchAllocator`): a
CuPy memory pool whose chunks come from the reserve, so nothing allocates outside the budget
and the arena's high-water mark counts the temporaries too.  An allocation that does not fit
raises :class:`ScratchOverflow` naming the step, its layer and the reserve (``strict=False``:
falls back to CuPy's own pool with a logged warning).  CPU mode has no allocator to redirect
(NumPy temporaries), but the same layout, the same :class:`swap.arena.ScratchReserve` and the
same measurement.

The dry run.  The first ``measure`` iterations (default 1; they still train, like the paper's
profiling iterations) count every transient allocation per step (:class:`TransientMeter`: a
CuPy memory hook on the GPU, ``tracemalloc`` on the CPU), including the solver update and test
passes between them (:data:`OUTSIDE`).  During the dry run an allocation that does not fit
the reserve falls back to CuPy's pool and is counted; when it ends, a reserve smaller than the
measured peak raises :class:`ScratchOverflow` (strict) with the budget that would work, or logs
a warning.  :func:`measure_scratch` runs a dry run without a budget and returns the peak, which
:func:`install` takes as ``scratch=`` (the plan then gets ``budget - scratch - test nets``).

Test nets (the solver's) run their forward passes through the executor too
(:class:`TestNetMemory`): their buffers are laid out once (liveness over the forward steps),
bound to arena regions for a test pass and released when training resumes.

Streams.  GPU mode runs three CUDA streams, as the paper: compute (the current stream, on which
layers and the solver run), swap-out (offload, the release that follows it) and swap-in
(prefetch), ordered only by events: an offload waits for the event of the step that last
wrote its buffer, a prefetch for the offload that filled its host copy, every allocation and
prefetch for the events of its region's previous occupant (last reader done, offload done), and
a step for the prefetches of the buffers it reads; each iteration starts with compute waiting
on the tails of the previous iteration's swap streams.  The swap-in stream runs its copies in
the order they were issued, so the compiled iteration (:meth:`Executor._compile`) has a step
wait only on the latest-issued prefetch it reads, and not at all where compute already waited
on a later one: the same order with fewer waits (ResNet-152's dynamic plan at 86: 266 where
there were 355).  A RECOMPUTE op (the ``recompute``
strategy) runs a layer's forward again on the compute stream just before the backward step it
belongs to: the buffers it writes were allocated by that step's ALLOCATE ops like any other
(their regions' free events awaited), it waits on the prefetches of what it reads exactly as a
step does, and the events recorded after the step cover it (compute is in order); the layer's
``recompute`` flag, where it has one (BatchNorm), is set around the call so that its forward
changes no state.  Events are created once and re-recorded
every iteration; a step records its event only if some operation waits on it.  CPU mode runs
the same code with synchronous copies and no events: the accounting is identical.  A backward
step runs its layer through ``Net.backward_layer``, so the net's ``backward_listener`` (ps/:
gradient communication that overlaps backward) hears of it right after the layer's kernels
are queued on the compute stream; parameter diffs are resident, so what it hands to another
stream stays in place until the update.

``poison=True`` fills every freshly allocated or released region with 0xFF bytes (NaN, -1): at
once in CPU mode, with ``cudaMemsetAsync`` on the region's stream in GPU mode (after the
offload on swap-out, with the release's own event as the region's free event), so that reading
memory the plan does not guarantee shows up in the results.

NVTX ranges (:mod:`swap.nvtx`; ``MINICAFFE_NVTX=1`` or ``nvtx=True``) mark every layer
forward/backward and every memory operation.

Host overhead per iteration is kept to what the plan needs: views of every region are made
once and rebound (a blob sees the same view object every iteration, so its own view cache
holds), waits are precomputed per operation, resident buffers are never touched after setup,
and the first iteration (and every forward-only pass) issues the plan op by op, replaying and
so checking the arena's offsets and the residency states.  Later full iterations, identical by
construction, run from compiled tables (``Executor._compile``): per step, the device calls
(raw runtime waits, copies, records) and the storage assignments (binds, releases), resolved
once.  ``fast=False`` keeps every iteration op by op.

``MemoryTrace`` (``--memory-trace out.csv``) records per step the bytes allocated and released on
each stream, with timestamps (host clock in CPU mode; CUDA events, read once per iteration, in
GPU mode); ``scripts/plot_memory_trace.py`` draws it as the paper's Figure 11.
"""
from __future__ import annotations

import csv
import os
import statistics
import sys
import threading
import time
import tracemalloc
import weakref
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from . import nvtx as _nvtx
from .arena import ALIGN, Arena, DeviceArena, HostArena, ScratchReserve, align
from .gmap import (CUDNN_WORKSPACE_LIMIT, DATA, FORWARD, PARAM, SAVED, SCRATCH, build_gmap,
                   net_batch_size)
from .plan import (ALLOCATE, BEFORE, COMPUTE, OFFLOAD, PREFETCH, RECOMPUTE, RELEASE, SETUP,
                   SWAP_IN, SWAP_OUT, BudgetError, Plan, arena_need, make_plan,
                   plan_budget_error, resident_extent)

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

# labels of what runs when no step does (transient accounting, error messages)
OUTSIDE = -1            # between steps: the solver update, user code between iterations
ENV_SCRATCH = "MINICAFFE_SCRATCH"
ENV_STRICT = "MINICAFFE_SCRATCH_STRICT"


class ResidencyError(RuntimeError):
    """An operation illegal in a buffer's current residency state."""


class ScratchOverflow(BudgetError):
    """A CuPy allocation the scratch reserve cannot hold (or a dry run that measured more
    transient memory than the reserve has).  ``min_budget`` is a budget that would work;
    ``scratch`` a reserve that would (bytes, None if unknown); ``peak`` the transient peak the
    dry run measured (None when the overflow happened after it)."""

    def __init__(self, message, *, scratch=None, peak=None, **kw):
        super().__init__(message, **kw)
        self.scratch = scratch
        self.peak = peak


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
def _overridden(streams, name: str, args):
    """``(method, args)`` where the instance's ``name`` was replaced (a test's or a timer's
    wrapper: the compiled iteration goes through it too), else None."""
    fn = vars(streams).get(name)
    return None if fn is None else (fn, args)


class Streams:
    """What the executor asks of its streams: ``event``, ``record``, ``wait``, ``copy``,
    ``fill``, ``synchronize``, and for the compiled iteration (``Executor._compile``) each of
    ``wait`` / ``record`` / ``copy`` / ``fill`` as a ``(function, args)`` primitive (None:
    nothing to do), by default the method itself; subclasses resolve them further."""

    def wait_action(self, stream: str, event):
        return self.wait, (stream, [event])

    def record_action(self, event, stream: str):
        return self.record, (event, stream)

    def copy_action(self, dst, src, stream: str):
        return self.copy, (dst, src, stream)

    def fill_action(self, device: DeviceArena, offset: int, nbytes: int, stream: str):
        return self.fill, (device, offset, nbytes, stream)


class HostStreams(Streams):
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

    # the compiled iteration's primitives, ``(function, args)`` or None (Executor._compile)
    def wait_action(self, stream: str, event):
        return _overridden(self, "wait", (stream, [event]))

    def record_action(self, event, stream: str):
        return _overridden(self, "record", (event, stream))

    def copy_action(self, dst, src, stream: str):
        return _overridden(self, "copy", (dst, src, stream)) or (np.copyto, (dst, src))

    def fill(self, device: DeviceArena, offset: int, nbytes: int, stream: str):
        device.fill(offset, nbytes)

    def synchronize(self):
        pass


class CudaStreams(Streams):  # pragma: no cover - exercised on the GPU machine only
    """GPU mode: compute is the current stream; swap-out and swap-in are non-blocking streams."""

    gpu = True

    def __init__(self, cupy):
        self.cp = cupy
        self.streams = {COMPUTE: cupy.cuda.get_current_stream(),
                        SWAP_OUT: cupy.cuda.Stream(non_blocking=True),
                        SWAP_IN: cupy.cuda.Stream(non_blocking=True)}
        rt = cupy.cuda.runtime
        self._memcpy = rt.memcpyAsync
        self._d2h = getattr(rt, "memcpyDeviceToHost", 2)      # cudaMemcpyKind values
        self._h2d = getattr(rt, "memcpyHostToDevice", 1)

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
        """Asynchronous copy between a device region and a pinned host region (uint8 arrays,
        both contiguous): one ``cudaMemcpyAsync`` on ``stream``, no synchronization."""
        fn, args = self._memcpy_call(dst, src, stream)
        fn(*args)

    def _memcpy_call(self, dst, src, stream: str):
        s = self.streams[stream]
        if isinstance(dst, np.ndarray):          # device -> host, into pinned memory
            return self._memcpy, (dst.ctypes.data, src.data.ptr, src.nbytes, self._d2h, s.ptr)
        return self._memcpy, (dst.data.ptr, src.ctypes.data, dst.nbytes, self._h2d, s.ptr)

    # the compiled iteration's primitives: the runtime's own calls on raw handles, resolved
    # once (Executor._compile); the events and arrays outlive the executor's tables
    def wait_action(self, stream: str, event):
        return (_overridden(self, "wait", (stream, [event]))
                or (self.cp.cuda.runtime.streamWaitEvent, (self.streams[stream].ptr,
                                                           event.ptr, 0)))

    def record_action(self, event, stream: str):
        return (_overridden(self, "record", (event, stream))
                or (self.cp.cuda.runtime.eventRecord, (event.ptr, self.streams[stream].ptr)))

    def copy_action(self, dst, src, stream: str):
        return (_overridden(self, "copy", (dst, src, stream))
                or self._memcpy_call(dst, src, stream))

    def fill(self, device: DeviceArena, offset: int, nbytes: int, stream: str):
        """Poison ``[offset, offset + nbytes)`` with 0xFF bytes, in order on ``stream``."""
        device.fill_async(offset, nbytes, self.streams[stream])

    def fill_action(self, device: DeviceArena, offset: int, nbytes: int, stream: str):
        """:meth:`fill` with the stream resolved now (a capture compiles its own tables)."""
        return device.fill_async, (offset, nbytes, self.streams[stream])

    def synchronize(self):
        for s in self.streams.values():
            s.synchronize()


# ----------------------------------------------------------------- backlog
class Backlog:
    """How far the device runs behind the host through one iteration, at every ``every``-th
    step of the compiled iteration (and its last): after step j is issued, a timing event on
    the compute stream and the host's clock.  Read after the iteration has synchronized,
    ``b_j = (device time from the first probe to probe j) - (host time between their
    issues)``: it grows while the host issues faster than the device runs (the device is the
    bottleneck; it stays below the launch queue's depth) and stays near zero, or falls, while
    the device waits for the host's launches (the host is the bottleneck).

    The iteration's CPU time of the host thread cannot tell the two apart: a thread that
    waits for room in a full launch queue spends CPU as one that works.  GPU mode only (the
    CPU mode's streams have no events); 46 events per ResNet-152 iteration (1,441 steps) at
    ``every`` 32."""

    def __init__(self, streams, n_steps: int, every: int = 32):
        if every < 1:
            raise ValueError(f"Backlog: every must be >= 1, got {every}")
        self.streams = streams
        self.steps = frozenset(set(range(0, n_steps, every)) | {n_steps - 1})
        self.events = {j: streams.event(timing=True) for j in sorted(self.steps)}
        self.host: dict = {}

    def mark(self, j: int):
        self.streams.record(self.events[j], COMPUTE)
        self.host[j] = time.perf_counter()

    def read(self) -> list:
        """``[(host seconds since the first probe, device seconds since it)]`` of the probes
        of the last iteration, in step order (its events must be complete); [] if none."""
        js = sorted(self.host)
        if not js:
            return []
        elapsed = self.streams.cp.cuda.get_elapsed_time
        e0, h0 = self.events[js[0]], self.host[js[0]]
        out = [(self.host[j] - h0, elapsed(e0, self.events[j]) / 1e3) for j in js]
        self.host = {}
        return out


def backlog_summary(points) -> dict:
    """``gpu_backlog_s`` (median over the probes after the first) and ``gpu_backlog_max_s`` of
    :meth:`Backlog.read`'s points: device seconds minus host seconds since the first probe.
    Empty with fewer than two points."""
    b = [dev - host for host, dev in points[1:]]
    if not b:
        return {}
    return {"gpu_backlog_s": statistics.median(b), "gpu_backlog_max_s": max(b)}


# ----------------------------------------------------------------- trace
class MemoryTrace:
    """CSV rows per step: bytes allocated / released per stream, offloaded, prefetched, held."""

    FIELDS = ("iteration", "step", "layer", "phase", "t_start_ms", "t_end_ms",
              "allocated_compute", "allocated_swap_in", "released_compute", "released_swap_out",
              "offloaded", "prefetched", "in_use", "high_water", "t_ready_ms")

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


# ------------------------------------------------------------ transients
class TransientMeter:
    """Peak bytes of transient allocations per step: the dry run.

    GPU: a CuPy memory hook counts every allocation and free made through CuPy's pools (ours
    or CuPy's default), by pooled-memory identity.  CPU: ``tracemalloc`` (NumPy reports its
    array data to it), reset at every label.  The value recorded for a label is the largest
    number of bytes held, at any moment while that label ran, by allocations made since
    :meth:`start`: what the scratch reserve must hold then.

    ``label(key)`` switches what is running: a step index, :data:`OUTSIDE`, or ``("test", i)``.
    """

    def __init__(self, gpu: bool, cp=None):
        self.gpu = gpu
        self.cp = cp
        self.active = False
        self.peaks: dict = {}
        self._key = OUTSIDE
        self._hook = None
        self._live: dict = {}
        self._cur = 0
        self._lpeak = 0
        self._base = 0
        self._started_tracing = False
        self._thread = None

    def start(self):
        if self.active:
            return
        self._thread = threading.get_ident()
        if self.gpu:  # pragma: no cover - GPU machine only
            self._hook = _transient_hook(self.cp, self)
            self._hook.__enter__()
        else:
            self._started_tracing = not tracemalloc.is_tracing()
            if self._started_tracing:
                tracemalloc.start()
            self._base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
        self.active = True

    # GPU hook callbacks
    def _alloc(self, key, nbytes):  # pragma: no cover - GPU machine only
        self._live[key] = nbytes
        self._cur += nbytes
        if self._cur > self._lpeak:
            self._lpeak = self._cur

    def _free(self, key):  # pragma: no cover - GPU machine only
        self._cur -= self._live.pop(key, 0)

    def label(self, key):
        if self.gpu:
            p = self._lpeak
            self._lpeak = self._cur
        else:
            p = max(0, tracemalloc.get_traced_memory()[1] - self._base)
            tracemalloc.reset_peak()
        k = self._key
        if p > self.peaks.get(k, -1):
            self.peaks[k] = p
        self._key = key

    def stop(self) -> dict:
        if not self.active:
            return dict(self.peaks)
        self.label(self._key)
        self._end()
        return dict(self.peaks)

    def abandon(self):
        """Stop measuring without recording: the owner was collected in its dry run, never
        closed (:class:`Executor` registers this with ``weakref.finalize``).  On the CPU this
        stops the ``tracemalloc`` tracing that :meth:`start` began, which would otherwise stay
        on for the rest of the process and make every later step 3 to 7 times slower (found
        in the test suite, session 40).  CuPy's memory hooks are per thread: a GPU hook is
        left only from the thread that entered it (a collection on another thread leaves it
        to that thread's next :meth:`stop`)."""
        if self.active and (not self.gpu or threading.get_ident() == self._thread):
            self._end()

    def _end(self):
        """Leave the GPU hook, or stop the tracing this meter began."""
        if self.gpu:  # pragma: no cover - GPU machine only
            self._hook.__exit__(None, None, None)
            self._hook = None
            self._live.clear()
        elif self._started_tracing:
            tracemalloc.stop()
        self.active = False


def _transient_hook(cp, meter):  # pragma: no cover - GPU machine only
    """A CuPy MemoryHook feeding ``meter`` (allocations and frees of pooled memory)."""
    base = getattr(cp.cuda, "MemoryHook", None)
    if base is None:
        import importlib
        base = importlib.import_module("cupy.cuda.memory_hook").MemoryHook

    class _Hook(base):
        name = f"minicaffe.swap.transients.{id(meter)}"     # one per meter

        def malloc_postprocess(self, **kw):
            if kw.get("mem_ptr"):
                meter._alloc(kw.get("pmem_id"), kw.get("mem_size", 0))

        def free_postprocess(self, **kw):
            meter._free(kw.get("pmem_id"))

    return _Hook()


@dataclass(frozen=True)
class TransientProfile:
    """What a dry run measured: bytes the scratch reserve must hold, per step and between.

    per_step[j]: peak during step j; outside: between steps (solver update, user code);
    tests: peak during each test net's passes; layout: the arena layout the run used.
    """
    per_step: tuple
    outside: int
    tests: tuple
    layout: "ArenaLayout"
    names: tuple = field(default=(), repr=False)

    @property
    def peak(self) -> int:
        return max((*self.per_step, self.outside, *self.tests), default=0)

    @property
    def peak_where(self) -> str:
        p = self.peak
        for j, v in enumerate(self.per_step):
            if v == p:
                return self.names[j] if self.names else f"step {j}"
        if self.outside == p:
            return "between steps (solver update)"
        return "a test net's forward pass"

    def reserve(self, margin: float = 0.10, slack: int = 16 << 20) -> int:
        """A scratch reserve for this need: the peak plus ``margin`` of it plus ``slack``
        bytes (the pool that serves CuPy keeps chunks, which fragments a little)."""
        return align(int(self.peak * (1 + margin)) + slack)

    def budget(self, margin: float = 0.10, slack: int = 16 << 20) -> int:
        """The smallest budget with this reserve: the plan, the test nets, then the reserve."""
        return self.layout.scratch_base + self.reserve(margin, slack)


# ------------------------------------------------------------- allocator
_INSTALLED: list = []               # scratch allocators installed in CuPy now (at most one)


class _RegionFunctions:  # pragma: no cover - GPU machine only
    """malloc/free of raw pointers in the reserve, for ``PythonFunctionAllocator``: called
    by the CuPy pool only when it needs a new chunk (or gives cached ones back), never per
    allocation.  Holds the arena's memory, so chunks still alive after the executor is gone
    stay valid.

    A chunk the reserve cannot hold is first refused with the runtime's out-of-memory
    status, on which CuPy's pool gives its cached free chunks back (they merge in the
    reserve) and asks again; refused a second time in a row, it goes to ``overflow(size)``,
    which raises :class:`ScratchOverflow` or returns a chunk of CuPy's own pool (kept here
    until the pool frees it)."""

    def __init__(self, cp, reserve: ScratchReserve, base_ptr: int, owner, overflow):
        self.reserve = reserve
        self.base_ptr = base_ptr
        self.owner = owner
        self.overflow = overflow
        rt = cp.cuda.runtime
        self.no_room = lambda: rt.CUDARuntimeError(getattr(rt, "errorMemoryAllocation", 2))
        self.refused = None              # size of the chunk refused last (the pool retries)
        self.fallback = {}               # ptr -> MemoryPointer of CuPy's pool

    def malloc(self, nbytes, device_id):
        off = self.reserve.malloc(nbytes)
        if off is not None:
            self.refused = None
            return self.base_ptr + off
        if self.refused != nbytes:
            self.refused = nbytes
            raise self.no_room()
        self.refused = None
        mp = self.overflow(nbytes)
        self.fallback[mp.ptr] = mp
        return mp.ptr

    def free(self, ptr, device_id):
        if self.fallback.pop(ptr, None) is None:
            self.reserve.free(ptr - self.base_ptr)


class ScratchAllocator:  # pragma: no cover - exercised on the GPU machine only
    """The CuPy allocator installed while an executor runs: a CuPy memory pool (per-stream
    free lists, splitting) whose chunks are carved from the scratch reserve of the arena.
    CuPy calls the pool's own ``malloc`` (``self.malloc``), so an allocation costs what it
    costs with CuPy's default pool: no Python on the way unless a new chunk is needed
    (:class:`_RegionFunctions`).  When no chunk fits, the pool's cached free chunks go back to
    the reserve and the allocation is retried once; then it overflows: :class:`ScratchOverflow`
    in strict mode, else CuPy's default pool with a logged warning.  During the dry run
    (``permissive``) an overflow always falls back and is counted.

    ``describe(where)`` turns the reserve's ``where`` label into words for messages; it must
    not hold the executor (this object outlives nothing, but CuPy holds it while installed).
    """

    def __init__(self, cp, device: DeviceArena, reserve: ScratchReserve, *, strict: bool,
                 describe, budget_hint):
        self.cp = cp
        self.reserve = reserve
        self.strict = strict
        self.permissive = False
        self.describe = describe
        self.budget_hint = budget_hint
        fns = self._fns = _RegionFunctions(cp, reserve, device.ptr + reserve.base,
                                           device._memory, self._overflow)
        self._inner = cp.cuda.memory.PythonFunctionAllocator(fns.malloc, fns.free)
        self.pool = cp.cuda.MemoryPool(self._inner.malloc)
        self.malloc = self.pool.malloc
        self.fallbacks = 0
        self.fallback_bytes = 0
        self.fallback_where: dict = {}
        self._prev = None
        self.installed = False

    def _overflow(self, size):
        r = self.reserve
        where = self.describe(r.where)
        if self.strict and not self.permissive:
            from .memory import fmt_bytes
            need = r.base + r.in_use + align(size)
            raise ScratchOverflow(
                f"scratch reserve exhausted {where}: CuPy asked for {fmt_bytes(size)}, the "
                f"reserve holds {fmt_bytes(r.capacity)} ({fmt_bytes(r.in_use)} in use in "
                f"{r.live} chunks). Every device allocation of training comes from the budget: "
                f"give a budget of at least {fmt_bytes(max(need, self.budget_hint()))} "
                f"(or more scratch=), or strict=False to let such allocations fall back to "
                f"CuPy's pool outside the budget", min_budget=need,
                scratch=align(r.in_use + align(size))) from None
        self.fallbacks += 1
        self.fallback_bytes += int(size)
        if r.where not in self.fallback_where and not self.permissive:
            from .memory import fmt_bytes
            from minicaffe.log import log
            log(f"scratch reserve ({fmt_bytes(r.capacity)}) full {where}: {fmt_bytes(size)} "
                f"from CuPy's pool, outside the budget", level="W", where="swap")
        self.fallback_where[r.where] = self.fallback_where.get(r.where, 0) + int(size)
        return self.cp.get_default_memory_pool().malloc(size)

    def trim(self):
        """Give chunks that overflowed to CuPy's pool back once they are free (the pool would
        otherwise serve later allocations from them, outside the budget and uncounted): at
        the end of the dry run and after every iteration that overflowed."""
        if self._fns.fallback:
            self.pool.free_all_blocks()

    def install(self):
        if self.installed:
            return
        self._prev = self.cp.cuda.get_allocator()
        self.cp.cuda.set_allocator(self.malloc)
        self.installed = True
        _INSTALLED.append(self)

    def uninstall(self):
        if not self.installed:
            return
        self.cp.cuda.set_allocator(self._prev)
        self._prev = None
        self.installed = False
        if self in _INSTALLED:
            _INSTALLED.remove(self)
        self.pool.free_all_blocks()


# ---------------------------------------------------------------- layout
@dataclass(frozen=True)
class ArenaLayout:
    """Where everything lives in the device arena (module doc).  All offsets in bytes."""
    capacity: int
    resident: int               # R: [0, R) holds the plan's resident buffers
    plan_extent: int            # E: the plan's layout ends here (plan.arena_bytes)
    test_dynamic: int           # Td: the test nets' per-pass buffers at [R, R + Td)
    test_persistent_base: int   # P
    test_persistent: int        # Tp
    scratch_base: int           # S = P + Tp: the reserve starts here

    @property
    def scratch(self) -> int:
        """Bytes of the scratch reserve."""
        return self.capacity - self.scratch_base


def arena_layout(plan: Plan, capacity: int | None = None, *, test_dynamic: int = 0,
                 test_persistent: int = 0, scratch: int = 0) -> ArenaLayout:
    """The arena layout of ``plan`` with the test nets' bytes and a scratch reserve; capacity
    None: exactly what they need (``scratch_base + scratch``)."""
    resident = resident_extent(plan)
    e = plan.arena_bytes
    p = arena_need(plan, test_dynamic)
    s = p + align(test_persistent)
    cap = s + align(scratch) if capacity is None else int(capacity)
    return ArenaLayout(capacity=cap, resident=resident, plan_extent=e,
                       test_dynamic=int(test_dynamic), test_persistent_base=p,
                       test_persistent=align(test_persistent), scratch_base=s)


# ------------------------------------------------------------- test nets
def _test_net_layout(net, shared: set) -> tuple:
    """A test net's buffers in the train arena (:class:`TestNetMemory`): (persistent items,
    their bytes, per-pass items, the per-pass high water).  An item is [target, aligned
    bytes, raw bytes, dtype, offset, name] (offsets from 0; per-pass items also carry their
    first and last forward step, laid out best fit by liveness).  ``shared``: ids of the
    storages the train net's plan backs (shared parameters), left out."""
    net.reshape()
    g = build_gmap(net)
    persistent, dynamic = [], []
    for b in g.buffers:
        if b.kind not in (DATA, SAVED, SCRATCH, PARAM) or not b.ref:
            continue
        t = _target(net, b.ref)
        if id(_storage(t)) in shared:
            continue                        # the train net's (shared parameters)
        raw = b.nbytes(g.k)
        size = align(raw)
        if size == 0:
            continue
        item = [t, size, raw, np.dtype(b.dtype), -1, b.name]
        if b.persistent:
            persistent.append(item)
        elif b.forward_uses:
            item.append((b.forward_uses[0], b.forward_uses[-1]))
            dynamic.append(item)
    off = 0
    for item in persistent:
        item[4] = off
        off += item[1]
    starts, ends = {}, {}
    for item in dynamic:
        starts.setdefault(item[6][0], []).append(item)
        ends.setdefault(item[6][1], []).append(item)
    a = Arena(sum(it[1] for it in dynamic) + ALIGN)
    for j in range(len(net.layers)):
        for item in sorted(starts.get(j, []), key=lambda it: -it[1]):
            item[4] = a.allocate(item[1])
        for item in ends.get(j, []):
            a.free(item[4])
    return persistent, off, dynamic, a.high_water


def _target(net, ref, solver=None):
    """What a GMAP buffer backs in ``net``: (blob, "data"|"diff"), ("history", list, i), None."""
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
        if solver is None:
            return None
        return ("history", solver.rule.history_slots()[ref[2]], ref[1])
    raise ValueError(f"unknown buffer reference {ref!r}")


def _storage(target):
    blob, which = target
    return blob.data_storage if which == "data" else blob.diff_storage


class TestNetMemory:
    """A test net's forward passes inside the train executor's arena.

    The test net's own buffers (blob data, forward internals, parameters it does not share
    with the train net) come from its GMAP: persistent ones (outputs, Input and DummyData tops,
    unshared parameters) get fixed regions at ``[P, P + Tp)`` for the whole run; the others
    are laid out once by liveness over the forward steps (best fit, replayed through
    :class:`swap.arena.Arena`) and bound to ``[R, R + Td)`` while a test pass runs: between
    training iterations, when the plan's per-iteration regions are all free.  Training
    releases them when it resumes; an access to them outside a test pass raises.

    Set as the test net's ``executor``: ``Net.forward_from_to`` delegates whole forward passes
    here (partial passes are refused, as for the train net).
    """

    __test__ = False                        # not a pytest class, despite its name

    def __init__(self, ex: "Executor", net, index: int, shared: set):
        self.ex = ex
        self.net = net
        self.index = index
        self.plan = ex.plan                     # Net's error message names the strategy
        self.n_layers = len(net.layers)
        # [target, nbytes(aligned), raw, dtype, offset, name(, (first, last) forward step)]
        (self.persistent, self.persistent_bytes,
         self.dynamic, self.dynamic_bytes) = _test_net_layout(net, shared)
        self._views = None
        self.bound = False
        self._names = tuple(f"test{index} fwd {n}" for n in net.layer_names)

    # ---- called by the executor
    def attach(self, dyn_base: int, pers_base: int):
        """Bind the persistent buffers for good (contents copied in), detach the others."""
        ex = self.ex
        self.dyn_base = dyn_base
        for item in self.persistent:
            t, size, raw, dtype, off = item[:5]
            off += pers_base
            item[4] = off
            ex.device.allocate(size, off)
            view = ex.device.view(off, raw, dtype)
            st = _storage(t)
            if st.array is not None:
                view[...] = st.array[:view.size]
            else:
                view[...] = 0
            (t[0].bind_data if t[1] == "data" else t[0].bind_diff)(view)
        for item in self.dynamic:
            item[4] += dyn_base
            st = _storage(item[0])
            st.array = None
            st.external = True
        self.net.executor = self

    def bind(self):
        """Take ``[R, R + Td)`` for a test pass (one region: the buffers inside share it by
        liveness) and bind the per-pass buffers to their places in it."""
        ex = self.ex
        if ex._bound_test is self:
            return
        if ex._bound_test is not None:
            ex._bound_test.unbind()
        st = ex.streams
        st.wait(COMPUTE, ex._end_wait)          # the plan's swap streams are done with it
        if self._views is None:
            self._views = [ex.device.view(it[4], it[2], it[3]) for it in self.dynamic]
        if self.dynamic_bytes:
            ex.device.allocate(self.dynamic_bytes, self.dyn_base)
            if ex.poison:
                st.fill(ex.device, self.dyn_base, self.dynamic_bytes, COMPUTE)
        for item, view in zip(self.dynamic, self._views):
            t = item[0]
            (t[0].bind_data if t[1] == "data" else t[0].bind_diff)(view)
        ex._bound_test = self
        self.bound = True

    def unbind(self):
        ex = self.ex
        for item in self.dynamic:
            t = item[0]
            (t[0].release_data if t[1] == "data" else t[0].release_diff)()
        if self.dynamic_bytes:
            ex.device.free(self.dyn_base)
        if ex._bound_test is self:
            ex._bound_test = None
        self.bound = False

    def forward(self):
        """One whole forward pass of the test net (Net.forward_from_to delegates here)."""
        ex = self.ex
        self.bind()
        net = self.net
        sc, meter, nv = ex._labels()
        key = ("test", self.index)
        if sc is not None:
            sc.where = key
        if meter is not None:
            meter.label(key)
        loss = 0.0
        for li in range(self.n_layers):
            if nv is not None:
                nv.push(self._names[li])
            loss = loss + net.forward_layer(li)
            if nv is not None:
                nv.pop()
        if sc is not None:
            sc.where = OUTSIDE
        if meter is not None:
            meter.label(OUTSIDE)
        return loss

    def close(self):
        """Give the test net its own arrays back (persistent contents copied out)."""
        if self.bound:
            self.unbind()
        xp = self.net.xp
        for item in self.persistent:
            st = _storage(item[0])
            if st.array is not None:
                st.array = xp.array(st.array, copy=True)
            st.external = False
        for item in self.dynamic:
            st = _storage(item[0])
            st.array = None
            st.external = False
        self.net.drop_views()
        if getattr(self.net, "executor", None) is self:
            self.net.executor = None


# --------------------------------------------------------------- executor
_OPEN = weakref.WeakSet()          # executors not closed yet (close_all, allocator hand-over)


class Executor:
    """Runs ``net``'s forward and backward passes under ``plan`` inside a budget-sized arena.

    Args:
        net: the built Net the plan was made for (same layers, same minibatch).
        plan: a :class:`swap.plan.Plan`.
        budget: arena capacity in bytes (default: the plan's budget, else exactly what the
            plan, the test nets and ``scratch`` need).
        solver: optional Solver whose history blobs move into the arena too.
        trace: optional path of a CSV memory trace.
        poison: fill every freshly allocated or released region with 0xFF bytes (NaN, -1), on
            the region's stream in GPU mode, so that reading memory the plan does not
            guarantee shows up in the results.
        scratch: bytes the scratch reserve must hold at least (default: whatever the budget
            leaves; 0 without a budget).  In GPU mode without a budget and without scratch,
            CuPy allocations stay in CuPy's pool and are only measured.
        strict: GPU: an allocation the reserve cannot hold raises :class:`ScratchOverflow`;
            False: it falls back to CuPy's pool with a logged warning (default:
            ``$MINICAFFE_SCRATCH_STRICT``, else True).
        measure: iterations of the dry run (transients counted per step); 0: none.
        nvtx: NVTX ranges (default: ``MINICAFFE_NVTX``).
        test_nets: nets whose forward passes share the arena (default: the solver's).
        fast: run steady-state iterations from the compiled tables (:meth:`_compile`);
            False: every iteration issues the plan op by op.

    Install with :func:`install` (or set ``net.executor``); ``Net.forward_backward`` then
    delegates here.
    """

    def __init__(self, net, plan: Plan, *, budget: int | None = None, solver=None,
                 trace: str | None = None, poison: bool = False, scratch: int | None = None,
                 strict: bool | None = None, measure: int = 1, nvtx: bool | None = None,
                 test_nets=None, fast: bool = True):
        g = plan.gmap
        if g.n_layers != len(net.layers) or g.layer_names != tuple(net.layer_names):
            raise ValueError(f"the plan was made for net {g.net_name!r} with {g.n_layers} layers, "
                             f"not for net {net.name!r} with {len(net.layers)} layers")
        if g.k != net_batch_size(net):
            raise ValueError(f"the plan is for minibatch {g.k}, net {net.name!r} has minibatch "
                             f"{net_batch_size(net)}")
        if budget is None:
            budget = plan.budget
        self.net = net
        self.plan = plan
        self.gmap = g
        self.solver = solver
        self.poison = bool(poison)
        self.fast = bool(fast)
        self.strict = default_strict() if strict is None else bool(strict)
        self.measure = max(0, int(measure))
        xp = net.xp
        gpu = net.mode == "GPU"
        self._targets = [_target(net, b.ref, solver) for b in g.buffers]

        # ---- the test nets and the layout of the arena
        if test_nets is None:
            test_nets = list(getattr(solver, "test_nets", ()) or ())
        shared = {id(_storage(t)) for t in self._targets if t is not None and t[0] != "history"}
        self.tests = [TestNetMemory(self, t, i, shared) for i, t in enumerate(test_nets)]
        t_dyn = max((t.dynamic_bytes for t in self.tests), default=0)
        t_pers = sum(t.persistent_bytes for t in self.tests)
        need = arena_layout(plan, None, test_dynamic=t_dyn, test_persistent=t_pers,
                            scratch=scratch or 0)
        capacity = need.capacity if budget is None else int(budget)
        if need.capacity > capacity:
            what = f"plan {plan.strategy!r} needs an arena of {plan.arena_bytes} bytes"
            if self.tests:
                what += f", its test nets {need.scratch_base - plan.arena_bytes} more"
            if scratch:
                what += f", the scratch reserve {align(scratch)}"
            raise BudgetError(f"{what}: {need.capacity} bytes in all, the budget is {capacity}",
                              budget=capacity, min_budget=need.capacity,
                              strategy=plan.strategy, k=g.k)
        self.layout = arena_layout(plan, capacity, test_dynamic=t_dyn, test_persistent=t_pers)
        self.budget = capacity
        self.streams = CudaStreams(xp) if gpu else HostStreams()
        # The two arenas, allocated once (section 5).  CPU mode backs what the plan and the
        # test nets reach; GPU mode the whole budget (the reserve included).
        self.device = DeviceArena(capacity, xp, backing_bytes=self.layout.scratch_base)
        self.host = HostArena(plan.host_bytes, xp)
        self.scratch = ScratchReserve(self.layout.scratch_base, self.layout.scratch)
        self.residency = Residency(b.name for b in g.buffers)
        self.iterations = 0
        self.trace = MemoryTrace(trace) if trace else None
        self._nv = _nvtx.ranges(nvtx)
        self._graph_wanted = False        # use_graph: full passes as one CUDA graph
        self._graph = None                # its swap.graph.CapturedIteration, once built
        self.graph_refused = None         # why the graph was refused (logged once)
        self.graph_hooks = []             # objects that take part in the capture (swap.graph)

        self._build_tables()
        for i in self._setup:
            self._do(i, setup=True)
        self._bound_test = None
        for t in self.tests:
            t.attach(self.layout.resident, self.layout.test_persistent_base)

        # ---- the scratch allocator (GPU) and the dry run
        self._allocator = None
        if gpu and (budget is not None or scratch is not None):  # pragma: no cover - GPU only
            names = self._where_names()
            self._allocator = ScratchAllocator(
                xp, self.device, self.scratch, strict=self.strict,
                describe=lambda w, names=names: _describe(names, w),
                budget_hint=_weak_call(self._budget_hint, 0))
            for other in list(_OPEN):
                if other._allocator is not None and other._allocator.installed:
                    from minicaffe.log import log
                    log(f"executor of net {other.net.name!r} was not closed: closing it before "
                        f"installing the scratch allocator of net {net.name!r}", level="W",
                        where="swap")
                    other.close()
            for orphan in reversed(list(_INSTALLED)):   # of executors collected unclosed
                orphan.uninstall()
            self._allocator.permissive = self.measure > 0
            self._allocator.install()
        self.transients = None
        self._meter = TransientMeter(gpu, xp if gpu else None) if self.measure else None
        _OPEN.add(self)
        if self._meter is not None:
            self._meter.start()
            # an executor collected in its dry run, never closed, stops its meter
            weakref.finalize(self, self._meter.abandon)

    # ------------------------------------------------------------ tables
    def _build_tables(self):
        """Everything the per-iteration loop needs, computed once (module doc)."""
        g, plan, st = self.gmap, self.plan, self.streams
        ops = self._ops = plan.ops
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
        # a step checks the residency of what it touches, resident buffers excepted, and
        # empty ones (a cuDNN workspace of zero bytes at this k), which no plan places
        skip = self._resident | {b.id for b in g.buffers if b.nbytes(g.k) == 0}
        self._check = [tuple(b for b in t if b not in skip) for t in self._touches]
        self._dynamic = tuple(sorted({op.buffer for op in ops
                                      if op.step != SETUP and op.kind != RECOMPUTE}
                                     - self._resident))
        self._fwd = [s.phase == FORWARD for s in g.steps]
        self._layer = [s.layer for s in g.steps]
        self._raw = [b.nbytes(g.k) for b in g.buffers]
        self._dtype = [np.dtype(b.dtype) for b in g.buffers]
        self._binders = [None] * len(g.buffers)
        self._releasers = [None] * len(g.buffers)
        for bid, t in enumerate(self._targets):
            if t is not None and t[0] != "history":
                blob, which = t
                self._binders[bid] = blob.bind_data if which == "data" else blob.bind_diff
                self._releasers[bid] = (blob.release_data if which == "data"
                                        else blob.release_diff)
        self._views = [None] * len(ops)        # per op: the typed view of its region
        self._copies = [None] * len(ops)       # per copy op: (dst, src)
        # events, created once and re-recorded every iteration (GPU); None in CPU mode
        gpu_poison = st.gpu and self.poison
        self._op_event = [st.event() if (op.kind in (OFFLOAD, PREFETCH)
                                         or (gpu_poison and op.kind == RELEASE)) else None
                          for op in ops]
        self._step_event = [st.event() for _ in range(n)]
        self._start_event = st.event()
        self._end_events = [e for e in (st.event(), st.event()) if e is not None]
        self._end_wait = []                # the end events, once recorded (GPU)
        used = set()

        def free_event(d):
            o = ops[d]
            if o.kind == OFFLOAD:
                return self._op_event[d]
            if gpu_poison:                       # after the poisoning of the region
                return self._op_event[d]
            if o.stream == SWAP_OUT:             # a release after an offload
                return self._op_event[o.after[0]]
            used.add(o.wait_step)
            return self._step_event[o.wait_step]

        self._waits = [()] * len(ops)
        for i, op in enumerate(ops):
            if op.kind == ALLOCATE:
                # compute is in order with itself: wait only on regions freed by swap-out
                deps = [d for d in op.after if ops[d].stream != COMPUTE]
            elif op.kind == PREFETCH:
                deps = list(op.after)
            elif op.kind == OFFLOAD:
                used.add(op.wait_step)
                self._waits[i] = (self._step_event[op.wait_step],)
                continue
            else:
                continue
            self._waits[i] = tuple(e for e in (free_event(d) for d in deps) if e is not None)
        self._record = [j in used for j in range(n)]
        # what the per-iteration loop calls: per step, (issue method of the op's kind, op index),
        # resolved here once instead of dispatching on the kind per op and iteration; with NVTX
        # ranges, every op goes through _do, which marks it
        self._issue = {ALLOCATE: self._allocate, PREFETCH: self._prefetch,
                       OFFLOAD: self._offload, RELEASE: self._release,
                       RECOMPUTE: self._recompute_op}
        for op in ops:
            if op.step != SETUP and op.kind not in self._issue:
                raise ValueError(f"unknown op kind {op.kind!r}")
        self._own_issue = dict(self._issue)
        self._recomputes = any(op.kind == RECOMPUTE for op in ops)
        self._build_issue_tables()
        self._prefetch_event = {}          # buffer -> event of its in-flight prefetch
        self._offset = {}                  # buffer -> offset of the region it holds now
        self._replay = True                # replay the arena bookkeeping (first iteration)
        self._force_replay = False
        names = [b.name for b in g.buffers]
        self._step_names = [f"{'fwd' if s.phase == FORWARD else 'bwd'} {s.name}"
                            for s in g.steps]
        self._op_names = [f"{op.kind} " + (self._step_names[op.source] if op.kind == RECOMPUTE
                                           else names[op.buffer]) for op in ops]
        self._detach_dynamic()

    def _build_issue_tables(self):
        """Per step, the (issue method, op index) pairs the loop calls, from ``self._issue``
        (a profiler that wraps entries of it calls this again, and again to remove them)."""
        ops = self._ops
        self._compiled = None             # the compiled iteration follows the tables
        self.backlog = None               # a Backlog the compiled iteration marks (or None)
        if getattr(self, "_graph", None) is not None:
            self._graph.reset()           # captured again from the new tables
        if self._nv is not None:
            fn = lambda i: self._do                         # noqa: E731
        else:
            fn = lambda i: self._issue[ops[i].kind]         # noqa: E731
        self._issue_before = [tuple((fn(i), i) for i in b) for b in self._before]
        self._issue_after = [tuple((fn(i), i) for i in a) for a in self._after]

    # ------------------------------------------------------------ binding
    def _resolve(self, b):
        """What a buffer backs in the net: (blob, "data"|"diff"), ("history", list, i), None."""
        return _target(self.net, b.ref, self.solver)

    @staticmethod
    def _storage(target):
        return _storage(target)

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

    def _bind_op(self, i: int, bid: int, offset: int):
        """Bind buffer ``bid`` to the region of op ``i``: the same view object every
        iteration (made on first use), so the blob's own view cache holds."""
        binder = self._binders[bid]
        if binder is None:
            return
        v = self._views[i]
        if v is None:
            v = self._views[i] = self.device.view(offset, self._raw[bid], self._dtype[bid])
        binder(v)

    def _unbind(self, bid: int):
        r = self._releasers[bid]
        if r is not None:
            r()

    def _copy_args(self, i: int, op):
        c = self._copies[i]
        if c is None:
            dev = self.device.region(op.offset, op.nbytes)
            host = self.host.view(op.host_offset, op.nbytes)
            c = self._copies[i] = (dev, host) if op.kind == PREFETCH else (host, dev)
        return c

    # ---------------------------------------------------------------- ops
    def _free_event(self, i: int):
        """The event after which the region released by op ``i`` may be reused."""
        op = self._ops[i]
        if op.kind == OFFLOAD or (self.streams.gpu and self.poison):
            return self._op_event[i]
        if op.stream == SWAP_OUT:                        # a release after an offload
            return self._op_event[op.after[0]]
        return self._step_event[op.wait_step]

    def _do(self, i: int, setup: bool = False):
        """Issue op ``i`` (``setup``: one of the plan's SETUP ops, whose buffer's contents are
        copied into the arena)."""
        nv = self._nv
        if nv is not None:
            nv.push(self._op_names[i])
        if setup:
            op = self._ops[i]
            if op.kind != ALLOCATE:
                raise ValueError(f"setup op {i} is a {op.kind!r}: only allocations run at setup")
            self.device.allocate(op.nbytes, op.offset)
            self._offset[op.buffer] = op.offset
            self.residency.apply(op.buffer, "allocate")
            if self.poison:
                self.streams.fill(self.device, op.offset, op.nbytes, COMPUTE)
            self._bind(op.buffer, op.offset, copy_in=True)
        else:
            self._issue[self._ops[i].kind](i)
        if nv is not None:
            nv.pop()

    # The per-kind issue methods, called per op and per iteration (the host's critical path
    # at small k: keep them to the plan's work).  The arena bookkeeping replays the layout
    # (and so checks it) in the first iteration and in forward-only passes; later iterations
    # only count bytes (module doc).
    def _take_region(self, i: int, stream: str, event: str):
        """The arena side of an allocation or prefetch: claim op ``i``'s region (replayed
        through the arena or only counted), wait on ``stream`` for its previous occupants,
        step the buffer's residency by ``event``."""
        op = self._ops[i]
        if self._replay or self._force_replay:
            self.device.allocate(op.nbytes, op.offset)
        else:
            self.device.in_use += op.nbytes
        self._offset[op.buffer] = op.offset
        w = self._waits[i]
        if w:
            self.streams.wait(stream, w)
        self.residency.apply(op.buffer, event)
        return op

    def _allocate(self, i: int):
        op = self._take_region(i, COMPUTE, "allocate")
        bid = op.buffer
        if self.poison:
            self.streams.fill(self.device, op.offset, op.nbytes, COMPUTE)
        self._bind_op(i, bid, op.offset)

    def _prefetch(self, i: int):
        op = self._take_region(i, SWAP_IN, "prefetch")
        bid = op.buffer
        st = self.streams
        dst, src = self._copy_args(i, op)
        st.copy(dst, src, SWAP_IN)
        ev = self._op_event[i]
        st.record(ev, SWAP_IN)
        self._prefetch_event[bid] = ev
        self._bind_op(i, bid, op.offset)

    def _offload(self, i: int):
        op = self._ops[i]
        st = self.streams
        st.wait(SWAP_OUT, self._waits[i])
        self.residency.apply(op.buffer, "offload")
        dst, src = self._copy_args(i, op)
        st.copy(dst, src, SWAP_OUT)
        st.record(self._op_event[i], SWAP_OUT)

    def _release(self, i: int):
        op = self._ops[i]
        bid = op.buffer
        if self._replay or self._force_replay:
            self.device.free(op.offset)
        else:
            self.device.in_use -= op.nbytes
        del self._offset[bid]
        self.residency.apply(bid, "release")
        r = self._releasers[bid]
        if r is not None:
            r()
        if self.poison:
            # on the region's stream: after its last reader (compute) or its offload
            st = self.streams
            st.fill(self.device, op.offset, op.nbytes, op.stream)
            st.record(self._op_event[i], op.stream)

    def _recompute_op(self, i: int):
        op = self._ops[i]
        self._recompute(op.source, op.step)

    def _ready(self, j: int, before: int | None = None):
        """Before step j computes (or is recomputed before step ``before``): its buffers are
        on the device (waiting on prefetches)."""
        res = self.residency
        state = res.state
        for bid in self._check[j]:
            s = state[bid]
            if s == ON_DEVICE:
                continue
            if s == PREFETCHING:
                self.streams.wait(COMPUTE, [self._prefetch_event.pop(bid, None)])
                res.apply(bid, "ready")
            else:
                what = str(self.gmap.steps[j])
                if before is not None:
                    what = f"the recomputation of {what} before {self.gmap.steps[before]}"
                raise ResidencyError(
                    f"{what} needs buffer {res.names[bid]!r}, which is {s}: the "
                    f"plan {self.plan.strategy!r} did not bring it onto the device")

    def _recompute(self, f: int, j: int):
        """A RECOMPUTE op: forward step ``f`` again, on the compute stream, before step j.

        What it writes was allocated by step j's ALLOCATE ops; what it reads is resident, kept
        or prefetched (waited on here, as a step waits).  A layer with a ``recompute`` flag
        (BatchNorm) runs with it set: its running statistics see each minibatch once."""
        if self._check[f]:
            self._ready(f, before=j)
        li = self._layer[f]
        layer = self.net.layers[li]
        flag = hasattr(layer, "recompute")
        if flag:
            layer.recompute = True
        try:
            self.net.forward_layer(li)
        finally:
            if flag:
                layer.recompute = False

    # ------------------------------------------------------ compiled iteration
    def _compilable(self) -> bool:
        """Whether a full pass may run from the compiled tables: a steady-state iteration (the
        layout replayed and checked once), nothing that observes the ops one by one (NVTX
        ranges, a memory trace, the dry run's meter, a profiler's or a timer's wrappers of the
        issue methods), no recomputation.  Poisoning is compiled too; so are wrappers of the
        streams' ``wait`` / ``record`` / ``copy`` (:func:`_overridden`)."""
        return (self.fast and not self._replay and not self._force_replay
                and self._nv is None and self.trace is None
                and not (self._meter is not None and self._meter.active)
                and not self._recomputes and self._issue == self._own_issue)

    def _compile(self):
        """Per step, what a steady-state iteration does before and after the layer, resolved
        once: ``(calls, binds)`` each side.  ``calls``: ``(function, args)`` of the stream
        waits, copies, event records (and poisoning fills) of the plan's ops, raw runtime calls
        on the GPU, and the compute stream's waits on the prefetches the step reads.
        ``binds``: ``(storage, view or None)``, the blobs' binds and releases as plain
        assignments of their storage (the first iteration checked the views through
        ``Blob.bind_data``; ``external`` stays set), in op order.  Binds touch no device
        memory, so doing a side's calls before its binds keeps every device operation in
        plan order.

        Every full iteration issues the same operations on the same regions (the plan is
        fixed), so what the op-by-op loop decides per op and iteration (its residency checks
        and state, the byte counts, which prefetch a step waits for) is decided here once.
        The residency states are not stepped: a full pass leaves every per-iteration buffer
        FREED, where it found them, and the op-by-op loop checked that in the first
        iteration.  On the GPU this cuts the executor's own host time per iteration by half
        or more, the critical path when the host, not the device, bounds the iteration
        (deep nets at small k)."""
        st, ops = self.streams, self._ops
        prefetching = {}                  # buffer -> (issue rank, op) of an unawaited prefetch
        issued = [0]                      # prefetches compiled so far, in swap-in stream order
        # an allocation's waits on offloads issued earlier in the iteration are coalesced like
        # the prefetches' (the swap-out stream runs its copies in issue order too): per side,
        # one wait on the latest such offload, none where compute waited on a later one.  Not
        # with poisoning, whose fills on the compute stream follow each allocation's waits.
        coalesce = not self.poison
        offload_of = {id(self._op_event[i]): i for i, op in enumerate(ops)
                      if op.kind == OFFLOAD and self._op_event[i] is not None}
        out_rank = {}                     # offload op -> rank in swap-out stream order
        out_ops = []                      # rank -> offload op
        out_waited = [-1]                 # the latest offload the compute stream waited on
        side_out = []                     # this side's ranks to wait on (coalesced)
        storage = [None if t is None or t[0] == "history" else self._storage(t)
                   for t in self._targets]

        def bind(i, bid, binds):
            if storage[bid] is None:
                return
            v = self._views[i]
            if v is None:
                v = self._views[i] = self.device.view(ops[i].offset, self._raw[bid],
                                                      self._dtype[bid])
            binds.append((storage[bid], v))

        def actions(i, calls, binds):
            op = ops[i]
            bid = op.buffer
            if op.kind == ALLOCATE:
                for e in self._waits[i]:
                    d = offload_of.get(id(e)) if coalesce else None
                    if d is not None and d in out_rank:
                        side_out.append(out_rank[d])
                    else:                 # not an offload, or the previous iteration's
                        calls.append(st.wait_action(COMPUTE, e))
                if self.poison:
                    calls.append(st.fill_action(self.device, op.offset, op.nbytes, COMPUTE))
                bind(i, bid, binds)
            elif op.kind == PREFETCH:
                calls.extend(st.wait_action(SWAP_IN, e) for e in self._waits[i])
                calls.append(st.copy_action(*self._copy_args(i, op), SWAP_IN))
                calls.append(st.record_action(self._op_event[i], SWAP_IN))
                prefetching[bid] = (issued[0], i)
                issued[0] += 1
                bind(i, bid, binds)
            elif op.kind == OFFLOAD:
                calls.extend(st.wait_action(SWAP_OUT, e) for e in self._waits[i])
                calls.append(st.copy_action(*self._copy_args(i, op), SWAP_OUT))
                calls.append(st.record_action(self._op_event[i], SWAP_OUT))
                out_rank[i] = len(out_ops)
                out_ops.append(i)
            elif op.kind == RELEASE:
                if storage[bid] is not None:
                    binds.append((storage[bid], None))
                if self.poison:     # on the region's stream; the region's free event follows
                    calls.append(st.fill_action(self.device, op.offset, op.nbytes, op.stream))
                    calls.append(st.record_action(self._op_event[i], op.stream))
            else:
                raise ValueError(f"op {i}: a {op.kind!r} cannot be compiled")

        def side(calls, binds):
            if side_out:
                r = max(side_out)
                side_out.clear()
                if r > out_waited[0]:     # one wait covers every earlier offload
                    calls.append(st.wait_action(COMPUTE, self._op_event[out_ops[r]]))
                    out_waited[0] = r
            return tuple(c for c in calls if c is not None), tuple(binds)

        before, after = [], []
        waited = (-1, -1)                 # the latest prefetch the compute stream waited on
        for j in range(self.gmap.n_steps):
            calls, binds = [], []
            for i in self._before[j]:
                actions(i, calls, binds)
            latest = max((prefetching.pop(bid) for bid in self._check[j] if bid in prefetching),
                         default=(-1, -1))
            if latest > waited:           # one wait covers every earlier prefetch (module doc)
                calls.append(st.wait_action(COMPUTE, self._op_event[latest[1]]))
                waited = latest
            before.append(side(calls, binds))
            calls, binds = [], []
            if self._record[j]:
                calls.append(st.record_action(self._step_event[j], COMPUTE))
            for i in self._after[j]:
                actions(i, calls, binds)
            after.append(side(calls, binds))
        self._compiled = (before, after, self._wrappers())
        return self._compiled

    def _wrappers(self):
        v = vars(self.streams)
        return v.get("wait"), v.get("record"), v.get("copy")

    def _run_compiled(self, sc):
        c = self._compiled
        if c is None or c[2] != self._wrappers():   # a stream method wrapped since
            c = self._compile()
        before, after, _ = c
        return self._run_steps(before, after, 0, len(before), sc, self.backlog)

    def _run_steps(self, before, after, start: int, stop: int, sc, probe=None):
        """Steps ``start`` to ``stop - 1`` from compiled tables (:meth:`_compile`, or a
        capture's, :mod:`swap.graph`); returns the sum of their losses."""
        net = self.net
        forward, backward = net.forward_layer, net.backward_layer
        fwd, layer = self._fwd, self._layer
        loss = 0.0
        try:
            for j in range(start, stop):
                if sc is not None:
                    sc.where = j
                calls, binds = before[j]
                for fn, args in calls:
                    fn(*args)
                for st, v in binds:
                    st.array = v
                if fwd[j]:
                    loss = loss + forward(layer[j])
                else:
                    backward(layer[j])
                calls, binds = after[j]
                for fn, args in calls:
                    fn(*args)
                for st, v in binds:
                    st.array = v
                if probe is not None and j in probe.steps:
                    probe.mark(j)
        except BaseException:
            # the pass stopped midway: no blob keeps a view of a region the plan may reuse
            for bid in self._dynamic:
                self._unbind(bid)
            raise
        return loss

    # ------------------------------------------------------------ CUDA graph
    def use_graph(self, on: bool = True):
        """Run steady full iterations as one CUDA graph (:mod:`swap.graph`) from the next
        compiled iteration on; refused with the reasons logged once."""
        self._graph_wanted = bool(on)
        if not on and self._graph is not None:
            self._graph.reset()
            self._graph = None

    @property
    def graph_wanted(self) -> bool:
        """:meth:`use_graph` asked for the graph (it may still be refused)."""
        return self._graph_wanted

    @property
    def graph_launches(self) -> int:
        """Full passes run as graph launches so far (0 while none is captured)."""
        return 0 if self._graph is None else self._graph.launches

    @property
    def graph_captured(self) -> bool:
        """The passes run as launches of a captured graph now."""
        return self._graph is not None and self._graph.graph is not None

    def graph(self):
        """The :class:`swap.graph.CapturedIteration` (built on first use), or None when off
        or refused (the reasons in ``graph_refused``)."""
        if self._graph is None and self._graph_wanted and not self.graph_refused:
            from minicaffe.graph import NotCapturable
            from .graph import CapturedIteration
            try:
                self._graph = CapturedIteration(self)
            except NotCapturable as e:
                self._refuse_graph(str(e))
        return self._graph

    def _refuse_graph(self, why: str):
        from minicaffe.log import log
        self.graph_refused = why
        if self._graph is not None:
            self._graph.reset()
            self._graph = None
        log(f"cuda_graph: net {self.net.name!r} runs its iterations eagerly under the swap "
            f"plan: {why}", level="W", where="swap")

    def _run_graph(self, sc):
        """A full pass as a graph launch; None when the graph is off or refused."""
        if any(self._wrappers()):      # a profiler's or timer's wrappers: eager while they last
            return None
        g = self.graph()
        if g is None:
            return None
        from .graph import _Fallback
        try:
            return g.run(sc)
        except _Fallback as f:
            cause = f.__cause__
            self._refuse_graph(f"the capture failed: {type(cause).__name__}: {cause}")
            return f.loss

    def _labels(self):
        """(scratch reserve, meter, nvtx ranges) to update per step, or None each."""
        sc = self.scratch if self._allocator is not None else None
        m = self._meter if (self._meter is not None and self._meter.active) else None
        return sc, m, self._nv

    # ------------------------------------------------------------ passes
    def _run(self, last_step: int):
        net = self.net
        st = self.streams
        if self._bound_test is not None:          # training resumes: the test nets let go
            self._bound_test.unbind()
        if self._graph_wanted and last_step == self.gmap.n_steps - 1 and self._compilable():
            sc = self._labels()[0]
            loss = self._run_graph(sc)
            if loss is not None:
                if sc is not None:
                    sc.where = OUTSIDE
                return loss
        st.wait(COMPUTE, self._end_wait)          # previous iteration's swap-stream tails
        st.record(self._start_event, COMPUTE)
        st.wait(SWAP_IN, [self._start_event])     # the previous iteration is done with
        st.wait(SWAP_OUT, [self._start_event])    # every region (solver update included)
        tracing = self.trace is not None
        rows, t_events = [], []
        t0 = time.perf_counter()
        sc, meter, nv = self._labels()
        check, record = self._check, self._record
        fwd, layer, step_event = self._fwd, self._layer, self._step_event
        issue_before, issue_after = self._issue_before, self._issue_after
        loss = 0.0
        if last_step == self.gmap.n_steps - 1 and self._compilable():
            loss = self._run_compiled(sc)
        else:
            for j in range(last_step + 1):
                if sc is not None:
                    sc.where = j
                if meter is not None:
                    meter.label(j)
                if tracing:
                    a = time.perf_counter()
                    if st.gpu:
                        ev0 = st.event(timing=True)
                        st.record(ev0, COMPUTE)
                for fn, i in issue_before[j]:
                    fn(i)
                if check[j]:
                    self._ready(j)
                if tracing:           # past the step's waits: what follows is its compute
                    b = time.perf_counter()
                    if st.gpu:
                        ev_ready = st.event(timing=True)
                        st.record(ev_ready, COMPUTE)
                if nv is not None:
                    nv.push(self._step_names[j])
                if fwd[j]:
                    loss = loss + net.forward_layer(layer[j])
                else:
                    net.backward_layer(layer[j])
                if nv is not None:
                    nv.pop()
                if record[j]:
                    st.record(step_event[j], COMPUTE)
                for fn, i in issue_after[j]:
                    fn(i)
                if tracing:
                    if st.gpu:
                        ev1 = st.event(timing=True)
                        st.record(ev1, COMPUTE)
                        t_events.append((ev0, ev1, ev_ready))
                    rows.append(self._trace_row(j, (a - t0) * 1e3,
                                                (time.perf_counter() - t0) * 1e3,
                                                (b - t0) * 1e3))
        if self._end_events:
            st.record(self._end_events[0], SWAP_OUT)
            st.record(self._end_events[1], SWAP_IN)
            self._end_wait = self._end_events
        if sc is not None:
            sc.where = OUTSIDE
        if meter is not None:
            meter.label(OUTSIDE)
        if tracing:
            if st.gpu:                                  # one sync per traced iteration
                t_events[-1][1].synchronize()
                elapsed = self.streams.cp.cuda.get_elapsed_time
                for row, (e0, e1, er) in zip(rows, t_events):
                    row[4] = elapsed(t_events[0][0], e0)
                    row[5] = elapsed(t_events[0][0], e1)
                    row[-1] = elapsed(t_events[0][0], er)
            self.trace.write(rows)
        return loss

    def _trace_row(self, j, t_start, t_end, t_ready):
        ops = self._ops
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
            elif op.kind == OFFLOAD:
                by["offloaded"] += op.nbytes
        step = self.gmap.steps[j]
        return [self.iterations, j, step.name, step.phase, round(t_start, 4), round(t_end, 4),
                by["allocated_compute"], by["allocated_swap_in"], by["released_compute"],
                by["released_swap_out"], by["offloaded"], by["prefetched"], self.device.in_use,
                self.device.high_water, round(t_ready, 4)]

    def forward_backward(self):
        """One training pass under the plan; returns the loss (a device scalar)."""
        if self._meter is not None and self._meter.active and self.iterations >= self.measure:
            self.end_dry_run()
        loss = self._run(self.gmap.n_steps - 1)
        self._check_all_freed()
        if self._allocator is not None:     # pragma: no cover - GPU machine only
            self._allocator.trim()
        self.iterations += 1
        # the layout was replayed (checked) through the arena once; every later iteration
        # issues the same operations, so it only counts bytes (forward passes still replay)
        self._replay = False
        return loss

    def forward(self):
        """A forward-only pass (Solver.solve's last display, pycaffe's ``net.forward()``):
        the forward steps of the plan, then everything per-iteration is dropped."""
        self._force_replay = True
        try:
            loss = self._run(self.gmap.n_forward - 1)
        finally:
            self._force_replay = False
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
        state = self.residency.state
        stray = [self.residency.names[b] for b in self._dynamic if state[b] != FREED]
        if stray:
            raise ResidencyError(f"plan {self.plan.strategy!r} left buffers held after the "
                                 f"iteration: {', '.join(stray[:5])}")

    # ------------------------------------------------------------ dry run
    def end_dry_run(self, check: bool = True) -> "TransientProfile | None":
        """End the measurement of transients (normally at the start of iteration
        ``measure + 1``); check the reserve against it.  Returns the :class:`TransientProfile`.

        Raises :class:`ScratchOverflow` in strict GPU mode when the dry run needed more than
        the reserve holds (or had to fall back to CuPy's pool)."""
        if self._meter is None:
            return self.transients
        if self._meter.active:
            peaks = self._meter.stop()
            n = self.gmap.n_steps
            self.transients = TransientProfile(
                per_step=tuple(int(peaks.get(j, 0)) for j in range(n)),
                outside=int(peaks.get(OUTSIDE, 0)),
                tests=tuple(int(peaks.get(("test", i), 0)) for i in range(len(self.tests))),
                layout=self.layout, names=tuple(self._where_names()[:n]))
        a = self._allocator
        if a is not None and a.permissive:  # pragma: no cover - GPU machine only
            a.permissive = False
            a.trim()
            tp = self.transients
            if not check:
                return tp
            if a.fallbacks:
                from .memory import fmt_bytes
                need = tp.budget()
                msg = (f"the dry run measured {fmt_bytes(tp.peak)} of transient allocations "
                       f"(peak at {tp.peak_where}), and the scratch reserve holds "
                       f"{fmt_bytes(self.scratch.capacity)}"
                       + (f" ({a.fallbacks} allocations, {fmt_bytes(a.fallback_bytes)}, fell "
                          "back to CuPy's pool)" if a.fallbacks else "")
                       + f". A budget of {fmt_bytes(need)} would hold the plan "
                       f"({fmt_bytes(self.layout.scratch_base)} with the test nets) and a "
                       f"reserve of {fmt_bytes(tp.reserve())} (install(..., scratch=) or "
                       f"${ENV_SCRATCH})")
                if self.strict:
                    raise ScratchOverflow(msg, budget=self.budget, min_budget=need,
                                          strategy=self.plan.strategy, k=self.gmap.k,
                                          scratch=tp.reserve(), peak=tp.peak)
                from minicaffe.log import log
                log(msg, level="W", where="swap")
        return self.transients

    def _budget_hint(self) -> int:
        tp = self.transients
        return tp.budget() if tp is not None else 0

    def _where_names(self) -> list:
        """Words for the steps, as labels of the scratch reserve and the meter name them."""
        return [f"{s}, a {s.type} layer" for s in self.gmap.steps]

    # ------------------------------------------------------------ reports
    @property
    def high_water(self) -> int:
        """Highest arena byte ever handed out (measured): plan, test nets and, when the
        scratch reserve serves CuPy (GPU), the reserve's own high-water mark."""
        hw = self.device.high_water
        if self.scratch.high_water:
            hw = max(hw, self.scratch.base + self.scratch.high_water)
        return hw

    @property
    def peak_in_use(self) -> int:
        return self.device.peak_in_use

    @property
    def needed_budget(self) -> int | None:
        """The smallest budget that holds the plan, the test nets and the transients the dry
        run measured (None before it ends)."""
        return None if self.transients is None else self.transients.budget()

    def report(self) -> str:
        from .memory import fmt_bytes
        p = self.plan
        off, pre = p.transfer_bytes()
        text = (f"swap {p.strategy!r}: budget {fmt_bytes(self.budget)}, arena high-water mark "
                f"{fmt_bytes(self.high_water)} (peak in use {fmt_bytes(self.peak_in_use)}; "
                f"planned peak {fmt_bytes(p.peak)}), host {fmt_bytes(p.host_bytes)}"
                + (", pinned" if self.host.pinned else "")
                + f"; per iteration offload {fmt_bytes(off)}, prefetch {fmt_bytes(pre)}")
        lay = self.layout
        text += f"; scratch reserve {fmt_bytes(lay.scratch)}"
        if self.scratch.high_water:
            text += f" (high-water {fmt_bytes(self.scratch.high_water)})"
        if self.tests:
            text += (f"; test nets {fmt_bytes(lay.test_dynamic)} per pass + "
                     f"{fmt_bytes(lay.test_persistent)} resident")
        tp = self.transients
        if tp is not None:
            text += f"; transients measured {fmt_bytes(tp.peak)} (peak {tp.peak_where})"
            if not self.device.gpu and tp.peak > lay.scratch:
                # NumPy's temporaries: no allocator puts them in the reserve, nothing checks
                # them against it (a GPU's dry run would have)
                text += (f", NumPy's, outside the arena on the CPU and more than the scratch "
                         f"reserve holds: a GPU would need a budget of {fmt_bytes(tp.budget())}")
            else:
                text += f", smallest budget with them {fmt_bytes(tp.budget())}"
        a = self._allocator
        if a is not None and a.fallbacks:
            text += (f"; {a.fallbacks} allocations ({fmt_bytes(a.fallback_bytes)}) fell back "
                     "to CuPy's pool")
        return text

    def close(self):
        """Give the net back its own arrays (persistent contents copied out of the arena) and
        CuPy its own allocator."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        _OPEN.discard(self)
        self.streams.synchronize()
        if self._graph is not None:             # its pool's chunks go back to the reserve
            self._graph.stream.synchronize()
            self._graph.reset()
            self._graph = None
        self.end_dry_run(check=False)
        if self._allocator is not None:         # pragma: no cover - GPU machine only
            self._allocator.uninstall()         # before any copy below allocates
            self._rehome_solver_scalars()
            ops = sys.modules.get("minicaffe.cudnn.ops")
            if ops is not None and hasattr(ops, "release_workspaces"):
                ops.release_workspaces()        # cached cuDNN workspaces made in the reserve
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
        for t in self.tests:
            t.close()
        self._bound_test = None
        self.net.drop_views()                   # cached views would keep the arena alive
        if self._allocator is not None:         # pragma: no cover - GPU machine only
            self._rehome_stragglers()
            self._allocator.pool.free_all_blocks()
            self.scratch_live_at_close = self.scratch.live
            self.scratch_bytes_at_close = int(self._allocator.pool.used_bytes())
            if self.scratch_bytes_at_close:
                from minicaffe.log import log
                log(f"{self.scratch_bytes_at_close} bytes of CuPy arrays made while the executor "
                    "ran are still referenced after close; they keep its arena's memory until "
                    "they are freed", level="W", where="swap")
        if getattr(self.net, "executor", None) is self:
            self.net.executor = None
        if self.trace is not None:
            self.trace.close()
        # the executor's own views of the arenas: a closed executor that stays referenced (a
        # caller's variable, a decision) must not keep the cudaMalloc alive through them
        self._views = [None] * len(self._views)
        self._copies = [None] * len(self._copies)
        self._compiled = None
        self._prefetch_event.clear()
        # Page-locked host memory and the device arena are scarce: free them with the executor,
        # not at garbage collection (the profiler and the tuner's measurements build one
        # executor after another in one process, and a closed executor may stay referenced).
        self.host.release()
        if self.device.gpu:
            self.device.release()

    def _rehome_stragglers(self):  # pragma: no cover - GPU machine only
        """Copy into CuPy's own pool the device arrays that layers and the solver made and kept
        while the executor ran (a layer's cache sized to the minibatch, a solver temporary):
        they were carved from the scratch reserve, and each would keep the whole closed arena
        alive.  Walks the attributes of the net, its layers, its test nets and theirs, the solver
        and its update rule, one container deep, and drops the solver's fused-update tables
        (measured on an H200: their 4 KiB kept each closed 12 GiB arena); blobs were re-homed
        already."""
        cp = self.net.xp
        lo = self.device.ptr
        hi = lo + self.device.capacity

        def fix(v):
            if isinstance(v, cp.ndarray):
                return v.copy() if lo <= v.data.ptr < hi else v
            if isinstance(v, list):
                new = [fix(x) for x in v]
                return new if any(a is not b for a, b in zip(new, v)) else v
            if isinstance(v, tuple) and not hasattr(v, "_fields"):
                new = tuple(fix(x) for x in v)
                return new if any(a is not b for a, b in zip(new, v)) else v
            if isinstance(v, dict):
                new = {k: fix(x) for k, x in v.items()}
                return new if any(new[k] is not v[k] for k in v) else v
            return v

        owners = [self.net] + list(self.net.layers)
        for t in self.tests:
            owners += [t.net] + list(t.net.layers)
        if self.solver is not None:
            owners += [self.solver, getattr(self.solver, "rule", None)]
            # the one-launch SGD update's device tables point into the arena and live in it:
            # drop them, the next update builds them again where the parameters are now
            if getattr(self.solver, "_sgd_fused", None):
                self.solver._sgd_fused = None
        for obj in owners:
            if obj is None or not hasattr(obj, "__dict__"):
                continue
            for name, v in list(vars(obj).items()):
                nv = fix(v)
                if nv is not v:
                    setattr(obj, name, nv)

    def _rehome_solver_scalars(self):  # pragma: no cover - GPU machine only
        """The solver's recent losses are device scalars made in the reserve: copy them into
        CuPy's own pool, so that they do not keep the closed arena alive."""
        s = self.solver
        if s is None:
            return
        if getattr(s, "last_loss", None) is not None and hasattr(s.last_loss, "copy"):
            s.last_loss = s.last_loss.copy()
        losses = getattr(s, "_losses", None)
        if isinstance(losses, deque):
            s._losses = deque((x.copy() if hasattr(x, "copy") else x for x in losses),
                              maxlen=losses.maxlen)


def _describe(names, where) -> str:
    if isinstance(where, int) and 0 <= where < len(names):
        return f"at {names[where]}"
    if where == OUTSIDE or where is None:
        return "between steps (solver update or code outside the plan)"
    if isinstance(where, tuple) and where and where[0] == "test":
        return f"in a forward pass of test net #{where[1]}"
    return f"at {where!r}"


def _weak_call(method, default):
    """A callable that calls a bound ``method`` without keeping its object alive."""
    ref = weakref.WeakMethod(method)

    def call():
        m = ref()
        return default if m is None else m()
    return call


def close_all():
    """Close every executor not closed yet and give CuPy its own allocator back (tests'
    teardown)."""
    for ex in list(_OPEN):
        ex.close()
    for orphan in reversed(list(_INSTALLED)):  # pragma: no cover - GPU machine only
        orphan.uninstall()


def default_strict() -> bool:
    """``MINICAFFE_SCRATCH_STRICT`` (1/0), default 1: overflowing the reserve raises."""
    v = os.environ.get(ENV_STRICT, "").strip().lower()
    if v in ("", "1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{ENV_STRICT}={os.environ[ENV_STRICT]!r}: give 1 or 0")


def default_scratch() -> int | None:
    """``MINICAFFE_SCRATCH`` (bytes, or 512M, 2G ...) if set, else None."""
    v = os.environ.get(ENV_SCRATCH, "").strip()
    if not v:
        return None
    from .memory import parse_bytes
    return parse_bytes(v)


LOWERINGS = ("caffe", "chunked")


def lowering_for(strategy: str, lowering: str | None = None) -> str:
    """The convolution lowering a strategy runs with: ``lowering`` if given, else
    ``$MINICAFFE_LOWERING`` if set, else "caffe" for ``none`` (the Caffe baseline allocates
    exactly what Caffe does: one image of im2col per layer) and "chunked" for the others."""
    if lowering is None:
        lowering = os.environ.get("MINICAFFE_LOWERING") or None
    if lowering is None:
        lowering = "caffe" if strategy == "none" else "chunked"
    if lowering not in LOWERINGS:
        raise ValueError(f"convolution lowering {lowering!r}: use one of {', '.join(LOWERINGS)}")
    return lowering


def set_lowering(net, lowering: str, budget: int | None = None) -> int:
    """Give every convolution of ``net`` Caffe's scratch ("caffe") or minicaffe's
    ("chunked", the default of every strategy but ``none``).  Takes effect at the next
    ``net.reshape()``; returns the number of convolutions it applies to.

    * A CAFFE-engine convolution lowers one image at a time into a one-image column buffer,
      as Caffe does ("caffe"), or chunks of images up to ``ConvolutionLayer.col_buffer_bytes``
      ("chunked": fewer, larger GEMMs, more scratch).
    * A CUDNN-engine convolution's workspace is bounded by Caffe's 8 MiB per algorithm
      (``cudnn_conv_layer.cpp``; "caffe"), or ("chunked") inside ``budget`` by 8 MiB per
      image of the minibatch, at most a quarter of the budget (a sixteenth of it, fixed,
      with ``$MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE=0``; the engine's 4 GiB without a
      budget: :func:`minicaffe.engine.bound_workspaces`).  Under Caffe's plan every layer
      keeps its own workspace for the whole iteration, so an unbounded one would cost the
      minibatch; the swapping plans hold one convolution's at a time.
    """
    if lowering not in LOWERINGS:
        raise ValueError(f"convolution lowering {lowering!r}: use one of {', '.join(LOWERINGS)}")
    from minicaffe.engine import bound_workspaces
    bound_workspaces(net, budget, limit=CUDNN_WORKSPACE_LIMIT if lowering == "caffe" else None)
    n = 0
    for layer in net.layers:
        if not hasattr(type(layer), "col_buffer_bytes"):
            continue
        if lowering == "caffe":
            layer.col_buffer_bytes = 0
        else:
            layer.__dict__.pop("col_buffer_bytes", None)
        n += 1
    return n


def pair_bn_scale(strategy: str) -> bool:
    """Whether a plan of ``strategy`` runs BatchNorm+Scale pairs fused (where the net's
    fusion is on, ``$MINICAFFE_FUSE_BN_SCALE``): every strategy but the recomputing ones,
    whose BatchNorm forward, run again in backward, would also write the Scale's output
    over an in-place chain's data."""
    from minicaffe.net import fusion_default
    return fusion_default() and strategy not in ("recompute", "superneurons")


def lay_out_for(net, strategy: str, budget: int | None = None, lowering: str | None = None):
    """Give ``net`` the layers a plan of ``strategy`` runs: the convolutions' lowering
    (:func:`lowering_for`, :func:`set_lowering` with ``budget``) and BatchNorm+Scale pairs
    fused where the strategy runs them so (:func:`pair_bn_scale`).  Takes effect at the next
    ``net.reshape()``.  What :func:`install` does to each net before it builds the GMAP;
    ``minicaffe plan`` and the scripts size a net the same way."""
    set_lowering(net, lowering_for(strategy, lowering), budget)
    net.set_bn_scale_fusion(pair_bn_scale(strategy), planned=True)


def install(target, strategy: str = "naive", budget: int | None = None, *,
            trace: str | None = None, poison: bool = False, pinned=frozenset(),
            scratch: int | None = None, strict: bool | None = None, measure: int = 1,
            nvtx: bool | None = None, test_nets=None, lowering: str | None = None,
            fast: bool = True, workspace_budget: int | None = None, recompute=(),
            lead: int = 0) -> Executor:
    """Plan ``strategy`` for a Solver's train net (or a Net) and make it run under the plan.

    Builds the GMAP at the net's minibatch, the plan, and an Executor, and sets
    ``net.executor`` (and each test net's).  The plan gets ``budget`` less the scratch reserve
    (``scratch``, default ``$MINICAFFE_SCRATCH`` or none) and less the test nets' persistent
    buffers; None: the smallest plan.  A budget too small fails here, before the first
    iteration, with :class:`swap.plan.BudgetError` naming the smallest budget that works and
    the largest minibatch that fits.  ``lowering``: the convolutions' im2col
    (:func:`lowering_for`; ``none`` defaults to Caffe's one image, so that its memory is
    Caffe's).  ``workspace_budget``: the budget whose share bounds the cuDNN workspaces
    (:func:`set_lowering`; default ``budget``), for a run without a budget that should choose
    the algorithms a budgeted plan chose.  ``pinned``: buffer ids of the GMAP built here, or
    "all" for every feature map (nothing swapped: the dynamic plan where all of them fit).
    ``recompute``: with ``dynamic``, names of forward layers whose groups the plan rebuilds in
    backward (:func:`swap.plan.dynamic_recompute`).  ``lead``: with ``dynamic``, each
    prefetch's region laid out that many steps ahead (:func:`swap.plan._layout`).  The other
    options are the Executor's.
    """
    if lead and strategy != "dynamic":
        raise ValueError(f"lead {lead}: a prefetch lead is for the dynamic plan, not {strategy!r}")
    if recompute and strategy != "dynamic":
        raise ValueError(f"recompute {', '.join(recompute)}: layers are chosen for the dynamic "
                         f"plan; strategy {strategy!r} decides its own (use --swap recompute "
                         "for SuperNeurons' rules)")
    solver = target if hasattr(target, "net") and hasattr(target, "rule") else None
    net = target.net if solver is not None else target
    lowering = lowering_for(strategy, lowering)
    for n in [net] + list(test_nets if test_nets is not None
                          else getattr(solver, "test_nets", ()) or ()):
        lay_out_for(n, strategy, budget if workspace_budget is None else workspace_budget,
                    lowering)
    net.reshape()                         # every layer's internals exist at their sizes
    # the column buffers GPU convolutions shared before a plan bound their scratch: the
    # plan places its own, so these would be device memory outside the budget
    from minicaffe.layers.conv import release_shared_scratch
    release_shared_scratch()
    if scratch is None:
        scratch = default_scratch()
    g = build_gmap(net, solver_type=solver.type if solver is not None else "SGD")
    if test_nets is None:
        test_nets = list(getattr(solver, "test_nets", ()) or ())
    plan_budget = budget
    extra = t_dyn = 0
    if budget is not None:
        # the budget less the scratch reserve and the test nets' persistent buffers; a test
        # pass also needs its per-pass buffers after the plan's resident ones (arena_need)
        t_pers, t_dyn = _test_bytes(net, g, solver, test_nets)
        plan_budget = int(budget) - align(scratch or 0) - t_pers
        extra = budget - plan_budget
    if isinstance(pinned, str):
        if pinned != "all":
            raise ValueError(f"pinned: buffer ids or 'all', not {pinned!r}")
        pinned = frozenset(g.feature_maps())
    options = {"lead": int(lead)} if lead else {}
    if recompute:
        from .plan import dynamic_recompute
        options["recompute"] = dynamic_recompute(g, recompute, pinned)
    try:
        plan = make_plan(g, strategy, plan_budget, pinned, **options)
        if t_dyn and arena_need(plan, t_dyn) > plan_budget:
            # the plan fits, a test pass after its resident buffers does not: the error names
            # the budget that holds both (the executor's own check gives bytes only)
            raise plan_budget_error(g, strategy, plan_budget, plan, pinned, t_dyn)
    except BudgetError as e:
        if t_dyn and hasattr(e, "with_test_pass"):
            e = e.with_test_pass(t_dyn)     # its smallest budget and k leave room for a pass
        if not extra:
            raise e from None
        raise e.given(budget, plan_budget) from None
    ex = Executor(net, plan, budget=budget, solver=solver, trace=trace, poison=poison,
                  scratch=scratch, strict=strict, measure=measure, nvtx=nvtx,
                  test_nets=test_nets, fast=fast)
    net.executor = ex
    return ex


def budget_for_plan(target, budget: int, *, scratch: int | None = None, test_nets=None,
                    gmap=None) -> int:
    """The part of ``budget`` a plan may lay out: the budget less the scratch reserve
    (``scratch``, default ``$MINICAFFE_SCRATCH`` or none) and less the test nets' persistent
    buffers.  What :func:`install` gives the planner; a tuner choosing k under a budget
    (Algorithm 2: M_budget - M_ws - ...) should plan within it too.  (The test nets' per-pass
    buffers share the plan's per-iteration regions; the executor checks that they fit.)"""
    solver = target if hasattr(target, "net") and hasattr(target, "rule") else None
    net = target.net if solver is not None else target
    if scratch is None:
        scratch = default_scratch()
    if test_nets is None:
        test_nets = list(getattr(solver, "test_nets", ()) or ())
    if gmap is None:
        net.reshape()
        gmap = build_gmap(net, solver_type=solver.type if solver is not None else "SGD")
    return int(budget) - align(scratch or 0) - _test_persistent_bytes(net, gmap, solver,
                                                                      test_nets)


def _test_bytes(net, g, solver, test_nets) -> tuple:
    """(bytes the test nets keep for the whole run, laid out after the plan; the largest
    test net's per-pass bytes, laid out after the plan's resident regions while it runs)."""
    if not test_nets:
        return 0, 0
    targets = [_target(net, b.ref, solver) for b in g.buffers]
    shared = {id(_storage(t)) for t in targets if t is not None and t[0] != "history"}
    persistent, dynamic = 0, 0
    for t in test_nets:
        _, p, _, d = _test_net_layout(t, shared)
        persistent += p
        dynamic = max(dynamic, d)
    return align(persistent), dynamic


def _test_persistent_bytes(net, g, solver, test_nets) -> int:
    """Bytes the test nets keep for the whole run (laid out after the plan)."""
    return _test_bytes(net, g, solver, test_nets)[0]


def test_dynamic_bytes(target, *, test_nets=None, gmap=None) -> int:
    """The largest per-pass bytes of the test nets of ``target`` (a Solver, or a Net with
    ``test_nets``): a plan's resident regions and these must fit its budget together
    (:func:`swap.plan.arena_need`), as the executor lays them out."""
    solver = target if hasattr(target, "net") and hasattr(target, "rule") else None
    net = target.net if solver is not None else target
    if test_nets is None:
        test_nets = list(getattr(solver, "test_nets", ()) or ())
    if not test_nets:
        return 0
    if gmap is None:
        net.reshape()
        gmap = build_gmap(net, solver_type=solver.type if solver is not None else "SGD")
    return _test_bytes(net, gmap, solver, test_nets)[1]


test_dynamic_bytes.__test__ = False     # not a pytest function, despite its name


def measure_scratch(target, strategy: str = "naive", iterations: int = 1,
                    **options) -> TransientProfile:
    """The dry run on its own: run ``iterations`` training iterations of a Solver (they train)
    under ``strategy`` without a budget, counting transient allocations per step; close the
    executor and return what it measured (:meth:`TransientProfile.budget` is the smallest
    budget that holds the plan, the test nets and the transients)."""
    solver = target if hasattr(target, "net") and hasattr(target, "rule") else None
    ex = install(target, strategy, None, measure=iterations, scratch=options.pop("scratch", None),
                 **options)
    try:
        for _ in range(iterations):
            if solver is not None:
                solver.step(1)
            else:
                target.forward_backward()
        return ex.end_dry_run()
    finally:
        ex.close()
