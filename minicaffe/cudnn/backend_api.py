"""cuDNN's graph (backend) API for the bound convolutions: an execution plan found once per
convolution, direction and beta, and run through a variant pack kept per set of pointers.

Why.  cuDNN 9's legacy convolution calls cost the host 23 to 64 us each on the H200
machines (session 41, ``docs/results/tuner_s41/conv_host.py``): cuDNN looks its engine up
again on every call.  A deep net at a small minibatch issues more convolution calls than
the device can run in the host's time (ResNet-152 at 16: 465 calls, the host 62 to 113 ms
per iteration against the device's 57 to 69), so the iteration runs at the host's pace.
Through the backend API the plan is built once, and ``cudnnBackendExecute`` with a kept
variant pack cost 10 to 38 us per call where the legacy call cost 43 to 120 on the same
machine (session 42, ``docs/results/tuner_s42/backend_probe.py``).

Which plan, by the legacy search's rules (:mod:`.ops`):

- engine configurations come from cuDNN's heuristics, mode INSTANT and then FALLBACK, at
  most :data:`MAX_CONFIGS` each, and then every other engine of the operation graph with
  its default knobs (``CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT``): without FMA-only
  Winograd and FFT engines, which the heuristics do not name, the 3x3 convolutions ran 2
  to 4 times slower on the device than the legacy call's algorithm (session 42, call b);
- a configuration is dropped where its engine's notes break the rules the legacy search
  keeps (:func:`refusal`): float32 without ``tf32`` takes no engine noted TENSOR_CORE (TF32
  on float32), DOWN_CONVERT_INPUTS or REDUCED_PRECISION_REDUCTION, as ``CUDNN_FMA_MATH``
  does for the legacy calls; ``deterministic`` takes no NONDETERMINISTIC engine; and no
  engine compiled at run time is taken (it costs seconds per plan);
- a plan must fit the workspace the legacy choice was given: the caller's buffer, which the
  layer sized from the legacy choices, or without one the legacy choice's own bytes.  The
  memory a layer reports, and so the tuner's memory model, is the same under either API;
- every remaining plan is timed on the call's own operands (outputs that are accumulated
  into get temporaries), and the legacy algorithm beside them the same way: all queued
  behind one device-side wait (:func:`minicaffe.kernels.device_wait.device_wait`) so that
  CUDA events time the device and not the host's issue, :data:`SEARCH_REPS` runs each after
  a warm-up.  A search is made once per process for each shape, options and workspace
  limit (``ops._graph_choices``), whichever layer binds the shape.  The fastest plan is used where it is within :data:`LEGACY_MARGIN` of the legacy algorithm's
  device time; else the direction keeps the legacy call, so the host's saving is never paid
  for on the device.

Variant packs.  A pack binds the device pointers of one call (x or dx, w or dw, y or dy,
the workspace).  A layer's blobs keep their addresses from one iteration to the next (the
arenas and CuPy's pool hand back the same blocks), so a plan keeps its packs by pointers;
past :data:`MAX_PACKS` they are all dropped and built again as calls need them.

Tensors are declared 16-byte aligned; a call whose pointers are not (a chunk's slice at an
odd offset) runs the legacy call.  Enum values are cuDNN 9's ``cudnn_graph.h``.

``$MINICAFFE_CUDNN_API`` (``graph``, the default since session 43, or ``legacy``) or
``BoundConv(api=)`` picks the API; the free functions (``conv2d_forward`` and its siblings)
always call the legacy API, and so does every bound call the graph API cannot take (see
:func:`counts`; a cuDNN without the backend API takes none).
"""
from __future__ import annotations

import ctypes
import os
from ctypes import byref, c_double, c_float, c_int, c_int64, c_void_p
from typing import NamedTuple

import numpy as np

from . import lib as L

ENV_API = "MINICAFFE_CUDNN_API"
APIS = ("legacy", "graph")
# graph since session 43: the whole GPU suite passed on it (900 and the two tests fixed after),
# and the tuner met its model targets on six of the seven networks (docs/RESULTS.md)
DEFAULT_API = "graph"

