"""Eltwise: SUM with coefficients, PROD (stable and not), MAX with Caffe's ties; errors."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer

SHAPE = (2, 3, 2, 2)


def elt_text(params):
    return f'name: "elt" type: "Eltwise" eltwise_param {{ {params} }}'


def setup(text, values, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(v, xp=xp, dtype=dtype, name=f"in{i}") for i, v in enumerate(values)]
    top = [Blob(xp=xp, dtype=dtype, name="out")]
    layer.setup(bottom, top)
    return layer, bottom, top


def run(layer, bottom, top, dy):
    layer.forward(bottom, top)
    top[0].diff[...] = layer.xp.asarray(dy, dtype=layer.dtype)
    layer.backward(top, [True] * len(bottom), bottom)
    return [to_numpy(top[0].data).copy()] + [to_numpy(b.diff).copy() for b in bottom]


def distinct_inputs(rng, n, shape=SHAPE):
    """n arrays of distinct magnitudes >= 0.1 and random signs: no MAX ties within a finite
    difference, no zero to divide by in the unstable PROD gradient."""
    size = n * int(np.prod(shape))
    mags = (rng.permutation(size) + 2) * 0.05
    vals = mags * rng.choice([-1.0, 1.0], size=size)
    return list(vals.reshape((n,) + shape))


@pytest.mark.parametrize("params,n", [
    ("operation: SUM", 2), ("operation: SUM", 3), ("operation: SUM coeff: 1 coeff: -2", 2),
    ("operation: SUM coeff: 1 coeff: -2 coeff: 0.5", 3), ("operation: PROD", 2),
    ("operation: PROD", 3), ("operation: PROD stable_prod_grad: false", 2),
    ("operation: PROD stable_prod_grad: false", 3), ("operation: MAX", 2), ("operation: MAX", 3)])
def test_gradient(params, n, rng):
    xs = distinct_inputs(rng, n)
    layer = make_layer(elt_text(params))
    check_gradient(layer, [make_blob(x) for x in xs])


def test_forward_values(rng):
    a, b, c = (rng.standard_normal(SHAPE) for _ in range(3))
    layer, bottom, top = setup(elt_text("operation: SUM coeff: 2 coeff: -1 coeff: 0.5"), [a, b, c])
    dy = rng.standard_normal(SHAPE)
    y, da, db, dc = run(layer, bottom, top, dy)
    np.testing.assert_allclose(y, 2 * a - b + 0.5 * c)
    np.testing.assert_allclose(da, 2 * dy)
    np.testing.assert_allclose(db, -dy)
    np.testing.assert_allclose(dc, 0.5 * dy)
    for stable in ("true", "false"):
        layer, bottom, top = setup(elt_text(f"operation: PROD stable_prod_grad: {stable}"),
                                   [a, b, c])
        y, da, db, dc = run(layer, bottom, top, dy)
        np.testing.assert_allclose(y, a * b * c)
        np.testing.assert_allclose(da, dy * b * c)
        np.testing.assert_allclose(dc, dy * a * b)


def test_sum_is_default():
    layer, bottom, top = setup(elt_text(""), [np.ones(3), np.full(3, 2.0)])
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[0].data), [3, 3, 3])


def test_max_ties_follow_caffe():
    # Caffe: bottom 1 wins a tie against bottom 0 (it tests a > b); a later
    # bottom must be strictly greater to win.
    a = np.array([1.0, 2.0, 5.0, 0.0])
    b = np.array([1.0, 3.0, 5.0, 0.0])
    c = np.array([1.0, 3.0, 4.0, 0.5])
    layer, bottom, top = setup(elt_text("operation: MAX"), [a, b, c])
    y, da, db, dc = run(layer, bottom, top, np.array([10.0, 20.0, 30.0, 40.0]))
    np.testing.assert_array_equal(y, [1, 3, 5, 0.5])
    np.testing.assert_array_equal(to_numpy(layer.internal("mask").data), [1, 1, 1, 2])
    np.testing.assert_array_equal(da, [0, 0, 0, 0])
    np.testing.assert_array_equal(db, [10, 20, 30, 0])
    np.testing.assert_array_equal(dc, [0, 0, 0, 40])


def test_backward_reads():
    x = [np.ones(SHAPE)] * 3
    assert setup(elt_text("operation: SUM"), x)[0].backward_reads() == BackwardReads()
    layer = setup(elt_text("operation: MAX"), x)[0]
    assert layer.backward_reads() == BackwardReads(internals=("mask",))
    assert layer.internals["mask"].saved and layer.internal("mask").dtype == np.int32
    layer = setup(elt_text("operation: PROD"), x)[0]
    assert layer.backward_reads() == BackwardReads(bottom=(0, 1, 2))
    layer = setup(elt_text("operation: PROD stable_prod_grad: false"), x)[0]
    assert layer.backward_reads() == BackwardReads(bottom=(0, 1, 2), top=(0,))


@pytest.mark.parametrize("params,values,match", [
    ("operation: SUM", [np.ones((2, 3)), np.ones((3, 2))],
     r"bottom 'in0' has shape \(2, 3\), bottom 'in1' has shape \(3, 2\)"),
    ("operation: SUM coeff: 1", [np.ones(2), np.ones(2)], "one coefficient per bottom"),
    ("operation: PROD coeff: 1 coeff: 2", [np.ones(2), np.ones(2)], "only takes coefficients"),
])
def test_errors(params, values, match):
    with pytest.raises(ValueError, match=match):
        setup(elt_text(params), values)


def test_needs_two_bottoms():
    with pytest.raises(ValueError, match="at least 2"):
        setup(elt_text("operation: SUM"), [np.ones(2)])


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("params", ["operation: SUM coeff: 1 coeff: -2 coeff: 0.5",
                                    "operation: PROD", "operation: PROD stable_prod_grad: false",
                                    "operation: MAX"])
def test_gpu_matches_cpu(cp, params):
    rng = np.random.default_rng(3)
    xs = [x.astype(np.float32) for x in distinct_inputs(rng, 3, (4, 8, 5, 5))]
    dy = rng.standard_normal((4, 8, 5, 5)).astype(np.float32)
    outs = [run(*setup(elt_text(params), xs, xp=xp, dtype=np.float32), dy) for xp in (np, cp)]
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5
