"""NVTX ranges for Nsight Systems: every layer forward/backward and every swap operation.

The executor (:class:`swap.runtime.Executor`) pushes one range around each step's computation
(``fwd conv1``, ``bwd res2a_branch2b``) and one around each memory operation it issues
(``prefetch data:conv1``, ``offload saved:bn_conv1/x_norm``, ``allocate ...``, ``release
...``), on the host thread that issues the work; Nsight Systems lines them up with the kernels
and copies they launched on the three streams::

    MINICAFFE_NVTX=1 nsys profile -t cuda,nvtx -o swap python3 -m minicaffe train ... --swap naive

Enabled by ``MINICAFFE_NVTX=1`` or ``Executor(nvtx=True)``.  Without CuPy, or a CuPy built
without NVTX, every range is a no-op (and :func:`ranges` returns None, so the executor's hot
loop pays one ``is None`` test per step when ranges are off).
"""
from __future__ import annotations

import contextlib
import os

ENV = "MINICAFFE_NVTX"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def env_enabled() -> bool:
    """``MINICAFFE_NVTX`` read as a flag (1/true/yes/on; 0/false/no/off or unset)."""
    v = os.environ.get(ENV, "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"{ENV}={os.environ[ENV]!r}: give 1 or 0")


def backend():
    """CuPy's NVTX module (``RangePush`` / ``RangePop``), or None where it is unavailable."""
    try:
        from cupy.cuda import nvtx as mod
    except Exception:
        return None
    if not getattr(mod, "available", True):
        return None
    if not (hasattr(mod, "RangePush") and hasattr(mod, "RangePop")):
        return None
    return mod


class Ranges:
    """Push/pop NVTX ranges through ``mod`` (an object with ``RangePush(str)`` and
    ``RangePop()``; CuPy's module by default).  ``depth`` counts open ranges, so a caller can
    check that every push was popped."""

    def __init__(self, mod):
        self._push = mod.RangePush
        self._pop = mod.RangePop
        self.depth = 0

    def push(self, name: str):
        self._push(name)
        self.depth += 1

    def pop(self):
        self._pop()
        self.depth -= 1

    @contextlib.contextmanager
    def range(self, name: str):
        self.push(name)
        try:
            yield
        finally:
            self.pop()


def ranges(enabled: bool | None = None, mod=None) -> Ranges | None:
    """A :class:`Ranges` when NVTX is wanted (``enabled``, default: ``MINICAFFE_NVTX``) and
    available (``mod``, default: CuPy's), else None."""
    if enabled is None:
        enabled = env_enabled()
    if not enabled:
        return None
    mod = backend() if mod is None else mod
    return None if mod is None else Ranges(mod)


@contextlib.contextmanager
def nvtx_range(name: str, enabled: bool | None = None):
    """``with nvtx_range("phase"):`` for code outside the executor (a no-op when off)."""
    r = ranges(enabled)
    if r is None:
        yield
        return
    with r.range(name):
        yield