MAX_CONFIGS = 24        # engine configurations asked of each heuristics mode
MAX_PACKS = 64          # variant packs a plan keeps
# what the bound convolutions did on this API since the process began (counts(); the
# diagnosis of a host-bound step: packs built or calls left to the legacy API while timed)
_counts = {"executes": 0, "packs_built": 0, "packs_dropped": 0, "searches": 0,
           "legacy_misaligned": 0, "legacy_in_capture": 0, "legacy_no_plan": 0}
SEARCH_REPS = 2         # timed runs of each candidate
LEGACY_MARGIN = 1.02    # a plan is used where its device time is within 2 % of legacy's

# cudnnBackendDescriptorType_t
_CONVOLUTION, _ENGINE, _ENGINECFG, _ENGINEHEUR, _EXECUTION_PLAN = 1, 2, 3, 4, 5
_OPERATION = {"fwd": 10, "bwd_filter": 11, "bwd_data": 12}
_OPERATIONGRAPH, _VARIANT_PACK, _TENSOR = 15, 16, 17
# cudnnBackendAttributeType_t
_T_HANDLE, _T_DATA_TYPE, _T_INT64, _T_FLOAT, _T_DOUBLE, _T_VOID_PTR = 0, 1, 3, 4, 5, 6
_T_CONVOLUTION_MODE, _T_HEUR_MODE, _T_NUMERICAL_NOTE, _T_DESCRIPTOR = 7, 8, 11, 15
_T_BEHAVIOR_NOTE = 19
_CTYPES = {_T_HANDLE: c_void_p, _T_DATA_TYPE: c_int, _T_INT64: c_int64, _T_FLOAT: c_float,
           _T_DOUBLE: c_double, _T_VOID_PTR: c_void_p, _T_CONVOLUTION_MODE: c_int,
           _T_HEUR_MODE: c_int, _T_DESCRIPTOR: c_void_p}
# cudnnBackendAttributeName_t
_CONV_COMP_TYPE, _CONV_CONV_MODE, _CONV_DILATIONS, _CONV_FILTER_STRIDES = 100, 101, 102, 103
_CONV_POST_PADDINGS, _CONV_PRE_PADDINGS, _CONV_SPATIAL_DIMS = 104, 105, 106
_HEUR_MODE, _HEUR_OPERATION_GRAPH, _HEUR_RESULTS = 200, 201, 202
_ENGINECFG_ENGINE = 300
_PLAN_HANDLE, _PLAN_ENGINE_CONFIG, _PLAN_WORKSPACE_SIZE = 400, 401, 402
# per operation: alpha, beta, the convolution, then its tensors (uids 1, 2, 3 below)
_OPERATION_ATTRS = {
    "fwd": (700, 701, 702, {"x": 704, "w": 703, "y": 705}),
    "bwd_data": (706, 707, 708, {"x": 710, "w": 709, "y": 711}),
    "bwd_filter": (712, 713, 714, {"x": 716, "w": 715, "y": 717}),
}
_GRAPH_HANDLE, _GRAPH_OPS, _GRAPH_ENGINE_GLOBAL_COUNT = 800, 801, 802
_TENSOR_BYTE_ALIGNMENT, _TENSOR_DATA_TYPE, _TENSOR_DIMENSIONS = 900, 901, 902
_TENSOR_STRIDES, _TENSOR_UNIQUE_ID = 903, 906
_PACK_UNIQUE_IDS, _PACK_DATA_POINTERS, _PACK_WORKSPACE = 1000, 1001, 1003
_ENGINE_OPERATION_GRAPH, _ENGINE_GLOBAL_INDEX = 1300, 1301
_ENGINE_NUMERICAL_NOTE, _ENGINE_BEHAVIOR_NOTE = 1303, 1305
# enum values of the attributes
_HEUR_MODE_INSTANT, _HEUR_MODE_FALLBACK = 0, 2
_CROSS_CORRELATION = 1
_DATA_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}
NOTE_NAMES = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT",
              "NONDETERMINISTIC", "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6",
              "WINOGRAD_TILE_13x13", "STRICT_NAN_PROP")
