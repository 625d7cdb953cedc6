"""The fused GPU fast paths (minicaffe.kernels.cuda_fused) against the generic layer code.

Every fused kernel is checked against the generic NumPy/CuPy path of its layer
(or of the solver), in float32 and float64, on odd shapes, in place and not:

* on a GPU (tests marked ``gpu``): the fast path against the same layer built
  under ``cuda_fused.disabled()``, both in CuPy;
* everywhere else, through a CPU emulator of the *same CUDA source*: it is
  compiled as C++ (g++) with one fiber per CUDA thread, which runs until its
  next ``__syncthreads``, the fibers of a block in a new shuffled order
  between every two barriers, blocks one after another, and the layers' NumPy
  arrays are handed to it by address, exactly as CuPy would hand device
  pointers to the kernels (a numpy scalar of the wrong width in a wrapper shows
  up here as wrong results, as it would on the GPU).  This checks the index
  maths, the workspace layout, the in-place hazards, a missing barrier and the
  argument packing without a GPU; timing, NVRTC-specific issues and threads
  that run at the same time (within a block or across blocks) are left to the
  GPU tests.

Also here, CPU-only: the dispatch conditions (the fast path is never taken on
NumPy in normal use, and only where enabled, compiled and supported).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.kernels import cuda_fused
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.testing import make_layer

F32, F64 = np.float32, np.float64
TOL = {F32: 1e-5, F64: 1e-10}


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b), initial=0.0) / max(np.max(np.abs(b), initial=0.0), 1e-30))


# ------------------------------------------------------------- the emulator
_PRELUDE = r"""
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>
#include <ucontext.h>

struct EmuDim { unsigned int x = 0, y = 0, z = 0; };
static EmuDim threadIdx, blockIdx, blockDim, gridDim;
static void emu_syncthreads();

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static  /* blocks run one at a time: a static is block-shared */
#define __restrict__

