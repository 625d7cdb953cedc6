"""A swap executor's steady iteration replayed as one CUDA graph.

Under a swap plan the host issues every step of an iteration: the layer's kernels and cuDNN
calls, and the plan's stream waits, copies and event records (``Executor._run_compiled``).
For ResNet-152 at k = 72 that is 110-130 ms of one CPU per iteration against about 200 ms
of GPU work; a worker of the parameter server whose main thread lands on a shared core runs
1.5-1.9x slower and the GPU waits for it (issue 6, RESULTS "Session 21").  The plan is
fixed, so a steady iteration issues the same operations on the same arena regions every
time, which is what a CUDA graph records.  :class:`CapturedIteration` records it once and
then launches it:

* **What runs outside the graph.**  The data layers at the head of the iteration (their
  forward copies host data whose source address changes) run eagerly before each launch, on
  the graph's stream, from the same compiled tables; so do test nets, the solver's update
  and whatever a caller does between iterations.
* **Three streams in one graph.**  The capture starts on a non-blocking stream of its own
  (``stream``); the swap-in and swap-out streams join it by waiting on an event recorded
  there first and are joined back at its end, so every offload and prefetch of the plan is a
  node of the graph with the same dependencies as eagerly.  A launch is ordered after the
  caller's stream (an event) and the caller's stream after the launch.
* **Waits on events recorded outside the capture** are invalid inside it.  They are the
  waits on the previous iteration's work (regions it released, its swap-stream tails) and on
  the eager data steps' work.  Both are complete-ordered before the launch: graph launches on
  one stream run one after the other, and before each launch the graph's stream waits for
  what the eager steps left on the swap streams.  :func:`capture_calls` drops exactly those
  waits, statically, from the compiled tables.
* **Temporaries** (layer scratch, the loss) are allocated during the capture from a CuPy
  memory pool of the graph's own whose chunks come from the executor's scratch reserve, so
  they count in the budget.  The pool serves only the capture and keeps its chunks while the
  graph lives: nothing allocated between launches can land where the graph writes.  A
  reserve too small for both the graph's temporaries and the eager ones refuses the capture
  (the iteration runs eagerly, with a logged reason), never a fallback outside the budget.
* **Python runs once.**  Per-layer Python (binds, listeners, counters) runs during the
  capture only.  A net with a forward listener is refused; a backward listener only when a
  hook (:meth:`CapturedIteration.add_hook`) says it handles the graph, as the parameter
  server's worker does: its bucket copies are captured on its copy stream with *external*
  event records (``cuEventRecordWithFlags(..., CU_EVENT_RECORD_EXTERNAL)``), which every
  launch records again, and after each launch it hands the buckets to its round thread.
* **Refused, with the reasons logged once:** CPU mode, recomputation, layers not known to
  be capturable (:data:`minicaffe.graph.CAPTURABLE_TYPES`), data layers after the head,
  cuBLAS through CuPy, wrapped stream methods (a profiler), listeners without a hook.  A
  capture that fails midway runs that iteration eagerly and is not tried again.

Turned on by the solver's ``cuda_graph`` (``minicaffe train --cuda-graph``,
``MINICAFFE_CUDA_GRAPH=1``) for a net under a swap plan.
"""
from __future__ import annotations

import ctypes
import sys

from minicaffe.graph import CAPTURABLE_TYPES, DATA_LAYER_TYPES, NotCapturable, gemm_layers

CU_EVENT_RECORD_EXTERNAL = 0x1
_DRIVER: list = []


def data_prefix(net, fwd, layer) -> int:
    """Number of leading steps that are forwards of data layers (no bottoms): they run
    eagerly before each launch."""
    d = 0
    while d < len(fwd) and fwd[d]:
        li = layer[d]
        if net.layers[li].type not in DATA_LAYER_TYPES or net.bottom_vecs[li]:
            break
        d += 1
    return d


def why_not_capturable(ex, hooks=()) -> list:
    """Every reason that keeps executor ``ex``'s iteration out of a CUDA graph."""
    net = ex.net
    reasons = []
    if not ex.streams.gpu:
        reasons.append("CPU mode")
    if ex._recomputes:
        reasons.append("the plan recomputes feature maps")
    if any(ex._wrappers()):
        reasons.append("the swap streams' methods are wrapped (a profiler or timer)")
    if net.forward_listener is not None:
        reasons.append("a forward listener runs Python per layer (copy-up 'forward' of the "
                       "parameter server: use --copy-up update)")
    if net.backward_listener is not None and not any(
            getattr(h, "handles_backward_listener", False) for h in hooks):
        reasons.append("a backward listener runs Python per layer and no hook replays it")
    d = data_prefix(net, ex._fwd, ex._layer)
    seen = set()
    for j in range(d, len(ex._layer)):
        li = ex._layer[j]
        if li in seen:
            continue
        seen.add(li)
        lay = net.layers[li]
        if lay.type in DATA_LAYER_TYPES:
            reasons.append(f"data layer {lay.name!r} does not come first")
        elif lay.type not in CAPTURABLE_TYPES:
            reasons.append(f"layer {lay.name!r} of type {lay.type} is not known to be capturable")
    if ex.streams.gpu:
        from minicaffe import cublas
        names = gemm_layers(net)
        if names and not cublas.enabled_for(net.xp):
            reasons.append(f"layers {', '.join(map(repr, names))} would call cuBLAS through "
                           f"CuPy, which refuses stream capture: "
                           f"{cublas.unavailable_reason(net.xp)}")
    return reasons


