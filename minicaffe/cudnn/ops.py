"""cuDNN operations for the CUDNN engine: convolution, pooling, LRN, softmax.

Arrays are CuPy ndarrays on the current device, C-contiguous, float32 or
float64, in Caffe's layouts: images (N, C, H, W), weights (M, C/G, kh, kw),
biases (M,).  Every call sets the cuDNN handle's stream to CuPy's current
stream first, so work is ordered with the CuPy kernels around it; no call
synchronizes the host except an algorithm search (below).

Semantics follow Caffe's parameter-diff rule: ``conv2d_backward_filter`` and
``conv2d_backward_bias`` *accumulate* into their output (cuDNN ``beta = 1``),
every other op overwrites its output (``beta = 0``).

Convolution algorithms
    For each (shapes, pad, stride, dilation, groups, dtype, math) plan and each
    direction (fwd, bwd_data, bwd_filter) one algorithm is chosen once and
    cached: with ``find=True`` by timing every algorithm on the device
    (``cudnnFindConvolution*AlgorithmEx``: synchronizes, and needs the
    operands; :func:`conv_workspace_bytes` allocates temporary ones), with
    ``find=False`` by cuDNN's heuristics (``cudnnGetConvolution*Algorithm_v7``).
    The chosen algorithm is the fastest whose workspace fits the limit
    (``workspace_limit=`` or ``$MINICAFFE_CUDNN_WORKSPACE_LIMIT``, default
    64 MiB; 0 forces zero-workspace algorithms), whose math is allowed
    (float32 with ``tf32=False``: ``CUDNN_FMA_MATH`` only, so no TF32, as
    Caffe; ``tf32=True``: ``CUDNN_DEFAULT_MATH``, TF32 tensor cores allowed),
    and, with ``deterministic=True``, that cuDNN reports as
    ``CUDNN_DETERMINISTIC``.  The descriptor's math type is then set to the one
    the search reported with the algorithm (cuDNN runs an algorithm with the
    descriptor's math type, not the one it timed).

Workspace
    Pass ``workspace=`` (a CuPy array of at least the chosen algorithm's
    bytes; if it is smaller, an algorithm that fits it is chosen instead), or
    leave it None to use a cached per-op CuPy buffer (grown on demand,
    dropped by :func:`release_workspaces`).  :func:`conv_workspace_bytes`
    tells a layer how much scratch to report to the memory manager.  Keep
    operands and workspaces 256-byte aligned (CuPy's allocations are): an
    algorithm found on aligned buffers may refuse a misaligned one
    (``CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER``), so arena offsets should
    be rounded up to 256 bytes.

Pooling and Caffe's ceil rounding
    Caffe's pooled size rounds up (``ceil((H + 2p - k) / s) + 1``, minus a
    last window that would start in the padding), so the last window may
    overhang the padded input; cuDNN's own output size
    (``cudnnGetPooling2dForwardOutputDim``) rounds down.  The output
    descriptor is given Caffe's size explicitly, as Caffe's own
    ``CuDNNPoolingLayer`` does.  Whether this cuDNN accepts an output larger
    than its floor size and computes the overhanging windows as Caffe does
    (MAX over the pixels inside the image; AVE divided by the window clipped
    to the padded input), and whether it pools padded windows as Caffe does
    (MAX ignores the padding, AVE counts it: ``AVERAGE_COUNT_INCLUDE_PADDING``),
    is not taken on trust: it is measured once per process, mode and kind by a
    probe against :func:`pool2d_reference`, a NumPy transcription of Caffe's
    pooling (:func:`pool2d_supported`).  Where cuDNN rejects or differs, and
    for windows that cover no pixel at all (stride > kernel without padding),
    the pooling ops raise :class:`CudnnUnsupported` ("use the CAFFE engine")
    and the layer falls back.  ``tests/cudnn`` reports the probes' outcome
    (``test_pooling_probes``, XFAIL with cuDNN's answer where it differs).
    MAX backward recomputes the argmax from the bottom and top data (cuDNN
    keeps no mask), so it reads both; for ties it may route the gradient to
    another maximum than Caffe's first one.  AVE backward reads neither.

LRN
    ``cudnnSetLRNDescriptor(n, alpha, beta, k)`` divides ``alpha`` by the
    window width ``n`` itself (cuDNN API reference, ``lrnAlpha``: "Inside the
    library code, this value is divided by the window width for LRN"), so
    Caffe's ``alpha`` is passed unchanged, as Caffe's ``CuDNNLRNLayer`` does:
    both compute ``y = x * (k + alpha/n * sum_window x^2)^-beta``
    (``tests/cudnn`` checks it against the CAFFE engine with alpha up to 3).
    cuDNN's window is ``[c - (n-1)/2, c + n - 1 - (n-1)/2]``, Caffe's for odd
    ``n``.  cuDNN requires 1 <= n <= 16, k >= 1e-5, beta >= 0.01
    (:func:`lrn_supported`); only ACROSS_CHANNELS maps onto cuDNN.

Errors
    Argument mistakes raise ValueError/TypeError naming the op and the
    argument; a configuration cuDNN lacks (its NOT_SUPPORTED statuses, no
    algorithm within the limits, the pooling and LRN rules above) raises
    :class:`CudnnUnsupported`, on which a layer falls back to the CAFFE
    engine; any other cuDNN failure raises :class:`CudnnError` with cuDNN's
    own message.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import threading
from collections import OrderedDict
from ctypes import byref, c_double, c_float, c_int, c_size_t, c_void_p
from typing import NamedTuple

import numpy as np

from . import backend_api
from . import lib as L
from .lib import CudnnError, CudnnUnsupported

DEFAULT_WORKSPACE_LIMIT = 4 << 30
BUDGET_WORKSPACE_SHARE = 16          # a fixed bound under a memory budget: budget / 16 per call
BUDGET_WORKSPACE_CAP_SHARE = 4       # a bound per image under a budget: at most budget / 4
MIN_BUDGET_WORKSPACE_LIMIT = 64 << 20
# under a budget, by default: 8 MiB of workspace per image of the call's minibatch (session 11,
# H200: VGG-16's and AlexNet's fastest algorithms within it at every minibatch; see
# docs/RESULTS.md "cuDNN workspace bound")
DEFAULT_WORKSPACE_PER_IMAGE = 8 << 20
ENV_WORKSPACE_LIMIT = "MINICAFFE_CUDNN_WORKSPACE_LIMIT"
ENV_WORKSPACE_PER_IMAGE = "MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE"
# the most workspace one call gets under a bound per image (default: a quarter of the budget)
ENV_WORKSPACE_CAP = "MINICAFFE_CUDNN_WORKSPACE_CAP"
# 0: a convolution under a bound per image runs on the whole minibatch even past the cap
ENV_CHUNKS = "MINICAFFE_CUDNN_CHUNKS"
# 0: every convolution under a bound per image gets the budget's bytes per image, not those
# its own fastest algorithms need (:func:`fastest_bytes_per_image`)
ENV_FIT = "MINICAFFE_CUDNN_FIT_FASTEST"
# a layer's fastest algorithms are timed on this many images, within the cap
FIT_PROBE_IMAGES = 16
# an algorithm within 5 % of the fastest counts as fast (the least workspace among them wins)
FASTEST_TOLERANCE = 1.05
FWD, BWD_DATA, BWD_FILTER = "fwd", "bwd_data", "bwd_filter"
DIRECTIONS = (FWD, BWD_DATA, BWD_FILTER)
MAX, AVE = 0, 1  # Caffe's PoolingParameter.PoolMethod values

_INT_MAX = (1 << 31) - 1
_DTYPES = {np.dtype(np.float32): L.CUDNN_DATA_FLOAT, np.dtype(np.float64): L.CUDNN_DATA_DOUBLE}
# alpha/beta scale factors live in host memory: float for float data, double for double
_SCALAR_OBJS = {np.dtype(np.float32): (c_float(1.0), c_float(0.0)),
                np.dtype(np.float64): (c_double(1.0), c_double(0.0))}
_SCALARS = {dt: (ctypes.addressof(one), ctypes.addressof(zero))
            for dt, (one, zero) in _SCALAR_OBJS.items()}

_lock = threading.RLock()
_generation = [0]   # clear_cache() counts up: every BoundConv fetches its plan and choices again


# ------------------------------------------------------------------ helpers
def _cupy():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - CuPy absent
        raise RuntimeError("the CUDNN engine needs CuPy: pip install 'minicaffe[gpu]'") from e
    return cupy


def parse_bytes(text) -> int:
    """'67108864', '64M', '64MiB', '1G', '512k' -> bytes (binary multiples)."""
    s = str(text).strip().lower().replace("ib", "").replace("b", "")
    mult = 1
    if s and s[-1] in "kmgt":
        mult = 1 << (10 * ("kmgt".index(s[-1]) + 1))
        s = s[:-1]
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a byte count (examples: 0, 67108864, 64M, "
                         "1G)") from None
    if v < 0 or not math.isfinite(v):
        raise ValueError(f"byte count {text!r} must be non-negative")
    return int(v * mult)


def env_bytes(var: str, default: int) -> int:
    """Bytes from the environment variable ``var`` (:func:`parse_bytes`), ``default`` when it
    is unset or empty; a bad value raises ValueError naming the variable."""
    text = os.environ.get(var, "").strip()
    if not text:
        return default
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise ValueError(f"${var}: {e}") from None


def workspace_limit(value=None) -> int:
    """The convolution workspace limit in bytes: ``value``, else
    ``$MINICAFFE_CUDNN_WORKSPACE_LIMIT``, else 4 GiB (:data:`DEFAULT_WORKSPACE_LIMIT`)."""
    if value is not None:
        v = int(value)
        if v < 0:
            raise ValueError(f"workspace_limit must be >= 0 bytes, got {value}")
        return v
    return env_bytes(ENV_WORKSPACE_LIMIT, DEFAULT_WORKSPACE_LIMIT)


def _pair(v, name) -> tuple[int, int]:
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    t = tuple(int(a) for a in v)
    if len(t) != 2:
        raise ValueError(f"{name} must be an int or an (h, w) pair, got {v!r}")
    return t


def _check_arrays(op: str, **arrays):
    """The common dtype of the given CuPy arrays (None entries skipped); raises
    with the op and argument names on anything cuDNN cannot take."""
    cp = _cupy()
    dt, first = None, None
    dev = cp.cuda.runtime.getDevice()
    for name, a in arrays.items():
        if a is None:
            continue
        if not isinstance(a, cp.ndarray):
            raise TypeError(f"{op}: {name} must be a cupy.ndarray, got {type(a).__name__}")
        if a.dtype not in _DTYPES:
            raise TypeError(f"{op}: {name} has dtype {a.dtype}; cuDNN ops take float32 or float64")
        if not a.flags.c_contiguous:
            raise ValueError(f"{op}: {name} of shape {a.shape} must be C-contiguous")
        if a.device.id != dev:
            raise ValueError(f"{op}: {name} lives on device {a.device.id}, the current device is "
                             f"{dev}")
        if dt is None:
            dt, first = a.dtype, name
        elif a.dtype != dt:
            raise TypeError(f"{op}: {name} is {a.dtype} but {first} is {dt}; dtypes must match")
    return dt


def _ptr(a) -> int:
    return a.data.ptr


def _refused(op: str, e: CudnnError) -> Exception:
    """What a failed call of ``op`` raises: CudnnUnsupported for NOT_SUPPORTED, else ``e``
    (:func:`_refusal` for the hot paths, which catch the error themselves: a generator
    context manager costs about 3 us per call, 469 calls per ResNet-152 iteration)."""
    if e.not_supported:
        return CudnnUnsupported(f"{op}: {e}; use the CAFFE engine")
    return e


@contextlib.contextmanager
def _refusal(op: str):
    """Turn cuDNN's NOT_SUPPORTED (a shape, type or layout it lacks) into CudnnUnsupported,
    the error on which a layer falls back to the CAFFE engine."""
    try:
        yield
    except CudnnError as e:
        err = _refused(op, e)
        if err is e:
            raise
        raise err from e


# ------------------------------------------------------------------ handles
class _Handles(threading.local):
    def __init__(self):
        self.by_device = {}     # device -> [handle, the stream it was last bound to]


_handles = _Handles()


def _handle():
    """(library, handle) for the current device and thread, bound to CuPy's current stream."""
    lib, h, _ = _handle_on_device()
    return lib, h


