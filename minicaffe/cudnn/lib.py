"""Loading cuDNN 9 and the ctypes prototypes of its legacy API.

CuPy 14 ships no cuDNN wrapper, so the CUDNN engine binds the few legacy
functions it needs (convolution, pooling, LRN, softmax) with ctypes.  Every
function that returns a ``cudnnStatus_t`` is checked: a non-zero status raises
:class:`CudnnError` naming the function, the status and cuDNN's own last error
message.  Nothing here touches a GPU; importing this module never fails.

Where the library comes from, in this order (the first that loads wins):

1. ``$MINICAFFE_CUDNN_PATH``: ``libcudnn.so.9`` itself or the folder holding it.
   When set, it is the *only* place looked at (an explicit choice is never
   silently replaced by another copy).
2. A ``libcudnn.so.9`` this process has already loaded (PyTorch loads the copy
   of its own venv): sharing it avoids two cuDNN copies in one process, which
   is what ``CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH`` usually means.
3. The ``nvidia/cudnn/lib`` folder of every site-packages on ``sys.path`` (the
   ``nvidia-cudnn-cu13`` wheel, e.g.
   ``/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib``).
4. The system loader (``LD_LIBRARY_PATH``, ``ld.so.cache``).

cuDNN 9 is split: ``libcudnn.so.9`` is a shim that ``dlopen``s
``libcudnn_graph``, ``libcudnn_ops``, ``libcudnn_cnn``, ``libcudnn_engines_*``
... by soname.  The wheel's shim carries ``RPATH=$ORIGIN`` and the sub-libraries
``RUNPATH=$ORIGIN:$ORIGIN/../../cublas/lib:...`` (checked on
nvidia-cudnn-cu13 9.28), so loading the shim by its path is enough; the load
is then verified by cuDNN's own ``cudnn{Graph,Ops,Cnn}VersionCheck`` (which
load those sub-libraries).  Only if that fails (a copy without the rpath) are
the ``libcudnn_*.so.9`` of the shim's folder preloaded with ``RTLD_GLOBAL``, a
missing dependency (``libcublasLt.so.13``...) being looked up in the sibling
``nvidia/*/lib`` wheel folders, and the checks run again.  Sub-libraries that
still fail to preload (the runtime-compiled engines need ``libcuda.so.1``) are
recorded in :func:`load_report` and left to cuDNN to load lazily.

Enum values and struct layouts below are those of cuDNN 9's
``cudnn_graph.h``, ``cudnn_ops.h`` and ``cudnn_cnn.h``.
"""
from __future__ import annotations

import ctypes
import glob
import os
import re
import site
import sys
import threading
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_size_t, c_uint, c_void_p

ENV_PATH = "MINICAFFE_CUDNN_PATH"
SONAME = "libcudnn.so.9"
INSTALL_HINT = ("install it with `pip install 'minicaffe[cudnn]'` (the nvidia-cudnn-cu13 wheel), "
                f"or set {ENV_PATH} to libcudnn.so.9 or the folder that holds it")