static inline void __syncthreads() { emu_syncthreads(); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline double __dsqrt_rn(double a) { return std::sqrt(a); }
"""

_LAUNCHER = r"""
template <typename... A, std::size_t... I>
static void emu_call(void (*k)(A...), void** args, std::index_sequence<I...>) {
  k(*reinterpret_cast<A*>(args[I])...);
}

// One fiber (a ucontext with a stack of its own) per CUDA thread of a block, all on the
// calling host thread.  A block's fibers run one at a time, each until it calls __syncthreads
// or returns, in an order shuffled afresh for every stretch between two barriers (seeded by
// the launch, the block and the stretch, so a failure repeats): a thread that reads what
// another writes without the barrier between them finds it unwritten in about half the
// orders.  Blocks run one after another.  No two threads run at once, so a race inside a
// stretch on one address (a lost update) would not show; within a block the kernels here
// share addresses only in the tree sums and through thread 0's __shared__ values, both
// behind a barrier.  This replaced one host thread per CUDA thread with a std::barrier:
// 0.4 ms a barrier on the 2-core CI machine and 256 threads competing with the other
// pytest-xdist worker (the module took 46 to 61 s in the suite); with the barrier after
// block_sum2's stores, between its tree levels, after block_sum4's stores or after
// dropout_forward's thread 0 removed from the CUDA source, 39, 93, 8 and 11 of the 276
// tests fail (with the threads: 39, 90, 8 and 2 to 11).
struct EmuFibers {
  static constexpr std::size_t STACK = 256 << 10;
  enum State : unsigned char { RUNS, WAITS, RETURNED };
  explicit EmuFibers(unsigned n)
      : n(n), ctx(n), state(n), order(n), stacks(new char[n * STACK]) {}

  // runs call(kernel, args) on every thread of every block
  void run(void (*c)(void*, void**), void* k, void** a, unsigned gx, unsigned gy) {
    call = c; kernel = k; args = a;
    ++launches;
    for (unsigned by = 0; by < gy; ++by) {
      for (unsigned bx = 0; bx < gx; ++bx) {
        blockIdx = EmuDim{bx, by, 0};
        block(launches * 0x9E3779B97F4A7C15ULL + (std::uint64_t(by) << 32 | bx));
      }
    }
  }

  void block(std::uint64_t seed) {
    for (unsigned t = 0; t < n; ++t) {
      getcontext(&ctx[t]);
      ctx[t].uc_stack.ss_sp = stacks.get() + t * STACK;
      ctx[t].uc_stack.ss_size = STACK;
      ctx[t].uc_link = &host;
      makecontext(&ctx[t], &EmuFibers::entry, 0);
      state[t] = RUNS;
    }
    for (bool waiting = true; waiting;) {
      waiting = false;
      std::iota(order.begin(), order.end(), 0u);
      for (unsigned i = n - 1; i > 0; --i) {   // Fisher-Yates, splitmix64 draws
        seed += 0x9E3779B97F4A7C15ULL;
        std::uint64_t z = seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        std::swap(order[i], order[(z ^ (z >> 31)) % (i + 1)]);
      }
      for (unsigned t : order) {
        if (state[t] == RETURNED) continue;     // as on the device: it holds no barrier
        current = t;
        threadIdx = EmuDim{t, 0, 0};
        state[t] = RUNS;
        swapcontext(&host, &ctx[t]);            // to its next __syncthreads, or its end
        waiting |= state[t] == WAITS;
      }
    }
  }

  static void entry() {
    EmuFibers* f = active;
    f->call(f->kernel, f->args);
    f->state[f->current] = RETURNED;            // then uc_link: back to block()
  }

  void syncthreads() {
    state[current] = WAITS;
    swapcontext(&ctx[current], &host);
  }

  const unsigned n;
  std::vector<ucontext_t> ctx;
  std::vector<unsigned char> state;
  std::vector<unsigned> order;
  std::unique_ptr<char[]> stacks;
  ucontext_t host;
  unsigned current = 0;
  std::uint64_t launches = 0;
  void (*call)(void*, void**) = nullptr;
  void* kernel = nullptr;
  void** args = nullptr;
  static inline EmuFibers* active = nullptr;
};

static void emu_syncthreads() { EmuFibers::active->syncthreads(); }

template <typename... A>
static void emu_trampoline(void* k, void** args) {
  emu_call(reinterpret_cast<void (*)(A...)>(k), args, std::index_sequence_for<A...>{});
}

// the fibers of a block size, shared by every kernel (never freed)
static EmuFibers* emu_fibers(unsigned threads) {
  static std::map<unsigned, EmuFibers*> made;
  EmuFibers*& f = made[threads];
  if (f == nullptr) f = new EmuFibers(threads);
  return f;
}

template <typename... A>
static void emu_launch(void (*k)(A...), unsigned gx, unsigned gy, unsigned threads, void** args) {
  gridDim = EmuDim{gx, gy, 1};
  blockDim = EmuDim{threads, 1, 1};
  EmuFibers::active = emu_fibers(threads);
  EmuFibers::active->run(&emu_trampoline<A...>, reinterpret_cast<void*>(k), args, gx, gy);
}
"""


class Emulator:
    """The cuda_fused source compiled for the CPU; ``fn(kernel, dtype)`` mimics
    ``RawModule.get_function``: the result is called as ``f(grid, block, args)``."""

    def __init__(self, lib):
        self.lib = lib

    def fn(self, kernel, dtype):
        t = cuda_fused._CTYPE[np.dtype(dtype)]
        entry = getattr(self.lib, f"emu_{kernel}_{t}")

        def launch(grid, block, args):
            keep, addrs = [], []
            for a in args:
                if isinstance(a, np.ndarray):
                    assert a.flags.c_contiguous, f"{kernel}: non-contiguous array argument"
                    buf = ctypes.c_uint64(a.ctypes.data)
                elif isinstance(a, np.generic):
                    buf = ctypes.create_string_buffer(a.tobytes(), a.nbytes)
                else:  # CuPy would guess a width for a Python scalar: the wrappers must not
                    raise TypeError(f"{kernel}: argument {a!r} is not a numpy scalar or array")
                keep.append(buf)
                addrs.append(ctypes.addressof(buf))
            argv = (ctypes.c_void_p * len(addrs))(*addrs)
            gx = int(grid[0])
            gy = int(grid[1]) if len(grid) > 1 else 1
            entry(ctypes.c_uint(gx), ctypes.c_uint(gy), ctypes.c_uint(int(block[0])), argv)

        return launch


@functools.lru_cache(maxsize=None)
def _emulator():
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        return None
    entries = []
    for t in ("float", "double"):
        for k in cuda_fused.KERNELS:
            entries.append(f'extern "C" void emu_{k}_{t}(unsigned gx, unsigned gy, unsigned n, '
                           f'void** a) {{ emu_launch(&{k}<{t}>, gx, gy, n, a); }}')
    code = _PRELUDE + cuda_fused.source() + _LAUNCHER + "\n".join(entries) + "\n"
    d = tempfile.mkdtemp(prefix="cuda_fused_emu_")
    src, lib = os.path.join(d, "emu.cpp"), os.path.join(d, "emu.so")
    with open(src, "w") as f:
        f.write(code)
    cmd = [cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared",
           src, "-o", lib]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail("the cuda_fused source does not compile in the CPU emulator:\n"
                    + proc.stderr[-4000:])
    return Emulator(ctypes.CDLL(lib))


class Backend:
    def __init__(self, xp, kind):
        self.xp, self.kind = xp, kind


@pytest.fixture
def backend(request, monkeypatch):
    """'emu': NumPy arrays through the emulated kernels; 'gpu': CuPy on the device."""
    if request.param == "gpu":
        import cupy
        assert cuda_fused.enabled_for(cupy, F32), "fused kernels did not compile on this GPU"
        return Backend(cupy, "gpu")
    emu = _emulator()
    if emu is None:
        pytest.skip("no C++ compiler for the CPU emulator")
    monkeypatch.setattr(cuda_fused, "enabled_for",
                        lambda xp, dtype=None: cuda_fused.enabled() and xp is np and (
                            dtype is None or np.dtype(dtype) in cuda_fused._CTYPE))
    monkeypatch.setattr(cuda_fused, "_fn", emu.fn)
    return Backend(np, "emu")


BACKENDS = [pytest.param("emu", id="emu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]
with_backends = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


def fused_and_generic(run):
    """run(fused: bool) under the matching switch; returns (fused result, generic result)."""
    fused = run(True)
    with cuda_fused.disabled():
        generic = run(False)
    return fused, generic


def assert_close(fused, generic, dtype, what=""):
    assert len(fused) == len(generic)
    for i, (a, b) in enumerate(zip(fused, generic)):
        assert np.shape(a) == np.shape(b), f"{what} output {i}: shape {np.shape(a)} vs {np.shape(b)}"
        e = rel_err(a, b)
        assert e <= TOL[dtype], f"{what} output {i}: relative error {e:.3g} > {TOL[dtype]:g}"


# ---------------------------------------------------------------- BatchNorm
BN_SHAPES = [(3, 5, 7, 11), (5, 3, 1, 1), (4, 6), (5, 4, 33, 9), (8, 3, 20, 20), (1, 2, 3, 300)]
# (m = N*H*W >= 4 per channel: at m = 2 the TRAIN backward cancels exactly, dx is rounding noise)


def run_bn(xp, dtype, shape, phase, in_place, fused, iters=2, text='name: "bn" type: "BatchNorm"'):
    rng = np.random.default_rng(11)
    layer = make_layer(text, xp=xp, dtype=dtype, phase=phase)
    bottom = Blob(shape, xp=xp, dtype=dtype, name="x")
    top = bottom if in_place else Blob(xp=xp, dtype=dtype, name="y")
    layer.setup([bottom], [top])
    assert layer._fused == fused
    c = shape[1]
    layer.blobs[0].data[...] = xp.asarray(rng.uniform(-1, 1, c), dtype=dtype)
    layer.blobs[1].data[...] = xp.asarray(rng.uniform(0.5, 2, c), dtype=dtype)
    layer.blobs[2].data[...] = xp.asarray([1.7], dtype=dtype)
    out = []
    for _ in range(iters):  # twice: the running sums are updated on top of the first update
        x = rng.standard_normal(shape) * 3 + 2
        dy = rng.standard_normal(shape)
        bottom.data[...] = xp.asarray(x, dtype=dtype)
        layer.forward([bottom], [top])
        out.append(to_numpy(top.data).copy())
        top.diff[...] = xp.asarray(dy, dtype=dtype)
        layer.backward([top], [True], [bottom])
        out.append(to_numpy(bottom.diff).copy())
    out += [to_numpy(b.data).copy() for b in layer.blobs]
    out.append(to_numpy(layer.internal("std").data).copy())
    if "x_norm" in layer.internals:
        out.append(to_numpy(layer.internal("x_norm").data).copy())
    return out


@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST])
@pytest.mark.parametrize("in_place", [False, True])
def test_batchnorm_fused_matches_generic(backend, dtype, shape, phase, in_place):
    fused, generic = fused_and_generic(
        lambda f: run_bn(backend.xp, dtype, shape, phase, in_place, f))
    assert_close(fused, generic, dtype, f"BatchNorm {shape}")


@with_backends
def test_batchnorm_use_global_stats_in_train_and_zero_factor(backend):
    """use_global_stats forced in TRAIN, and a scale factor of 0 (mean = var = 0)."""
    text = 'name: "bn" type: "BatchNorm" batch_norm_param { use_global_stats: true eps: 0.01 }'

    def run(f):
        out = run_bn(backend.xp, F32, (3, 4, 5, 2), caffe_pb2.TRAIN, True, f, iters=1, text=text)
        return out

    assert_close(*fused_and_generic(run), F32, "BatchNorm global")

    def run_zero(f):
        xp = backend.xp
        layer = make_layer(text, xp=xp, dtype=F32, phase=caffe_pb2.TRAIN)
        bottom, top = Blob((2, 3, 4, 4), xp=xp, dtype=F32), Blob(xp=xp, dtype=F32)
        layer.setup([bottom], [top])
        bottom.data[...] = xp.asarray(np.random.default_rng(1).standard_normal(bottom.shape),
                                      dtype=F32)
        layer.forward([bottom], [top])  # blobs all 0: y = x / sqrt(eps)
        return [to_numpy(top.data)]

    assert_close(*fused_and_generic(run_zero), F32, "BatchNorm zero factor")


@with_backends
def test_batchnorm_running_update_follows_caffe(backend):
    """The fused TRAIN forward updates the three blobs with Caffe's formulas exactly."""
    xp, shape, maf = backend.xp, (4, 3, 5, 5), 0.9
    text = f'name: "bn" type: "BatchNorm" batch_norm_param {{ moving_average_fraction: {maf} }}'
    layer = make_layer(text, xp=xp, dtype=F64, phase=caffe_pb2.TRAIN)
    bottom, top = Blob(shape, xp=xp, dtype=F64), Blob(xp=xp, dtype=F64)
    layer.setup([bottom], [top])
    assert layer._fused
    x = np.random.default_rng(3).standard_normal(shape) * 2 + 5  # a mean far from 0
    bottom.data[...] = xp.asarray(x)
    layer.forward([bottom], [top])
    m = x.size // 3
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(to_numpy(layer.blobs[0].data), mean, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(layer.blobs[1].data), var * m / (m - 1), rtol=1e-12)
    np.testing.assert_allclose(to_numpy(layer.blobs[2].data), [1.0])
    np.testing.assert_allclose(to_numpy(layer.internal("std").data),
                               np.sqrt(var + float(np.float32(1e-5))), rtol=1e-12)


# -------------------------------------------------------------------- Scale
SCALE_CASES = [
    ("bias_term: true", [(3, 5, 7, 11)]),
    ("", [(2, 3, 4, 9)]),
    ("axis: 0 bias_term: true", [(4, 3, 5, 2), (4, 3)]),
    ("num_axes: 0 bias_term: true", [(3, 4, 5, 3)]),
    ("axis: 1 num_axes: 2 bias_term: true", [(2, 3, 4, 5)]),
    ("axis: -1", [(3, 2, 5, 7)]),
    ("bias_term: true", [(6, 4)]),
    ("bias_term: true", [(5, 3, 33, 9)]),
    ("axis: 1", [(3, 4, 5, 6), (4, 5)]),
]


def run_scale(xp, dtype, params, shapes, in_place, fused, props=None):
    rng = np.random.default_rng(5)
    text = f'name: "s" type: "Scale" scale_param {{ {params} }}'
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [Blob(s, xp=xp, dtype=dtype, name=f"b{i}") for i, s in enumerate(shapes)]
    top = [bottom[0] if in_place else Blob(xp=xp, dtype=dtype, name="t")]
    layer.setup(bottom, top)
    assert layer._fused == fused
    for b in layer.blobs:
        b.data[...] = xp.asarray(rng.standard_normal(b.shape), dtype=dtype)
        b.diff[...] = xp.asarray(rng.standard_normal(b.shape), dtype=dtype)  # accumulates
    for b in bottom:
        b.data[...] = xp.asarray(rng.standard_normal(b.shape), dtype=dtype)
    if len(bottom) > 1:
        bottom[1].diff[...] = 7.0  # overwritten, not accumulated
    layer.forward(bottom, top)
    out = [to_numpy(top[0].data).copy()]
    top[0].diff[...] = xp.asarray(rng.standard_normal(top[0].shape), dtype=dtype)
    layer.backward(top, props or [True] * len(bottom), bottom)
    if (props or [True])[0]:
        out.append(to_numpy(bottom[0].diff).copy())
    out += [to_numpy(b.diff).copy() for b in layer.blobs]
    if len(bottom) > 1:
        out.append(to_numpy(bottom[1].diff).copy())
    return out


@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("params,shapes", SCALE_CASES)
@pytest.mark.parametrize("in_place", [False, True])
def test_scale_fused_matches_generic(backend, dtype, params, shapes, in_place):
    fused, generic = fused_and_generic(
        lambda f: run_scale(backend.xp, dtype, params, shapes, in_place, f))
    assert_close(fused, generic, dtype, f"Scale {params} {shapes}")


@with_backends
@pytest.mark.parametrize("props", [[False], [True]])
def test_scale_fused_partial_backward(backend, props):
    """No bottom gradient, or frozen params (lr_mult 0 leaves param diffs untouched)."""
    def run(f):
        out = run_scale(backend.xp, F32, "bias_term: true", [(3, 4, 5, 5)], True, f, props=props)
        return out

    assert_close(*fused_and_generic(run), F32, "Scale partial")


# --------------------------------------------------------------- ReLU/Eltwise
def run_relu(xp, dtype, shape, slope, in_place, fused):
    rng = np.random.default_rng(7)
    layer = make_layer(f'name: "r" type: "ReLU" relu_param {{ negative_slope: {slope} }}',
                       xp=xp, dtype=dtype)
    bottom = Blob(shape, xp=xp, dtype=dtype)
    top = bottom if in_place else Blob(xp=xp, dtype=dtype)
    layer.setup([bottom], [top])
    assert layer._fused == fused
    x = rng.standard_normal(shape)
    x.flat[::7] = 0.0  # exact zeros take the "not > 0" branch
    bottom.data[...] = xp.asarray(x, dtype=dtype)
    layer.forward([bottom], [top])
    y = to_numpy(top.data).copy()
    top.diff[...] = xp.asarray(rng.standard_normal(shape), dtype=dtype)
    layer.backward([top], [True], [bottom])
    return [y, to_numpy(bottom.diff).copy()]


@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("slope", [0.0, 0.1, -0.5])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("shape", [(3, 5, 7, 11), (4, 6, 5, 4)])  # one element, 16-byte packs
def test_relu_fused_is_bitwise_generic(backend, dtype, slope, in_place, shape, monkeypatch):
    calls = []
    fn = cuda_fused._fn
    monkeypatch.setattr(cuda_fused, "_fn", lambda k, dt: calls.append(k) or fn(k, dt))
    fused, generic = fused_and_generic(
        lambda f: run_relu(backend.xp, dtype, shape, slope, in_place, f))
    for a, b in zip(fused, generic):
        np.testing.assert_array_equal(a, b)
    packed = np.prod(shape) % (16 // np.dtype(dtype).itemsize) == 0
    assert calls == (["relu_forward_v", "relu_backward_v"] if packed
                     else ["relu_forward", "relu_backward"])


def run_eltwise(xp, dtype, n_bottoms, coeffs, in_place, props, fused, shape=(3, 4, 5, 7)):
    rng = np.random.default_rng(9)
    c = " ".join(f"coeff: {v}" for v in coeffs)
    layer = make_layer(f'name: "e" type: "Eltwise" eltwise_param {{ {c} }}', xp=xp, dtype=dtype)
    bottom = [Blob(shape, xp=xp, dtype=dtype, name=f"b{i}") for i in range(n_bottoms)]
    top = [bottom[0] if in_place else Blob(xp=xp, dtype=dtype)]
    layer.setup(bottom, top)
    assert layer._fused == fused
    for b in bottom:
        b.data[...] = xp.asarray(rng.standard_normal(shape), dtype=dtype)
    layer.forward(bottom, top)
    out = [to_numpy(top[0].data).copy()]
    top[0].diff[...] = xp.asarray(rng.standard_normal(shape), dtype=dtype)
    for b in bottom[1:]:
        b.diff[...] = 5.0  # overwritten where propagated
    layer.backward(top, props, bottom)
    return out + [to_numpy(b.diff).copy() for b in bottom]


@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("n,coeffs,props", [
    (2, [], [True, True]), (2, [1.0, -1.0], [True, True]), (2, [0.5, 2.0], [False, True]),
    (3, [1.0, 2.0, -0.5], [True, True, True]), (3, [], [True, False, True]),
])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("shape", [(3, 4, 5, 7), (3, 5, 7, 11)])  # 16-byte packs, one element
def test_eltwise_sum_fused_is_bitwise_generic(backend, dtype, n, coeffs, props, in_place, shape):
    fused, generic = fused_and_generic(
        lambda f: run_eltwise(backend.xp, dtype, n, coeffs, in_place, props, f, shape))
    for a, b in zip(fused, generic):
        np.testing.assert_array_equal(a, b)


def run_split(xp, dtype, shape, n_top, fused):
    rng = np.random.default_rng(13)
    layer = make_layer('name: "s" type: "Split"', xp=xp, dtype=dtype)
    bottom = Blob(shape, xp=xp, dtype=dtype, name="x")
    top = [Blob(xp=xp, dtype=dtype, name=f"t{i}") for i in range(n_top)]
    layer.setup([bottom], top)
    assert layer._fused == fused
    bottom.data[...] = xp.asarray(rng.standard_normal(shape), dtype=dtype)
    layer.forward([bottom], top)
    for t in top:
        t.diff[...] = xp.asarray(rng.standard_normal(shape), dtype=dtype)
    bottom.diff[...] = 5.0  # overwritten
    layer.backward(top, [True], [bottom])
    return [to_numpy(bottom.diff).copy()]


@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("n_top", [2, 3])
@pytest.mark.parametrize("shape", [(3, 4, 5, 7), (3, 5, 7, 11)])  # 16-byte packs, one element
def test_split_backward_fused_is_bitwise_generic(backend, dtype, n_top, shape):
    fused, generic = fused_and_generic(lambda f: run_split(backend.xp, dtype, shape, n_top, f))
    np.testing.assert_array_equal(fused[0], generic[0])


# ------------------------------------------------------------------ Dropout
def assert_same_bits(a, b, what=""):
    """Equal bit for bit (so -0.0 differs from 0.0), except that any NaN matches any
    NaN: CUDA writes one canonical NaN where the CPU keeps the operand's."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, what
    nan = np.isnan(a) if a.dtype.kind == "f" else np.zeros(a.shape, bool)
    if a.dtype.kind == "f":
        np.testing.assert_array_equal(nan, np.isnan(b), err_msg=f"{what}: NaN positions")
    u = f"u{a.itemsize}"
    np.testing.assert_array_equal(a[~nan].view(u), b[~nan].view(u), err_msg=what)


def run_dropout(xp, dtype, shape, in_place, fused, iters=2, ratio=0.3):
    """Two TRAIN iterations from a fixed key and counter; returns masks, tops, bottom
    diffs and the final state."""
    rng = np.random.default_rng(17)
    layer = make_layer(f'name: "d" type: "Dropout" dropout_param {{ dropout_ratio: {ratio} }}',
                       xp=xp, dtype=dtype, phase=caffe_pb2.TRAIN)
    bottom = Blob(shape, xp=xp, dtype=dtype)
    top = bottom if in_place else Blob(xp=xp, dtype=dtype)
    layer.setup([bottom], [top])
    assert layer._fused == fused
    layer.load_state_dict({"key": 0xD1B54A32D192ED03, "counter": 41})
    out = []
    for _ in range(iters):
        x = rng.standard_normal(shape)
        x.flat[1::9] *= -1e-30  # tiny negatives: dropped ones become -0.0
        if x.size > 8:
            x.flat[:3] = [np.inf, -np.inf, np.nan]  # inf * 0 and NaN, as the generic path makes them
        bottom.data[...] = xp.asarray(x, dtype=dtype)
        layer.forward([bottom], [top])
        out += [to_numpy(layer.internal("mask").data).copy(), to_numpy(top.data).copy()]
        top.diff[...] = xp.asarray(rng.standard_normal(shape), dtype=dtype)
        layer.backward([top], [True], [bottom])
        out.append(to_numpy(bottom.diff).copy())
    state = to_numpy(layer.rng_state)
    assert state[2] == 0, "the kernel's tickets are cleared after each launch"
    assert layer.state_dict() == {"key": 0xD1B54A32D192ED03, "counter": 41 + iters}
    return out


@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("shape", [(3, 5, 7, 11), (2, 3), (4, 1000)])  # 5, 1 and 16 blocks
def test_dropout_fused_is_bitwise_generic(backend, dtype, in_place, shape, monkeypatch):
    """Same masks (the counter-based draw), same y and dx bits, and the counter advanced
    once per forward by the kernel itself (the last block's ticket)."""
    calls = []
    fn = cuda_fused._fn
    monkeypatch.setattr(cuda_fused, "_fn", lambda k, dt: calls.append(k) or fn(k, dt))
    fused, generic = fused_and_generic(
        lambda f: run_dropout(backend.xp, dtype, shape, in_place, f))
    for i, (a, b) in enumerate(zip(fused, generic)):
        assert_same_bits(a, b, f"Dropout {shape} output {i}")
    assert calls == ["dropout_forward", "dropout_backward"] * 2


@with_backends
def test_dropout_fused_empty_bottom_still_draws(backend):
    """An empty bottom is one draw too (one block, nothing written): the counter
    stays in step with the CPU's."""
    xp = backend.xp
    layer = make_layer('name: "d" type: "Dropout"', xp=xp, dtype=F32, phase=caffe_pb2.TRAIN)
    bottom, top = Blob((0, 4), xp=xp, dtype=F32), Blob(xp=xp, dtype=F32)
    layer.setup([bottom], [top])
    assert layer._fused
    layer.load_state_dict({"key": 5, "counter": 0})
    layer.forward([bottom], [top])
    layer.backward([top], [True], [bottom])
    assert layer.state_dict() == {"key": 5, "counter": 1}
    assert int(to_numpy(layer.rng_state)[2]) == 0


# ---------------------------------------------------------------------- SGD
SGD_NET = """
name: "sgd"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 4 dim: 5 } shape { dim: 2 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 7 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "ip1" top: "ip1" }
layer { name: "sc" type: "Scale" bottom: "ip1" top: "ip1" scale_param { bias_term: true } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        param { lr_mult: 2 decay_mult: 0 } param { lr_mult: 0.5 decay_mult: 3 }
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def run_sgd(xp, dtype, fields, fused, iters=3):
    from minicaffe.solver import Solver
    p = caffe_pb2.SolverParameter()
    base = {"base_lr": "base_lr: 0.05", "momentum": "momentum: 0.9",
            "weight_decay": "weight_decay: 0.01", "max_iter": "max_iter: 100"}
    text = " ".join(v for k, v in base.items() if k + ":" not in fields) + " " + fields
    p.MergeFrom(parse_text(text, caffe_pb2.SolverParameter))
    p.net_param.CopyFrom(parse_text(SGD_NET, caffe_pb2.NetParameter))
    mode = "CPU" if xp is np else "GPU"
    ctx = contextlib.nullcontext() if fused else cuda_fused.disabled()
    with ctx:
        solver = Solver(p, mode=mode, dtype=dtype, verbose=False)
        rng = np.random.default_rng(13)
        params = solver.net.learnable_params
        for q, h in zip(params, solver.history):
            q.data[...] = xp.asarray(rng.standard_normal(q.shape), dtype=dtype)
            h[...] = xp.asarray(rng.standard_normal(h.shape) * 0.1, dtype=dtype)
        for _ in range(iters):
            for q in params:  # gradients as a backward pass would leave them
                q.diff[...] = xp.asarray(rng.standard_normal(q.shape), dtype=dtype)
            solver.apply_update()
            solver.iter += 1
        assert (solver.fused_sgd() is not None) == fused
        return ([to_numpy(q.data).copy() for q in params] + [to_numpy(q.diff).copy() for q in params]
                + [to_numpy(h).copy() for h in solver.history])


SGD_FIELDS = ["", 'regularization_type: "L1"', "iter_size: 2", 'lr_policy: "inv" gamma: 0.1 power: 0.75',
              "momentum: 0", "weight_decay: 0"]


@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("fields", SGD_FIELDS)
def test_fused_sgd_matches_generic_update(backend, dtype, fields):
    fused, generic = fused_and_generic(lambda f: run_sgd(backend.xp, dtype, fields, f))
    for i, (a, b) in enumerate(zip(fused, generic)):
        e = rel_err(a, b)
        assert e <= (1e-6 if dtype == F32 else 1e-14), f"array {i}: relative error {e:.3g}"


@with_backends
def test_fused_sgd_rebuilds_when_storage_moves(backend):
    """A parameter rebound to new storage (as a memory plan may do) rebuilds the tables."""
    from minicaffe.solver import Solver
    xp = backend.xp
    p = caffe_pb2.SolverParameter(base_lr=0.1, momentum=0.5, max_iter=10)
    p.net_param.CopyFrom(parse_text(SGD_NET, caffe_pb2.NetParameter))
    solver = Solver(p, mode="CPU" if xp is np else "GPU", verbose=False)
    first = solver.fused_sgd()
    assert first is not None and solver.fused_sgd() is first
    q = solver.net.learnable_params[0]
    q.data_storage.array = q.data_storage.array.copy()
    q._views.clear()
    second = solver.fused_sgd()
    assert second is not first and second.matches(solver.net.learnable_params, solver.history)


@with_backends
def test_fused_sgd_storage_key_is_the_views_pointers_and_sees_every_move(backend):
    """The tables' key reads the storages' arrays: it is the pointers of the data and diff
    views (where the tables point), and it changes when a storage is replaced, released,
    shared with another blob or grown by a reshape."""
    from minicaffe.solver import Solver
    xp = backend.xp
    p = caffe_pb2.SolverParameter(base_lr=0.1, momentum=0.5, max_iter=10)
    p.net_param.CopyFrom(parse_text(SGD_NET, caffe_pb2.NetParameter))
    solver = Solver(p, mode="CPU" if xp is np else "GPU", verbose=False)
    params, history = solver.net.learnable_params, solver.history
    ptr = cuda_fused._ptr
    key = cuda_fused.MultiTensorSGD.storage_key
    assert key(params, history)[0][1] is None       # a diff not allocated yet: no pointer
    views = tuple((ptr(q.data), ptr(q.diff), ptr(h), q.count)   # (allocates the diffs)
                  for q, h in zip(params, history))
    assert key(params, history) == views
    tables = solver.fused_sgd()
    assert tables is not None and tables.matches(params, history)
    q, other = params[0], params[1]
    moves = [
        lambda: setattr(q.diff_storage, "array", q.diff_storage.array.copy()),
        q.release_data,
        lambda: q.share_data(type(q)(q.shape, xp=xp, dtype=q.dtype, name="elsewhere")),
        lambda: other.reshape(other.count + 1),
        lambda: other.reshape(other.count - 1),             # the same arrays, fewer elements
        lambda: history.__setitem__(1, history[1].copy()),
    ]
    for move in moves:
        move()
        assert not tables.matches(params, history)
        assert not tables.matches(params, history)          # (no identity kept from a miss)
        tables = solver.fused_sgd()
        assert tables.matches(params, history) and tables.matches(params, history)
        assert tables.key == tuple((ptr(q.data), ptr(q.diff), ptr(h), q.count)
                                   for q, h in zip(params, history))
    # not moves: a reshape to the same shape (a new shape tuple) and a blob whose storage is
    # rebound to the very same array still match, through the addresses
    q.reshape(q.shape)
    other.data_storage.array = other.data_storage.array
    assert tables.matches(params, history) and solver.fused_sgd() is tables
    assert not tables.matches(params[:-1], history[:-1])    # fewer parameters


def test_fused_sgd_refused_for_other_rules(monkeypatch):
    """Nesterov and Adam keep the generic update even where the kernels would run."""
    from minicaffe.solver import Solver
    monkeypatch.setattr(cuda_fused, "enabled_for", lambda xp, dtype=None: True)
    for kind in ("Nesterov", "Adam"):
        p = caffe_pb2.SolverParameter(base_lr=0.1, momentum=0.9, type=kind, max_iter=1)
        p.net_param.CopyFrom(parse_text(SGD_NET, caffe_pb2.NetParameter))
        assert Solver(p, mode="CPU", verbose=False).fused_sgd() is None


# ------------------------------------------------------ dispatch (CPU only)
def test_module_imports_and_stays_off_without_a_gpu():
    assert "bn_stats_partial" in cuda_fused.source()
    assert not cuda_fused.enabled_for(np)
    assert not cuda_fused.enabled_for(np, np.float32)


def test_fast_path_not_taken_on_numpy():
    from minicaffe.solver import Solver
    layers = [make_layer('name: "bn" type: "BatchNorm"', phase=caffe_pb2.TRAIN),
              make_layer('name: "s" type: "Scale" scale_param { bias_term: true }'),
              make_layer('name: "r" type: "ReLU"'),
              make_layer('name: "e" type: "Eltwise"'),
              make_layer('name: "d" type: "Dropout"', phase=caffe_pb2.TRAIN)]
    for layer in layers:
        bottoms = [Blob((2, 3, 4, 4))] * (2 if layer.type == "Eltwise" else 1)
        layer.setup(bottoms, [Blob()])
        assert layer._fused is False, layer.type
    assert "fused_ws" not in layers[0].internals and "fused_ws" not in layers[1].internals
    p = caffe_pb2.SolverParameter(base_lr=0.1, momentum=0.9, max_iter=1)
    p.net_param.CopyFrom(parse_text(SGD_NET, caffe_pb2.NetParameter))
    assert Solver(p, mode="CPU", verbose=False).fused_sgd() is None


def test_enabled_for_conditions(monkeypatch):
    fake = object()  # stands for the cupy module
    monkeypatch.setattr(cuda_fused, "_cp", fake)
    monkeypatch.setattr(cuda_fused, "available", lambda: True)
    monkeypatch.setattr(cuda_fused, "compiles", lambda: True)
    assert cuda_fused.enabled_for(fake)
    assert cuda_fused.enabled_for(fake, np.float32) and cuda_fused.enabled_for(fake, np.float64)
    assert not cuda_fused.enabled_for(fake, np.float16)
    assert not cuda_fused.enabled_for(np)
    with cuda_fused.disabled():
        assert not cuda_fused.enabled_for(fake)
    assert cuda_fused.enabled_for(fake)
    monkeypatch.setattr(cuda_fused, "compiles", lambda: False)  # NVRTC failed: generic paths
    assert not cuda_fused.enabled_for(fake)
    monkeypatch.setattr(cuda_fused, "compiles", lambda: True)
    monkeypatch.setattr(cuda_fused, "available", lambda: False)  # no device answers
    assert not cuda_fused.enabled_for(fake)


def test_env_switch_is_read_at_import():
    code = ("import os; os.environ['MINICAFFE_FUSED'] = '0'; "
            "from minicaffe.kernels import cuda_fused as f; assert not f.enabled(); "
            "f.set_enabled(True); assert f.enabled()")
    subprocess.run([os.environ.get("PYTHON", sys.executable), "-c", code], check=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def test_layers_dispatch_only_where_supported(monkeypatch):
    """With the kernels 'available': Eltwise PROD/MAX and a Scale whose operand
    exceeds the grid keep the generic path; float16 would too."""
    monkeypatch.setattr(cuda_fused, "enabled_for",
                        lambda xp, dtype=None: dtype is None or np.dtype(dtype) in cuda_fused._CTYPE)
    for op, want in (("SUM", True), ("PROD", False), ("MAX", False)):
        layer = make_layer(f'name: "e" type: "Eltwise" eltwise_param {{ operation: {op} }}')
        layer.setup([Blob((2, 3)), Blob((2, 3))], [Blob()])
        assert layer._fused is want, op
    layer = make_layer('name: "s" type: "Scale" scale_param { axis: 0 num_axes: -1 }')
    layer.setup([Blob((300, 300))], [Blob()])  # 90000 operand elements > 65535
    assert layer._fused is False
    layer = make_layer('name: "s" type: "Scale"')
    layer.setup([Blob((2, 3, 4))], [Blob()])
    assert layer._fused and "fused_ws" in layer.internals
    assert not layer.internals["fused_ws"].saved


@pytest.mark.parametrize("m,c", [(1, 1), (7, 3), (1024, 2), (1025, 2), (200704, 64), (3136, 2048),
                                 (10 ** 7, 1), (5, 100000)])
def test_channel_chunks_cover_each_channel(m, c):
    p, length = cuda_fused.channel_chunks(m, c)
    assert p >= 1 and length >= 1
    assert p * length >= m and (p - 1) * length < m  # every element once, no empty block
    assert length % 4 == 0  # whole 16-byte units of float (and of double) per block
    assert cuda_fused.workspace_size(c, p) == c * (2 * p + 1)


# --------------------------------------------------------------- GPU only
@pytest.mark.gpu
def test_fused_layers_allocate_nothing_in_the_steady_state(cp):
    """After one warm-up iteration the fused forward/backward of BatchNorm, Scale,
    ReLU, Eltwise and the SGD update take no memory from CuPy's pool."""
    from cupy.cuda import memory_hook

    class Count(memory_hook.MemoryHook):
        name = "count"

        def __init__(self):
            self.n = 0

        def malloc_preprocess(self, **kw):
            self.n += 1

    shape = (4, 8, 6, 6)
    bn = make_layer('name: "bn" type: "BatchNorm"', xp=cp, dtype=F32, phase=caffe_pb2.TRAIN)
    sc = make_layer('name: "s" type: "Scale" scale_param { bias_term: true }', xp=cp, dtype=F32)
    relu = make_layer('name: "r" type: "ReLU"', xp=cp, dtype=F32)
    elt = make_layer('name: "e" type: "Eltwise"', xp=cp, dtype=F32)
    x, other, y = (Blob(shape, xp=cp, dtype=F32) for _ in range(3))
    bn.setup([x], [x])
    sc.setup([x], [x])
    relu.setup([x], [x])
    elt.setup([x, other], [y])

    def iteration():
        for layer, b, t in ((bn, [x], [x]), (sc, [x], [x]), (relu, [x], [x]), (elt, [x, other], [y])):
            layer.forward(b, t)
        for layer, b, t in ((elt, [x, other], [y]), (relu, [x], [x]), (sc, [x], [x]), (bn, [x], [x])):
            layer.backward(t, [True] * len(b), b)

    x.data[...] = cp.asarray(np.random.default_rng(0).standard_normal(shape), dtype=F32)
    y.diff[...] = 1.0
    iteration()
    hook = Count()
    with hook:
        iteration()
    cp.cuda.Device().synchronize()
    assert hook.n == 0


@pytest.mark.gpu
def test_fused_dropout_allocates_nothing(cp):
    """TRAIN Dropout's fused forward and backward take no memory from CuPy's pool: the
    counter is read and advanced on the device, no array is made on the host's side."""
    from cupy.cuda import memory_hook

    class Count(memory_hook.MemoryHook):
        name = "count"

        def __init__(self):
            self.n = 0

        def malloc_preprocess(self, **kw):
            self.n += 1

    layer = make_layer('name: "d" type: "Dropout"', xp=cp, dtype=F32, phase=caffe_pb2.TRAIN)
    x = Blob((4, 8, 6, 6), xp=cp, dtype=F32)
    layer.setup([x], [x])
    assert layer._fused
    x.data[...] = 1.0
    layer.forward([x], [x])  # the warm-up allocates the lazily made mask and diff
    layer.backward([x], [True], [x])
    hook = Count()
    with hook:
        for _ in range(3):
            layer.forward([x], [x])
            layer.backward([x], [True], [x])
    assert hook.n == 0
    assert layer.state_dict()["counter"] == 4


@pytest.mark.gpu
def test_fused_kernels_run_on_the_current_stream(cp):
    """A kernel queued behind a long one on a side stream sees that stream's order."""
    s = cp.cuda.Stream(non_blocking=True)
    layer = make_layer('name: "r" type: "ReLU"', xp=cp, dtype=F32)
    b, t = Blob((1 << 20,), xp=cp, dtype=F32), Blob(xp=cp, dtype=F32)
    layer.setup([b], [t])
    with s:
        b.data[...] = -1.0
        layer.forward([b], [t])
        b.data[...] = 2.0
        layer.forward([b], [t])
    s.synchronize()
    assert float(t.data.min()) == 2.0


# ---------------------------------------------- BatchNorm + Scale, paired in a net
def pair_net(bn_in_place=True, bias=True, scale_lr=1.0, bn_on_data=False, scale_in_place=True,
             scale_extra="", bn_extra="", shape=(3, 4, 6, 5)):
    """Input -> Convolution -> BatchNorm -> Scale -> ReLU -> InnerProduct -> EuclideanLoss."""
    n, c, h, w = shape
    conv = "" if bn_on_data else f'''
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param {{ num_output: {c + 1} kernel_size: 3 pad: 1 engine: CAFFE
    weight_filler {{ type: "gaussian" std: 0.3 }} bias_filler {{ type: "constant" value: 0.2 }} }} }}'''
    bn_bottom = "data" if bn_on_data else "conv"
    bn_top = bn_bottom if bn_in_place else "bn"
    s_top = bn_top if scale_in_place else "sc"
    lr = f"param {{ lr_mult: {scale_lr} }} " * (2 if bias else 1)
    return f'''name: "pair"
layer {{ name: "data" type: "Input" top: "data" top: "target"
  input_param {{ shape {{ dim: {n} dim: {c} dim: {h} dim: {w} }} shape {{ dim: {n} dim: 7 }} }} }}
{conv}
layer {{ name: "bn" type: "BatchNorm" bottom: "{bn_bottom}" top: "{bn_top}" {bn_extra} }}
layer {{ name: "scale" type: "Scale" bottom: "{bn_top}" top: "{s_top}" {lr}
  scale_param {{ bias_term: {str(bias).lower()} filler {{ type: "uniform" min: 0.5 max: 1.5 }}
    bias_filler {{ type: "uniform" min: -0.5 max: 0.5 }} {scale_extra} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "{s_top}" top: "{s_top}" }}
layer {{ name: "ip" type: "InnerProduct" bottom: "{s_top}" top: "ip"
  inner_product_param {{ num_output: 7 weight_filler {{ type: "gaussian" std: 0.2 }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }}
'''


def _build_pair_net(xp, text, dtype=F32, seed=0):
    from minicaffe.net import Net
    from minicaffe.rng import set_random_seed
    set_random_seed(seed)
    net = Net(parse_text(text, caffe_pb2.NetParameter), caffe_pb2.TRAIN,
              mode="GPU" if xp is not np else "CPU", dtype=dtype)
    rng = np.random.default_rng(seed + 1)
    for name in ("data", "target"):
        b = net.blobs[name]
        b.data[...] = xp.asarray(rng.standard_normal(b.shape) * 2 + 1, dtype=dtype)
    return net


def _state(net):
    out = {}
    for name, b in net.blobs.items():
        out[f"blob {name} data"] = to_numpy(b.data).copy()
        out[f"blob {name} diff"] = to_numpy(b.diff).copy()
    for li, layer in enumerate(net.layers):
        for pi, b in enumerate(layer.blobs):
            out[f"{net.layer_names[li]} param {pi} data"] = to_numpy(b.data).copy()
            out[f"{net.layer_names[li]} param {pi} diff"] = to_numpy(b.diff).copy()
    return out


def _run_pair(xp, text, paired, dtype=F32, iters=2, unpair="set_bn_scale_fusion"):
    """(net, each iteration's _state) after forward and backward; ``paired`` False: the
    net's ``unpair`` method turns that fusion off first."""
    net = _build_pair_net(xp, text, dtype)
    if not paired:
        getattr(net, unpair)(False)
    states = []
    for _ in range(iters):
        net.clear_param_diffs()
        net.forward_backward()
        states.append(_state(net))
    return net, states


PAIR_CASES = {
    "in place, bias": {},
    "bn not in place, no bias": {"bn_in_place": False, "bias": False},
    "scale frozen (lr_mult 0)": {"scale_lr": 0.0},
    "bn on the input (no bottom diff)": {"bn_on_data": True},
    "odd shape": {"shape": (2, 3, 33, 9)},
    "16-byte lanes": {"shape": (3, 4, 8, 6)},
}


@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("case", list(PAIR_CASES))
def test_bn_scale_pair_is_bitwise_the_two_layers(backend, dtype, case):
    """A paired BatchNorm+Scale leaves every blob (data and diff), parameter and
    statistic exactly as the two fused layers run one after the other."""
    text = pair_net(**PAIR_CASES[case])
    paired_net, paired = _run_pair(backend.xp, text, True, dtype)
    bn = paired_net.layer_index("bn")
    assert paired_net.bn_scale_pairs == [(bn, bn + 1)]
    assert "bottom_copy" not in paired_net.layers[bn + 1].internals  # one activation saved
    ref_net, ref = _run_pair(backend.xp, text, False, dtype)
    assert ref_net.bn_scale_pairs == [] and "bottom_copy" in ref_net.layers[bn + 1].internals
    for it, (a, b) in enumerate(zip(paired, ref)):
        assert a.keys() == b.keys()
        for key in a:
            if backend.kind == "emu":
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"iteration {it}: {key}")
            else:  # the convolution's cuBLAS/cuDNN calls may differ in the last bit
                np.testing.assert_allclose(a[key], b[key], rtol=TOL[dtype], atol=TOL[dtype],
                                           err_msg=f"iteration {it}: {key}")


@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("bn_in_place", [True, False])
def test_lanes_give_the_one_element_results(backend, dtype, bn_in_place, monkeypatch):
    """The channel kernels moving 16-byte units give what they give one element at a
    time: elementwise outputs to the bit for the same statistics, the per-block sums
    (added in another order, in double) to float rounding."""
    text = pair_net(bn_in_place=bn_in_place, shape=(3, 4, 8, 6))
    taken = []
    real_vec = cuda_fused._vec

    def vec(s, length, *arrays):
        v = real_vec(s, length, *arrays)
        taken.append(int(v))
        return v

    monkeypatch.setattr(cuda_fused, "_vec", vec)
    _, lanes = _run_pair(backend.xp, text, True, dtype)
    assert taken and all(taken), "the 16-byte path was not taken"
    monkeypatch.setitem(cuda_fused._state, "lanes", False)
    taken.clear()
    _, single = _run_pair(backend.xp, text, True, dtype)
    assert taken and not any(taken)
    for it, (a, b) in enumerate(zip(lanes, single)):
        for key in a:
            if key == "conv param 1 diff":
                # the sum of BatchNorm's dx over each channel: zero but for rounding, so
                # judged against the sum of |dx| it adds
                bound = TOL[dtype] * np.abs(a["blob conv diff"]).sum(axis=(0, 2, 3))
                assert np.all(np.abs(a[key] - b[key]) <= bound), f"iteration {it}: {key}"
                continue
            e = rel_err(a[key], b[key])
            assert e <= TOL[dtype], f"iteration {it}: {key}: relative error {e:.3g}"


@with_backends
def test_bn_scale_pair_partial_forward_unpairs(backend):
    """net.forward(end='bn') must show the BatchNorm's own output (normalized, not
    scaled): a pass that splits a pair unpairs the net, with the same results."""
    xp = backend.xp
    text = pair_net(bn_in_place=False)
    net = _build_pair_net(xp, text)
    assert net.bn_scale_pairs
    out = to_numpy(net.forward(end="bn")["bn"]).copy()
    assert net.bn_scale_pairs == []
    ref = _build_pair_net(xp, text)
    ref.set_bn_scale_fusion(False)
    np.testing.assert_array_equal(out, to_numpy(ref.forward(end="bn")["bn"]))
    # normalized: per-channel mean 0, not the Scale's bias
    assert np.abs(out.mean(axis=(0, 2, 3))).max() < 1e-5
    net.forward()
    net.backward()  # unpaired from now on, and still right
    ref.forward()
    ref.backward()
    np.testing.assert_array_equal(to_numpy(net.blobs["data"].diff),
                                  to_numpy(ref.blobs["data"].diff))


@with_backends
@pytest.mark.parametrize("what,kwargs", [
    ("scale not in place", {"scale_in_place": False}),
    ("global statistics", {"bn_extra": "batch_norm_param { use_global_stats: true }"}),
    ("scale along axis 0", {"scale_extra": "axis: 0 num_axes: 1", "bias": False}),
])
def test_bn_scale_not_paired(backend, what, kwargs):
    # (axis 0: a (N,) scale, N = 3 here, is never a per-channel one)
    net = _build_pair_net(backend.xp, pair_net(**kwargs))
    assert net.bn_scale_pairs == [], what


def test_bn_scale_not_paired_with_explicit_propagate_down(monkeypatch):
    text = pair_net().replace('layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" ',
                              'layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" '
                              'propagate_down: true ')
    assert "propagate_down: true" in text
    emu = _emulator()
    if emu is None:
        pytest.skip("no C++ compiler for the CPU emulator")
    monkeypatch.setattr(cuda_fused, "enabled_for", lambda xp, dtype=None: xp is np)
    monkeypatch.setattr(cuda_fused, "_fn", emu.fn)
    assert _build_pair_net(np, text).bn_scale_pairs == []
    assert _build_pair_net(np, pair_net()).bn_scale_pairs == [(2, 3)]


def test_bn_scale_pairs_off_on_the_cpu_and_by_environment(monkeypatch):
    """No pairs where the fused kernels do not run (plain NumPy), none with
    MINICAFFE_FUSE_BN_SCALE=0; a memory plan keeps the pairs whose BatchNorm is in place."""
    assert _build_pair_net(np, pair_net()).bn_scale_pairs == []
    monkeypatch.setattr(cuda_fused, "enabled_for", lambda xp, dtype=None: xp is np)
    monkeypatch.setenv("MINICAFFE_FUSE_BN_SCALE", "0")
    assert _build_pair_net(np, pair_net()).bn_scale_pairs == []
    monkeypatch.setenv("MINICAFFE_FUSE_BN_SCALE", "1")
    from swap.gmap import CAFFE, build_gmap
    net = _build_pair_net(np, pair_net())
    assert net.bn_scale_pairs == [(2, 3)]
    g = build_gmap(net)
    assert net.bn_scale_pairs == [(2, 3)] and "bottom_copy" not in net.layers[3].internals
    # Caffe keeps the Scale's copy of its input: the Caffe accounting counts it
    copy = g.find("caffe:scale/bottom_copy")
    assert copy.kind == CAFFE and copy.nbytes(g.k) == net.blobs["conv"].nbytes
    # a BatchNorm not in place: the pair's backward would write a diff that is not the
    # Scale's own, so a plan runs that pair unpaired
    net = _build_pair_net(np, pair_net(bn_in_place=False))
    assert net.bn_scale_pairs == [(2, 3)]
    build_gmap(net)
    assert net.bn_scale_pairs == [] and "bottom_copy" in net.layers[3].internals


def test_bn_scale_pair_gmap_runs_the_pairs_backward_in_the_scales_step(monkeypatch):
    """The paired Scale's backward step reads the BatchNorm's x_norm and std and holds its
    workspace; the BatchNorm's own backward step reads neither."""
    monkeypatch.setattr(cuda_fused, "enabled_for", lambda xp, dtype=None: xp is np)
    from swap.gmap import BACKWARD, build_gmap
    net = _build_pair_net(np, pair_net())
    g = build_gmap(net)

    def backward_step(name):
        li = net.layer_index(name)
        return next(s for s in g.steps if s.layer == li and s.phase == BACKWARD).index

    sc, bn = backward_step("scale"), backward_step("bn")
    assert bn == sc + 1
    for name in ("saved:bn/x_norm", "saved:bn/std"):
        assert g.find(name).uses[-1] == sc, name
    ws = g.find("scratch:bn/fused_ws")
    assert sc in ws.uses and bn not in ws.uses


@pytest.mark.parametrize("strategy", ["none", "naive", "dynamic"])
def test_bn_scale_pair_under_a_memory_plan_is_bitwise_the_two_layers(monkeypatch, strategy):
    """Under a plan (every feature map offloaded with naive, poisoned when released), the
    paired net computes exactly what the unplanned unpaired one does: the data diff, every
    parameter and its gradient, the statistics, the loss."""
    emu = _emulator()
    if emu is None:
        pytest.skip("no C++ compiler for the CPU emulator")
    monkeypatch.setattr(cuda_fused, "enabled_for", lambda xp, dtype=None: xp is np)
    monkeypatch.setattr(cuda_fused, "_fn", emu.fn)
    from swap.runtime import install

    def run(planned):
        net = _build_pair_net(np, pair_net())
        if planned:
            install(net, strategy, None, poison=True, lowering="chunked")
            assert net.bn_scale_pairs == [(2, 3)]
        else:
            net.set_bn_scale_fusion(False)
        out = []
        for _ in range(3):
            net.clear_param_diffs()
            loss = float(net.forward_backward())
            out.append({"loss": loss, "data diff": net.blobs["data"].diff.copy(),
                        **{f"{net.layer_names[li]} param {pi} {what}": getattr(b, what).copy()
                           for li, layer in enumerate(net.layers)
                           for pi, b in enumerate(layer.blobs) for what in ("data", "diff")}})
        return out

    for it, (a, b) in enumerate(zip(run(True), run(False))):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"iteration {it}: {key}")


# ------------------------------------------------------- Convolution + in-place ReLU
@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("slope", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 5, 7, 11), (2, 4, 8, 6), (1, 3, 1, 1)])
def test_bias_relu_is_bitwise_the_bias_then_the_relu(backend, dtype, slope, with_bias, shape):
    """One pass of bias and ReLU gives what the generic path's two give (the bias added,
    rounded once, then the ReLU), NaN included, in one element and 16-byte units."""
    xp = backend.xp
    rng = np.random.default_rng(5)
    n, c, h, w = shape
    y0 = rng.standard_normal(shape).astype(dtype)
    y0.flat[::7] = np.nan
    bias = rng.standard_normal(c).astype(dtype) if with_bias else None
    expect = y0 + bias.reshape(1, c, 1, 1) if with_bias else y0.copy()
    expect = np.where(expect > 0, expect, expect * dtype(slope)) if slope else (
        np.maximum(expect, 0))
    y = xp.asarray(y0)
    b = xp.asarray(bias) if with_bias else None
    cuda_fused.bias_relu_forward(y.reshape(n, c, h * w), b, slope,
                                 *cuda_fused.channel_chunks(n * h * w, c))
    np.testing.assert_array_equal(to_numpy(y), expect)


