"""Random number generators, seeded like Caffe's ``random_seed``.

Caffe keeps one process-wide RNG that ``Caffe::set_random_seed`` reseeds; the
solver seeds it from ``SolverParameter.random_seed`` before building nets, so a
run with a fixed seed is reproducible.  We do the same with a NumPy Generator
(fillers, data shuffling, crops and mirrors are drawn on the host, so a CPU and
a GPU run with the same seed get the same weights and the same batches) and a
CuPy generator for per-element device randomness (stochastic pooling).

Dropout draws from neither: its masks come from a counter-based generator
(:func:`stream_uint32`), a pure function of a 64-bit key, a draw counter and
the element index, which NumPy and the CUDA kernel of
:mod:`minicaffe.kernels.cuda_fused` compute alike, so CPU and GPU masks are
the same bits.  The key is drawn from the host generator (:func:`stream_key`),
so it follows the process seed; the counter is a number in device memory that
the kernel itself advances, so a CUDA graph replays fresh masks.
"""
from __future__ import annotations

import numpy as np

_state = {"seed": None, "host": np.random.default_rng(), "device": None, "generation": 0}


def set_random_seed(seed: int | None):
    """Reseed both generators; ``None`` or a negative seed means nondeterministic.

    Counter-based streams keyed before this call take a new key from the
    reseeded host generator at their next draw (see :func:`generation`).
    """
    if seed is not None and seed < 0:
        seed = None
    _state["seed"] = seed
    _state["host"] = np.random.default_rng(seed)
    _state["device"] = None
    _state["generation"] += 1


def host_rng() -> np.random.Generator:
    return _state["host"]


def rng_for(xp):
    """A generator that makes arrays of module ``xp`` (numpy or cupy)."""
    if xp is np:
        return _state["host"]
    if _state["device"] is None:
        seed = _state["seed"]
        if seed is None:
            seed = int(_state["host"].integers(0, 2**31 - 1))
        _state["device"] = xp.random.default_rng(seed)
    return _state["device"]


def current_seed():
    return _state["seed"]


def generation() -> int:
    """How many times :func:`set_random_seed` has run in this process.  A layer
    that keyed its stream under an older generation re-keys before its next
    draw, so that ``set_random_seed(s)`` restarts every stream as it restarts
    the host generator (the gradient checker relies on it: the same mask on
    each evaluation)."""
    return _state["generation"]


# --------------------------------------------------- counter-based streams
# splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
# generators", OOPSLA 2014; as in Java's SplittableRandom and Vigna's
# splitmix64.c, whose finalizer is Stafford's variant 13): the n-th output of
# the generator seeded with s is mix64(s + n * GOLDEN) mod 2**64.
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
_G, _M1, _M2 = np.uint64(GOLDEN), np.uint64(MIX1), np.uint64(MIX2)
_ONE, _S27, _S30, _S31, _S32 = (np.uint64(v) for v in (1, 27, 30, 31, 32))


def stream_key() -> int:
    """A new 64-bit stream key, drawn from the host generator: fixed by the
    process seed and the order of draws, different for every caller, and
    nondeterministic when the seed is None."""
    return int(host_rng().integers(0, 2**64, dtype=np.uint64))


def _mix64(z):
    """splitmix64's finalizer on a uint64 array, in place (wraps mod 2**64)."""
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def stream_uint32(key, counter, start: int, stop: int, xp=np):
    """Draw ``counter`` of stream ``key``, elements ``[start, stop)``: (stop - start,) uint32.

    Element i of draw c of the stream with key k is

        base    = mix64(k + GOLDEN * (c + 1))            # splitmix64 seeded with k, output c + 1
        rand(i) = mix64(base + GOLDEN * (i + 1)) >> 32   # seeded with base, output i + 1

    where mix64 is splitmix64's finalizer (z ^= z >> 30; z *= MIX1; z ^= z >> 27;
    z *= MIX2; z ^= z >> 31), all mod 2**64.  The CUDA kernel ``dropout_forward``
    computes the same bits.  ``key`` and ``counter`` are ints or uint64 arrays of
    module ``xp`` with one element (read where they live: a device counter is
    not copied to the host).
    """
    k = xp.asarray(key, dtype=np.uint64).reshape(1)
    c = xp.asarray(counter, dtype=np.uint64).reshape(1)
    base = _mix64(k + (c + _ONE) * _G)  # array first: CuPy's operator runs
    z = xp.arange(start + 1, stop + 1, dtype=np.uint64)
    z *= _G
    z += base
    return (_mix64(z) >> _S32).astype(np.uint32)


def caffe_uint_threshold(ratio: float, dtype) -> int:
    """Caffe's ``uint_thres_ = static_cast<unsigned int>(UINT_MAX * threshold_)`` with
    ``threshold_`` of the net's type: in float32, UINT_MAX converts to 2**32 and
    the product is rounded to float32; in float64, UINT_MAX is exact and the
    product is rounded to double; the cast truncates.  An element is kept when
    its unsigned draw is strictly greater."""
    if np.dtype(dtype) == np.float32:
        product = np.float32(4294967295.0) * np.float32(ratio)
    else:
        product = np.float64(4294967295.0) * np.float64(ratio)
    return int(product)