def capture_calls(before, after, start: int, is_record, is_wait, recorded: set):
    """The compiled tables of steps ``start`` on, for a capture: a wait on an event that no
    call of the capture has recorded before it is dropped (module doc).  ``recorded`` holds
    the event handles recorded before the first step (the capture's fork) and is updated.
    Calls are ``(function, args)``: a record's event is ``args[0]``, a wait's ``args[1]``
    (``cudaEventRecord(event, stream)``, ``cudaStreamWaitEvent(stream, event, flags)``).
    Returns ``(before, after, dropped)`` with the steps before ``start`` left empty."""
    out_b, out_a = [((), ())] * start, [((), ())] * start
    dropped = 0
    for j in range(start, len(before)):
        for side, out in ((before[j], out_b), (after[j], out_a)):
            calls, binds = side
            kept = []
            for fn, args in calls:
                if is_record(fn):
                    recorded.add(args[0])
                elif is_wait(fn) and args[1] not in recorded:
                    dropped += 1
                    continue
                kept.append((fn, args))
            out.append((tuple(kept), binds))
    return out_b, out_a, dropped


def record_external(event, stream):  # pragma: no cover - GPU machine only
    """Record ``event`` on ``stream`` as an external event: inside a capture it becomes a
    node that every launch records, so the host and other streams can wait for that point
    of the graph."""
    if not _DRIVER:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuEventRecordWithFlags.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
        lib.cuEventRecordWithFlags.restype = ctypes.c_int
        _DRIVER.append(lib)
    rc = _DRIVER[0].cuEventRecordWithFlags(event.ptr, stream.ptr, CU_EVENT_RECORD_EXTERNAL)
    if rc != 0:
        raise RuntimeError(f"cuEventRecordWithFlags(EXTERNAL) failed: CUDA driver error {rc}")


