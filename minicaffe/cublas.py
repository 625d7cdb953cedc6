"""GEMMs on the GPU through cuBLAS itself (ctypes), so that they can be captured in a CUDA graph.

CuPy's own cuBLAS wrappers (``cupy.matmul``, ``dot``, ``tensordot`` and even
``cupy_backends.cuda.libs.cublas``, whose ``setStream`` checks) refuse to run
while a stream captures ("calling cuBLAS API during stream capture is
currently unsupported").  cuBLAS itself can be captured when the handle's
stream and a user-owned workspace are set (cuBLAS docs, "CUDA Graphs
support"; PyTorch does the same in ``CublasHandlePool.cpp``).  This module
binds the few functions the layers need and offers two row-major helpers on
CuPy arrays:

    gemm(a, b, out, trans_a, trans_b, alpha, beta)
        out (M, N) = alpha * op(a) @ op(b) + beta * out
    gemm_strided_batched(a, b, out, ...)
        out[i] (M, N) = alpha * op(a[i]) @ op(b[i]) + beta * out[i], i < batch;
        a 2-d ``a`` or ``b`` is shared by every matrix of the batch (stride 0)

with op(x) = x, or x.T when ``trans_x``.  float32 or float64, all three of one
dtype.  An operand is a row-major matrix (or a batch of them): unit stride
along its last axis, a row stride (leading dimension) of at least its column
count, any non-negative batch stride; so C-contiguous arrays and views such as
``y[:, g]`` of a (B, G, M, N) array qualify, and a transpose is asked for with
``trans_*`` instead of passing ``x.T``.  ``out`` must not overlap ``a`` or ``b``.

Row-major through a column-major library
    A row-major (R, C) matrix with row stride ld is, read column-major, its
    transpose: a (C, R) matrix with leading dimension ld.  So out = op(a) op(b)
    is computed as out^T = op(b)^T op(a)^T: cuBLAS is called with the operands
    swapped (``b`` first), m = N, n = M, and each operand's transpose flag as
    given (``trans_b`` for cuBLAS's first operand, ``trans_a`` for its second).

Exact float32
    Every handle gets ``CUBLAS_DEFAULT_MATH`` explicitly: no TF32 tensor cores
    for float32 (that would take ``CUBLAS_TF32_TENSOR_OP_MATH``), so the results
    equal CuPy's ``matmul`` (which does not enable TF32 unless ``CUPY_TF32=1``)
    up to summation order, and Caffe's float32 arithmetic.  (An environment
    that forces reduced precision on every library, ``NVIDIA_TF32_OVERRIDE=1``
    or cuBLAS's emulation variables, is not overridden.)

Handles, streams and workspaces
    One handle per device and per thread (cuBLAS handles must not be used by
    two threads at once), created on first use.  Every call binds it to CuPy's
    current stream (``cublasSetStream_v2``) and then to that stream's workspace
    (``cublasSetWorkspace_v2``): setting the stream resets the workspace to
    cuBLAS's internal pool, so the order matters and both are set on every
    call (two cheap host calls, no device work).  Why a user workspace: without
    one cuBLAS allocates its own workspace, which under stream capture either
    fails or is allocated anew for every captured graph (PyTorch issue 83461,
    memory growing with each capture); a buffer of ours has a fixed address
    that the graph records.  Why one per stream (as PyTorch keys it by handle
    and stream): GEMMs of one thread issued on two streams may run at the same
    time and must not share scratch.  Each workspace is ``$MINICAFFE_CUBLAS_WORKSPACE``
    bytes (default 32 MiB, cuBLAS's recommendation for Hopper; 4 MiB suffice
    before it), allocated once with ``cudaMalloc`` outside CuPy's memory pools
    (so a graph's private pool never holds it and it never moves), and kept
    for the life of the thread.  The handle and the workspace of a stream are
    created on the first GEMM on that stream, which must not happen during a
    capture (a clear error says so): run one iteration eagerly first, as
    :class:`minicaffe.graph.IterationGraph` does, or call :func:`prepare`.

Where the library comes from, in this order (the first that loads wins):

1. ``$MINICAFFE_CUBLAS_LIB``: ``libcublas.so.N`` itself (a path, or a soname for
   the system loader) or the folder holding it; when set, the only place looked at.
2. A ``libcublas.so.13``/``.12`` this process has already loaded (CuPy loads
   one for its own wrappers): one copy in the process.
3. The nvidia pip wheels of every site-packages on ``sys.path``: CUDA 13's
   ``nvidia/cu13/lib`` (wheel ``nvidia-cublas``), CUDA 12's
   ``nvidia/cublas/lib`` (``nvidia-cublas-cu12``).
4. ``$CUDA_HOME``/``$CUDA_PATH``/``/usr/local/cuda`` ``lib64``, then the system
   loader.

The soname of CuPy's CUDA major version is tried first.  The library's
dependency ``libcublasLt`` sits beside it (``RUNPATH=$ORIGIN`` in the wheels;
otherwise it is preloaded from the sibling ``nvidia/*/lib`` folders).

Layers call :func:`enabled_for` (CuPy arrays, the switch ``$MINICAFFE_CUBLAS``
on, the library loads and a handle can be created) and keep their CuPy calls
otherwise; :func:`unavailable_reason` says why (graph capture is then refused
with that reason).  Importing this module never fails and touches no GPU.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from ctypes import (POINTER, byref, c_char_p, c_double, c_float, c_int, c_longlong, c_size_t,
                    c_void_p)
from typing import NamedTuple

import numpy as np

# generic loader helpers shared with the cuDNN binding: site-packages folders, the
# loader's own map of this process, dlopen that preloads a missing dependency
from .cudnn.lib import _dependency_dirs, _dlopen_global, _loaded_path, _site_dirs, load_once

try:  # importing cupy needs no GPU
    import cupy as _cp
except Exception:  # pragma: no cover - CuPy absent
    _cp = None

ENV_LIB = "MINICAFFE_CUBLAS_LIB"
ENV_SWITCH = "MINICAFFE_CUBLAS"          # 0: layers keep CuPy's GEMMs (no graph capture)
ENV_WORKSPACE = "MINICAFFE_CUBLAS_WORKSPACE"
DEFAULT_WORKSPACE = 32 << 20
SONAMES = ("libcublas.so.13", "libcublas.so.12")
WHEEL_DIRS = ("cu13", "cublas", "cu12")  # site-packages/nvidia/<dir>/lib
INSTALL_HINT = ("install CuPy's cuBLAS (`pip install nvidia-cublas` for CUDA 13, "
                f"`nvidia-cublas-cu12` for CUDA 12), or set {ENV_LIB} to libcublas.so.N or the "
                "folder that holds it")
_INT_MAX = (1 << 31) - 1

# ------------------------------------------------------------------ enums (cublas_api.h)
CUBLAS_STATUS_SUCCESS = 0
STATUS_NAMES = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED",
                3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
                8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
                13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
                15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}
CUBLAS_OP_N = 0                 # cublasOperation_t
CUBLAS_OP_T = 1
CUBLAS_POINTER_MODE_HOST = 0    # cublasPointerMode_t: alpha and beta read from host memory
CUBLAS_DEFAULT_MATH = 0         # cublasMath_t: float32 stays float32 (no TF32)
MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL = 0, 1, 2   # libraryPropertyType


class CublasNotFound(RuntimeError):
    """libcublas could not be found or loaded."""


class CublasError(RuntimeError):
    """A cuBLAS function returned a non-success status, or cannot be called now."""

    def __init__(self, func: str, status: int | None, detail: str = ""):
        self.func = func
        self.status = status
        if status is None:
            msg = f"{func}: {detail}"
        else:
            name = STATUS_NAMES.get(int(status), f"status {status}")
            msg = f"{func} failed: {name} ({status})" + (f": {detail}" if detail else "")
        super().__init__(msg)


# ------------------------------------------------------------------ prototypes
_S = c_int                      # cublasStatus_t
_P = c_void_p                   # handles, streams, device pointers
_I = c_int
_LL = c_longlong
_PF, _PD = POINTER(c_float), POINTER(c_double)


def _gemm_args(scalar):
    # (handle, transa, transb, m, n, k, *alpha, *A, lda, *B, ldb, *beta, *C, ldc)
    return [_P, _I, _I, _I, _I, _I, scalar, _P, _I, _P, _I, scalar, _P, _I]


def _batched_args(scalar):
    # (handle, transa, transb, m, n, k, *alpha, *A, lda, strideA, *B, ldb, strideB,
    #  *beta, *C, ldc, strideC, batchCount)
    return [_P, _I, _I, _I, _I, _I, scalar, _P, _I, _LL, _P, _I, _LL, scalar, _P, _I, _LL, _I]


_PROTOTYPES = {
    # (libraryPropertyType type, int *value): no handle, no GPU needed
    "cublasGetProperty": (_S, [_I, POINTER(c_int)]),
    "cublasCreate_v2": (_S, [POINTER(c_void_p)]),
    "cublasDestroy_v2": (_S, [_P]),
    "cublasSetStream_v2": (_S, [_P, _P]),
    # (handle, void *workspace, size_t workspaceSizeInBytes)
    "cublasSetWorkspace_v2": (_S, [_P, _P, c_size_t]),
    "cublasSetMathMode": (_S, [_P, _I]),
    "cublasSetPointerMode_v2": (_S, [_P, _I]),
    "cublasSgemm_v2": (_S, _gemm_args(_PF)),
    "cublasDgemm_v2": (_S, _gemm_args(_PD)),
    "cublasSgemmStridedBatched": (_S, _batched_args(_PF)),
    "cublasDgemmStridedBatched": (_S, _batched_args(_PD)),
    # diagnostics
    "cublasGetStatusString": (c_char_p, [_I]),
    "cublasGetCudartVersion": (c_size_t, []),
}
_OPTIONAL = {"cublasGetStatusString", "cublasGetCudartVersion"}
_FUNCTIONS = {  # (dtype, batched) -> function
    (np.dtype(np.float32), False): "cublasSgemm_v2",
    (np.dtype(np.float64), False): "cublasDgemm_v2",
    (np.dtype(np.float32), True): "cublasSgemmStridedBatched",
    (np.dtype(np.float64), True): "cublasDgemmStridedBatched",
}
_SCALAR = {np.dtype(np.float32): c_float, np.dtype(np.float64): c_double}


class Library:
    """The loaded cuBLAS with checked prototypes: ``lib.cublasCreate_v2(byref(h))``.

    Each status-returning function raises :class:`CublasError` on failure
    (ctypes ``errcheck``).  ``path`` is the file loaded, ``version`` a
    (major, minor, patch) tuple from ``cublasGetProperty``.
    """

    def __init__(self, cdll: ctypes.CDLL, path: str, notes=()):
        self._cdll = cdll
        self.path = path
        self.notes = list(notes)
        missing = []
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(cdll, name, None)
            if fn is None:
                if name not in _OPTIONAL:
                    missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            if restype is _S:
                fn.errcheck = self._errcheck
            setattr(self, name, fn)
        if missing:
            raise CublasNotFound(f"{path} lacks {', '.join(missing)} (not cuBLAS 12 or later)")
        v = c_int()
        parts = []
        for prop in (MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL):
            self.cublasGetProperty(prop, byref(v))
            parts.append(int(v.value))
        self.version = tuple(parts)

    def status_string(self, status: int) -> str:
        fn = getattr(self, "cublasGetStatusString", None)
        try:
            s = fn(int(status)) if fn is not None else None
            return s.decode(errors="replace") if s else ""
        except Exception:  # diagnostics must never mask the real error
            return ""

    def _errcheck(self, result, func, args):
        if result != CUBLAS_STATUS_SUCCESS:
            raise CublasError(func.__name__, result, self.status_string(result))
        return result

    def __repr__(self):
        return f"<cuBLAS {'.'.join(map(str, self.version))} from {self.path}>"


# ------------------------------------------------------------------ search
def _cupy_cuda_major() -> int | None:
    """CUDA major version of the CuPy already imported (None when unknown; imports nothing)."""
    cp = sys.modules.get("cupy")
    try:
        return int(cp.cuda.runtime.runtimeGetVersion()) // 1000 if cp is not None else None
    except Exception:
        return None


def _sonames(cuda_major: int | None) -> list[str]:
    """SONAMES, the one of ``cuda_major`` first."""
    want = f"libcublas.so.{cuda_major}"
    return sorted(SONAMES, key=lambda s: s != want)


def candidates(env: dict | None = None, cuda_major: int | None = None) -> list[tuple[str, str]]:
    """(where, path-or-soname) pairs to try, in order (see the module doc).

    Pure: looks at the environment and the file system, loads nothing.
    """
    env = os.environ if env is None else env
    sonames = _sonames(cuda_major)
    explicit = env.get(ENV_LIB, "")
    if explicit:
        p = os.path.expanduser(explicit)
        if os.path.isdir(p):
            found = [os.path.join(p, s) for s in sonames if os.path.exists(os.path.join(p, s))]
            return [(f"{ENV_LIB} folder", f) for f in found or [os.path.join(p, sonames[0])]]
        return [(ENV_LIB, p)]
    out = [("already loaded in this process", s) for s in sonames]
    for d in _site_dirs():
        for s in sonames:
            for sub in WHEEL_DIRS:
                f = os.path.join(d, "nvidia", sub, "lib", s)
                if os.path.exists(f):
                    out.append((f"nvidia wheel in {d}", f))
    roots = [env.get("CUDA_HOME", ""), env.get("CUDA_PATH", ""), "/usr/local/cuda"]
    for root in dict.fromkeys(r for r in roots if r):
        for s in sonames:
            f = os.path.join(root, "lib64", s)
            if os.path.exists(f):
                out.append((f"CUDA toolkit {root}", f))
    out += [("system loader", s) for s in sonames]
    return out


def _open(where: str, target: str, notes: list):
    """Load one candidate; returns (CDLL, absolute path or soname)."""
    if where == "already loaded in this process":
        if not getattr(os, "RTLD_NOLOAD", 0):
            raise OSError("RTLD_NOLOAD is not available on this platform")
        cdll = ctypes.CDLL(target, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        return cdll, _loaded_path(target) or target
    if where == "system loader" or (where == ENV_LIB and os.sep not in target):  # a soname
        cdll = ctypes.CDLL(target, mode=ctypes.RTLD_GLOBAL)
        return cdll, _loaded_path(os.path.basename(target)) or target
    if not os.path.exists(target):
        raise OSError(f"{target}: no such file")
    path = os.path.abspath(target)
    return _dlopen_global(path, notes, _dependency_dirs(os.path.dirname(path))), path


_lock = threading.Lock()
_cache: dict = {}  # $MINICAFFE_CUBLAS_LIB -> Library or CublasNotFound


def load(env: dict | None = None) -> Library:
    """cuBLAS, loaded once per value of ``$MINICAFFE_CUBLAS_LIB``.

    Raises :class:`CublasNotFound` naming every place tried and how to install.
    """
    env = os.environ if env is None else env
    return load_once(_cache, _lock, env.get(ENV_LIB, ""), _load_uncached, env)


def _load_uncached(env) -> Library | CublasNotFound:
    tried = []
    for where, target in candidates(env, _cupy_cuda_major()):
        notes = []
        try:
            cdll, path = _open(where, target, notes)
        except OSError as e:
            if where != "already loaded in this process":
                tried.append(f"{where}: {target} ({e})")
            continue
        try:
            return Library(cdll, path, notes)
        except (CublasNotFound, CublasError) as e:
            tried.append(f"{where}: {e}")
    return CublasNotFound("libcublas could not be loaded (" + ", ".join(SONAMES) + "); tried:\n  - "
                          + "\n  - ".join(tried or ["nothing"]) + f"\n{INSTALL_HINT}")


def _reset_cache():
    """Forget load results and the availability verdict (tests change the environment)."""
    with _lock:
        _cache.clear()
    _state["lib"] = _state["verdict"] = None


def load_report() -> str:
    """Where cuBLAS came from (for logs and bug reports)."""
    try:
        lib = load()
    except CublasNotFound as e:
        return str(e)
    lines = [repr(lib)]
    fn = getattr(lib, "cublasGetCudartVersion", None)
    if fn is not None:
        v = int(fn())
        lines.append(f"built against CUDA runtime {v // 1000}.{v % 1000 // 10}")
    return "\n".join(lines + lib.notes)


# ------------------------------------------------------------------ handles
class _PerThread(threading.local):
    def __init__(self):
        self.handles = {}       # device id -> cublasHandle_t (int)
        self.workspaces = {}    # (device id, stream ptr) -> cupy.cuda.memory.Memory


_tls = _PerThread()


def _cupy():
    if _cp is None:  # pragma: no cover - CuPy absent
        raise RuntimeError("minicaffe.cublas needs CuPy: pip install 'minicaffe[gpu]'")
    return _cp


def _capturing(stream) -> bool:
    try:
        return bool(stream.is_capturing())
    except Exception:  # the legacy stream while another captures, HIP...
        return False


def workspace_bytes() -> int:
    """Bytes of each stream's workspace: ``$MINICAFFE_CUBLAS_WORKSPACE`` or 32 MiB."""
    from .cudnn.ops import env_bytes
    return env_bytes(ENV_WORKSPACE, DEFAULT_WORKSPACE)