def _handle_on_device():
    """(library, handle, device) for the current device and thread, the handle bound to
    CuPy's current stream.

    Handles live as long as their thread (cuDNN handles must not be shared by
    threads running concurrently); creating one costs a few hundred ms once.  The
    stream is set only when it differs from the one the handle was last bound to
    (only this function binds these handles), which saves a library call per op.
    A handle keeps the library that created it: the library is looked up (an
    environment read, ``$MINICAFFE_CUDNN_PATH``) once per handle, not once per op
    (469 look-ups per ResNet-152 iteration, about 1 ms of the host's issue at batch 16).
    """
    cp = _cupy()
    dev = cp.cuda.runtime.getDevice()
    entry = _handles.by_device.get(dev)
    if entry is None:
        lib = L.load()
        v = c_void_p()
        lib.cudnnCreate(byref(v))
        entry = [v.value, None, lib]
        _handles.by_device[dev] = entry
    lib = entry[2]
    stream = cp.cuda.get_current_stream().ptr
    if entry[1] != stream:
        lib.cudnnSetStream(entry[0], stream)
        entry[1] = stream
    return lib, entry[0], dev


# -------------------------------------------------------------- descriptors
class _Desc:
    """An owned cuDNN descriptor: created now, destroyed with the object."""

    __slots__ = ("ptr", "_lib", "_destroy", "__weakref__")

    def __init__(self, create: str, destroy: str):
        self._lib = L.load()
        self._destroy = destroy
        self.ptr = None
        v = c_void_p()
        getattr(self._lib, create)(byref(v))
        self.ptr = v.value

    def __del__(self):
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            try:
                getattr(self._lib, self._destroy)(ptr)
            except Exception:  # interpreter shutdown, or a destroy failure: nothing to do
                pass


class _LRU:
    """A small LRU of descriptors keyed by their parameters."""

    def __init__(self, size: int):
        self.size = size
        self.d = OrderedDict()

    def get(self, key, make):
        v = self.d.get(key)
        if v is None:
            v = make()
            self.d[key] = v
            if len(self.d) > self.size:
                self.d.popitem(last=False)
        else:
            self.d.move_to_end(key)
        return v

    def clear(self):
        self.d.clear()


_tensor_descs = _LRU(4096)
_other_descs = _LRU(1024)


def _check_dims(op, shape):
    if any(d < 1 or d > _INT_MAX for d in shape):
        raise CudnnUnsupported(f"{op}: cuDNN takes dimensions 1..2^31-1, got {tuple(shape)}; "
                               "use the CAFFE engine")
    if math.prod(shape) > _INT_MAX:
        raise CudnnUnsupported(f"{op}: cuDNN's legacy API takes tensors of at most 2^31-1 "
                               f"elements, got {tuple(shape)}; use the CAFFE engine")


def _tensor_desc(shape, dtype) -> _Desc:
    """Packed NCHW tensor descriptor of a 4-d shape."""
    shape = tuple(int(d) for d in shape)
    key = (shape, np.dtype(dtype).str)

    def make():
        _check_dims("tensor", shape)
        n, c, h, w = shape
        d = _Desc("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor")
        d._lib.cudnnSetTensor4dDescriptorEx(d.ptr, _DTYPES[np.dtype(dtype)], n, c, h, w,
                                            c * h * w, h * w, w, 1)
        return d
    with _lock:
        return _tensor_descs.get(key, make)


def _filter_desc(shape, dtype) -> _Desc:
    """Filter descriptor (K, C/G, kh, kw), NCHW."""
    shape = tuple(int(d) for d in shape)
    key = ("filter", shape, np.dtype(dtype).str)

    def make():
        _check_dims("filter", shape)
        k, c, h, w = shape
        d = _Desc("cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor")
        d._lib.cudnnSetFilter4dDescriptor(d.ptr, _DTYPES[np.dtype(dtype)], L.CUDNN_TENSOR_NCHW,
                                          k, c, h, w)
        return d
    with _lock:
        return _other_descs.get(key, make)


# ------------------------------------------------------------- convolution
class ConvGeometry(NamedTuple):
    """A 2-d convolution's shapes: x (N, C, H, W), w (M, C/G, kh, kw), y (N, M, OH, OW)."""
    x_shape: tuple
    w_shape: tuple
    pad: tuple
    stride: tuple
    dilation: tuple
    groups: int
    y_shape: tuple


