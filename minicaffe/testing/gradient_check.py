"""Numerical gradient checking, as Caffe's ``test_gradient_check_util.hpp``.

The objective is a random projection of the tops, ``f = sum_i <w_i, top_i>``
(Chainer's habit; Caffe uses ``sum(top^2)/2``): with top diffs set to ``w_i``,
backward must produce ``df/dbottom`` and accumulate ``df/dparam``.  Each
element is checked against a central difference in float64.
"""
from __future__ import annotations

import numpy as np

from ..blob import Blob
from ..rng import set_random_seed


def make_layer(text: str, xp=np, dtype=np.float64, phase=None):
    """Build a layer from a LayerParameter in prototxt text (no setup yet)."""
    from ..layer import create_layer
    from ..proto import caffe_pb2, parse_text
    param = parse_text(text, caffe_pb2.LayerParameter, filename="<test layer>")
    if phase is not None:
        param.phase = phase
    return create_layer(param, xp=xp, dtype=dtype)


def make_blob(values, xp=np, dtype=np.float64, name: str = "") -> Blob:
    values = np.asarray(values)
    b = Blob(values.shape, xp=xp, dtype=dtype, name=name)
    b.data[...] = xp.asarray(values, dtype=dtype)
    return b


def _objective(layer, bottom, top, weights, seed):
    set_random_seed(seed)  # random layers (Dropout) draw the same mask each call
    layer.forward(bottom, top)
    return float(sum(float((t.data * w).sum()) for t, w in zip(top, weights)))


def numerical_gradients(layer, bottom, top, weights, targets, eps, seed):
    """Central differences of the projected objective w.r.t. each target blob."""
    grads = []
    for blob in targets:
        g = np.zeros(blob.shape, dtype=np.float64)
        flat = blob.data.reshape(-1)
        gflat = g.reshape(-1)
        for i in range(flat.size):
            x0 = float(flat[i])
            flat[i] = x0 + eps
            fp = _objective(layer, bottom, top, weights, seed)
            flat[i] = x0 - eps
            fm = _objective(layer, bottom, top, weights, seed)
            flat[i] = x0
            gflat[i] = (fp - fm) / (2 * eps)
        grads.append(g)
    return grads


def check_gradient(layer, bottom: list[Blob], top: list[Blob] | None = None,
                   check_bottom=None, check_params=None, eps: float = 1e-6,
                   rtol: float = 1e-5, atol: float = 1e-7, seed: int = 1701,
                   setup: bool = True):
    """Compare analytic and numerical gradients; raise AssertionError on mismatch.

    Args:
        layer: a layer built with float64 blobs.
        bottom: input blobs (their data is the point of evaluation).
        top: output blobs; created when None.
        check_bottom: indices of bottoms to check (default: all that the layer
            allows a gradient for).
        check_params: indices of ``layer.blobs`` to check (default: those with
            ``param_propagate_down``).
    Returns the top blobs.
    """
    from ..backend import to_numpy
    xp = layer.xp
    if top is None:
        n_top = next((n for n in (layer.exact_num_top, layer.min_num_top) if n is not None), 1)
        top = [Blob(xp=xp, dtype=layer.dtype, name=f"top{i}") for i in range(n_top)]
    if setup:
        layer.setup(bottom, top)
    if check_bottom is None:
        check_bottom = [i for i in range(len(bottom)) if layer.allow_force_backward(i)]
    if check_params is None:
        check_params = [i for i, p in enumerate(layer.param_propagate_down) if p]
    set_random_seed(seed)
    layer.forward(bottom, top)
    rng = np.random.default_rng(seed)
    weights = [xp.asarray(rng.standard_normal(t.shape), dtype=layer.dtype) for t in top]

    # analytic
    for p in layer.blobs:
        p.diff[...] = 0
    _objective(layer, bottom, top, weights, seed)
    for t, w in zip(top, weights):
        t.diff[...] = w
    propagate = [i in check_bottom for i in range(len(bottom))]
    saved_ppd = list(layer.param_propagate_down)
    layer.param_propagate_down = [i in check_params for i in range(len(layer.blobs))]
    layer.backward(top, propagate, bottom)
    layer.param_propagate_down = saved_ppd
    analytic = [to_numpy(bottom[i].diff).copy() for i in check_bottom]
    analytic += [to_numpy(layer.blobs[i].diff).copy() for i in check_params]

    targets = [bottom[i] for i in check_bottom] + [layer.blobs[i] for i in check_params]
    names = [f"bottom[{i}]" for i in check_bottom] + [f"param[{i}]" for i in check_params]
    numeric = numerical_gradients(layer, bottom, top, weights, targets, eps, seed)
    for name, a, n in zip(names, analytic, numeric):
        err = np.abs(a - n)
        tol = atol + rtol * np.maximum(np.abs(a), np.abs(n))
        bad = ~(err <= tol)  # NaN fails
        if bad.any():
            idx = np.unravel_index(int(np.argmax(err - tol)), a.shape)
            raise AssertionError(
                f"layer {layer.name!r} ({layer.type}): gradient of {name} wrong at {idx}: "
                f"analytic {a[idx]:.8g}, numerical {n[idx]:.8g} "
                f"({int(bad.sum())} of {a.size} elements off)")
    return top