BEHAVIOR_NAMES = ("RUNTIME_COMPILATION", "REQUIRES_FILTER_INT8x32_REORDER",
                  "REQUIRES_BIAS_INT8x32_REORDER", "SUPPORTS_CUDA_GRAPH_NATIVE_API")
_UIDS = (1, 2, 3)       # x or dx, w or dw, y or dy
ALIGNMENT = 16


def api_choice(value=None) -> str:
    """``legacy`` or ``graph``: ``value`` where given, else ``$MINICAFFE_CUDNN_API``, else
    :data:`DEFAULT_API`."""
    raw = value if value is not None else os.environ.get(ENV_API, DEFAULT_API)
    v = str(raw).strip().lower()
    if v not in APIS:
        where = "api=" if value is not None else f"${ENV_API}"
        raise ValueError(f"{where}{raw!r}: the cuDNN API is one of {', '.join(APIS)}")
    return v


def refusal(notes, behaviours, dtype, tf32: bool, deterministic: bool) -> str | None:
    """Why an engine with these numerical and behaviour notes (names, as in
    :data:`NOTE_NAMES` and :data:`BEHAVIOR_NAMES`) may not run a call under the legacy
    search's rules; None where it may."""
    if np.dtype(dtype) == np.float32 and not tf32:
        for note in ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"):
            if note in notes:
                return f"{note} (float32 without TF32)"
    if deterministic and "NONDETERMINISTIC" in notes:
        return "NONDETERMINISTIC"
    if "RUNTIME_COMPILATION" in behaviours:
        return "RUNTIME_COMPILATION"
    return None


def packed_strides(shape) -> list:
    """The strides, in elements, of a C-contiguous array of ``shape``."""
    out, step = [], 1
    for d in reversed(tuple(shape)):
        out.append(step)
        step *= int(d)
    return out[::-1]


def aligned(*pointers) -> bool:
    """Whether every pointer (None counts as aligned) is :data:`ALIGNMENT`-byte aligned."""
    bits = 0
    for p in pointers:
        bits |= p or 0
    return bits % ALIGNMENT == 0


# ------------------------------------------------------------------ binding
class _Api:
    """The backend API's functions of one loaded library (statuses checked by callers)."""

    def __init__(self, library):
        c = library._cdll
        self.library = library
        self.create = c.cudnnBackendCreateDescriptor
        self.create.argtypes, self.create.restype = [c_int, ctypes.POINTER(c_void_p)], c_int
        self.destroy = c.cudnnBackendDestroyDescriptor
        self.destroy.argtypes, self.destroy.restype = [c_void_p], c_int
        self.finalize = c.cudnnBackendFinalize
        self.finalize.argtypes, self.finalize.restype = [c_void_p], c_int
        self.set = c.cudnnBackendSetAttribute
        self.set.argtypes = [c_void_p, c_int, c_int, c_int64, c_void_p]
        self.set.restype = c_int
        self.get = c.cudnnBackendGetAttribute
        self.get.argtypes = [c_void_p, c_int, c_int, c_int64, ctypes.POINTER(c_int64),
                             c_void_p]
        self.get.restype = c_int
        self.execute = c.cudnnBackendExecute
        self.execute.argtypes, self.execute.restype = [c_void_p, c_void_p, c_void_p], c_int

    def check(self, status, what):
        if status != 0:
            raise L.CudnnError(what, status, self.library.last_error())


def _api(library) -> _Api:
    a = getattr(library, "_backend_api", None)
    if a is None:
        a = library._backend_api = _Api(library)
    return a