def conv_relu_net(relu_in_place=True, slope=0.0, bias=True, engine="CAFFE", shape=(3, 4, 9, 7),
                  num_output=5):
    """Input -> Convolution -> ReLU -> Convolution -> ReLU -> InnerProduct -> EuclideanLoss."""
    n, c, h, w = shape
    r1 = "conv1" if relu_in_place else "relu1"
    return f'''name: "conv_relu"
layer {{ name: "data" type: "Input" top: "data" top: "target"
  input_param {{ shape {{ dim: {n} dim: {c} dim: {h} dim: {w} }} shape {{ dim: {n} dim: 7 }} }} }}
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param {{ num_output: {num_output} kernel_size: 3 pad: 1 engine: {engine}
    bias_term: {str(bias).lower()}
    weight_filler {{ type: "gaussian" std: 0.3 }} bias_filler {{ type: "uniform" min: -0.5 max: 0.5 }} }} }}
layer {{ name: "relu1" type: "ReLU" bottom: "conv1" top: "{r1}" relu_param {{ negative_slope: {slope} }} }}
layer {{ name: "conv2" type: "Convolution" bottom: "{r1}" top: "conv2"
  convolution_param {{ num_output: 6 kernel_size: 3 engine: {engine}
    weight_filler {{ type: "gaussian" std: 0.3 }} bias_filler {{ type: "uniform" min: -0.5 max: 0.5 }} }} }}
layer {{ name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }}
layer {{ name: "ip" type: "InnerProduct" bottom: "conv2" top: "ip"
  inner_product_param {{ num_output: 7 weight_filler {{ type: "gaussian" std: 0.2 }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }}
'''