# ------------------------------------------------------------------ enums
# cudnnStatus_t (cudnn_graph.h, cuDNN 9: categories of 1000)
CUDNN_STATUS_SUCCESS = 0
STATUS_NAMES = {
    0: "CUDNN_STATUS_SUCCESS",
    1001: "CUDNN_STATUS_NOT_INITIALIZED",
    1002: "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
    1003: "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH",
    1004: "CUDNN_STATUS_DEPRECATED",
    1005: "CUDNN_STATUS_LICENSE_ERROR",
    1006: "CUDNN_STATUS_RUNTIME_IN_PROGRESS",
    1007: "CUDNN_STATUS_RUNTIME_FP_OVERFLOW",
    1008: "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
    2000: "CUDNN_STATUS_BAD_PARAM",
    2001: "CUDNN_STATUS_INVALID_VALUE",
    2002: "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
    2003: "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
    2004: "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
    2005: "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND",
    2006: "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
    2007: "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH",
    2008: "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
    2009: "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES",
    2010: "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE",
    2011: "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH",
    2012: "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE",
    3000: "CUDNN_STATUS_NOT_SUPPORTED",
    3001: "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN",
    3002: "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
    3003: "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE",
    3004: "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT",
    3005: "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
    3006: "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART",
    3007: "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
    3008: "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
    3009: "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE",
    3010: "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT",
    3011: "CUDNN_STATUS_NOT_SUPPORTED_PADDING",
    3012: "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM",
    3013: "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API",
    4000: "CUDNN_STATUS_INTERNAL_ERROR",
    4001: "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
    4002: "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE",
    4003: "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    4004: "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    4005: "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM",
    4006: "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED",
    5000: "CUDNN_STATUS_EXECUTION_FAILED",
    5001: "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
    5002: "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS",
    5003: "CUDNN_STATUS_EXECUTION_FAILED_CUDART",
    5004: "CUDNN_STATUS_EXECUTION_FAILED_CURAND",
}
STATUS_BAD_PARAM = 2000
STATUS_NOT_SUPPORTED = 3000

# cudnnDataType_t
CUDNN_DATA_FLOAT = 0
CUDNN_DATA_DOUBLE = 1
CUDNN_DATA_HALF = 2
# cudnnTensorFormat_t
CUDNN_TENSOR_NCHW = 0
CUDNN_TENSOR_NHWC = 1
# cudnnMathType_t
CUDNN_DEFAULT_MATH = 0          # float32 may use TF32 tensor cores on Ampere and later
CUDNN_TENSOR_OP_MATH = 1
CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2
CUDNN_FMA_MATH = 3              # FMA kernels only: no TF32
MATH_NAMES = {0: "DEFAULT_MATH", 1: "TENSOR_OP_MATH", 2: "TENSOR_OP_MATH_ALLOW_CONVERSION",
              3: "FMA_MATH"}
# cudnnNanPropagation_t
CUDNN_NOT_PROPAGATE_NAN = 0
CUDNN_PROPAGATE_NAN = 1
# cudnnDeterminism_t
CUDNN_NON_DETERMINISTIC = 0
CUDNN_DETERMINISTIC = 1
# cudnnConvolutionMode_t
CUDNN_CONVOLUTION = 0
CUDNN_CROSS_CORRELATION = 1     # what Caffe (and every framework) calls convolution
# cudnnConvolutionFwdAlgo_t
FWD_ALGO_NAMES = {0: "IMPLICIT_GEMM", 1: "IMPLICIT_PRECOMP_GEMM", 2: "GEMM", 3: "DIRECT",
                  4: "FFT", 5: "FFT_TILING", 6: "WINOGRAD", 7: "WINOGRAD_NONFUSED"}
CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8
# cudnnConvolutionBwdDataAlgo_t
BWD_DATA_ALGO_NAMES = {0: "ALGO_0", 1: "ALGO_1", 2: "FFT", 3: "FFT_TILING", 4: "WINOGRAD",
                       5: "WINOGRAD_NONFUSED"}
CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT = 6
# cudnnConvolutionBwdFilterAlgo_t
BWD_FILTER_ALGO_NAMES = {0: "ALGO_0", 1: "ALGO_1", 2: "FFT", 3: "ALGO_3", 4: "WINOGRAD",
                         5: "WINOGRAD_NONFUSED", 6: "FFT_TILING"}
CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT = 7
# cudnnPoolingMode_t
CUDNN_POOLING_MAX = 0
CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1
CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2
CUDNN_POOLING_MAX_DETERMINISTIC = 3
# cudnnSoftmaxAlgorithm_t
CUDNN_SOFTMAX_FAST = 0
CUDNN_SOFTMAX_ACCURATE = 1
CUDNN_SOFTMAX_LOG = 2
# cudnnSoftmaxMode_t
CUDNN_SOFTMAX_MODE_INSTANCE = 0
CUDNN_SOFTMAX_MODE_CHANNEL = 1
# cudnnLRNMode_t
CUDNN_LRN_CROSS_CHANNEL_DIM1 = 0
CUDNN_LRN_MIN_N = 1
CUDNN_LRN_MAX_N = 16
CUDNN_LRN_MIN_K = 1e-5
CUDNN_LRN_MIN_BETA = 0.01


# ---------------------------------------------------------------- structs
class _AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t: the three share one layout.

    (algo, status: enums (int); time: float ms; memory: size_t bytes;
    determinism, mathType: enums; reserved: int[3]); 48 bytes on x86-64.
    """
    _fields_ = [
        ("algo", c_int),
        ("status", c_int),
        ("time", c_float),
        ("memory", c_size_t),
        ("determinism", c_int),
        ("mathType", c_int),
        ("reserved", c_int * 3),
    ]


class ConvolutionFwdAlgoPerf(_AlgoPerf):
    pass


class ConvolutionBwdDataAlgoPerf(_AlgoPerf):
    pass


class ConvolutionBwdFilterAlgoPerf(_AlgoPerf):
    pass


# ------------------------------------------------------------- exceptions
class CudnnNotFound(RuntimeError):
    """libcudnn.so.9 could not be found or loaded."""


class CudnnUnsupported(RuntimeError):
    """cuDNN cannot compute this configuration as Caffe defines it: use the CAFFE engine."""


class CudnnError(RuntimeError):
    """A cuDNN function returned a non-success status."""

    def __init__(self, func: str, status: int, detail: str = ""):
        self.func = func
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, f"status {self.status}")
        msg = f"{func} failed: {self.status_name} ({self.status})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)

    @property
    def category(self) -> int:
        """1000 init/version, 2000 bad parameter, 3000 not supported, 4000 internal,
        5000 execution."""
        return self.status // 1000 * 1000

    @property
    def not_supported(self) -> bool:
        return self.category == STATUS_NOT_SUPPORTED


# -------------------------------------------------------------- prototypes
_S = c_int  # cudnnStatus_t
_P = c_void_p  # handles, descriptors, device and host pointers
_PP = POINTER(c_void_p)
_PI = POINTER(c_int)
_PZ = POINTER(c_size_t)
_I = c_int
_Z = c_size_t

# name: (restype, argtypes); every restype _S is status-checked.
_PROTOTYPES = {
    # library, handle, stream (cudnn_graph.h)
    "cudnnGetVersion": (c_size_t, []),
    "cudnnGetCudartVersion": (c_size_t, []),
    "cudnnGetErrorString": (c_char_p, [_I]),
    "cudnnGetLastErrorString": (None, [c_char_p, _Z]),
    "cudnnCreate": (_S, [_PP]),
    "cudnnDestroy": (_S, [_P]),
    "cudnnSetStream": (_S, [_P, _P]),
    "cudnnGetStream": (_S, [_P, _PP]),
    "cudnnGraphVersionCheck": (_S, []),
    "cudnnOpsVersionCheck": (_S, []),
    "cudnnCnnVersionCheck": (_S, []),
    # tensors and filters (cudnn_ops.h)
    "cudnnCreateTensorDescriptor": (_S, [_PP]),
    # (desc, dataType, n, c, h, w, nStride, cStride, hStride, wStride)
    "cudnnSetTensor4dDescriptorEx": (_S, [_P, _I, _I, _I, _I, _I, _I, _I, _I, _I]),
    # (desc, dataType, nbDims, dimA[], strideA[])
    "cudnnSetTensorNdDescriptor": (_S, [_P, _I, _I, _PI, _PI]),
    "cudnnDestroyTensorDescriptor": (_S, [_P]),
    "cudnnCreateFilterDescriptor": (_S, [_PP]),
    # (desc, dataType, format, k, c, h, w): dataType comes before format
    "cudnnSetFilter4dDescriptor": (_S, [_P, _I, _I, _I, _I, _I, _I]),
    "cudnnDestroyFilterDescriptor": (_S, [_P]),
    # (handle, alpha, aDesc, A, beta, cDesc, C): C = alpha*A + beta*C, A broadcast
    "cudnnAddTensor": (_S, [_P, _P, _P, _P, _P, _P, _P]),
    # convolution (cudnn_cnn.h)
    "cudnnCreateConvolutionDescriptor": (_S, [_PP]),
    "cudnnDestroyConvolutionDescriptor": (_S, [_P]),
    # (desc, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, computeType)
    "cudnnSetConvolution2dDescriptor": (_S, [_P, _I, _I, _I, _I, _I, _I, _I, _I]),
    "cudnnSetConvolutionGroupCount": (_S, [_P, _I]),
    "cudnnSetConvolutionMathType": (_S, [_P, _I]),
    "cudnnGetConvolutionMathType": (_S, [_P, _PI]),
    # (convDesc, xDesc, wDesc, *n, *c, *h, *w)
    "cudnnGetConvolution2dForwardOutputDim": (_S, [_P, _P, _P, _PI, _PI, _PI, _PI]),
    "cudnnGetConvolutionForwardAlgorithmMaxCount": (_S, [_P, _PI]),
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": (_S, [_P, _PI]),
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": (_S, [_P, _PI]),
    # (handle, xDesc, x, wDesc, w, convDesc, yDesc, y, requested, *returned, perf[], ws, wsBytes)
    "cudnnFindConvolutionForwardAlgorithmEx": (
        _S, [_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, POINTER(ConvolutionFwdAlgoPerf), _P, _Z]),
    # (handle, wDesc, w, dyDesc, dy, convDesc, dxDesc, dx, requested, *returned, perf[], ws,
    #  wsBytes)
    "cudnnFindConvolutionBackwardDataAlgorithmEx": (
        _S, [_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, POINTER(ConvolutionBwdDataAlgoPerf), _P,
             _Z]),
    # (handle, xDesc, x, dyDesc, dy, convDesc, dwDesc, dw, requested, *returned, perf[], ws,
    #  wsBytes)
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": (
        _S, [_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, POINTER(ConvolutionBwdFilterAlgoPerf), _P,
             _Z]),
    # heuristics: (handle, xDesc, wDesc, convDesc, yDesc, requested, *returned, perf[])
    "cudnnGetConvolutionForwardAlgorithm_v7": (
        _S, [_P, _P, _P, _P, _P, _I, _PI, POINTER(ConvolutionFwdAlgoPerf)]),
    # (handle, wDesc, dyDesc, convDesc, dxDesc, requested, *returned, perf[])
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": (
        _S, [_P, _P, _P, _P, _P, _I, _PI, POINTER(ConvolutionBwdDataAlgoPerf)]),
    # (handle, xDesc, dyDesc, convDesc, dwDesc, requested, *returned, perf[])
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": (
        _S, [_P, _P, _P, _P, _P, _I, _PI, POINTER(ConvolutionBwdFilterAlgoPerf)]),
    # (handle, xDesc, wDesc, convDesc, yDesc, algo, *bytes)
    "cudnnGetConvolutionForwardWorkspaceSize": (_S, [_P, _P, _P, _P, _P, _I, _PZ]),
    # (handle, wDesc, dyDesc, convDesc, dxDesc, algo, *bytes)
    "cudnnGetConvolutionBackwardDataWorkspaceSize": (_S, [_P, _P, _P, _P, _P, _I, _PZ]),
    # (handle, xDesc, dyDesc, convDesc, dwDesc, algo, *bytes)
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": (_S, [_P, _P, _P, _P, _P, _I, _PZ]),
    # (handle, alpha, xDesc, x, wDesc, w, convDesc, algo, ws, wsBytes, beta, yDesc, y)
    "cudnnConvolutionForward": (_S, [_P, _P, _P, _P, _P, _P, _P, _I, _P, _Z, _P, _P, _P]),
    # (handle, alpha, wDesc, w, dyDesc, dy, convDesc, algo, ws, wsBytes, beta, dxDesc, dx)
    "cudnnConvolutionBackwardData": (_S, [_P, _P, _P, _P, _P, _P, _P, _I, _P, _Z, _P, _P, _P]),
    # (handle, alpha, xDesc, x, dyDesc, dy, convDesc, algo, ws, wsBytes, beta, dwDesc, dw)
    "cudnnConvolutionBackwardFilter": (_S, [_P, _P, _P, _P, _P, _P, _P, _I, _P, _Z, _P, _P, _P]),
    # (handle, alpha, dyDesc, dy, beta, dbDesc, db)
    "cudnnConvolutionBackwardBias": (_S, [_P, _P, _P, _P, _P, _P, _P]),
    # pooling (cudnn_ops.h)
    "cudnnCreatePoolingDescriptor": (_S, [_PP]),
    # (desc, mode, maxpoolingNanOpt, windowH, windowW, padH, padW, strideH, strideW)
    "cudnnSetPooling2dDescriptor": (_S, [_P, _I, _I, _I, _I, _I, _I, _I, _I]),
    # (poolDesc, xDesc, *n, *c, *h, *w)
    "cudnnGetPooling2dForwardOutputDim": (_S, [_P, _P, _PI, _PI, _PI, _PI]),
    "cudnnDestroyPoolingDescriptor": (_S, [_P]),
    # (handle, poolDesc, alpha, xDesc, x, beta, yDesc, y)
    "cudnnPoolingForward": (_S, [_P, _P, _P, _P, _P, _P, _P, _P]),
    # (handle, poolDesc, alpha, yDesc, y, dyDesc, dy, xDesc, x, beta, dxDesc, dx)
    "cudnnPoolingBackward": (_S, [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P]),
    # LRN (cudnn_ops.h)
    "cudnnCreateLRNDescriptor": (_S, [_PP]),
    # (desc, unsigned lrnN, double lrnAlpha, double lrnBeta, double lrnK)
    "cudnnSetLRNDescriptor": (_S, [_P, c_uint, c_double, c_double, c_double]),
    "cudnnDestroyLRNDescriptor": (_S, [_P]),
    # (handle, lrnDesc, lrnMode, alpha, xDesc, x, beta, yDesc, y)
    "cudnnLRNCrossChannelForward": (_S, [_P, _P, _I, _P, _P, _P, _P, _P, _P]),
    # (handle, lrnDesc, lrnMode, alpha, yDesc, y, dyDesc, dy, xDesc, x, beta, dxDesc, dx)
    "cudnnLRNCrossChannelBackward": (_S, [_P, _P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P]),
    # softmax (cudnn_ops.h)
    # (handle, algo, mode, alpha, xDesc, x, beta, yDesc, y)
    "cudnnSoftmaxForward": (_S, [_P, _I, _I, _P, _P, _P, _P, _P, _P]),
    # (handle, algo, mode, alpha, yDesc, y, dyDesc, dy, beta, dxDesc, dx)
    "cudnnSoftmaxBackward": (_S, [_P, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P]),
}

# Symbols whose absence is tolerated (newer than 9.0, or diagnostics only).
_OPTIONAL = {"cudnnGetLastErrorString", "cudnnGetCudartVersion", "cudnnGraphVersionCheck",
             "cudnnOpsVersionCheck", "cudnnCnnVersionCheck"}


class Library:
    """The loaded cuDNN with checked prototypes: ``lib.cudnnCreate(byref(h))``.

    Attributes named like the C functions; each status-returning one raises
    :class:`CudnnError` on failure (via ctypes' ``errcheck``, so a call costs
    one ctypes call).  ``path`` is the file that was loaded, ``version`` the
    value of ``cudnnGetVersion()`` (9.19.0 reads 91900).
    """

    def __init__(self, cdll: ctypes.CDLL, path: str, preloaded, notes):
        self._cdll = cdll
        self.path = path
        self.preloaded = list(preloaded)
        self.notes = list(notes)
        self.missing = []
        for name, (restype, argtypes) in _PROTOTYPES.items():
            try:
                fn = getattr(cdll, name)
            except AttributeError:
                if name not in _OPTIONAL:
                    self.missing.append(name)
                setattr(self, name, _missing_symbol(name, path))
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            if restype is _S:
                fn.errcheck = self._errcheck
            setattr(self, name, fn)
        if self.missing:
            raise CudnnNotFound(
                f"{path} lacks the legacy cuDNN functions {', '.join(self.missing)}; minicaffe "
                f"needs cuDNN 9 (the legacy API); {INSTALL_HINT}")
        self.version = int(self.cudnnGetVersion())

    def last_error(self) -> str:
        """cuDNN's own message about the last failed call of this thread ("" when unknown)."""
        if getattr(self._cdll, "cudnnGetLastErrorString", None) is None:
            return ""  # before cuDNN 9.0
        try:
            buf = ctypes.create_string_buffer(2048)
            self.cudnnGetLastErrorString(buf, ctypes.sizeof(buf))
            return buf.value.decode(errors="replace").strip()
        except Exception:  # diagnostics must never mask the real error
            return ""

    def error_string(self, status: int) -> str:
        try:
            s = self.cudnnGetErrorString(int(status))
            return s.decode(errors="replace") if s else ""
        except Exception:
            return ""

    def _errcheck(self, result, func, args):
        if result != CUDNN_STATUS_SUCCESS:
            detail = self.last_error() or self.error_string(result)
            raise CudnnError(func.__name__, result, detail)
        return result

    def __repr__(self):
        return f"<cuDNN {version_string(self.version)} from {self.path}>"