class _Descriptor:
    """One backend descriptor, destroyed with the object."""

    __slots__ = ("api", "ptr", "kind")

    def __init__(self, api: _Api, kind: int):
        v = c_void_p()
        api.check(api.create(kind, byref(v)), f"cudnnBackendCreateDescriptor({kind})")
        self.api, self.ptr, self.kind = api, v.value, kind

    def set(self, name: int, typ: int, values):
        arr = (_CTYPES[typ] * len(values))(*values)
        self.api.check(self.api.set(self.ptr, name, typ, len(values),
                                    ctypes.cast(arr, c_void_p)),
                       f"cudnnBackendSetAttribute({self.kind}, {name})")
        return self

    def finalize(self, what: str):
        self.api.check(self.api.finalize(self.ptr), f"cudnnBackendFinalize({what})")
        return self

    def get_values(self, name: int, typ: int, count: int, ctype) -> list:
        """Up to ``count`` values of an attribute of a scalar type ([] where cuDNN refuses)."""
        arr = (ctype * count)()
        n = c_int64()
        if self.api.get(self.ptr, name, typ, count, byref(n), ctypes.cast(arr, c_void_p)):
            return []
        return list(arr[:n.value])

    def __del__(self):
        try:
            self.api.destroy(self.ptr)
        except Exception:       # interpreter exit: the library may be gone
            pass


# ------------------------------------------------------------ operation graphs
class Candidate(NamedTuple):
    """One finalized execution plan of an operation graph."""
    plan: _Descriptor
    workspace: int
    engine: int                 # the engine's global index
    notes: tuple
    behaviours: tuple
    keep: tuple                 # the descriptors the plan was built from


def _tensor(api, uid, shape, dtype) -> _Descriptor:
    t = _Descriptor(api, _TENSOR)
    t.set(_TENSOR_DATA_TYPE, _T_DATA_TYPE, [_DATA_TYPES[np.dtype(dtype)]])
    t.set(_TENSOR_DIMENSIONS, _T_INT64, list(shape))
    t.set(_TENSOR_STRIDES, _T_INT64, packed_strides(shape))
    t.set(_TENSOR_UNIQUE_ID, _T_INT64, [uid])
    t.set(_TENSOR_BYTE_ALIGNMENT, _T_INT64, [ALIGNMENT])
    return t.finalize("tensor")


def operation_graph(api, handle, geom, dtype, direction: str, beta: float):
    """(the finalized operation graph of one convolution direction, the descriptors it
    holds).  The group count is the ratio of x's channels to w's."""
    dt = np.dtype(dtype)
    conv = _Descriptor(api, _CONVOLUTION)
    conv.set(_CONV_COMP_TYPE, _T_DATA_TYPE, [_DATA_TYPES[dt]])
    conv.set(_CONV_CONV_MODE, _T_CONVOLUTION_MODE, [_CROSS_CORRELATION])
    conv.set(_CONV_SPATIAL_DIMS, _T_INT64, [2])
    conv.set(_CONV_DILATIONS, _T_INT64, list(geom.dilation))
    conv.set(_CONV_FILTER_STRIDES, _T_INT64, list(geom.stride))
    conv.set(_CONV_PRE_PADDINGS, _T_INT64, list(geom.pad))
    conv.set(_CONV_POST_PADDINGS, _T_INT64, list(geom.pad))
    conv.finalize("convolution")
    x = _tensor(api, _UIDS[0], geom.x_shape, dt)
    w = _tensor(api, _UIDS[1], geom.w_shape, dt)
    y = _tensor(api, _UIDS[2], geom.y_shape, dt)
    alpha, beta_attr, conv_attr, tensors = _OPERATION_ATTRS[direction]
    op = _Descriptor(api, _OPERATION[direction])
    for key, t in (("x", x), ("w", w), ("y", y)):
        op.set(tensors[key], _T_DESCRIPTOR, [t.ptr])
    op.set(conv_attr, _T_DESCRIPTOR, [conv.ptr])
    scalar = _T_DOUBLE if dt == np.float64 else _T_FLOAT
    op.set(alpha, scalar, [1.0])
    op.set(beta_attr, scalar, [float(beta)])
    op.finalize(f"convolution {direction} operation")
    graph = _Descriptor(api, _OPERATIONGRAPH)
    graph.set(_GRAPH_HANDLE, _T_HANDLE, [handle])
    graph.set(_GRAPH_OPS, _T_DESCRIPTOR, [op.ptr])
    graph.finalize("operation graph")
    return graph, (conv, x, w, y, op)