def _run_conv_relu(xp, text, paired, dtype=F32):
    return _run_pair(xp, text, paired, dtype, unpair="set_conv_relu_fusion")


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("kwargs", [{}, {"slope": 0.1}, {"bias": False}])
def test_conv_relu_pair_is_bitwise_the_two_layers(dtype, kwargs):
    """A Convolution paired with its in-place ReLU leaves every blob, diff and parameter as
    the two layers run apart (NumPy: the same operations in the same order)."""
    text = conv_relu_net(**kwargs)
    net, paired = _run_conv_relu(np, text, True, dtype)
    assert net.conv_relu_pairs == [(1, 2), (3, 4)]
    assert net.layers[1].fused_relu is net.layers[2] and net.layers[2].fused_into is net.layers[1]
    ref, apart = _run_conv_relu(np, text, False, dtype)
    assert ref.conv_relu_pairs == [] and ref.layers[1].fused_relu is None
    assert ref.layers[2].fused_into is None
    for it, (a, b) in enumerate(zip(paired, apart)):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"iteration {it}: {key}")


def test_conv_relu_not_paired():
    assert _build_pair_net(np, conv_relu_net(relu_in_place=False)).conv_relu_pairs == [(3, 4)]
    # a Deconvolution is not paired; nor is a ReLU after something else
    text = conv_relu_net().replace('name: "conv2" type: "Convolution"',
                                   'name: "conv2" type: "Deconvolution"')
    assert _build_pair_net(np, text).conv_relu_pairs == [(1, 2)]


