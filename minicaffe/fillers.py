"""Weight fillers (Caffe's ``filler.hpp``), drawn on the host for determinism.

Values are drawn with the host generator of :mod:`minicaffe.rng` and copied to
the blob's array module, so CPU and GPU nets built with one seed start equal.
"""
from __future__ import annotations

import numpy as np

from .rng import host_rng

FAN_IN, FAN_OUT, AVERAGE = 0, 1, 2
KNOWN_FILLERS = ("constant", "uniform", "gaussian", "xavier", "msra", "positive_unitball",
                 "bilinear")


# elements drawn at a time (32 MiB of float64): the generator's stream is sequential, so the
# values are those of one draw of the whole blob, without a float64 array of its size beside
# it (VGG-16's fc6: 103 M weights, 822 MB, then 411 MB more in the blob's type)
FILL_CHUNK = 1 << 22


def _draw_into(blob, draw) -> bool:
    """``blob.data`` = ``draw(n)`` over its elements in order, :data:`FILL_CHUNK` at a time;
    False (nothing written) where the data is not one contiguous run."""
    data = blob.data
    if not data.flags.c_contiguous:
        return False
    flat = data.reshape(-1)
    n = flat.size
    for a in range(0, n, FILL_CHUNK):
        b = min(n, a + FILL_CHUNK)
        flat[a:b] = blob.xp.asarray(draw(b - a), dtype=blob.dtype)
    return True


def _fans(shape):
    count = int(np.prod(shape)) if shape else 1
    fan_in = count // shape[0] if len(shape) > 0 and shape[0] else count
    fan_out = count // shape[1] if len(shape) > 1 and shape[1] else count
    return fan_in, fan_out


def _norm_n(filler, shape):
    fan_in, fan_out = _fans(shape)
    vn = filler.variance_norm
    if vn == AVERAGE:
        return (fan_in + fan_out) / 2.0
    if vn == FAN_OUT:
        return float(fan_out)
    return float(fan_in)


def _check_like_caffe(blob, filler, kind, where):
    """The CHECKs that abort Caffe's fillers before any value is drawn (filler.hpp, and the
    caffe_rng_* calls of math_functions.cpp that they make), as ValueErrors that name the blob."""
    shape = tuple(blob.shape)
    count = int(np.prod(shape)) if shape else 1
    what = f"{kind} filler on blob {blob.name!r} of shape {shape}"
    if count == 0 and kind != "bilinear":
        # filler.hpp: CHECK(blob->count()) in the constant, uniform, gaussian, xavier and msra
        # fillers; positive_unitball CHECK(dim) (dim = count / shape(0)); bilinear has no check
        raise ValueError(f"{where}{what}: the blob is empty (Caffe CHECKs count > 0)")
    if not shape and (kind in ("xavier", "msra", "positive_unitball")
                      or (kind == "gaussian" and filler.sparse >= 0)):
        # filler.hpp reads blob->shape(0) (fan_in, rows, num_outputs): a CHECK on a 0-d blob
        raise ValueError(f"{where}{what}: needs a blob of at least one axis (Caffe reads "
                         "shape(0))")
    if kind == "uniform" and not filler.min <= filler.max:
        # filler.hpp: caffe_rng_uniform(count, min, max), which CHECK_LE(a, b)
        raise ValueError(f"{where}{what}: min = {filler.min} is more than max = {filler.max}")
    if kind == "gaussian" and not filler.std > 0:
        # filler.hpp: caffe_rng_gaussian(count, mean, std), which CHECK_GT(sigma, 0)
        raise ValueError(f"{where}{what}: std = {filler.std} must be positive")


def fill(blob, filler, where: str = ""):
    """Fill ``blob.data`` according to a FillerParameter message."""
    shape = blob.shape
    rng = host_rng()
    kind = filler.type
    if kind not in KNOWN_FILLERS:
        raise ValueError(
            f"{where}unknown filler type {kind!r} (known: {', '.join(KNOWN_FILLERS)})")
    if filler.sparse < -1 or (filler.sparse != -1 and kind != "gaussian"):
        # Caffe: only the gaussian filler supports sparsity (CHECK_EQ(sparse, -1) elsewhere).
        raise ValueError(
            f"{where}filler {kind!r}: sparse = {filler.sparse} is not supported "
            "(only the gaussian filler takes sparse >= 0; -1 means dense)")
    _check_like_caffe(blob, filler, kind, where)
    if kind == "constant":
        # Caffe: caffe_set(count, Dtype(value), data).  In place: FCN-8s's fc6 holds 103 M
        # weights, and a float64 array of them beside the blob was 822 MB (and, on a GPU,
        # a copy to the device)
        blob.data[...] = np.dtype(blob.dtype).type(filler.value)
        return blob
    dense = None            # a draw of independent values: (generator method, its parameters)
    if kind == "uniform":
        dense = (rng.uniform, filler.min, filler.max)
    elif kind == "gaussian" and filler.sparse < 0:
        dense = (rng.normal, filler.mean, filler.std)
    elif kind == "xavier":
        scale = np.sqrt(3.0 / _norm_n(filler, shape))
        dense = (rng.uniform, -scale, scale)
    elif kind == "msra":
        dense = (rng.normal, 0.0, np.sqrt(2.0 / _norm_n(filler, shape)))
    if dense is not None:
        method, a, b = dense
        if _draw_into(blob, lambda n: method(a, b, size=n)):
            return blob
        values = method(a, b, size=shape)
    elif kind == "gaussian":        # sparse: Caffe's mask is drawn after all the values
        values = rng.normal(filler.mean, filler.std, size=shape)
        if filler.sparse >= 0:
            # Caffe: keep each weight with probability sparse / num_outputs (= shape[0]).
            if len(shape) < 1:
                raise ValueError(f"{where}sparse gaussian filler needs a blob of >= 1 axis")
            p = filler.sparse / float(shape[0])
            if p > 1:
                # filler.hpp: caffe_rng_bernoulli(count, sparse / num_outputs, mask), which
                # CHECK_LE(p, 1) (math_functions.cpp)
                raise ValueError(
                    f"{where}sparse gaussian filler: sparse = {filler.sparse} is more than the "
                    f"{shape[0]} outputs (shape[0]) of blob {blob.name!r}; Caffe keeps each "
                    "weight with probability sparse / shape[0], which must be <= 1")
            values *= rng.random(size=shape) < p
    elif kind == "positive_unitball":
        values = rng.uniform(0.0, 1.0, size=shape)
        n = shape[0] if shape else 1
        values = values.reshape(n, -1)
        values /= values.sum(axis=1, keepdims=True)
        values = values.reshape(shape)
    elif kind == "bilinear":
        if len(shape) != 4 or shape[2] != shape[3]:
            raise ValueError(
                f"{where}bilinear filler needs a 4-d blob with square kernels, got {shape}")
        k = shape[3]
        f = np.ceil(k / 2.0)
        # Caffe's BilinearFiller: c = (k - 1) / (2f), the kernel's centre over f (the form
        # test_filler.cpp's BilinearFillerTest checks for k = 6 and 7; the older
        # (2f - 1 - f % 2) / (2f) puts the centre off by half a pixel for k = 2, 3, 6, 7, ...).
        c = (k - 1) / (2.0 * f)
        x = np.arange(k)
        w1 = 1 - np.abs(x / f - c)
        values = np.broadcast_to(np.outer(w1, w1), shape).copy()
    blob.data[...] = blob.xp.asarray(values, dtype=blob.dtype)
    return blob