def conv_geometry(x_shape, w_shape, pad=0, stride=1, dilation=1, groups=1) -> ConvGeometry:
    """Check a convolution's parameters and compute its output shape (Caffe's floor rule,
    which is cuDNN's): ``OH = (H + 2*ph - (dh*(kh-1)+1)) // sh + 1``."""
    x_shape = tuple(int(d) for d in x_shape)
    w_shape = tuple(int(d) for d in w_shape)
    pad, stride, dilation = (_pair(pad, "pad"), _pair(stride, "stride"),
                             _pair(dilation, "dilation"))
    groups = int(groups)
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ValueError(f"conv2d: x must be (N, C, H, W) and w (M, C/G, kh, kw); got x "
                         f"{x_shape}, w {w_shape}")
    if groups < 1 or min(stride) < 1 or min(dilation) < 1 or min(pad) < 0:
        raise ValueError(f"conv2d: needs groups, stride, dilation >= 1 and pad >= 0; got groups "
                         f"{groups}, stride {stride}, dilation {dilation}, pad {pad}")
    n, c, h, w = x_shape
    m, cg, kh, kw = w_shape
    if cg * groups != c:
        raise ValueError(f"conv2d: x {x_shape} has {c} channels but w {w_shape} with groups "
                         f"{groups} expects {cg * groups}")
    if m % groups:
        raise ValueError(f"conv2d: {m} output channels of w {w_shape} are not a multiple of "
                         f"groups {groups}")
    oh = (h + 2 * pad[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (w + 2 * pad[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"conv2d: kernel {(kh, kw)} (dilation {dilation}) does not fit x "
                         f"{x_shape} padded by {pad}")
    return ConvGeometry(x_shape, w_shape, pad, stride, dilation, groups, (n, m, oh, ow))


class AlgoChoice(NamedTuple):
    """The algorithm chosen for one direction of one convolution plan."""
    direction: str
    algo: int
    name: str
    math_type: int
    workspace: int      # bytes the call needs
    time_ms: float      # measured by the search (heuristics: cuDNN's value, often -1)
    deterministic: bool
    source: str         # "find" or "heuristic"


class _DirSpec(NamedTuple):
    perf: type
    max_count: str
    find: str
    get: str
    ws: str
    run: str
    names: dict
    count: int


_SPECS = {
    FWD: _DirSpec(L.ConvolutionFwdAlgoPerf, "cudnnGetConvolutionForwardAlgorithmMaxCount",
                  "cudnnFindConvolutionForwardAlgorithmEx",
                  "cudnnGetConvolutionForwardAlgorithm_v7",
                  "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward",
                  L.FWD_ALGO_NAMES, L.CUDNN_CONVOLUTION_FWD_ALGO_COUNT),
    BWD_DATA: _DirSpec(L.ConvolutionBwdDataAlgoPerf,
                       "cudnnGetConvolutionBackwardDataAlgorithmMaxCount",
                       "cudnnFindConvolutionBackwardDataAlgorithmEx",
                       "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                       "cudnnGetConvolutionBackwardDataWorkspaceSize",
                       "cudnnConvolutionBackwardData", L.BWD_DATA_ALGO_NAMES,
                       L.CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT),
    BWD_FILTER: _DirSpec(L.ConvolutionBwdFilterAlgoPerf,
                         "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount",
                         "cudnnFindConvolutionBackwardFilterAlgorithmEx",
                         "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                         "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                         "cudnnConvolutionBackwardFilter", L.BWD_FILTER_ALGO_NAMES,
                         L.CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT),
}


def _requested_math(dtype, tf32: bool) -> int:
    if np.dtype(dtype) == np.float32 and not tf32:
        return L.CUDNN_FMA_MATH  # Caffe is FP32: forbid TF32
    return L.CUDNN_DEFAULT_MATH  # float32 + tf32: TF32 allowed; float64: full precision anyway


def _math_ok(dtype, tf32: bool, math_type: int) -> bool:
    if np.dtype(dtype) == np.float32 and not tf32:
        return math_type == L.CUDNN_FMA_MATH
    return True


class _ConvPlan:
    """Descriptors and chosen algorithms of one convolution (one per key)."""

    def __init__(self, geom: ConvGeometry, dtype, tf32: bool, lib, h):
        self.geom = geom
        self.dtype = np.dtype(dtype)
        self.tf32 = bool(tf32)
        self.math = _requested_math(dtype, tf32)
        m = geom.w_shape[0]
        self.x = _tensor_desc(geom.x_shape, dtype)
        self.y = _tensor_desc(geom.y_shape, dtype)
        self.w = _filter_desc(geom.w_shape, dtype)
        self.bias = _tensor_desc((1, m, 1, 1), dtype)
        # one convolution descriptor per direction: each keeps the math type its
        # chosen algorithm was found with
        self.conv = {d: self._conv_desc(lib) for d in DIRECTIONS}
        self.conv_math = {d: self.math for d in DIRECTIONS}
        self.choices: dict = {}
        dims = [c_int() for _ in range(4)]
        lib.cudnnGetConvolution2dForwardOutputDim(self.conv[FWD].ptr, self.x.ptr, self.w.ptr,
                                                  *[byref(d) for d in dims])
        got = tuple(d.value for d in dims)
        if got != geom.y_shape:
            raise CudnnUnsupported(f"conv2d: cuDNN computes an output {got} where Caffe's is "
                                   f"{geom.y_shape} for {geom}; use the CAFFE engine")

    def _conv_desc(self, lib) -> _Desc:
        g = self.geom
        d = _Desc("cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor")
        lib.cudnnSetConvolution2dDescriptor(d.ptr, g.pad[0], g.pad[1], g.stride[0], g.stride[1],
                                            g.dilation[0], g.dilation[1],
                                            L.CUDNN_CROSS_CORRELATION, _DTYPES[self.dtype])
        lib.cudnnSetConvolutionGroupCount(d.ptr, g.groups)
        lib.cudnnSetConvolutionMathType(d.ptr, self.math)
        return d

    def set_math(self, lib, direction, math_type):
        if self.conv_math[direction] != math_type:
            lib.cudnnSetConvolutionMathType(self.conv[direction].ptr, math_type)
            self.conv_math[direction] = math_type

    def descs(self, direction):
        """Descriptors in the argument order of the direction's workspace/heuristic calls."""
        c = self.conv[direction].ptr
        if direction == FWD:
            return self.x.ptr, self.w.ptr, c, self.y.ptr
        if direction == BWD_DATA:
            return self.w.ptr, self.y.ptr, c, self.x.ptr
        return self.x.ptr, self.y.ptr, c, self.w.ptr


_plans: dict = {}
# (handle, geometry, dtype, options, direction, accumulate, workspace limit, legacy algorithm)
# -> the backend API's GraphConv, or False where the legacy call stays: a layer bound again
# at a shape it had (the profiler's runs, the tuner's processes) is not searched again
_graph_choices: dict = {}
_same_conv: dict = {}       # _conv_key -> the plans of that convolution at any minibatch
_stats = {"searches": 0, "hits": 0}


def _conv_key(dev, geom, dtype_str, tf32) -> tuple:
    """A convolution apart from its minibatch: the plans :func:`conv_workspace_estimate` may
    take another minibatch's choices from."""
    return (dev, dtype_str, bool(tf32), geom.x_shape[1:], geom.w_shape, geom.pad, geom.stride,
            geom.dilation, geom.groups)


def _plan(geom, dtype, tf32, lib, h) -> _ConvPlan:
    cp = _cupy()
    dev = cp.cuda.runtime.getDevice()
    key = (dev, geom, np.dtype(dtype).str, bool(tf32))
    p = _plans.get(key)
    if p is None:
        with _lock:
            p = _plans.get(key)
            if p is None:
                p = _ConvPlan(geom, dtype, tf32, lib, h)
                _plans[key] = p
                _same_conv.setdefault(_conv_key(dev, geom, key[2], tf32), []).append(p)
    return p


def _nearest_searched(dev, geom, dtype_str, tf32, keys_at):
    """``(plan, its choice keys)`` of the same convolution at the minibatch nearest (by ratio)
    to ``geom``'s whose every direction was searched (``keys_at(num)``: the choice keys at a
    minibatch), or None.  Only that convolution's plans are looked at (:data:`_same_conv`):
    a tuner's search asks some hundred minibatches of every convolution, and a scan of every
    plan made each ask cost as many steps as there were plans (4590 for GoogLeNet)."""
    n = geom.x_shape[0]
    nearest = None
    for p in list(_same_conv.get(_conv_key(dev, geom, dtype_str, tf32), ())):
        there = keys_at(p.geom.x_shape[0])
        if not all(there[d] in p.choices for d in DIRECTIONS):
            continue
        ratio = abs(math.log(p.geom.x_shape[0] / n))
        if nearest is None or ratio < nearest[0]:
            nearest = (ratio, p, there)
    return None if nearest is None else nearest[1:]


def _ws_size(lib, h, plan, direction, algo) -> int | None:
    """Workspace bytes of ``algo`` under the descriptor's current math type (None: unsupported)."""
    n = c_size_t()
    try:
        getattr(lib, _SPECS[direction].ws)(h, *plan.descs(direction), algo, byref(n))
    except CudnnError:
        return None
    return int(n.value)


def _choose(plan, direction, lib, h, limit, deterministic, find, operands) -> AlgoChoice:
    """The cached algorithm of ``direction`` (searching for it on a miss)."""
    key = (direction, int(limit), bool(deterministic), bool(find))
    c = plan.choices.get(key)
    if c is not None:
        _stats["hits"] += 1
        return c
    with _lock:
        c = plan.choices.get(key)
        if c is None:
            c = _search(plan, direction, lib, h, int(limit), bool(deterministic), bool(find),
                        operands)
            plan.choices[key] = c
            _stats["searches"] += 1
        else:
            _stats["hits"] += 1
    return c


def _find_operands(plan, direction, operands):
    """Device pointers (in0, in1, out) for a Find call; temporaries where not given.

    ``operands`` maps names to arrays (x, w, y for fwd; w, dy, dx for
    bwd_data; x, dy, dw for bwd_filter); a missing or None entry is replaced
    by a zero array of the right shape, kept alive by the returned list.
    """
    cp = _cupy()
    g = plan.geom
    shapes = {"x": g.x_shape, "w": g.w_shape, "y": g.y_shape, "dy": g.y_shape, "dx": g.x_shape,
              "dw": g.w_shape}
    names = {FWD: ("x", "w", "y"), BWD_DATA: ("w", "dy", "dx"), BWD_FILTER: ("x", "dy", "dw")}
    keep, ptrs = [], []
    for n in names[direction]:
        a = operands.get(n)
        if a is None:
            a = cp.zeros(shapes[n], dtype=plan.dtype)
            keep.append(a)
        ptrs.append(_ptr(a))
    return ptrs, keep


def _results(plan, direction, lib, h, limit, find, operands) -> tuple:
    """(cuDNN's performance records for ``direction``, "find" or "heuristic"): timed on
    ``operands`` within ``limit`` bytes of workspace, fastest first (``find``), or cuDNN's
    heuristic order, which needs no memory."""
    cp = _cupy()
    spec = _SPECS[direction]
    plan.set_math(lib, direction, plan.math)
    cnt = c_int()
    getattr(lib, spec.max_count)(h, byref(cnt))
    n_req = max(int(cnt.value), spec.count)
    perf = (spec.perf * n_req)()
    returned = c_int()
    d0, d1, conv, d3 = plan.descs(direction)
    if not find:
        with _refusal(f"conv2d {direction} algorithm heuristics"):
            getattr(lib, spec.get)(h, d0, d1, conv, d3, n_req, byref(returned), perf)
        return list(perf[:returned.value]), "heuristic"
    # the search workspace: the most that any algorithm within the limit needs
    sizes = [_ws_size(lib, h, plan, direction, a) for a in range(spec.count)]
    ws_bytes = max((s for s in sizes if s is not None and s <= limit), default=0)
    ws = cp.empty(ws_bytes, dtype=cp.uint8) if ws_bytes else None
    (p0, p1, p3), keep = _find_operands(plan, direction, operands)
    # times every algorithm on the current stream; blocks until done
    with _refusal(f"conv2d {direction} algorithm search"):
        getattr(lib, spec.find)(h, d0, p0, d1, p1, conv, d3, p3, n_req, byref(returned),
                                perf, _ptr(ws) if ws is not None else None, ws_bytes)
    del ws, keep
    return sorted(perf[:returned.value],
                  key=lambda r: (r.status != 0, r.time if r.time >= 0 else math.inf)), "find"


def _judge(plan, direction, lib, h, limit, deterministic, r, source):
    """The :class:`AlgoChoice` of performance record ``r`` where it may run here (its status,
    math type, determinism and workspace within ``limit``), else why not (a string).  Leaves
    the descriptor's math type at ``r``'s."""
    name = _SPECS[direction].names.get(r.algo, str(r.algo))
    if r.status != 0:
        return L.STATUS_NAMES.get(r.status, f"status {r.status}")
    if not _math_ok(plan.dtype, plan.tf32, r.mathType):
        return f"math {L.MATH_NAMES.get(r.mathType, r.mathType)} (TF32 not allowed)"
    if deterministic and r.determinism != L.CUDNN_DETERMINISTIC:
        return "not deterministic"
    plan.set_math(lib, direction, r.mathType)
    need = _ws_size(lib, h, plan, direction, r.algo)
    if need is None:
        return "no workspace size"
    need = max(need, int(r.memory))
    if need > limit:
        return f"needs {need} B of workspace"
    return AlgoChoice(direction, int(r.algo), name, int(r.mathType), need, float(r.time),
                      r.determinism == L.CUDNN_DETERMINISTIC, source)


def _search(plan, direction, lib, h, limit, deterministic, find, operands) -> AlgoChoice:
    results, source = _results(plan, direction, lib, h, limit, find, operands)
    rejected = []
    for r in results:
        c = _judge(plan, direction, lib, h, limit, deterministic, r, source)
        if isinstance(c, AlgoChoice):
            return c
        rejected.append(f"{_SPECS[direction].names.get(r.algo, str(r.algo))}: {c}")
    plan.set_math(lib, direction, plan.math)
    g = plan.geom
    raise CudnnUnsupported(
        f"conv2d {direction}: no cuDNN algorithm fits (x {g.x_shape}, w {g.w_shape}, pad {g.pad}, "
        f"stride {g.stride}, dilation {g.dilation}, groups {g.groups}, {plan.dtype}, "
        f"tf32={plan.tf32}, deterministic={deterministic}, workspace limit {limit} B, "
        f"{source}); candidates: {'; '.join(rejected) or 'none returned'}.  Raise the limit "
        f"(workspace_limit= or ${ENV_WORKSPACE_LIMIT}), drop deterministic, or use the CAFFE "
        "engine")


_candidates: dict = {}


def conv_candidates(x_shape, w_shape, pad=0, stride=1, dilation=1, groups=1,
                    dtype=np.float32, *, tf32=False, deterministic=False,
                    workspace_limit=None) -> dict:
    """Every algorithm that may run each direction of this convolution within the workspace
    limit, timed by cuDNN's search on temporary operands of these shapes:
    ``{direction: (AlgoChoice, ...)}``, fastest first (cached per shape and options; a
    direction with none is an empty tuple).  For choosing a layer's bytes per image
    (:func:`fastest_bytes_per_image`), not for the calls, which search their own shapes."""
    geom = conv_geometry(x_shape, w_shape, pad, stride, dilation, groups)
    dt = np.dtype(dtype)
    if dt not in _DTYPES:
        raise TypeError(f"conv_candidates: dtype {dt}; cuDNN ops take float32 or float64")
    limit = workspace_limit_value(workspace_limit)
    lib, h = _handle()
    key = (_cupy().cuda.runtime.getDevice(), geom, dt.str, bool(tf32), bool(deterministic),
           int(limit))
    got = _candidates.get(key)
    if got is not None:
        return got
    with _lock:
        plan = _plan(geom, dt, tf32, lib, h)
        got = {}
        for d in DIRECTIONS:
            results, source = _results(plan, d, lib, h, limit, True, {})
            got[d] = tuple(c for c in (_judge(plan, d, lib, h, limit, deterministic, r, source)
                                       for r in results) if isinstance(c, AlgoChoice))
            plan.set_math(lib, d, plan.math)
        _candidates[key] = got
    return got


def fastest_bytes_per_image(candidates: dict, images: int,
                            tolerance: float = FASTEST_TOLERANCE) -> int:
    """Bytes of workspace per image that a convolution's fastest algorithms need, from
    :func:`conv_candidates` timed on ``images`` images: for each direction, the least
    workspace among the algorithms within ``tolerance`` times its fastest time (so a
    workspace many times larger for a gain of a few per cent is not asked for); the most over
    the directions, over ``images``, rounded up.  0 where no direction has a timed
    candidate."""
    if images <= 0:
        raise ValueError(f"fastest_bytes_per_image: images must be positive, not {images}")
    need = 0
    for choices in candidates.values():
        timed = [c for c in choices if c.time_ms >= 0]
        if not timed:
            continue
        best = min(c.time_ms for c in timed)
        need = max(need, min(c.workspace for c in timed if c.time_ms <= best * tolerance))
    return -(-int(need) // int(images))


_workspaces: dict = {}


def workspace_limit_under_budget(budget: int | None) -> int:
    """The workspace limit for convolutions that run inside a memory budget of ``budget``
    bytes: ``$MINICAFFE_CUDNN_WORKSPACE_LIMIT`` when set, else ``budget / 16`` (at least
    64 MiB, at most :data:`DEFAULT_WORKSPACE_LIMIT`).  A convolution's workspace is scratch
    that the plan must place beside the feature maps, so an unbounded one would cost the
    minibatch; ``budget`` None (no budget): :func:`workspace_limit`."""
    if budget is None or os.environ.get(ENV_WORKSPACE_LIMIT, "").strip():
        return workspace_limit()
    share = int(budget) // BUDGET_WORKSPACE_SHARE
    return max(MIN_BUDGET_WORKSPACE_LIMIT, min(DEFAULT_WORKSPACE_LIMIT, share))


def workspace_per_image_under_budget(budget: int | None) -> int:
    """Bytes of workspace per image for convolutions inside a memory budget (0: a fixed
    bound, :func:`workspace_limit_under_budget`): ``$MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE``
    when set (0 turns the bound per image off), else :data:`DEFAULT_WORKSPACE_PER_IMAGE`;
    0 without a budget or where ``$MINICAFFE_CUDNN_WORKSPACE_LIMIT`` fixes the limit.

    Below the fixed bound's minibatch (a sixteenth of the budget over the bytes per image:
    96 images at 12 GiB) the fixed bound holds (:func:`minicaffe.engine.bound_workspaces`):
    some algorithms need a part of their workspace whatever the minibatch, and 8 MiB per
    image was too little for them at small k (VGG-16's conv3 and conv4 ran 3.7 to 4.7 times
    slower per image at 69 than at 138, which left the performance model 22 % off at 88 and
    92, between the two), while memory is not scarce there.

    Why per image: with a fixed number of bytes, a convolution's fastest algorithm stops
    fitting past some minibatch (its workspace grows with the batch) and a slower one runs
    from there on, so the time per image rises with k (VGG-16 at a 12 GiB budget's 768 MiB:
    2.49 ms per image for the convolutions at 192 against 1.45 with 8 MiB per image).  With a
    bound per image the same algorithms fit at every k; the memory model charges their
    workspace at each k (``swap.gmap.Size.per_k``)."""
    if budget is None or os.environ.get(ENV_WORKSPACE_LIMIT, "").strip():
        return 0
    return env_bytes(ENV_WORKSPACE_PER_IMAGE, DEFAULT_WORKSPACE_PER_IMAGE)


def workspace_cap_under_budget(budget: int) -> int:
    """The most workspace a bound per image gives one call inside ``budget``:
    ``$MINICAFFE_CUDNN_WORKSPACE_CAP`` when set, else a quarter of the budget; at least
    64 MiB, at most :data:`DEFAULT_WORKSPACE_LIMIT`.

    A convolution whose fastest algorithms need more than the cap over its minibatch runs in
    chunks (:func:`workspace_chunks`), so a lower cap trades the scratch the plan must place
    for more, smaller calls: VGG-16's conv1_2 to conv3_3 under the workspace fit reach the
    3 GiB cap of a 12 GiB budget at k = 221 (session 33), where the fit off holds 0.25 to
    1.2 GiB for them."""
    share = env_bytes(ENV_WORKSPACE_CAP, int(budget) // BUDGET_WORKSPACE_CAP_SHARE)
    return max(MIN_BUDGET_WORKSPACE_LIMIT, min(DEFAULT_WORKSPACE_LIMIT, share))


def workspace_limit_at(limit: int, per_image: int, num: int, floor: int = 0) -> int:
    """The workspace limit of a call on ``num`` images: ``limit`` (a fixed bound, per_image 0),
    or ``per_image * num``, at least ``floor`` (at least 64 MiB) and at most ``limit`` (the
    cap)."""
    if not per_image:
        return int(limit)
    low = max(MIN_BUDGET_WORKSPACE_LIMIT, int(floor))
    return min(int(limit), max(low, int(per_image) * int(num)))


def chunk_images(limit: int, per_image: int, multiple: int = 1) -> int:
    """The most images one chunk of :func:`workspace_chunks` holds: ``limit // per_image``, down
    to a multiple of ``multiple`` where it holds one."""
    most = max(1, int(limit) // max(1, int(per_image)))
    step = max(1, int(multiple))
    if most >= step:
        most -= most % step
    return most


def chunk_count(num: int, limit: int, per_image: int, multiple: int = 1) -> int:
    """How many calls :func:`workspace_chunks` cuts a minibatch of ``num`` images into (1
    without a bound per image, or where the minibatch fits ``limit``).  The performance model
    prices a chunked convolution per call (:class:`swap.model.ComputeModel`, ``chunks``)."""
    num = int(num)
    if not per_image or num <= 0 or num * int(per_image) <= int(limit):
        return 1
    return -(-num // chunk_images(limit, per_image, multiple))


def workspace_chunks(num: int, limit: int, per_image: int, multiple: int = 1) -> tuple:
    """((start, stop), ...): the slices of a minibatch of ``num`` images that one convolution
    call each runs on, so that every call has its full workspace per image.

    Under a bound per image (``per_image`` bytes, at most ``limit``), past ``limit /
    per_image`` images the bound stops growing with the minibatch, and a convolution whose
    fastest algorithm needs more falls back to a slower one: AlexNet inside 12 GiB ran at 7305
    images/s at k = 1533, against 11263 at 1152 (H200, session 16).  Cut into chunks of at
    most ``limit // per_image`` images (as even as they come: at most two sizes), each call
    has at least ``per_image`` bytes per image again, in one workspace of at most ``limit``
    (the layer gives every chunk ``limit`` itself: ``Convolution._call_limit``).  The
    weight and bias gradients accumulate over the chunks (cuDNN's beta = 1), so the results
    are the whole call's up to the order of the sums.  One chunk, the whole minibatch, where
    the bound is fixed (``per_image`` 0) or the minibatch fits.

    ``multiple``: where ``per_image`` was measured on that many images (the layer's probe,
    :data:`FIT_PROBE_IMAGES`), a chunk holds at most a multiple of them, so that a chunk
    rounded up to the next multiple still fits.  Some algorithms size their workspace for
    the images rounded up so: VGG-16's conv1_2 under WINOGRAD_NONFUSED needs 55.1 MiB per
    image at 32 images and 48 x 55.1 MiB at 44 (H200, session 36, call b), so its chunks of
    24-25 images under a 1.5 GiB cap (27 images of the probe's bytes) did not fit it, ran
    FFT_TILING forward and backward-data, 45 % slower per image, and VGG-16 at 221 took
    282.9 ms with every map kept against 270.2 under a 3 GiB cap."""
    num = int(num)
    n = chunk_count(num, limit, per_image, multiple)
    if n == 1:
        return ((0, num),)
    q, r = divmod(num, n)
    out, at = [], 0
    for i in range(n):
        size = q + (1 if i < r else 0)
        out.append((at, at + size))
        at += size
    return tuple(out)


def _cached_workspace(kind: str, nbytes: int):
    """The shared scratch buffer of the current device, grown to ``nbytes``.

    One buffer per device serves every convolution direction (``kind`` names the
    caller in messages only): calls on one stream run one after another, so a net
    without a memory manager holds one workspace, of the largest need, not one
    per layer.  Calls on streams that may overlap must pass their own
    ``workspace=``.  Growing frees the old buffer into CuPy's memory pool, which
    reuses it only for later work.
    """
    cp = _cupy()
    key = cp.cuda.runtime.getDevice()
    buf = _workspaces.get(key)
    if buf is None or buf.nbytes < nbytes:
        buf = cp.empty(-(-nbytes // (1 << 20)) << 20, dtype=cp.uint8)  # whole MiB
        _workspaces[key] = buf
    return buf


def release_workspaces():
    """Drop the cached per-op workspaces (their memory returns to CuPy's pool)."""
    _workspaces.clear()


def _workspace_arg(kind, need, workspace):
    """(pointer or None, bytes) to pass as a call's workspace."""
    if need == 0:
        return None, 0
    if workspace is None:
        workspace = _cached_workspace(kind, need)
    elif workspace.nbytes < need:
        raise ValueError(f"{kind}: the workspace has {workspace.nbytes} B, the algorithm needs "
                         f"{need} B")
    return _ptr(workspace), need


def _choose_for_call(plan, direction, lib, h, limit, deterministic, find, operands, workspace):
    c = _choose(plan, direction, lib, h, limit, deterministic, find, operands)
    if workspace is not None:
        if not isinstance(workspace, _cupy().ndarray) or not workspace.flags.c_contiguous:
            raise TypeError(f"conv2d {direction}: workspace must be a C-contiguous cupy.ndarray")
        if c.workspace > workspace.nbytes:
            # the caller's buffer is the real limit
            c = _choose(plan, direction, lib, h, min(limit, workspace.nbytes), deterministic,
                        find, operands)
    plan.set_math(lib, direction, c.math_type)
    return c


def conv2d_forward(x, w, b, y, pad=0, stride=1, dilation=1, groups=1, *, workspace=None,
                   tf32=False, deterministic=False, find=True, workspace_limit=None):
    """y (N, M, OH, OW) = conv(x (N, C, H, W), w (M, C/G, kh, kw)) + b (M,); y overwritten.

    ``b`` may be None.  Returns ``y``.
    """
    dt = _check_arrays("conv2d_forward", x=x, w=w, b=b, y=y)
    geom = conv_geometry(x.shape, w.shape, pad, stride, dilation, groups)
    if y.shape != geom.y_shape:
        raise ValueError(f"conv2d_forward: y has shape {y.shape}, expected {geom.y_shape}")
    if b is not None and b.size != geom.w_shape[0]:
        raise ValueError(f"conv2d_forward: bias has {b.size} elements, expected "
                         f"{geom.w_shape[0]}")
    if x.size == 0:
        return y
    lib, h = _handle()
    plan = _plan(geom, dt, tf32, lib, h)
    c = _choose_for_call(plan, FWD, lib, h, workspace_limit_value(workspace_limit),
                         deterministic, find, {"x": x, "w": w, "y": y}, workspace)
    ws, ws_bytes = _workspace_arg(FWD, c.workspace, workspace)
    one, zero = _SCALARS[dt]
    with _refusal("conv2d_forward"):
        lib.cudnnConvolutionForward(h, one, plan.x.ptr, _ptr(x), plan.w.ptr, _ptr(w),
                                    plan.conv[FWD].ptr, c.algo, ws, ws_bytes, zero, plan.y.ptr,
                                    _ptr(y))
        if b is not None:  # y += b broadcast over (N, ., OH, OW)
            lib.cudnnAddTensor(h, one, plan.bias.ptr, _ptr(b), one, plan.y.ptr, _ptr(y))
    return y


def conv2d_backward_data(w, dy, dx, pad=0, stride=1, dilation=1, groups=1, *, workspace=None,
                         tf32=False, deterministic=False, find=True, workspace_limit=None,
                         accumulate=False):
    """dx (N, C, H, W) = conv_transpose(dy (N, M, OH, OW), w); overwritten (Caffe's
    bottom diff), or added to with ``accumulate=True``.  Returns ``dx``."""
    dt = _check_arrays("conv2d_backward_data", w=w, dy=dy, dx=dx)
    geom = conv_geometry(dx.shape, w.shape, pad, stride, dilation, groups)
    if dy.shape != geom.y_shape:
        raise ValueError(f"conv2d_backward_data: dy has shape {dy.shape}, expected "
                         f"{geom.y_shape} for dx {dx.shape} and w {w.shape}")
    if dx.size == 0:
        return dx
    lib, h = _handle()
    plan = _plan(geom, dt, tf32, lib, h)
    ops = {"w": w, "dy": dy, "dx": None if accumulate else dx}
    c = _choose_for_call(plan, BWD_DATA, lib, h, workspace_limit_value(workspace_limit),
                         deterministic, find, ops, workspace)
    ws, ws_bytes = _workspace_arg(BWD_DATA, c.workspace, workspace)
    one, zero = _SCALARS[dt]
    with _refusal("conv2d_backward_data"):
        lib.cudnnConvolutionBackwardData(h, one, plan.w.ptr, _ptr(w), plan.y.ptr, _ptr(dy),
                                         plan.conv[BWD_DATA].ptr, c.algo, ws, ws_bytes,
                                         one if accumulate else zero, plan.x.ptr, _ptr(dx))
    return dx


def conv2d_backward_filter(x, dy, dw, pad=0, stride=1, dilation=1, groups=1, *, workspace=None,
                           tf32=False, deterministic=False, find=True, workspace_limit=None,
                           accumulate=True):
    """dw (M, C/G, kh, kw) += correlation of x (N, C, H, W) with dy (N, M, OH, OW).

    Accumulates (cuDNN beta = 1) as Caffe's parameter diffs do; ``accumulate=False``
    overwrites.  The algorithm search never writes ``dw``.  Returns ``dw``.
    """
    dt = _check_arrays("conv2d_backward_filter", x=x, dy=dy, dw=dw)
    geom = conv_geometry(x.shape, dw.shape, pad, stride, dilation, groups)
    if dy.shape != geom.y_shape:
        raise ValueError(f"conv2d_backward_filter: dy has shape {dy.shape}, expected "
                         f"{geom.y_shape} for x {x.shape} and dw {dw.shape}")
    if x.size == 0:
        if not accumulate:
            dw.fill(0)
        return dw
    lib, h = _handle()
    plan = _plan(geom, dt, tf32, lib, h)
    ops = {"x": x, "dy": dy, "dw": None}  # never let the search clobber dw
    c = _choose_for_call(plan, BWD_FILTER, lib, h, workspace_limit_value(workspace_limit),
                         deterministic, find, ops, workspace)
    ws, ws_bytes = _workspace_arg(BWD_FILTER, c.workspace, workspace)
    one, zero = _SCALARS[dt]
    with _refusal("conv2d_backward_filter"):
        lib.cudnnConvolutionBackwardFilter(h, one, plan.x.ptr, _ptr(x), plan.y.ptr, _ptr(dy),
                                           plan.conv[BWD_FILTER].ptr, c.algo, ws, ws_bytes,
                                           one if accumulate else zero, plan.w.ptr, _ptr(dw))
    return dw


def _capturing() -> bool:
    """Whether CuPy's current stream is capturing a CUDA graph (where a query fails, as on
    the legacy stream while another stream captures globally, it counts as capturing)."""
    try:
        return bool(_cupy().cuda.get_current_stream().is_capturing())
    except Exception:
        return True


class BoundConv:
    """One convolution at one shape and dtype with fixed cuDNN options: its three directions
    with the argument checks and cache lookups of the free functions done once.

    A deep net issues hundreds of convolution calls per iteration from the host, and
    :func:`conv2d_forward` and its siblings check and look up everything on every call (the
    geometry, every array, the plan and the algorithm caches: session 12's cProfile of
    ResNet-101 on the H200's host put 11 ms per iteration into those helpers).  A layer binds
    one of these to its current shape and calls it every iteration: a call compares its
    arrays' shapes and dtype with the bound ones and passes pointers.  The arrays must be
    C-contiguous and on the current device, as a layer's blob views are; arrays of another
    shape or dtype are handed to the free function, which checks everything and names what
    is wrong.  :func:`clear_cache` is seen by every bound convolution at its next call (the
    plan and the algorithms are fetched again, and searched again where forgotten).
    """

    __slots__ = ("geom", "dtype", "tf32", "deterministic", "find", "limit", "api", "_gen",
                 "_dev", "_h", "_plan", "_choices", "_graph", "_args")

    def __init__(self, x_shape, w_shape, pad=0, stride=1, dilation=1, groups=1,
                 dtype=np.float32, *, tf32=False, deterministic=False, find=True,
                 workspace_limit=None, api=None):
        self.geom = conv_geometry(x_shape, w_shape, pad, stride, dilation, groups)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _DTYPES:
            raise TypeError(f"BoundConv: dtype {self.dtype}; cuDNN ops take float32 or float64")
        self.tf32, self.deterministic, self.find = bool(tf32), bool(deterministic), bool(find)
        self.limit = workspace_limit_value(workspace_limit)
        # "legacy" or "graph" (cuDNN's backend API, module backend_api): $MINICAFFE_CUDNN_API
        self.api = backend_api.api_choice(api)
        g = self.geom
        self._args = ((g.pad, g.stride, g.dilation, g.groups),
                      {"tf32": self.tf32, "deterministic": self.deterministic,
                       "find": self.find, "workspace_limit": self.limit})
        self._gen, self._dev, self._h, self._plan, self._choices = -1, None, None, None, {}
        self._graph = {}

    def _ready(self, direction, operands, workspace):
        """(lib, handle, plan, choice) for a call of ``direction``; the choice is searched
        (on ``operands``) the first time, and again for a smaller caller's buffer."""
        lib, h, dev = _handle_on_device()
        if self._gen != _generation[0] or self._dev != dev or self._h != h:
            self._refresh(lib, h, dev)
        key = (direction, -1 if workspace is None else workspace.nbytes)
        c = self._choices.get(key)
        if c is None:
            c = _choose_for_call(self._plan, direction, lib, h, self.limit, self.deterministic,
                                 self.find, operands, workspace)
            self._choices[key] = c
        else:
            _stats["hits"] += 1
            self._plan.set_math(lib, direction, c.math_type)
        return lib, h, self._plan, c

    def _refresh(self, lib, h, dev):
        """Fetch the plan again and forget the choices (after :func:`clear_cache`, on another
        device or thread's handle)."""
        self._plan = _plan(self.geom, self.dtype, self.tf32, lib, h)
        self._choices, self._graph = {}, {}
        self._gen, self._dev, self._h = _generation[0], dev, h

    def _graph_call(self, direction, accumulate, a, w, b, workspace):
        """Run ``direction`` through cuDNN's backend API (:mod:`.backend_api`) where its
        search chose a plan for this workspace and the pointers are aligned: returns the
        library; else None, and the caller makes the legacy call.  ``a, w, b``: x or dx,
        w or dw, y or dy."""
        lib, h, dev = _handle_on_device()
        if self._gen != _generation[0] or self._dev != dev or self._h != h:
            self._refresh(lib, h, dev)
        pa, pw, pb = a.data.ptr, w.data.ptr, b.data.ptr
        if (pa | pw | pb) & (backend_api.ALIGNMENT - 1):
            backend_api.count("legacy_misaligned")
            return None
        key = (direction, accumulate, -1 if workspace is None else workspace.nbytes)
        g = self._graph.get(key)
        if g is None:
            if _capturing():
                # a search synchronizes: inside a CUDA graph's capture this call stays
                # legacy, and the first eager call searches
                backend_api.count("legacy_in_capture")
                return None
            g = self._graph[key] = self._graph_search(direction, accumulate, a, w, b,
                                                      workspace) or False
        if g is False:
            backend_api.count("legacy_no_plan")
            return None
        ws = 0
        if g.workspace:
            ws = (workspace if workspace is not None
                  else _cached_workspace(direction, g.workspace)).data.ptr
            if ws & (backend_api.ALIGNMENT - 1):
                backend_api.count("legacy_misaligned")
                return None
        try:
            g.run(h, pa, pw, pb, ws)
        except CudnnError as e:
            raise _refused(f"conv2d {direction}", e) from e
        return lib

    def _graph_search(self, direction, accumulate, a, w, b, workspace):
        """The backend API's plan for ``direction`` (a :class:`backend_api.GraphConv`), or
        None where the legacy call stays: searched on this call's operands within the
        workspace the legacy choice was given, and timed against the legacy algorithm."""
        cp = _cupy()
        legacy_ops = {FWD: {"x": a, "w": w, "y": b},
                      BWD_DATA: {"w": w, "dy": b, "dx": None if accumulate else a},
                      BWD_FILTER: {"x": a, "dy": b, "dw": None}}[direction]
        lib, h, plan, c = self._ready(direction, legacy_ops, workspace)
        limit = workspace.nbytes if workspace is not None else c.workspace
        arrays = [a, w, b]
        out = {FWD: 2, BWD_DATA: 0, BWD_FILTER: 1}[direction]
        if accumulate or direction == BWD_FILTER:
            try:
                arrays[out] = cp.zeros_like(arrays[out])    # the search must not add to it
            except MemoryError:
                # no room for the search's scratch output (a swap plan's scratch reserve):
                # this convolution keeps the legacy call; another binding searches again
                return None
        if workspace is None and limit:
            _cached_workspace(direction, limit)         # grown before either takes a pointer
        ws = (workspace if workspace is not None else
              _cached_workspace(direction, limit)).data.ptr if limit else 0
        lws, lws_bytes = _workspace_arg(direction, c.workspace, workspace)
        p = [arr.data.ptr for arr in arrays]
        one, zero = _SCALARS[self.dtype]
        beta = one if accumulate else zero
        conv = plan.conv[direction].ptr
        if direction == FWD:
            def legacy():
                lib.cudnnConvolutionForward(h, one, plan.x.ptr, p[0], plan.w.ptr, p[1], conv,
                                            c.algo, lws, lws_bytes, zero, plan.y.ptr, p[2])
        elif direction == BWD_DATA:
            def legacy():
                lib.cudnnConvolutionBackwardData(h, one, plan.w.ptr, p[1], plan.y.ptr, p[2],
                                                 conv, c.algo, lws, lws_bytes, beta,
                                                 plan.x.ptr, p[0])
        else:
            def legacy():
                lib.cudnnConvolutionBackwardFilter(h, one, plan.x.ptr, p[0], plan.y.ptr, p[2],
                                                   conv, c.algo, lws, lws_bytes, beta,
                                                   plan.w.ptr, p[1])
        key = (h, self.geom, self.dtype.str, self.tf32, self.deterministic, direction,
               bool(accumulate), int(limit), c.algo)
        with _lock:
            g = _graph_choices.get(key)
            if g is None:
                g = _graph_choices[key] = backend_api.search(
                    lib, h, self.geom, self.dtype, self.tf32, self.deterministic, direction,
                    bool(accumulate), limit, p, ws, legacy) or False
        return g

    def _binds(self, x, w, y) -> bool:
        """Whether input, filter and output (or their diffs) are of the bound shape and
        dtype, and not empty; else the free functions check and run the call."""
        g, dt = self.geom, self.dtype
        return (x.shape == g.x_shape and w.shape == g.w_shape and y.shape == g.y_shape
                and x.dtype == dt and w.dtype == dt and y.dtype == dt and x.size != 0)

    def forward(self, x, w, b, y, workspace=None):
        """:func:`conv2d_forward` at the bound shape."""
        dt = self.dtype
        if not self._binds(x, w, y) or (
                b is not None and (b.size != self.geom.w_shape[0] or b.dtype != dt)):
            geo, kw = self._args
            return conv2d_forward(x, w, b, y, *geo, workspace=workspace, **kw)
        one, zero = _SCALARS[dt]
        lib = self._graph_call(FWD, False, x, w, y, workspace) if self.api == "graph" else None
        if lib is not None:
            plan, h = self._plan, self._h
        else:
            lib, h, plan, c = self._ready(FWD, {"x": x, "w": w, "y": y}, workspace)
            ws, ws_bytes = _workspace_arg(FWD, c.workspace, workspace)
            try:
                lib.cudnnConvolutionForward(h, one, plan.x.ptr, x.data.ptr, plan.w.ptr,
                                            w.data.ptr, plan.conv[FWD].ptr, c.algo, ws,
                                            ws_bytes, zero, plan.y.ptr, y.data.ptr)
            except CudnnError as e:
                raise _refused("conv2d_forward", e) from e
        try:
            if b is not None:
                lib.cudnnAddTensor(h, one, plan.bias.ptr, b.data.ptr, one, plan.y.ptr,
                                   y.data.ptr)
        except CudnnError as e:
            raise _refused("conv2d_forward", e) from e
        return y

    def backward_data(self, w, dy, dx, workspace=None, accumulate=False):
        """:func:`conv2d_backward_data` at the bound shape."""
        if not self._binds(dx, w, dy):
            geo, kw = self._args
            return conv2d_backward_data(w, dy, dx, *geo, workspace=workspace,
                                        accumulate=accumulate, **kw)
        if self.api == "graph" and self._graph_call(BWD_DATA, accumulate, dx, w, dy,
                                                    workspace) is not None:
            return dx
        ops = {"w": w, "dy": dy, "dx": None if accumulate else dx}
        lib, h, plan, c = self._ready(BWD_DATA, ops, workspace)
        ws, ws_bytes = _workspace_arg(BWD_DATA, c.workspace, workspace)
        one, zero = _SCALARS[self.dtype]
        try:
            lib.cudnnConvolutionBackwardData(h, one, plan.w.ptr, w.data.ptr, plan.y.ptr,
                                             dy.data.ptr, plan.conv[BWD_DATA].ptr, c.algo, ws,
                                             ws_bytes, one if accumulate else zero, plan.x.ptr,
                                             dx.data.ptr)
        except CudnnError as e:
            raise _refused("conv2d_backward_data", e) from e
        return dx

    def backward_filter(self, x, dy, dw, workspace=None, accumulate=True):
        """:func:`conv2d_backward_filter` at the bound shape."""
        if not self._binds(x, dw, dy):
            geo, kw = self._args
            return conv2d_backward_filter(x, dy, dw, *geo, workspace=workspace,
                                          accumulate=accumulate, **kw)
        if self.api == "graph" and self._graph_call(BWD_FILTER, accumulate, x, dw, dy,
                                                    workspace) is not None:
            return dw
        lib, h, plan, c = self._ready(BWD_FILTER, {"x": x, "dy": dy, "dw": None}, workspace)
        ws, ws_bytes = _workspace_arg(BWD_FILTER, c.workspace, workspace)
        one, zero = _SCALARS[self.dtype]
        try:
            lib.cudnnConvolutionBackwardFilter(h, one, plan.x.ptr, x.data.ptr, plan.y.ptr,
                                               dy.data.ptr, plan.conv[BWD_FILTER].ptr, c.algo,
                                               ws, ws_bytes, one if accumulate else zero,
                                               plan.w.ptr, dw.data.ptr)
        except CudnnError as e:
            raise _refused("conv2d_backward_filter", e) from e
        return dw


def conv2d_backward_bias(dy, db, *, accumulate=True):
    """db (M,) += dy (N, M, OH, OW) summed over N, OH, OW (cuDNN beta = 1)."""
    dt = _check_arrays("conv2d_backward_bias", dy=dy, db=db)
    if dy.ndim != 4 or db.size != dy.shape[1]:
        raise ValueError(f"conv2d_backward_bias: dy must be (N, M, OH, OW) and db (M,); got dy "
                         f"{dy.shape}, db {db.shape}")
    if dy.size == 0:
        if not accumulate:
            db.fill(0)
        return db
    lib, h = _handle()
    dyd = _tensor_desc(dy.shape, dt)
    dbd = _tensor_desc((1, dy.shape[1], 1, 1), dt)
    one, zero = _SCALARS[dt]
    with _refusal("conv2d_backward_bias"):
        lib.cudnnConvolutionBackwardBias(h, one, dyd.ptr, _ptr(dy), one if accumulate else zero,
                                         dbd.ptr, _ptr(db))
    return db


def workspace_limit_value(value=None) -> int:
    """Alias of :func:`workspace_limit` (the keyword argument shadows it inside the ops)."""
    return workspace_limit(value)


def conv_algorithms(x_shape, w_shape, pad=0, stride=1, dilation=1, groups=1,
                    dtype=np.float32, *, tf32=False, deterministic=False, find=True,
                    workspace_limit=None, directions=DIRECTIONS) -> dict:
    """The algorithm chosen for each direction ({direction: AlgoChoice}), searching now
    if needed (``find=True`` allocates temporary operands of the given shapes)."""
    geom = conv_geometry(x_shape, w_shape, pad, stride, dilation, groups)
    dt = np.dtype(dtype)
    if dt not in _DTYPES:
        raise TypeError(f"conv_algorithms: dtype {dt}; cuDNN ops take float32 or float64")
    lib, h = _handle()
    plan = _plan(geom, dt, tf32, lib, h)
    limit = workspace_limit_value(workspace_limit)
    return {d: _choose(plan, d, lib, h, limit, deterministic, find, {}) for d in directions}


def conv_workspace_bytes(x_shape, w_shape, pad=0, stride=1, dilation=1, groups=1,
                         dtype=np.float32, *, tf32=False, deterministic=False, find=True,
                         workspace_limit=None) -> dict:
    """Workspace bytes of the chosen algorithms: ``dict(fwd=, bwd_data=, bwd_filter=)``.

    Each is at most the workspace limit.  Runs (and caches) the algorithm
    search, so the later calls with the same parameters use exactly these
    algorithms; with ``find=True`` the search allocates temporary operands of
    the given shapes through CuPy (call it before the arena is allocated, or
    pass ``find=False`` to use cuDNN's heuristics, which need no memory).
    """
    algos = conv_algorithms(x_shape, w_shape, pad, stride, dilation, groups, dtype, tf32=tf32,
                            deterministic=deterministic, find=find,
                            workspace_limit=workspace_limit)
    return {d: c.workspace for d, c in algos.items()}


def conv_workspace_estimate(x_shape, w_shape, pad=0, stride=1, dilation=1, groups=1,
                            dtype=np.float32, *, tf32=False, deterministic=False, find=True,
                            workspace_limit=None, limit_at=None) -> dict:
    """Workspace bytes of each direction at this shape, as :func:`conv_workspace_bytes`
    says, without a timed search where the same convolution was searched at another
    minibatch: for a memory model that asks many minibatches (``swap.gmap``), where a search
    at each would cost seconds.  ``limit_at``: ``num -> limit`` where the limit depends on the
    minibatch (a bound per image, :func:`workspace_limit_at`); the limit here is then
    ``limit_at(N)`` and another minibatch's choices are those made under its own limit.

    * a shape already searched with these options: its choices' workspaces, exactly;
    * else, where the same convolution (every dimension but the minibatch, the same options)
      was searched at other minibatches: the algorithms chosen at the nearest one (by ratio),
      their workspaces at this shape (cuDNN's size query, no timing), each at most the limit
      (past it, a search here would choose an algorithm within the limit);
    * else: the search itself (:func:`conv_workspace_bytes`).

    A reshape at this shape later searches it for real; the choice there may differ (cuDNN's
    timings decide), and its workspace is then the layer's, which a plan built at that shape
    holds exactly.
    """
    geom = conv_geometry(x_shape, w_shape, pad, stride, dilation, groups)
    dt = np.dtype(dtype)
    if dt not in _DTYPES:
        raise TypeError(f"conv_workspace_estimate: dtype {dt}; cuDNN ops take float32 or "
                        "float64")
    n = geom.x_shape[0]
    if limit_at is not None:
        workspace_limit = limit_at(n)
    limit = workspace_limit_value(workspace_limit)

    def keys_at(num):
        lim = limit if limit_at is None else int(limit_at(num))
        return {d: (d, lim, bool(deterministic), bool(find)) for d in DIRECTIONS}
    keys = keys_at(n)
    dev = _cupy().cuda.runtime.getDevice()
    exact = _plans.get((dev, geom, dt.str, bool(tf32)))
    if exact is not None and all(keys[d] in exact.choices for d in DIRECTIONS):
        return {d: exact.choices[keys[d]].workspace for d in DIRECTIONS}
    nearest = _nearest_searched(dev, geom, dt.str, tf32, keys_at)
    if nearest is None:
        return conv_workspace_bytes(x_shape, w_shape, pad, stride, dilation, groups, dtype,
                                    tf32=tf32, deterministic=deterministic, find=find,
                                    workspace_limit=workspace_limit)
    lib, h = _handle()
    plan = _plan(geom, dt, tf32, lib, h)          # descriptors only: nothing is searched
    out = {}
    for d in DIRECTIONS:
        c = nearest[0].choices[nearest[1][d]]
        before = plan.conv_math[d]
        plan.set_math(lib, d, c.math_type)
        need = _ws_size(lib, h, plan, d, c.algo)
        plan.set_math(lib, d, before)
        out[d] = int(limit) if need is None or need > limit else int(need)
    return out


def algo_cache_info() -> dict:
    """Counters of the algorithm cache: plans, cached choices, searches run, hits."""
    return {"plans": len(_plans), "choices": sum(len(p.choices) for p in _plans.values()),
            "searches": _stats["searches"], "hits": _stats["hits"]}


def clear_cache():
    """Forget every plan, chosen algorithm, descriptor and cached workspace."""
    with _lock:
        _plans.clear()
        _same_conv.clear()
        _candidates.clear()
        _graph_choices.clear()
        _generation[0] += 1
        _stats["searches"] = _stats["hits"] = 0
        _tensor_descs.clear()
        _other_descs.clear()
        _pool_support.clear()
        release_workspaces()


# ----------------------------------------------------------------- pooling
def _pool_mode(mode) -> int:
    if isinstance(mode, str):
        m = {"MAX": MAX, "AVE": AVE}.get(mode.upper())
    else:
        m = int(mode) if int(mode) in (MAX, AVE) else None
    if m is None:
        raise ValueError(f"pool2d: mode {mode!r}: cuDNN pools MAX or AVE (STOCHASTIC: use the "
                         "CAFFE engine)")
    return m


def caffe_pooled_size(size, kernel, pad, stride, ceil=True) -> int:
    """Caffe's pooled extent along one axis (the clip applies when ``pad > 0``)."""
    num = size + 2 * pad - kernel
    out = (-(-num // stride) if ceil else num // stride) + 1
    if pad > 0 and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def pool2d_geometry_issue(in_hw, out_hw, mode, kernel, stride, pad) -> str | None:
    """Why cuDNN cannot pool this geometry as Caffe does, from the numbers alone;
    None when it can, or when only the ceil-rounding probe can tell
    (see :func:`pool2d_needs_probe`)."""
    return _geometry_issue(_pool_mode(mode), tuple(int(v) for v in in_hw),
                           tuple(int(v) for v in out_hw), _pair(kernel, "kernel"),
                           _pair(stride, "stride"), _pair(pad, "pad"))


@functools.lru_cache(maxsize=4096)
def _geometry_issue(m, in_hw, out_hw, k, s, p):
    (h, w), (oh, ow) = in_hw, out_hw
    if min(k) < 1 or min(s) < 1 or min(p) < 0 or min(h, w, oh, ow) < 1:
        return f"bad geometry: in {in_hw}, out {out_hw}, kernel {k}, stride {s}, pad {p}"
    for axis, size, out, kk, ss, pp in (("height", h, oh, k[0], s[0], p[0]),
                                        ("width", w, ow, k[1], s[1], p[1])):
        if pp >= kk:
            return f"pad {pp} >= kernel {kk} along the {axis}"
        floor_out = (size + 2 * pp - kk) // ss + 1
        if out < floor_out:
            return f"{out} outputs along the {axis}, fewer than cuDNN's {floor_out}"
        last = (out - 1) * ss - pp
        if last >= size:
            return (f"the last window along the {axis} starts at {last}, past the {size} input "
                    f"rows (stride {ss} > kernel {kk}): Caffe outputs "
                    f"{'-FLT_MAX' if m == MAX else '0'} there")
    return None


def pool2d_needs_probe(in_hw, out_hw, kernel, stride, pad) -> bool:
    """True when the last window overhangs the padded input (Caffe's ceil rounding
    gave more outputs than cuDNN's floor)."""
    k, s, p = _pair(kernel, "kernel"), _pair(stride, "stride"), _pair(pad, "pad")
    return any((out - 1) * ss - pp + kk > size + pp
               for size, out, kk, ss, pp in zip(in_hw, out_hw, k, s, p))


def pool2d_reference(x, out_hw, mode, kernel, stride, pad, dy=None):
    """Caffe's pooling on NumPy, loop by loop (pooling_layer.cpp): (top, bottom diff or None).

    MAX takes the first strict maximum of the pixels inside the image; AVE sums
    them and divides by the window clipped to the padded input.
    """
    m = _pool_mode(mode)
    (kh, kw), (sh, sw), (ph, pw) = (_pair(kernel, "kernel"), _pair(stride, "stride"),
                                    _pair(pad, "pad"))
    n, c, h, w = x.shape
    oh, ow = out_hw
    y = np.zeros((n, c, oh, ow), dtype=np.float64)
    dx = None if dy is None else np.zeros(x.shape, dtype=np.float64)
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * sh - ph, j * sw - pw
            h1, w1 = min(h0 + kh, h + ph), min(w0 + kw, w + pw)
            size = (h1 - h0) * (w1 - w0)
            a, b = max(h0, 0), max(w0, 0)
            e, f = min(h1, h), min(w1, w)
            win = x[:, :, a:e, b:f].reshape(n, c, -1)
            if m == AVE:
                y[:, :, i, j] = win.sum(axis=2) / size
                if dx is not None:
                    dx[:, :, a:e, b:f] += (dy[:, :, i, j] / size)[:, :, None, None]
            else:
                r = win.argmax(axis=2)
                y[:, :, i, j] = np.take_along_axis(win, r[:, :, None], 2)[:, :, 0]
                if dx is not None:
                    for nn in range(n):
                        for cc in range(c):
                            q = int(r[nn, cc])
                            dx[nn, cc, a + q // (f - b), b + q % (f - b)] += dy[nn, cc, i, j]
    return y, dx


_pool_support: dict = {}


# (H, W), kernel, stride, pad of the probes.  "pad": padded windows inside the padded
# input (Caffe's MAX ignores the padding, its AVE counts it); "ceil": Caffe's ceil size
# above cuDNN's floor size, the last window overhanging the padded input.
_PROBE_CASES = {
    "pad": (((4, 4), 3, 1, 1), ((5, 6), 2, 1, 1), ((5, 5), 3, 2, 1)),
    "ceil": (((3, 5), 2, 2, 0), ((4, 6), 3, 2, 1), ((8, 6), 3, 2, 0)),
}


def _probe(mode, kind) -> str | None:
    """Run cuDNN forward and backward on the small ``kind`` geometries and compare with
    :func:`pool2d_reference`: None when cuDNN takes Caffe's output size and computes
    Caffe's numbers, else why not.  Once per (device, mode, kind); syncs the device."""
    cp = _cupy()
    key = (cp.cuda.runtime.getDevice(), mode, kind)
    if key in _pool_support:
        return _pool_support[key]
    reason = None
    for hw, k, s, p in _PROBE_CASES[kind]:
        out = (caffe_pooled_size(hw[0], k, p, s), caffe_pooled_size(hw[1], k, p, s))
        # distinct negative values (exact in float32, which every cuDNN pools): a max
        # that took the padding or the overhang for zeros would show
        x = -(np.arange(2 * hw[0] * hw[1], dtype=np.float32).reshape(1, 2, *hw) + 1) / 8
        x = x.reshape(-1)[np.random.default_rng(0).permutation(x.size)].reshape(x.shape)
        dy = (np.arange(2 * out[0] * out[1], dtype=np.float32).reshape(1, 2, *out) + 1) / 4
        y_ref, dx_ref = pool2d_reference(x, out, mode, k, s, p, dy)
        xg, dyg = cp.asarray(x), cp.asarray(dy)
        yg = cp.empty(y_ref.shape, dtype=np.float32)
        dxg = cp.empty(x.shape, dtype=np.float32)
        what = (f"{'MAX' if mode == MAX else 'AVE'} pooling of a {hw} input, kernel {k}, "
                f"stride {s}, pad {p}, Caffe's output {out}")
        try:
            _pool_call(xg, yg, mode, k, s, p, False)
            _pool_call_backward(yg, dyg, xg, dxg, mode, k, s, p, False)
        except CudnnError as e:
            reason = f"cuDNN {L.version_string(L.version())} rejects {what}: {e}"
            break
        y, dx = cp.asnumpy(yg), cp.asnumpy(dxg)  # syncs (once per process)
        if not np.allclose(y, y_ref, rtol=1e-5, atol=1e-6):
            reason = (f"cuDNN {L.version_string(L.version())} computes {what} differently from "
                      f"Caffe: top {y.ravel().tolist()} vs {y_ref.ravel().tolist()}")
            break
        if not np.allclose(dx, dx_ref, rtol=1e-5, atol=1e-6):
            reason = (f"cuDNN {L.version_string(L.version())} computes the gradient of {what} "
                      f"differently from Caffe: {dx.ravel().tolist()} vs "
                      f"{dx_ref.ravel().tolist()}")
            break
    _pool_support[key] = reason
    return reason


def pool2d_supported(in_hw, out_hw, mode, kernel, stride, pad) -> tuple[bool, str]:
    """(True, "") when cuDNN pools this geometry exactly as Caffe does, else (False, why).

    The rules that the numbers alone decide are :func:`pool2d_geometry_issue`'s;
    padded geometries, and those where Caffe's ceil rounding makes the last window
    overhang the padded input, are decided by probes run once per process, mode
    and kind (they need the GPU and cuDNN, and synchronize the device once).
    """
    issue = pool2d_geometry_issue(in_hw, out_hw, mode, kernel, stride, pad)
    if issue:
        return False, issue
    m = _pool_mode(mode)
    if max(_pair(pad, "pad")) > 0:
        why = _probe(m, "pad")
        if why:
            return False, why
    if pool2d_needs_probe(in_hw, out_hw, kernel, stride, pad):
        why = _probe(m, "ceil")
        if why:
            return False, why
    return True, ""


def _pool_desc(mode, kernel, stride, pad, deterministic) -> _Desc:
    cmode = (L.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING if mode == AVE else
             L.CUDNN_POOLING_MAX_DETERMINISTIC if deterministic else L.CUDNN_POOLING_MAX)
    k, s, p = _pair(kernel, "kernel"), _pair(stride, "stride"), _pair(pad, "pad")
    key = ("pool", cmode, k, s, p)

    def make():
        d = _Desc("cudnnCreatePoolingDescriptor", "cudnnDestroyPoolingDescriptor")
        d._lib.cudnnSetPooling2dDescriptor(d.ptr, cmode, L.CUDNN_NOT_PROPAGATE_NAN, k[0], k[1],
                                           p[0], p[1], s[0], s[1])
        return d
    with _lock:
        return _other_descs.get(key, make)


def _pool_call(x, y, mode, kernel, stride, pad, deterministic):
    lib, h = _handle()
    dt = x.dtype
    d = _pool_desc(mode, kernel, stride, pad, deterministic)
    xd, yd = _tensor_desc(x.shape, dt), _tensor_desc(y.shape, dt)  # alive through the call
    one, zero = _SCALARS[dt]
    lib.cudnnPoolingForward(h, d.ptr, one, xd.ptr, _ptr(x), zero, yd.ptr, _ptr(y))


def _pool_call_backward(y, dy, x, dx, mode, kernel, stride, pad, deterministic):
    lib, h = _handle()
    dt = dx.dtype
    d = _pool_desc(mode, kernel, stride, pad, deterministic)
    one, zero = _SCALARS[dt]
    yd, xd = _tensor_desc(dy.shape, dt), _tensor_desc(dx.shape, dt)
    lib.cudnnPoolingBackward(h, d.ptr, one, yd.ptr, _ptr(y), yd.ptr, _ptr(dy), xd.ptr, _ptr(x),
                             zero, xd.ptr, _ptr(dx))


def _pool_check(op, x_shape, y_shape, mode, kernel, stride, pad):
    if len(x_shape) != 4 or len(y_shape) != 4 or tuple(x_shape[:2]) != tuple(y_shape[:2]):
        raise ValueError(f"{op}: bottom must be (N, C, H, W) and top (N, C, PH, PW); got "
                         f"{tuple(x_shape)} and {tuple(y_shape)}")
    m = _pool_mode(mode)
    ok, why = pool2d_supported(x_shape[2:], y_shape[2:], m, kernel, stride, pad)
    if not ok:
        raise CudnnUnsupported(f"{op}: {why}; use the CAFFE engine")
    return m


def pool2d_forward(x, y, mode, kernel, stride=1, pad=0, *, deterministic=False):
    """y (N, C, PH, PW) = pool(x (N, C, H, W)); ``y``'s shape is Caffe's output size.

    ``mode``: "MAX"/"AVE" or Caffe's enum (0, 1).  Raises CudnnUnsupported
    where cuDNN would differ from Caffe (see :func:`pool2d_supported`).
    """
    _check_arrays("pool2d_forward", x=x, y=y)
    m = _pool_check("pool2d_forward", x.shape, y.shape, mode, kernel, stride, pad)
    if x.size:
        with _refusal("pool2d_forward"):
            _pool_call(x, y, m, kernel, stride, pad, deterministic)
    return y


def pool2d_backward(y, dy, x, dx, mode, kernel, stride=1, pad=0, *, deterministic=False):
    """dx (N, C, H, W) = adjoint of pooling applied to dy (overwritten).

    MAX needs the forward's ``x`` and ``y`` (cuDNN recomputes the argmax).  AVE
    does not use their values: pass None for both and ``dx``/``dy`` stand in
    for the pointers cuDNN's signature asks for.  ``deterministic=True`` uses
    ``CUDNN_POOLING_MAX_DETERMINISTIC``.
    """
    m = _pool_mode(mode)
    if m == MAX and (x is None or y is None):
        raise ValueError("pool2d_backward: MAX pooling needs the forward's x and y")
    _check_arrays("pool2d_backward", y=y, dy=dy, x=x, dx=dx)
    _pool_check("pool2d_backward", dx.shape, dy.shape, m, kernel, stride, pad)
    for name, a, ref in (("x", x, dx), ("y", y, dy)):
        if a is not None and a.shape != ref.shape:
            raise ValueError(f"pool2d_backward: {name} has shape {a.shape}, expected {ref.shape}")
    if dx.size:
        with _refusal("pool2d_backward"):
            _pool_call_backward(dy if y is None else y, dy, dx if x is None else x, dx, m,
                                kernel, stride, pad, deterministic)
    return dx


# --------------------------------------------------------------------- LRN
def lrn_supported(size, alpha, beta, k) -> tuple[bool, str]:
    """(True, "") when cuDNN's cross-channel LRN takes Caffe's parameters, else (False, why)."""
    size = int(size)
    if not L.CUDNN_LRN_MIN_N <= size <= L.CUDNN_LRN_MAX_N:
        return False, (f"local_size {size} outside cuDNN's {L.CUDNN_LRN_MIN_N}.."
                       f"{L.CUDNN_LRN_MAX_N}")
    if size % 2 != 1:
        return False, f"local_size {size} is even (Caffe's window is centred: odd sizes only)"
    if k < L.CUDNN_LRN_MIN_K:
        return False, f"k {k} below cuDNN's minimum {L.CUDNN_LRN_MIN_K}"
    if beta < L.CUDNN_LRN_MIN_BETA:
        return False, f"beta {beta} below cuDNN's minimum {L.CUDNN_LRN_MIN_BETA}"
    return True, ""


def _lrn_desc(size, alpha, beta, k) -> _Desc:
    ok, why = lrn_supported(size, alpha, beta, k)
    if not ok:
        raise CudnnUnsupported(f"LRN: {why}; use the CAFFE engine")
    key = ("lrn", int(size), float(alpha), float(beta), float(k))

    def make():
        d = _Desc("cudnnCreateLRNDescriptor", "cudnnDestroyLRNDescriptor")
        # Caffe's alpha as is: cuDNN divides it by the window width n itself
        d._lib.cudnnSetLRNDescriptor(d.ptr, int(size), float(alpha), float(beta), float(k))
        return d
    with _lock:
        return _other_descs.get(key, make)


def lrn_forward(x, y, size, alpha, beta, k):
    """ACROSS_CHANNELS LRN: y = x * (k + alpha/size * sum_window x^2)^-beta over (N, C, H, W)."""
    dt = _check_arrays("lrn_forward", x=x, y=y)
    if x.ndim != 4 or y.shape != x.shape:
        raise ValueError(f"lrn_forward: x and y must be (N, C, H, W) of one shape; got "
                         f"{x.shape}, {y.shape}")
    d = _lrn_desc(size, alpha, beta, k)
    if x.size:
        lib, h = _handle()
        xd = _tensor_desc(x.shape, dt)
        one, zero = _SCALARS[dt]
        with _refusal("lrn_forward"):
            lib.cudnnLRNCrossChannelForward(h, d.ptr, L.CUDNN_LRN_CROSS_CHANNEL_DIM1, one,
                                            xd.ptr, _ptr(x), zero, xd.ptr, _ptr(y))
    return y


def lrn_backward(y, dy, x, dx, size, alpha, beta, k):
    """dx = gradient of ACROSS_CHANNELS LRN (overwritten); reads x, y and dy."""
    dt = _check_arrays("lrn_backward", y=y, dy=dy, x=x, dx=dx)
    if x.ndim != 4 or not (y.shape == dy.shape == dx.shape == x.shape):
        raise ValueError(f"lrn_backward: y, dy, x, dx must be (N, C, H, W) of one shape; got "
                         f"{y.shape}, {dy.shape}, {x.shape}, {dx.shape}")
    d = _lrn_desc(size, alpha, beta, k)
    if x.size:
        lib, h = _handle()
        xd = _tensor_desc(x.shape, dt)
        one, zero = _SCALARS[dt]
        with _refusal("lrn_backward"):
            lib.cudnnLRNCrossChannelBackward(h, d.ptr, L.CUDNN_LRN_CROSS_CHANNEL_DIM1, one,
                                             xd.ptr, _ptr(y), xd.ptr, _ptr(dy), xd.ptr, _ptr(x),
                                             zero, xd.ptr, _ptr(dx))
    return dx


# ----------------------------------------------------------------- softmax
def _softmax_view(op, shape, axis) -> tuple:
    nd = len(shape)
    if not -nd <= axis < nd:
        raise ValueError(f"{op}: axis {axis} out of range for shape {tuple(shape)}")
    axis = axis % nd
    outer = math.prod(shape[:axis])
    inner = math.prod(shape[axis + 1:])
    return (outer, shape[axis], inner, 1)


def softmax_forward(x, y, axis=1):
    """y = softmax of x along ``axis`` (CUDNN_SOFTMAX_ACCURATE: the max is subtracted
    first, as Caffe does), over an (outer, C, inner, 1) view; y may be x."""
    dt = _check_arrays("softmax_forward", x=x, y=y)
    if y.shape != x.shape:
        raise ValueError(f"softmax_forward: x {x.shape} and y {y.shape} must have one shape")
    if x.size:
        view = _softmax_view("softmax_forward", x.shape, axis)
        lib, h = _handle()
        d = _tensor_desc(view, dt)
        one, zero = _SCALARS[dt]
        with _refusal("softmax_forward"):
            lib.cudnnSoftmaxForward(h, L.CUDNN_SOFTMAX_ACCURATE, L.CUDNN_SOFTMAX_MODE_CHANNEL,
                                    one, d.ptr, _ptr(x), zero, d.ptr, _ptr(y))
    return y


def softmax_backward(y, dy, dx, axis=1):
    """dx = (dy - sum_c(dy * y)) * y along ``axis`` (overwritten; dx may be dy)."""
    dt = _check_arrays("softmax_backward", y=y, dy=dy, dx=dx)
    if not (y.shape == dy.shape == dx.shape):
        raise ValueError(f"softmax_backward: y {y.shape}, dy {dy.shape}, dx {dx.shape} must "
                         "have one shape")
    if y.size:
        view = _softmax_view("softmax_backward", y.shape, axis)
        lib, h = _handle()
        d = _tensor_desc(view, dt)
        one, zero = _SCALARS[dt]
        with _refusal("softmax_backward"):
            lib.cudnnSoftmaxBackward(h, L.CUDNN_SOFTMAX_ACCURATE, L.CUDNN_SOFTMAX_MODE_CHANNEL,
                                     one, d.ptr, _ptr(y), d.ptr, _ptr(dy), zero, d.ptr, _ptr(dx))
    return dx