def test_conv_relu_pairs_off_by_environment(monkeypatch):
    monkeypatch.setenv("MINICAFFE_FUSE_CONV_RELU", "0")
    assert _build_pair_net(np, conv_relu_net()).conv_relu_pairs == []
    monkeypatch.setenv("MINICAFFE_FUSE_CONV_RELU", "1")
    assert _build_pair_net(np, conv_relu_net()).conv_relu_pairs == [(1, 2), (3, 4)]


@pytest.mark.parametrize("how", ["end", "start", "debug_info", "after_forward",
                                 "before_forward"])
def test_conv_relu_forward_that_shows_the_conv_top_unpairs(how):
    """net.forward(end='conv1') shows the convolution's own top (negative values kept), as
    do a forward callback and debug_info after the convolution: such a forward unpairs the
    net (for good), with the two layers' results."""
    text = conv_relu_net()
    net = _build_pair_net(np, text)
    ref = _build_pair_net(np, text)
    ref.set_conv_relu_fusion(False)
    seen, ref_seen = [], []
    if how == "end":
        out = net.forward(end="conv1")["conv1"].copy()
        assert (out < 0).any() and net.conv_relu_pairs == []
        np.testing.assert_array_equal(out, ref.forward(end="conv1")["conv1"])
    elif how == "start":
        net.forward()
        ref.forward()
        net.forward(start="relu1")
        ref.forward(start="relu1")
        assert net.conv_relu_pairs == []
    elif how == "debug_info":
        net.debug_info = ref.debug_info = True
        net.forward()
        ref.forward()
        assert net.conv_relu_pairs == []
    else:
        for n, into in ((net, seen), (ref, ref_seen)):
            getattr(n, how)(lambda li, n=n, into=into: into.append(n.blobs["conv1"].data.copy())
                            if li == 1 else None)
        net.forward()
        ref.forward()
        assert net.conv_relu_pairs == [] and len(seen) == 1
        np.testing.assert_array_equal(seen[0], ref_seen[0])
        if how == "after_forward":
            assert (seen[0] < 0).any()
    net.backward()
    ref.backward()
    for key, v in _state(net).items():
        np.testing.assert_array_equal(v, _state(ref)[key], err_msg=key)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("kwargs", [{}, {"slope": 0.1}, {"bias": False},
                                    {"shape": (4, 3, 16, 16), "num_output": 8}])