def _not_under_capture(stream, what: str, dev: int):
    if _capturing(stream):
        raise CublasError(
            "minicaffe.cublas", None,
            f"the first GEMM of this thread on device {dev} and stream {stream.ptr:#x} was issued "
            f"during stream capture, which cannot create {what}: run one call eagerly on this "
            "stream first (an IterationGraph's warm-up does), or call minicaffe.cublas.prepare()")


def _handle(lib, dev: int, stream) -> int:
    """This thread's handle for device ``dev``, created on first use."""
    h = _tls.handles.get(dev)
    if h is None:
        _not_under_capture(stream, "a cuBLAS handle", dev)
        v = c_void_p()
        lib.cublasCreate_v2(byref(v))
        h = v.value
        lib.cublasSetMathMode(h, CUBLAS_DEFAULT_MATH)             # exact float32: no TF32
        lib.cublasSetPointerMode_v2(h, CUBLAS_POINTER_MODE_HOST)  # alpha, beta from the host
        _tls.handles[dev] = h
    return h


def _workspace(cp, dev: int, stream):
    """This thread's workspace for ``stream`` (a cupy.cuda.memory.Memory), created on first use."""
    ws = _tls.workspaces.get((dev, stream.ptr))
    if ws is None:
        _not_under_capture(stream, "a workspace", dev)
        size = -(-max(workspace_bytes(), 256) // 256) * 256  # whole 256-byte units
        try:  # cudaMalloc, outside CuPy's pools: a fixed address for the life of the thread
            ws = cp.cuda.memory.Memory(size)
        except cp.cuda.memory.OutOfMemoryError:
            cp.get_default_memory_pool().free_all_blocks()  # cached blocks back to the driver
            ws = cp.cuda.memory.Memory(size)
        _tls.workspaces[(dev, stream.ptr)] = ws
    return ws


def _bind(cp):
    """(library, handle) for the current device and thread, bound to CuPy's current
    stream and then to that stream's workspace (both on every call, in this order:
    ``cublasSetStream_v2`` resets the workspace to cuBLAS's own pool)."""
    lib = _state["lib"] or load()
    dev = cp.cuda.runtime.getDevice()
    stream = cp.cuda.get_current_stream()
    h = _handle(lib, dev, stream)
    ws = _workspace(cp, dev, stream)
    lib.cublasSetStream_v2(h, stream.ptr)
    lib.cublasSetWorkspace_v2(h, ws.ptr, ws.size)
    return lib, h


def prepare():
    """Create this thread's handle for the current device and the workspace of CuPy's
    current stream now (before a stream capture that will issue GEMMs on it)."""
    _bind(_cupy())


# ------------------------------------------------------------------ planning (pure)
class _Matrix(NamedTuple):
    """A row-major operand in elements: ``rows`` x ``cols`` with row stride ``ld``,
    ``batch`` of them ``stride`` apart (0: one matrix shared by the batch)."""
    ptr: int
    rows: int
    cols: int
    ld: int
    batch: int
    stride: int

    def extent(self, itemsize: int) -> tuple[int, int]:
        """[first, last + 1) byte addresses covered."""
        last = (self.batch - 1) * self.stride + (self.rows - 1) * self.ld + self.cols
        return self.ptr, self.ptr + last * itemsize


class GemmCall(NamedTuple):
    """One cuBLAS call, in cuBLAS's (column-major) terms, after the swap.

    ``args()`` gives the C arguments after the handle, alpha and beta as Python
    floats; ``function`` is the cuBLAS function; m, n, k, batch as passed
    (``k == 0``: out = beta * out, no call)."""
    function: str
    transa: int
    transb: int
    m: int
    n: int
    k: int
    alpha: float
    a: int
    lda: int
    stride_a: int
    b: int
    ldb: int
    stride_b: int
    beta: float
    c: int
    ldc: int
    stride_c: int
    batch: int
    batched: bool

    def args(self) -> tuple:
        if self.batched:
            return (self.transa, self.transb, self.m, self.n, self.k, self.alpha, self.a,
                    self.lda, self.stride_a, self.b, self.ldb, self.stride_b, self.beta, self.c,
                    self.ldc, self.stride_c, self.batch)
        return (self.transa, self.transb, self.m, self.n, self.k, self.alpha, self.a, self.lda,
                self.b, self.ldb, self.beta, self.c, self.ldc)


def _ptr(x) -> int:
    """Device address of a CuPy array (host address of a NumPy one: tests plan on NumPy)."""
    try:
        return x.data.ptr
    except AttributeError:
        return x.ctypes.data


def _operand(op: str, name: str, x, itemsize: int, batched: bool, out: bool) -> _Matrix:
    shape, strides = tuple(x.shape), tuple(x.strides)
    want = "a 3-d (batch, rows, cols) array" if out and batched else (
        "a 2-d (rows, cols) or 3-d (batch, rows, cols) array" if batched else "a 2-d array")
    if len(shape) not in ((3,) if out and batched else (2, 3) if batched else (2,)):
        raise ValueError(f"{op}: {name} must be {want}, got shape {shape}")
    if any(s < 0 or s % itemsize for s in strides):
        raise ValueError(f"{op}: {name} of shape {shape} has strides {strides}; cuBLAS needs "
                         f"non-negative strides in whole {itemsize}-byte elements")
    rows, cols = shape[-2], shape[-1]
    batch = shape[0] if len(shape) == 3 else 1
    if rows == 0 or cols == 0 or batch == 0:  # empty: nothing is read or written
        return _Matrix(_ptr(x), rows, cols, max(cols, 1), batch, 0)
    if cols > 1 and strides[-1] != itemsize:
        hint = ("give a C-contiguous out (and copy the result where it belongs)" if out else
                f"pass the untransposed array with trans_{name}=True, or a C-contiguous copy")
        raise ValueError(f"{op}: {name} of shape {shape} and strides {strides} is not row-major "
                         f"(its last axis must have unit stride); {hint}")
    ld = strides[-2] // itemsize if rows > 1 else cols
    if ld < cols:
        raise ValueError(f"{op}: {name} of shape {shape} and strides {strides}: its rows overlap "
                         f"(row stride {ld} elements < {cols} columns)")
    stride = strides[0] // itemsize if batch > 1 else 0
    for what, v in (("rows", rows), ("columns", cols), ("row stride", ld), ("batch", batch)):
        if v > _INT_MAX:
            raise ValueError(f"{op}: {name} of shape {shape} has {v} {what}, more than cuBLAS's "
                             f"32-bit sizes take ({_INT_MAX})")
    return _Matrix(_ptr(x), rows, cols, max(ld, 1), batch, stride)


def plan_gemm(a, b, out, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
              batched=False) -> GemmCall:
    """The cuBLAS call computing ``out = alpha op(a) op(b) + beta out`` (row-major), with
    every argument checked (errors name the argument).  Reads only ``shape``,
    ``strides``, ``dtype`` and the data address of its arguments; touches no GPU."""
    op = "gemm_strided_batched" if batched else "gemm"
    dt = None
    for name, x in (("a", a), ("b", b), ("out", out)):
        xdt = getattr(x, "dtype", None)
        xdt = np.dtype(xdt) if xdt is not None else None
        if xdt not in _SCALAR:
            raise TypeError(f"{op}: {name} has dtype {xdt}; cuBLAS GEMMs here take float32 or "
                            "float64")
        if dt is None:
            dt = xdt
        elif xdt != dt:
            raise TypeError(f"{op}: {name} is {xdt} but a is {dt}; the three dtypes must match")
    size = dt.itemsize
    A = _operand(op, "a", a, size, batched, False)
    B = _operand(op, "b", b, size, batched, False)
    C = _operand(op, "out", out, size, batched, True)
    m, k = (A.cols, A.rows) if trans_a else (A.rows, A.cols)
    kb, n = (B.cols, B.rows) if trans_b else (B.rows, B.cols)
    if k != kb or (C.rows, C.cols) != (m, n):
        ta, tb = (".T" if trans_a else ""), (".T" if trans_b else "")
        raise ValueError(
            f"{op}: shapes do not match: a{ta} is ({m}, {k}) (a {tuple(a.shape)}), b{tb} is "
            f"({kb}, {n}) (b {tuple(b.shape)}), so out must be ({m}, {n}); out is "
            f"{tuple(out.shape)}")
    if batched:
        for name, X in (("a", A), ("b", B)):
            if X.batch not in (1, C.batch):
                raise ValueError(f"{op}: {name} holds {X.batch} matrices, out {C.batch}: give "
                                 f"{C.batch}, or one (2-d) to share")
        if C.batch > 1 and C.stride < (C.rows - 1) * C.ld + C.cols:
            raise ValueError(f"{op}: the matrices of out (shape {tuple(out.shape)}, strides "
                             f"{tuple(out.strides)}) overlap each other")
    if m and n and C.batch:
        c0, c1 = C.extent(size)
        for name, X in (("a", A), ("b", B)):
            x0, x1 = X.extent(size)
            if X.rows and X.cols and x0 < c1 and c0 < x1:
                raise ValueError(f"{op}: out overlaps {name} in memory; cuBLAS cannot write its "
                                 "result over an input")
    # row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T: swap the operands
    return GemmCall(
        function=_FUNCTIONS[(dt, batched)],
        transa=CUBLAS_OP_T if trans_b else CUBLAS_OP_N,
        transb=CUBLAS_OP_T if trans_a else CUBLAS_OP_N,
        m=n, n=m, k=k, alpha=float(alpha),
        a=B.ptr, lda=B.ld, stride_a=B.stride,
        b=A.ptr, ldb=A.ld, stride_b=A.stride,
        beta=float(beta), c=C.ptr, ldc=C.ld, stride_c=C.stride,
        batch=C.batch, batched=batched)


# ------------------------------------------------------------------ GEMMs
def _check_device(op: str, cp, dev: int, **arrays):
    for name, x in arrays.items():
        if not isinstance(x, cp.ndarray):
            raise TypeError(f"{op}: {name} must be a cupy.ndarray, got {type(x).__name__}")
        if x.data.device_id != dev:
            raise ValueError(f"{op}: {name} lives on device {x.data.device_id}, the current "
                             f"device is {dev}")


def _run(call: GemmCall, out):
    if call.m == 0 or call.n == 0 or call.batch == 0:
        return out
    if call.k == 0:  # an empty sum: out = beta * out, as BLAS defines it
        if call.beta == 0.0:
            out.fill(0)
        else:
            out *= call.beta
        return out
    lib, h = _bind(_cp)
    getattr(lib, call.function)(h, *c_args(call))
    return out


def c_args(call: GemmCall) -> list:
    """The call's ctypes arguments after the handle: alpha and beta as pointers to host
    scalars of the data's type (read during the call: CUBLAS_POINTER_MODE_HOST)."""
    scalar = c_float if call.function.startswith("cublasS") else c_double
    args = list(call.args())
    args[5] = byref(scalar(call.alpha))
    args[12 if call.batched else 10] = byref(scalar(call.beta))
    return args


def gemm(a, b, out, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    """``out = alpha * op(a) @ op(b) + beta * out`` on CuPy's current stream; returns ``out``.

    a, b, out: 2-d CuPy arrays, row-major (see the module doc), float32 or float64.
    op(a) is (M, K), op(b) (K, N), out (M, N).  ``beta = 1`` accumulates into out
    (Caffe's param diffs); ``beta = 0`` overwrites it (its old values, even NaN,
    are not read).  Never synchronizes; capturable once :func:`prepare` ran here.
    """
    cp = _cupy()
    _check_device("gemm", cp, cp.cuda.runtime.getDevice(), a=a, b=b, out=out)
    return _run(plan_gemm(a, b, out, trans_a, trans_b, alpha, beta), out)


def gemm_strided_batched(a, b, out, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    """``out[i] = alpha * op(a[i]) @ op(b[i]) + beta * out[i]`` for every i, one launch.

    out: (batch, M, N); a: (batch, ., .) or 2-d (one matrix for every i), likewise b.
    The batch may be any strided view (e.g. ``y[:, g]`` of a (B, G, M, N) array);
    each matrix row-major.  Returns ``out``.
    """
    cp = _cupy()
    _check_device("gemm_strided_batched", cp, cp.cuda.runtime.getDevice(), a=a, b=b, out=out)
    return _run(plan_gemm(a, b, out, trans_a, trans_b, alpha, beta, batched=True), out)


# ------------------------------------------------------------------ the switch
_state = {"enabled": os.environ.get(ENV_SWITCH, "1").strip().lower()
          not in ("0", "false", "no", "off"),
          "lib": None,       # the Library once the verdict found it usable
          "verdict": None}   # '' (usable) or why not; None: not judged yet


def enabled() -> bool:
    """The switch alone: ``$MINICAFFE_CUBLAS`` (default on) or :func:`set_enabled`."""
    return _state["enabled"]


def set_enabled(flag: bool) -> bool:
    """Route the layers' GEMMs here (True) or through CuPy (False); returns the old value.
    Layers read the switch at every call."""
    old = _state["enabled"]
    _state["enabled"] = bool(flag)
    return old


@contextlib.contextmanager
def disabled():
    """GEMMs issued inside this block go through CuPy (tests compare both paths)."""
    old = set_enabled(False)
    try:
        yield
    finally:
        set_enabled(old)


def _verdict() -> str:
    """'' when cuBLAS loads and a handle can be created on the current device, else why
    not; judged once per process (not during a capture, which cannot create a handle)."""
    v = _state["verdict"]
    if v is not None:
        return v
    if _cp is None:
        v = "CuPy is not installed"
    else:
        try:
            lib = load()
        except CublasNotFound as e:
            lib, v = None, str(e)
        if lib is not None:
            stream = _cp.cuda.get_current_stream()
            if _capturing(stream):
                return ""  # judged at the next eager call; a GEMM now says what is missing
            try:
                _handle(lib, _cp.cuda.runtime.getDevice(), stream)
                v = ""
                _state["lib"] = lib
            except Exception as e:  # no device, a driver older than this cuBLAS...
                v = f"cuBLAS ({lib.path}) loaded but cannot run here: {type(e).__name__}: {e}"
    _state["verdict"] = v
    return v


def available() -> bool:
    """True when cuBLAS loads and runs here (judged once per process; needs a device)."""
    v = _state["verdict"]
    return not (_verdict() if v is None else v)


def unavailable_reason(xp=None) -> str:
    """Why the layers' GEMMs on arrays of ``xp`` do not go through this binding ('' if they do)."""
    if xp is not None and (_cp is None or xp is not _cp):
        return "not CuPy arrays"
    if not _state["enabled"]:
        return f"${ENV_SWITCH}=0 (or minicaffe.cublas.set_enabled(False))"
    return _verdict()


def enabled_for(xp) -> bool:
    """True when GEMMs on arrays of module ``xp`` go through this binding: xp is CuPy,
    the switch is on, and cuBLAS loads and runs here."""
    return _state["enabled"] and _cp is not None and xp is _cp and available()