def _missing_symbol(name, path):
    def call(*args):
        raise CudnnError(name, STATUS_NOT_SUPPORTED, f"{path} does not export {name}")
    call.__name__ = name
    return call


def version_string(v: int) -> str:
    """91900 -> '9.19.0' (cuDNN 9 encodes major*10000 + minor*100 + patch)."""
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


# ------------------------------------------------------------------ search
def _site_dirs() -> list[str]:
    """site-packages-like folders: sys.path entries, then site's own lists."""
    dirs = [p for p in sys.path if p]
    try:
        dirs += site.getsitepackages()
    except Exception:  # virtualenv's old site module
        pass
    try:
        dirs.append(site.getusersitepackages())
    except Exception:
        pass
    seen, out = set(), []
    for d in dirs:
        d = os.path.abspath(d)
        if d not in seen and os.path.isdir(d):
            seen.add(d)
            out.append(d)
    return out


def candidates(env: dict | None = None) -> list[tuple[str, str]]:
    """(where, path-or-soname) pairs to try, in order; see the module doc.

    Pure: looks at the environment and the file system, loads nothing.
    """
    env = os.environ if env is None else env
    explicit = env.get(ENV_PATH, "")
    if explicit:
        p = os.path.expanduser(explicit)
        if os.path.isdir(p):
            return [(f"{ENV_PATH} folder", os.path.join(p, SONAME))]
        return [(ENV_PATH, p)]
    out = [("already loaded in this process", SONAME)]
    for d in _site_dirs():
        f = os.path.join(d, "nvidia", "cudnn", "lib", SONAME)
        if os.path.exists(f):
            out.append((f"nvidia-cudnn wheel in {d}", f))
    out.append(("system loader", SONAME))
    return out