def _configs(api, graph, mode: int) -> list:
    """The engine configurations cuDNN's heuristics of ``mode`` name for ``graph``."""
    heur = _Descriptor(api, _ENGINEHEUR)
    heur.set(_HEUR_OPERATION_GRAPH, _T_DESCRIPTOR, [graph.ptr])
    heur.set(_HEUR_MODE, _T_HEUR_MODE, [mode])
    if api.finalize(heur.ptr):
        return []
    n = c_int64()
    if api.get(heur.ptr, _HEUR_RESULTS, _T_DESCRIPTOR, 0, byref(n), None):
        return []
    cfgs = [_Descriptor(api, _ENGINECFG) for _ in range(min(int(n.value), MAX_CONFIGS))]
    if not cfgs:
        return []
    arr = (c_void_p * len(cfgs))(*[c.ptr for c in cfgs])
    if api.get(heur.ptr, _HEUR_RESULTS, _T_DESCRIPTOR, len(cfgs), byref(n),
               ctypes.cast(arr, c_void_p)):
        return []
    return cfgs[:n.value]


def _every_engine(api, graph, seen):
    """(engine configuration, engine) of every engine of ``graph`` not in ``seen``, with its
    default knobs: the heuristics leave out engines the legacy search times (FFT and
    Winograd among them, which the legacy calls pick for 3x3 convolutions)."""
    count = graph.get_values(_GRAPH_ENGINE_GLOBAL_COUNT, _T_INT64, 1, c_int64)
    for index in range(int(count[0]) if count else 0):
        if index in seen:
            continue
        engine = _Descriptor(api, _ENGINE)
        engine.set(_ENGINE_OPERATION_GRAPH, _T_DESCRIPTOR, [graph.ptr])
        engine.set(_ENGINE_GLOBAL_INDEX, _T_INT64, [index])
        if api.finalize(engine.ptr):
            continue            # not an engine for this graph
        cfg = _Descriptor(api, _ENGINECFG)
        cfg.set(_ENGINECFG_ENGINE, _T_DESCRIPTOR, [engine.ptr])
        if api.finalize(cfg.ptr):
            continue
        yield cfg, engine


def _heuristic_engines(api, graph):
    """(engine configuration, engine) of each configuration the heuristics name."""
    for mode in (_HEUR_MODE_INSTANT, _HEUR_MODE_FALLBACK):
        for cfg in _configs(api, graph, mode):
            engine = _Descriptor(api, _ENGINE)
            arr = (c_void_p * 1)(engine.ptr)
            n = c_int64()
            if not api.get(cfg.ptr, _ENGINECFG_ENGINE, _T_DESCRIPTOR, 1, byref(n),
                           ctypes.cast(arr, c_void_p)):
                yield cfg, engine


