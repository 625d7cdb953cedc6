"""Array back ends: NumPy for CPU mode, CuPy for GPU mode.

A net is built for one mode, like Caffe's ``solver_mode``; every layer of it
receives the matching array module as ``self.xp`` and writes one code path for
both.  Nothing here is a process-global switch that layers consult: the
default mode below only chooses the mode of nets built without an explicit one
(pycaffe's ``set_mode_gpu()`` habit).
"""
from __future__ import annotations

import numpy as np

try:  # ``import cupy`` works without a GPU; creating arrays does not.
    import cupy as _cupy
except Exception:  # pragma: no cover - CuPy absent in CI
    _cupy = None

CPU = "CPU"
GPU = "GPU"

# "explicit": set_mode_cpu/gpu was called, so pycaffe's solvers follow it, not solver_mode
_default = {"mode": CPU, "device": 0, "explicit": False}


def gpu_available() -> bool:
    """True when CuPy imports and at least one CUDA device answers."""
    if _cupy is None:
        return False
    try:
        return _cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def cupy_module():
    """The cupy module, or a clear error when GPU mode is impossible here."""
    if _cupy is None:
        raise RuntimeError("GPU mode needs CuPy: pip install 'minicaffe[gpu]'")
    if not gpu_available():
        raise RuntimeError("GPU mode asked for, but no CUDA device is visible")
    return _cupy


def array_module(mode: str):
    """NumPy for ``CPU``, CuPy for ``GPU``."""
    mode = normalize_mode(mode)
    return cupy_module() if mode == GPU else np


def normalize_mode(mode) -> str:
    if mode is None:
        return _default["mode"]
    if isinstance(mode, int):  # SolverParameter.SolverMode: CPU=0, GPU=1
        return GPU if mode == 1 else CPU
    m = str(mode).upper()
    if m not in (CPU, GPU):
        raise ValueError(f"unknown mode {mode!r}: choose CPU or GPU")
    return m


def get_array_module(*arrays):
    """The module (numpy or cupy) that owns the given arrays."""
    if _cupy is not None:
        return _cupy.get_array_module(*arrays)
    return np


def is_gpu_array(a) -> bool:
    return _cupy is not None and isinstance(a, _cupy.ndarray)


def to_numpy(a):
    """A host copy of ``a`` (blocking device-to-host copy for CuPy arrays)."""
    if is_gpu_array(a):
        return a.get()
    return np.asarray(a)


def set_mode_cpu():
    """Default mode for nets and solvers built afterwards (pycaffe habit): as in pycaffe, a
    solver then runs in this mode whatever its file's ``solver_mode`` says."""
    _default["mode"] = CPU
    _default["explicit"] = True


def set_mode_gpu():
    cupy_module()
    _default["mode"] = GPU
    _default["explicit"] = True


def explicit_mode() -> str | None:
    """The mode set_mode_cpu/set_mode_gpu chose, or None where neither was called."""
    return _default["mode"] if _default["explicit"] else None


# How a host thread waits for the GPU (cudaStreamSynchronize, cudaEventSynchronize, ...):
# CUDA's own choice by default (it spins while the process has fewer contexts than the host
# has CPUs).  ``$MINICAFFE_CUDA_SYNC=blocking`` makes waiting threads sleep instead, which
# leaves the CPU to the others: on a host whose virtual CPUs share physical cores a spinning
# thread slows the one beside it (docs/RESULTS.md, issue 6, session 21).
SYNC_ENV = "MINICAFFE_CUDA_SYNC"
SYNC_FLAGS = {"auto": 0x0, "spin": 0x1, "yield": 0x2, "blocking": 0x4}  # CU_CTX_SCHED_*
SYNC_MASK = 0x7


def cuda_sync_flag(env=None):
    """The CU_CTX_SCHED_* flag ``$MINICAFFE_CUDA_SYNC`` asks for, or None when it is unset."""
    import os
    value = (os.environ if env is None else env).get(SYNC_ENV, "").strip().lower()
    if not value:
        return None
    if value not in SYNC_FLAGS:
        raise ValueError(f"${SYNC_ENV}={value!r}: give one of {', '.join(SYNC_FLAGS)}")
    return SYNC_FLAGS[value]


def _driver():  # pragma: no cover - GPU machine only
    import ctypes
    return ctypes.CDLL("libcuda.so.1")


def _check_driver(lib, rc: int, what: str):  # pragma: no cover - GPU machine only
    if rc:
        import ctypes
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what}: CUDA driver error {rc} "
                           f"({(name.value or b'?').decode()})")


def _primary_state(device_id: int):  # pragma: no cover - GPU machine only
    """(driver library, CUdevice, flags of its primary context) of device ``device_id``."""
    import ctypes
    lib = _driver()
    _check_driver(lib, lib.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _check_driver(lib, lib.cuDeviceGet(ctypes.byref(dev), int(device_id)), "cuDeviceGet")
    flags, active = ctypes.c_uint(), ctypes.c_int()
    _check_driver(lib, lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags),
                                                       ctypes.byref(active)),
                  "cuDevicePrimaryCtxGetState")
    return lib, dev, flags.value


def set_sync(device_id: int, flag: int):  # pragma: no cover - GPU machine only
    """Set device ``device_id``'s primary context to wait for the GPU as ``flag``
    (CU_CTX_SCHED_*), keeping its other flags; before or after the context exists."""
    import ctypes
    lib, dev, flags = _primary_state(device_id)
    setter = getattr(lib, "cuDevicePrimaryCtxSetFlags_v2", None) or lib.cuDevicePrimaryCtxSetFlags
    _check_driver(lib, setter(dev, ctypes.c_uint((flags & ~SYNC_MASK) | int(flag))),
                  f"{SYNC_ENV}: setting device {device_id}'s scheduling flags")


def sync_flags(device_id: int) -> int:  # pragma: no cover - GPU machine only
    """Device ``device_id``'s primary context's CU_CTX_SCHED_* bits."""
    return _primary_state(device_id)[2] & SYNC_MASK


def set_device(device_id: int):
    _default["device"] = int(device_id)
    if _cupy is not None and gpu_available():
        flag = cuda_sync_flag()
        if flag is not None:            # before the context is made current, where it is new
            set_sync(int(device_id), flag)
        _cupy.cuda.Device(int(device_id)).use()


def default_mode() -> str:
    return _default["mode"]