_SUBLIB_ORDER = ("graph", "engines_precompiled", "engines_runtime_compiled", "engines_tensor_ir",
                 "heuristic", "ops", "cnn", "adv", "ext")


def _sublibs(folder: str) -> list[str]:
    """The libcudnn_*.so.9 files of ``folder``, dependencies (graph) first."""
    files = sorted(glob.glob(os.path.join(folder, "libcudnn_*.so.9")))

    def rank(f):
        name = os.path.basename(f)[len("libcudnn_"):-len(".so.9")]
        return (_SUBLIB_ORDER.index(name) if name in _SUBLIB_ORDER else len(_SUBLIB_ORDER), name)
    return sorted(files, key=rank)


_MISSING_RE = re.compile(r"([\w.+-]+\.so(?:\.\d+)*): cannot open shared object file")


def _dependency_dirs(folder: str) -> list[str]:
    """lib folders of the other nvidia wheels beside a wheel's ``nvidia/cudnn/lib``."""
    nvidia = os.path.dirname(os.path.dirname(os.path.abspath(folder)))
    if os.path.basename(nvidia) != "nvidia":
        return []
    return sorted(d for d in glob.glob(os.path.join(nvidia, "*", "lib")) if d != folder)


def _dlopen_global(path: str, notes: list, dep_dirs: list, depth: int = 0):
    """dlopen with RTLD_GLOBAL; on a missing dependency, preload it from ``dep_dirs`` and retry."""
    try:
        return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        m = _MISSING_RE.search(str(e))
        if m and depth < 8:
            for d in dep_dirs:
                dep = os.path.join(d, m.group(1))
                if os.path.exists(dep):
                    notes.append(f"preloaded dependency {dep}")
                    _dlopen_global(dep, notes, dep_dirs, depth + 1)
                    return _dlopen_global(path, notes, dep_dirs, depth + 1)
        raise


