"""cuBLAS's GEMM contract run by NumPy on host memory, for tests without a GPU.

:func:`run_call` executes a :class:`minicaffe.cublas.GemmCall` as cuBLAS
defines it (column-major operands at raw addresses, leading dimensions,
strides between the matrices of a batch, alpha and beta), after the argument
checks that make cuBLAS answer ``CUBLAS_STATUS_INVALID_VALUE``.
:func:`on_host` makes ``minicaffe.cublas.gemm``/``gemm_strided_batched`` plan
with the real planner and run that way on NumPy arrays, so the layers' cuBLAS
branches (operand order, transpose flags, views, ``beta = 1`` accumulation)
are tested on the CPU against their NumPy branches; only the ctypes call and
the stream binding are left for the GPU tests.
"""
from __future__ import annotations

import contextlib
import ctypes

import numpy as np

from .. import cublas

_CTYPES = {"cublasS": (np.float32, ctypes.c_float), "cublasD": (np.float64, ctypes.c_double)}


def _view(ptr: int, rows: int, cols: int, ld: int, dtype, ctype):
    """The column-major rows x cols matrix at host address ``ptr`` (writable)."""
    item = np.dtype(dtype).itemsize
    count = (cols - 1) * ld + rows
    flat = np.frombuffer((ctype * count).from_address(ptr), dtype)
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (item, ld * item))


def run_call(call: cublas.GemmCall):
    """Execute ``call`` on host memory (its addresses must be host addresses)."""
    dtype, ctype = _CTYPES[call.function[:7]]
    item = np.dtype(dtype).itemsize
    ta, tb = call.transa != cublas.CUBLAS_OP_N, call.transb != cublas.CUBLAS_OP_N
    m, n, k = call.m, call.n, call.k
    if min(m, n, k, call.batch) < 0:
        raise ValueError("CUBLAS_STATUS_INVALID_VALUE: a negative size")
    for name, ld, rows in (("lda", call.lda, k if ta else m), ("ldb", call.ldb, n if tb else k),
                           ("ldc", call.ldc, m)):
        if ld < max(1, rows):
            raise ValueError(f"CUBLAS_STATUS_INVALID_VALUE: {name} {ld} < max(1, {rows})")
    if m == 0 or n == 0:
        return
    batches = call.batch if call.batched else 1
    strides = (call.stride_a, call.stride_b, call.stride_c) if call.batched else (0, 0, 0)
    for i in range(batches):
        pa, pb, pc = (p + i * s * item for p, s in zip((call.a, call.b, call.c), strides))
        C = _view(pc, m, n, call.ldc, dtype, ctype)
        if k == 0:
            C[...] = call.beta * C if call.beta != 0 else 0
            continue
        A = _view(pa, k, m, call.lda, dtype, ctype).T if ta else _view(pa, m, k, call.lda,
                                                                        dtype, ctype)
        B = _view(pb, n, k, call.ldb, dtype, ctype).T if tb else _view(pb, k, n, call.ldb,
                                                                        dtype, ctype)
        prod = call.alpha * (A @ B)
        # beta = 0: C is not read (it may hold NaN), as in BLAS
        C[...] = prod if call.beta == 0 else prod + call.beta * C


def gemm(a, b, out, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    """:func:`minicaffe.cublas.gemm` on NumPy arrays (the real planner, this executor)."""
    run_call(cublas.plan_gemm(a, b, out, trans_a, trans_b, alpha, beta))
    return out


def gemm_strided_batched(a, b, out, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    """:func:`minicaffe.cublas.gemm_strided_batched` on NumPy arrays."""
    run_call(cublas.plan_gemm(a, b, out, trans_a, trans_b, alpha, beta, batched=True))
    return out


@contextlib.contextmanager
def on_host(monkeypatch):
    """Inside: NumPy arrays take the layers' cuBLAS branches, run by :func:`run_call`
    (``monkeypatch`` is pytest's; everything is restored on exit)."""
    calls = []

    def counted(fn):
        def wrapper(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **kwargs)
        return wrapper

    with monkeypatch.context() as m:
        m.setattr(cublas, "enabled_for", lambda xp: xp is np)
        m.setattr(cublas, "gemm", counted(gemm))
        m.setattr(cublas, "gemm_strided_batched", counted(gemm_strided_batched))
        yield calls
