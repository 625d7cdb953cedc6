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


def set_device(device_id: int):
    _default["device"] = int(device_id)
    if _cupy is not None and gpu_available():
        _cupy.cuda.Device(int(device_id)).use()


def default_mode() -> str:
    return _default["mode"]