class CapturedIteration:
    """Executor ``ex``'s full training pass as one CUDA graph (module doc).  Built by
    :meth:`swap.runtime.Executor.graph` once :meth:`~swap.runtime.Executor.use_graph` asked
    for it; :meth:`run` replaces ``_run_compiled``.

    The objects in ``ex.graph_hooks`` take part in the capture: ``capturing()`` before it,
    ``captured(stream)`` inside it at its end (join your own streams to ``stream``),
    ``capture_ended(ok)`` after it, ``launched()`` after every launch; a hook whose
    ``handles_backward_listener`` is True replays per launch what the net's backward
    listener did during the capture (``ps.worker._GraphHook``)."""

    def __init__(self, ex):
        reasons = why_not_capturable(ex, ex.graph_hooks)
        if reasons:
            raise NotCapturable("; ".join(reasons))
        cp = ex.streams.cp
        self.ex, self.cp = ex, cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.prefix = data_prefix(ex.net, ex._fwd, ex._layer)
        ev = lambda: cp.cuda.Event(disable_timing=True)   # noqa: E731
        self._in, self._start, self._out = ev(), ev(), ev()
        self._join = (ev(), ev())
        self._fork, self._tail = ev(), (ev(), ev())      # recorded inside the capture only
        self.hooks = list(ex.graph_hooks)
        self.graph = None
        self.pool = None
        self.tables = None
        self.dropped = 0           # waits left out of the capture (capture_calls)
        self.captures = 0
        self.launches = 0
        self._loss = None
        self._key = None

    def _key_now(self):
        """Identity of the storage outside the plan's per-iteration regions (parameters and
        their diffs, layer internals, cuDNN's shared workspace): a graph holds their
        addresses."""
        net = self.ex.net
        key = []
        for lay in net.layers:
            for b in lay.blobs:
                key.append(id(b.data_storage.array))
                key.append(id(b.diff_storage.array))
            for it in lay.internals.values():
                key.append(id(it.blob.data_storage.array))
        ops = sys.modules.get("minicaffe.cudnn.ops")   # cuDNN's shared workspace, if it grew
        if ops is not None:
            key.extend(id(w) for w in getattr(ops, "_workspaces", {}).values())
        return tuple(key)

    def reset(self):
        """Forget the graph (it is captured again at the next iteration)."""
        self.graph = None
        self.tables = None
        self._loss = None
        if self.pool is not None:
            self.pool.free_all_blocks()
            self.pool = None

    def _streams(self):
        from .runtime import COMPUTE, SWAP_IN, SWAP_OUT
        s = self.ex.streams.streams
        return s[COMPUTE], s[SWAP_IN], s[SWAP_OUT]

    def _build_tables(self):
        """The executor's compiled tables with the compute stream replaced by ours."""
        from .runtime import COMPUTE
        ex = self.ex
        st = ex.streams.streams
        saved_stream, saved = st[COMPUTE], ex._compiled
        st[COMPUTE] = self.stream
        try:
            before, after, _ = ex._compile()
        finally:
            st[COMPUTE] = saved_stream
            ex._compiled = saved
        return before, after

    def _pool(self):
        """A CuPy pool whose chunks come from the executor's scratch reserve, or CuPy's own
        pool when the executor has no reserve; it never overflows outside the budget."""
        from .runtime import _RegionFunctions
        a = self.ex._allocator
        if a is None:
            return self.cp.cuda.MemoryPool()

        def refuse(size):
            raise NotCapturable(f"the scratch reserve cannot hold the graph's temporaries "
                                f"next to the eager ones ({size} bytes more asked)")
        fns = _RegionFunctions(self.cp, a.reserve, self.ex.device.ptr + a.reserve.base,
                               self.ex.device._memory, refuse)
        inner = self.cp.cuda.memory.PythonFunctionAllocator(fns.malloc, fns.free)
        return self.cp.cuda.MemoryPool(inner.malloc)

    def _capture(self, before, after, sc):
        ex, cp, cs = self.ex, self.cp, self.stream
        _, s_in, s_out = self._streams()
        rt = cp.cuda.runtime
        cb, ca, self.dropped = capture_calls(
            before, after, self.prefix, lambda f: f is rt.eventRecord,
            lambda f: f is rt.streamWaitEvent, {self._fork.ptr})
        if ex._allocator is not None:
            ex._allocator.pool.free_all_blocks()   # cached chunks back to the reserve
        self.pool = self._pool()
        from minicaffe import cublas
        if cublas.enabled_for(ex.net.xp):
            with cs:
                cublas.prepare()      # its handle's workspace for this stream, made outside
        for h in self.hooks:
            h.capturing()
        mode = getattr(rt, "streamCaptureModeRelaxed", 2)
        err = None
        cs.begin_capture(mode)
        try:
            with cp.cuda.using_allocator(self.pool.malloc), cs:
                self._fork.record(cs)
                s_in.wait_event(self._fork)
                s_out.wait_event(self._fork)
                loss = ex._run_steps(cb, ca, self.prefix, len(cb), sc)
                self._tail[0].record(s_in)
                self._tail[1].record(s_out)
                cs.wait_event(self._tail[0])
                cs.wait_event(self._tail[1])
                for h in self.hooks:
                    h.captured(cs)
        except BaseException as e:
            err = e
        try:                                   # the capture always ends, even after an error
            graph = cs.end_capture()
        except Exception as e:
            err = err or e
        for h in self.hooks:
            h.capture_ended(err is None)
        if err is not None:
            self.reset()
            raise err
        graph.upload(cs)
        self.graph = graph
        self._loss = loss
        self._key = self._key_now()
        self.captures += 1
        from minicaffe.log import log
        log(f"cuda_graph: net {ex.net.name!r} captured under the swap plan "
            f"({ex.plan.strategy}): steps {self.prefix}-{len(cb) - 1} in one graph, "
            f"{self.prefix} data step(s) eager, {self.dropped} wait(s) on earlier work "
            f"ordered by the launch instead", where="swap")

    def run(self, sc):
        """One training pass: the data steps eagerly, then the graph (captured the first
        time).  Returns the loss as a new device scalar."""
        ex, cs = self.ex, self.stream
        comp, s_in, s_out = self._streams()
        if self.graph is not None and self._key != self._key_now():
            self.reset()
        if self.tables is None:
            self.tables = self._build_tables()
        before, after = self.tables
        for e in ex._end_wait:                     # an eager iteration's swap-stream tails
            comp.wait_event(e)
        ex._end_wait = []
        self._in.record(comp)
        cs.wait_event(self._in)                    # the caller's work first
        self._start.record(cs)
        s_in.wait_event(self._start)               # the previous launch is over
        s_out.wait_event(self._start)
        with cs:
            ex._run_steps(before, after, 0, self.prefix, sc)   # data into their tops
        self._join[0].record(s_in)
        self._join[1].record(s_out)
        cs.wait_event(self._join[0])
        cs.wait_event(self._join[1])
        if self.graph is None:
            try:
                self._capture(before, after, sc)
            except Exception as e:
                # this iteration runs its remaining steps eagerly, on our stream
                with cs:
                    loss = ex._run_steps(before, after, self.prefix, len(before), sc)
                self._out.record(cs)
                comp.wait_event(self._out)
                raise _Fallback(loss) from e
        self.graph.launch(cs)
        self._out.record(cs)
        comp.wait_event(self._out)                 # the caller sees this iteration's results
        self.launches += 1
        for h in self.hooks:
            h.launched()
        loss = self._loss
        return loss.copy() if hasattr(loss, "copy") else loss


class _Fallback(Exception):
    """The capture failed after the iteration's data steps ran: the rest ran eagerly and
    ``loss`` is its loss (the executor logs the cause and stops trying)."""

    def __init__(self, loss):
        super().__init__("capture failed")
        self.loss = loss