def candidates(api, handle, graph, dtype, tf32: bool, deterministic: bool, limit: int):
    """(finalized plans within ``limit`` bytes of workspace that the rules allow, one per
    engine: the heuristics' configurations first, then every other engine of the graph
    with its default knobs; {engine: why it was left out})."""
    out, left_out, seen = [], {}, set()

    def every():
        yield from _heuristic_engines(api, graph)
        yield from _every_engine(api, graph, seen)

    for cfg, engine in every():
        index = engine.get_values(_ENGINE_GLOBAL_INDEX, _T_INT64, 1, c_int64)
        index = int(index[0]) if index else -1
        if index in seen:
            continue
        seen.add(index)
        notes = tuple(NOTE_NAMES[i] if 0 <= i < len(NOTE_NAMES) else str(i) for i in
                      engine.get_values(_ENGINE_NUMERICAL_NOTE, _T_NUMERICAL_NOTE, 16,
                                        c_int))
        behaviours = tuple(BEHAVIOR_NAMES[i] if 0 <= i < len(BEHAVIOR_NAMES) else str(i)
                           for i in engine.get_values(_ENGINE_BEHAVIOR_NOTE,
                                                      _T_BEHAVIOR_NOTE, 16, c_int))
        why = refusal(notes, behaviours, dtype, tf32, deterministic)
        if why is not None:
            left_out[index] = why
            continue
        plan = _Descriptor(api, _EXECUTION_PLAN)
        plan.set(_PLAN_HANDLE, _T_HANDLE, [handle])
        plan.set(_PLAN_ENGINE_CONFIG, _T_DESCRIPTOR, [cfg.ptr])
        if api.finalize(plan.ptr):
            left_out[index] = "the plan does not finalize"
            continue
        ws = plan.get_values(_PLAN_WORKSPACE_SIZE, _T_INT64, 1, c_int64)
        if not ws:
            left_out[index] = "no workspace size"
            continue
        if ws[0] > limit:
            left_out[index] = f"needs {ws[0]} B of workspace"
            continue
        out.append(Candidate(plan, int(ws[0]), index, notes, behaviours, (cfg, engine)))
    return out, left_out


# ---------------------------------------------------------------- execution
class GraphConv:
    """One convolution direction's chosen execution plan and its variant packs."""

    __slots__ = ("api", "candidate", "workspace", "engine", "graph_ms", "legacy_ms",
                 "_plan", "_packs", "_keep")

    def __init__(self, api, candidate: Candidate, graph_ms: float, legacy_ms, keep):
        self.api = api
        self.candidate = candidate
        self.workspace = candidate.workspace
        self.engine = candidate.engine
        self.graph_ms, self.legacy_ms = graph_ms, legacy_ms
        self._plan = candidate.plan.ptr
        self._packs: dict = {}
        self._keep = keep       # the operation graph and its descriptors

    def _pack(self, key) -> _Descriptor:
        if len(self._packs) >= MAX_PACKS:
            _counts["packs_dropped"] += len(self._packs)
            self._packs.clear()
        _counts["packs_built"] += 1
        p = _Descriptor(self.api, _VARIANT_PACK)
        p.set(_PACK_UNIQUE_IDS, _T_INT64, list(_UIDS))
        p.set(_PACK_DATA_POINTERS, _T_VOID_PTR, list(key[:3]))
        p.set(_PACK_WORKSPACE, _T_VOID_PTR, [key[3]])
        p.finalize("variant pack")
        self._packs[key] = p
        return p

    def run(self, handle, p_x, p_w, p_y, p_ws):
        """Execute on the handle's stream: pointers to x (or dx), w (or dw), y (or dy) and
        the workspace (None or 0 where it needs none)."""
        key = (p_x, p_w, p_y, p_ws)
        pack = self._packs.get(key)
        if pack is None:
            pack = self._pack(key)
        _counts["executes"] += 1
        status = self.api.execute(handle, self._plan, pack.ptr)
        if status:
            self.api.check(status, f"cudnnBackendExecute(engine {self.engine})")

    def packs(self) -> int:
        return len(self._packs)


HOST_US_PER_RUN = 100.0  # the device-side wait allows this much of the host's time per run