def _loaded_path(soname: str) -> str | None:
    """Where the loader found ``soname`` in this process (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.rstrip("\n").split(None, 5)
                if len(p) == 6 and os.path.basename(p[5]) == soname:
                    return p[5]
    except OSError:
        pass
    return None


def _open(where: str, target: str, notes: list):
    """Load one candidate; returns (CDLL, absolute path or soname)."""
    if where == "already loaded in this process":
        if not getattr(os, "RTLD_NOLOAD", 0):
            raise OSError("RTLD_NOLOAD is not available on this platform")
        cdll = ctypes.CDLL(target, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        return cdll, _loaded_path(SONAME) or target
    if where == "system loader":
        cdll = ctypes.CDLL(target, mode=ctypes.RTLD_GLOBAL)
        return cdll, _loaded_path(SONAME) or target
    if not os.path.exists(target):
        raise OSError(f"{target}: no such file")
    path = os.path.abspath(target)
    return _dlopen_global(path, notes, _dependency_dirs(os.path.dirname(path))), path


def _preload_sublibs(folder: str, notes: list) -> list:
    """dlopen the folder's libcudnn_*.so.9 with RTLD_GLOBAL, dependencies first.

    Failures are retried while another library still loads (a later one may
    be a dependency), then recorded in ``notes``.
    """
    dep_dirs = _dependency_dirs(folder)
    pending, loaded = _sublibs(folder), []
    for _ in range(len(pending) + 1):
        failed = []
        for f in pending:
            try:
                _dlopen_global(f, notes, dep_dirs)
                loaded.append(f)
            except OSError as e:
                failed.append((f, e))
        if not failed or len(failed) == len(pending):
            for f, e in failed:
                notes.append(f"could not preload {os.path.basename(f)} ({e}); cuDNN will try to "
                             "load it itself when needed")
            break
        pending = [f for f, _ in failed]
    return loaded


_lock = threading.Lock()
_cache: dict = {}  # MINICAFFE_CUDNN_PATH value -> Library or CudnnNotFound


def load_once(cache: dict, lock, key, load_uncached, env):
    """``load_uncached(env)`` once per ``key`` (thread-safe), its result kept in ``cache``:
    a library, or the exception that says why none loaded, raised again on every call."""
    got = cache.get(key)
    if got is None:
        with lock:
            got = cache.get(key)
            if got is None:
                got = load_uncached(env)
                cache[key] = got
    if isinstance(got, BaseException):
        raise got
    return got


def load(env: dict | None = None) -> Library:
    """The cuDNN library, loaded once per value of ``$MINICAFFE_CUDNN_PATH``.

    Raises :class:`CudnnNotFound` naming every place tried and how to install.
    """
    env = os.environ if env is None else env
    return load_once(_cache, _lock, env.get(ENV_PATH, ""), _load_uncached, env)


def _load_uncached(env) -> Library | CudnnNotFound:
    tried = []
    cands = candidates(env)
    for where, target in cands:
        notes = []
        try:
            cdll, path = _open(where, target, notes)
        except OSError as e:
            if where != "already loaded in this process":
                tried.append(f"{where}: {target} ({e})")
            continue
        try:
            lib = Library(cdll, path, [], notes)
        except CudnnNotFound as e:
            tried.append(f"{where}: {e}")
            continue
        if lib.version // 10000 != 9:
            tried.append(f"{where}: {path} is cuDNN {version_string(lib.version)}, not 9.x")
            continue
        problem = _version_checks(lib)
        folder = os.path.dirname(path) if os.path.isabs(path) else ""
        if problem and folder and where != "already loaded in this process":
            # the shim could not dlopen its sub-libraries by name: preload them from its folder
            lib.preloaded = _preload_sublibs(folder, lib.notes)
            problem = _version_checks(lib)
        if problem:
            tried.append(f"{where}: {path}: {problem}")
            continue
        return lib
    if not any(w.startswith("nvidia-cudnn wheel") or w.startswith(ENV_PATH) for w, _ in cands):
        tried.append(f"no nvidia/cudnn/lib/{SONAME} under any sys.path entry (python "
                     f"{sys.executable})")
    return CudnnNotFound(
        "cuDNN 9 could not be loaded for the CUDNN engine; tried:\n  - " + "\n  - ".join(tried)
        + f"\n{INSTALL_HINT} (engine: CAFFE needs no cuDNN).")


def _version_checks(lib: Library) -> str:
    """Each sub-library checks its version against its dependencies; calling the
    checks through the shim also loads graph, ops and cnn ("" when all is well)."""
    for name in ("cudnnGraphVersionCheck", "cudnnOpsVersionCheck", "cudnnCnnVersionCheck"):
        if getattr(lib._cdll, name, None) is None:
            continue
        try:
            getattr(lib, name)()
        except CudnnError as e:
            hint = ""
            if e.status == 1002:
                hint = (f" (two cuDNN copies mixed in one process? load the same copy as PyTorch, "
                        f"or set {ENV_PATH})")
            return f"{e}{hint}"
    return ""


def available() -> bool:
    """True when cuDNN 9 loads here; never raises (does not need a GPU)."""
    try:
        load()
        return True
    except Exception:
        return False


def version() -> int:
    """``cudnnGetVersion()``: 91900 for 9.19.0.  Raises CudnnNotFound without cuDNN."""
    return load().version


def library_path() -> str:
    """The file cuDNN was loaded from."""
    return load().path


def load_report() -> str:
    """Where cuDNN came from and what was preloaded (for logs and bug reports)."""
    try:
        lib = load()
    except CudnnNotFound as e:
        return str(e)
    lines = [repr(lib)]
    if getattr(lib._cdll, "cudnnGetCudartVersion", None) is not None:
        v = int(lib.cudnnGetCudartVersion())
        lines.append(f"built against CUDA runtime {v // 1000}.{v % 1000 // 10}")
    lines += [f"preloaded {p}" for p in lib.preloaded] + lib.notes
    return "\n".join(lines)


def _reset_cache():
    """Forget load results (tests change $MINICAFFE_CUDNN_PATH)."""
    with _lock:
        _cache.clear()