def test_conv_relu_pair_on_cudnn_is_the_two_layers(dtype, kwargs, monkeypatch):
    """cuDNN's convolution with the bias and the ReLU in one pass (bias_relu_forward, not
    cuDNN's AddTensor and the ReLU's own pass) against the layers run apart on the GPU."""
    import cupy
    calls = []
    real = cuda_fused.bias_relu_forward
    monkeypatch.setattr(cuda_fused, "bias_relu_forward",
                        lambda *a: calls.append(a[0].shape) or real(*a))
    text = conv_relu_net(engine="CUDNN", **kwargs)
    net, paired = _run_conv_relu(cupy, text, True, dtype)
    assert net.conv_relu_pairs == [(1, 2), (3, 4)] and len(calls) == 4   # 2 pairs x 2 passes
    calls.clear()
    _, apart = _run_conv_relu(cupy, text, False, dtype)
    assert calls == []
    # the two nets search their cuDNN algorithms apart and may take different ones (GEMM,
    # FFT, Winograd): float32 results agree to their rounding, judged against each array's
    # largest value (session 37, H200: a weight diff of about 190 differed past 1e-5 of
    # each element)
    tol = {F32: 1e-4, F64: 1e-10}[dtype]
    for it, (a, b) in enumerate(zip(paired, apart)):
        for key in a:
            e = rel_err(a[key], b[key])
            assert e <= tol, f"iteration {it}: {key}: relative error {e:.3g}"