def _device_ms(cp, runs, reps: int, tries: int = 3) -> list:
    """Device milliseconds per run of each callable, after one untimed run of each (module
    loading): all of them queued behind one device-side wait, long enough
    (:data:`HOST_US_PER_RUN` per run, twice the slowest host seen per call) that the host
    has queued every timed run before the device starts the first, so the events between
    them time the device alone.  Where the wait had ended before the host finished queueing
    (a host slower than that), the times carry the host's gaps: they are taken again behind
    a wait twice as long, up to ``tries`` times.  One wait per search: ResNet-152's 464
    searches per minibatch took 9 to 29 s with a wait per candidate."""
    from minicaffe.kernels.device_wait import device_wait
    for r in runs:
        r()
    stream = cp.cuda.get_current_stream()
    stream.synchronize()
    wait = 2e-4 + len(runs) * reps * HOST_US_PER_RUN * 1e-6
    for _ in range(tries):
        device_wait(cp, wait)
        waited = cp.cuda.Event()
        waited.record(stream)
        events = []
        for r in runs:
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            for _ in range(reps):
                r()
            e1.record(stream)
            events.append((e0, e1))
        # the device reached the runs before the host had queued them all
        overrun = waited.done
        events[-1][1].synchronize()
        if not overrun:
            break
        wait *= 2
    return [cp.cuda.get_elapsed_time(a, b) / reps for a, b in events]


_searches: list = []    # what each search found (search_log)


def search(library, handle, geom, dtype, tf32: bool, deterministic: bool, direction: str,
           accumulate: bool, limit: int, pointers, workspace_ptr, legacy_run=None):
    """The :class:`GraphConv` for one convolution direction, or None where the legacy call
    is to be kept (no plan within the rules and ``limit``, or the fastest plan slower on
    the device than ``legacy_run``, a callable making the legacy call on the same
    operands, by more than :data:`LEGACY_MARGIN`).  ``pointers``: x (or dx), w (or dw), y
    (or dy) for the search's runs; an output that is accumulated into must be scratch."""
    import cupy as cp
    record = {"direction": direction, "x": tuple(geom.x_shape), "w": tuple(geom.w_shape),
              "accumulate": bool(accumulate), "limit": int(limit), "candidates": 0,
              "left_out": {}, "engine": None, "graph_ms": None, "legacy_ms": None,
              "workspace": None, "error": None}
    _searches.append(record)
    _counts["searches"] += 1
    try:
        api = _api(library)
    except AttributeError as e:     # a cuDNN without the backend API (before 8): legacy calls
        record["error"] = f"no backend API in this cuDNN: {e}"
        return None
    try:
        graph, held = operation_graph(api, handle, geom, dtype, direction,
                                      1.0 if accumulate else 0.0)
        found, left_out = candidates(api, handle, graph, dtype, tf32, deterministic, limit)
    except L.CudnnError as e:     # a convolution the backend API cannot describe
        record["error"] = str(e)
        return None
    record.update(candidates=len(found), left_out=dict(left_out))
    if not found:
        return None
    # the legacy call first: what a host gap would still add falls on the plans, not on it
    runs = [] if legacy_run is None else [legacy_run]
    for c in found:
        gc = GraphConv(api, c, 0.0, None, (graph, held))
        runs.append(lambda gc=gc: gc.run(handle, *pointers, workspace_ptr))
    times = _device_ms(cp, runs, SEARCH_REPS)
    legacy_ms = times.pop(0) if legacy_run is not None else None
    best = min(range(len(found)), key=times.__getitem__)
    record.update(engine=found[best].engine, graph_ms=times[best], legacy_ms=legacy_ms,
                  workspace=found[best].workspace,
                  times={c.engine: t for c, t in zip(found, times)})
    if legacy_ms is not None and times[best] > legacy_ms * LEGACY_MARGIN:
        return None
    return GraphConv(api, found[best], times[best], legacy_ms, (graph, held))


def counts() -> dict:
    """How many graph-API executions, variant packs built and dropped (a plan keeps
    :data:`MAX_PACKS`), searches, and calls left to the legacy API (misaligned pointers, a
    first call inside a capture, no plan within the rules or the margin) this process made.
    The search's own timed runs count as executions."""
    return dict(_counts)


def count(what: str):
    """One more ``what`` in :func:`counts` (module ops: the legacy calls it makes)."""
    _counts[what] += 1


def search_log() -> list:
    """What each search of this process found (a dict per search: the direction, the
    shapes, the candidates' device times by engine, the one chosen, the legacy time)."""
    return list(_searches)


def clear_search_log():
    _searches.clear()