# ---------------------------------------------- the ReLU after a BatchNorm+Scale pair
@with_backends
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("slope", [0.0, 0.2])
def test_relu_after_a_pair_runs_in_the_pairs_pass(backend, dtype, slope, monkeypatch):
    """A ReLU in place on a paired Scale's top runs in the BatchNorm's forward pass; every
    blob, diff, parameter and statistic is bit for bit (GPU: to float rounding, as the
    pair's own test) what the ReLU run after the pair gives."""
    monkeypatch.setenv("MINICAFFE_FUSE_BN_RELU", "1")
    text = pair_net(shape=(3, 4, 8, 6)).replace(
        'type: "ReLU" bottom: "conv" top: "conv" }',
        f'type: "ReLU" bottom: "conv" top: "conv" relu_param {{ negative_slope: {slope} }} }}')
    linked_net, linked = _run_pair(backend.xp, text, True, dtype)
    bn = linked_net.layer_index("bn")
    assert linked_net.bn_relu_links == [(bn, bn + 2)]
    assert linked_net.layers[bn + 2].fused_into is linked_net.layers[bn]
    monkeypatch.setenv("MINICAFFE_FUSE_BN_RELU", "0")
    apart_net, apart = _run_pair(backend.xp, text, True, dtype)
    assert apart_net.bn_scale_pairs == [(bn, bn + 1)] and apart_net.bn_relu_links == []
    assert apart_net.layers[bn + 2].fused_into is None
    for it, (a, b) in enumerate(zip(linked, apart)):
        for key in a:
            if backend.kind == "emu":
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"iteration {it}: {key}")
            else:
                np.testing.assert_allclose(a[key], b[key], rtol=TOL[dtype], atol=TOL[dtype],
                                           err_msg=f"iteration {it}: {key}")


@with_backends
def test_a_forward_that_shows_the_scales_top_unlinks_the_relu(backend, monkeypatch):
    """net.forward(end='scale') shows the Scale's output before the ReLU: the ReLU is
    unlinked for good (the BatchNorm+Scale pair stays), with the layers' results."""
    monkeypatch.setenv("MINICAFFE_FUSE_BN_RELU", "1")
    xp = backend.xp
    text = pair_net()
    net = _build_pair_net(xp, text)
    bn = net.layer_index("bn")
    assert net.bn_relu_links == [(bn, bn + 2)]
    out = to_numpy(net.forward(end="scale")["conv"]).copy()
    assert (out < 0).any()
    assert net.bn_relu_links == [] and net.bn_scale_pairs == [(bn, bn + 1)]
    ref = _build_pair_net(xp, text)
    ref.set_bn_relu_fusion(False)
    np.testing.assert_array_equal(out, to_numpy(ref.forward(end="scale")["conv"]))
    net.forward()
    assert net.bn_relu_links == []


@with_backends
@pytest.mark.parametrize("how", ["debug_info", "after_forward"])
def test_a_forward_that_shows_every_top_unpairs_the_bn_scale_pairs(backend, how, monkeypatch):
    """debug_info and forward callbacks show each layer's top: the BatchNorm's must be its
    own (normalized, not scaled), so such a forward runs the pairs apart, for good."""
    monkeypatch.setenv("MINICAFFE_FUSE_BN_RELU", "1")
    xp = backend.xp
    text = pair_net(bn_in_place=False)
    net = _build_pair_net(xp, text)
    assert net.bn_scale_pairs and net.bn_relu_links
    seen = []
    if how == "debug_info":
        net.debug_info = True
    else:
        bn = net.layer_index("bn")
        net.after_forward(lambda li: seen.append(to_numpy(net.blobs["bn"].data).copy())
                          if li == bn else None)
    net.forward()
    assert net.bn_scale_pairs == [] and net.bn_relu_links == []
    if seen:        # normalized: per-channel mean 0, not the Scale's bias
        assert np.abs(seen[0].mean(axis=(0, 2, 3))).max() < 1e-5


@with_backends
@pytest.mark.parametrize("seed", range(4))
def test_any_sequence_of_passes_sees_the_bn_pairs_net_as_the_layers_apart(backend, seed,
                                                                          monkeypatch):
    """Whole and partial forward passes and backward passes, in a random order, leave every
    blob (data and diff) of a net with a BatchNorm+Scale pair and its ReLU as the net whose
    layers run apart leaves it (the emulator: bit for bit)."""
    monkeypatch.setenv("MINICAFFE_FUSE_BN_RELU", "1")
    xp = backend.xp
    rng = np.random.default_rng(seed)
    text = pair_net(bn_in_place=False)
    net, ref = _build_pair_net(xp, text), _build_pair_net(xp, text)
    ref.set_bn_scale_fusion(False)
    assert net.bn_scale_pairs and net.bn_relu_links and not ref.bn_scale_pairs
    names = net.layer_names
    for step in range(5):
        op = int(rng.integers(3))
        a, b = sorted(int(v) for v in rng.integers(len(names), size=2))
        for n in (net, ref):
            if op == 0:
                n.forward()
            elif op == 1:
                n.forward(start=names[a], end=names[b])
            else:
                n.forward()
                n.backward()
        for name, blob in ref.blobs.items():
            for what in ("data", "diff"):
                got, want = to_numpy(getattr(net.blobs[name], what)), to_numpy(getattr(blob, what))
                if backend.kind == "emu":
                    np.testing.assert_array_equal(got, want, err_msg=f"step {step}: {name} {what}")
                else:
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                                               err_msg=f"step {step}: {name} {what}")


def test_the_relu_joins_a_pair_only_when_asked(monkeypatch):
    """Off by default until its GPU run (MINICAFFE_FUSE_BN_RELU unset), on with it at 1."""
    emu = _emulator()
    if emu is None:
        pytest.skip("no C++ compiler for the CPU emulator")
    monkeypatch.setattr(cuda_fused, "enabled_for", lambda xp, dtype=None: xp is np)
    monkeypatch.setattr(cuda_fused, "_fn", emu.fn)
    monkeypatch.delenv("MINICAFFE_FUSE_BN_RELU", raising=False)
    net = _build_pair_net(np, pair_net())
    assert net.bn_scale_pairs == [(2, 3)] and net.bn_relu_links == []
    monkeypatch.setenv("MINICAFFE_FUSE_BN_RELU", "1")
    assert _build_pair_net(np, pair_net()).bn_relu_links == [(2, 4)]
