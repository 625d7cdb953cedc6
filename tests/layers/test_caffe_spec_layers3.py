"""Layers against BVLC Caffe's own unit tests, the files not yet ported elsewhere (part 2;
see test_caffe_spec_layers2.py for the conventions: seeded NumPy fills in place of Caffe's,
float64 gradient checks in place of its GradientChecker).

* ``test_mvn_layer.cpp``: TestForward, TestForwardMeanOnly, TestForwardAcrossChannels,
  TestGradient, TestGradientMeanOnly, TestGradientAcrossChannels.
* ``test_multinomial_logistic_loss_layer.cpp``: TestGradientCPU (and the forward it implies).
* ``test_slice_layer.cpp``: TestSetupNum, TestSetupChannels, TestTrivialSlice,
  TestSliceAcrossNum, TestSliceAcrossChannels, TestGradientTrivial, TestGradientAcrossNum,
  TestGradientAcrossChannels.
* ``test_softmax_layer.cpp``: TestForward, TestGradient.
* ``test_tanh_layer.cpp``: TestTanH, TestTanHOverflow, TestTanHGradient.
* ``test_threshold_layer.cpp``: TestSetup, Test, Test2.
* ``test_tile_layer.cpp``: TestTrivialSetup, TestSetup, TestForwardNum, TestForwardChannels,
  TestTrivialGradient, TestGradientNum, TestGradientChannels.
* ``test_reduction_layer.cpp``: TestSetUp, TestSetUpWithAxis1, TestSetUpWithAxis2, and for
  each of SUM, MEAN, ASUM and SUMSQ the forward and the gradient plain, with coeff 2.3, and
  with coeff 2.3 at axis 1 (TestSum ... TestSumOfSquaresCoeffAxis1Gradient, 24 tests).
* ``test_embed_layer.cpp``: TestForward, TestForwardWithBias, TestGradient,
  TestGradientWithBias (TestSetUp is in test_caffe_spec_vision.py).
* ``test_lrn_layer.cpp``: TestSetupAcrossChannels, TestSetupWithinChannel,
  TestGradientAcrossChannels, TestGradientAcrossChannelsLargeRegion,
  TestGradientWithinChannel (the forwards against the test's ReferenceLRNForward are in
  test_caffe_spec_vision.py).
"""
import math

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.testing import check_gradient
from test_caffe_spec_layers2 import f32, forward, gaussian, gradient, setup


# ---------------------------------------------------------------------------------- MVN
def mvn(body=""):
    return f'name: "mvn" type: "MVN" mvn_param {{ {body} }}'


@pytest.mark.parametrize("body, axes, unit_variance", [
    ("", (2, 3), True),                            # TestForward
    ("normalize_variance: false", (2, 3), False),  # TestForwardMeanOnly
    ("across_channels: true", (1, 2, 3), True),    # TestForwardAcrossChannels
], ids=["TestForward", "TestForwardMeanOnly", "TestForwardAcrossChannels"])
def test_mvn_forward(body, axes, unit_variance):
    """test_mvn_layer.cpp TestForward, TestForwardMeanOnly, TestForwardAcrossChannels: over
    each (n, c) (or each n across channels) the top has mean 0, and variance 1 unless
    ``normalize_variance: false``."""
    _, _, (top,) = forward(mvn(body), gaussian((2, 3, 4, 5)))
    np.testing.assert_allclose(top.data.mean(axis=axes), 0, atol=1e-3)
    if unit_variance:
        np.testing.assert_allclose((top.data ** 2).mean(axis=axes), 1, atol=1e-3)


@pytest.mark.parametrize("body", ["", "normalize_variance: false", "across_channels: true"],
                         ids=["TestGradient", "TestGradientMeanOnly",
                              "TestGradientAcrossChannels"])
def test_mvn_gradient(body):
    """test_mvn_layer.cpp TestGradient, TestGradientMeanOnly, TestGradientAcrossChannels
    (Caffe's backward treats the std as std + eps, eps 1e-9: exact to 1e-9 here)."""
    gradient(mvn(body), gaussian((2, 3, 4, 5), seed=1))


# -------------------------------------------------------------- MultinomialLogisticLoss
def multinomial_bottoms(seed=1701):
    """MultinomialLogisticLossLayerTest: (10, 5, 1, 1) from the PositiveUnitballFiller (each
    item's values uniform in [0, 1], scaled to sum to 1), labels in [0, 5)."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 1, (10, 5, 1, 1))
    p /= p.sum(axis=1, keepdims=True)
    return p, rng.integers(0, 5, (10, 1, 1, 1)).astype(np.float64)


def test_multinomial_logistic_loss_gradient_and_forward():
    """test_multinomial_logistic_loss_layer.cpp TestGradientCPU: bottom 0.  Caffe's checker
    skips |p| < 0.05, where its float step of 1e-2 would cross 0 and the log's clip at 1e-20;
    the step of 1e-6 here stays clear of both for every p.  The loss it differentiates:
    -sum_n log(p[n, l_n]) / N."""
    p, lab = multinomial_bottoms()
    assert p.min() > 1e-4
    text = 'name: "loss" type: "MultinomialLogisticLoss"'
    gradient(text, p, lab, check_bottom=[0])
    _, _, (top,) = forward(text, p, lab)
    want = -np.mean(np.log(p.reshape(10, 5)[np.arange(10), lab.reshape(10).astype(int)]))
    assert top.data == pytest.approx(want, rel=1e-12)


# -------------------------------------------------------------------------------- Slice
def slice_layer(body=""):
    return f'name: "slice" type: "Slice" slice_param {{ {body} }}'


def slice_bottom(seed=1701, shape=(6, 12, 2, 3)):
    """SliceLayerTest: (6, 12, 2, 3) Gaussian; ReduceBottomBlobSize: (4, 5, 2, 2)."""
    return gaussian(shape, seed)


@pytest.mark.parametrize("body, n_top, shapes", [
    ("axis: 0", 3, [(2, 12, 2, 3)] * 3),                     # TestSetupNum
    ("slice_point: 3", 2, [(6, 3, 2, 3), (6, 9, 2, 3)]),     # TestSetupChannels
], ids=["TestSetupNum", "TestSetupChannels"])
def test_slice_setup(body, n_top, shapes):
    """test_slice_layer.cpp TestSetupNum (three equal parts of the 6 items) and
    TestSetupChannels (channels 0..2 and 3..11)."""
    _, _, top = setup(slice_layer(body), slice_bottom(), n_top=n_top)
    assert [t.shape for t in top] == shapes


def test_slice_trivial():
    """test_slice_layer.cpp TestTrivialSlice: one top is the bottom."""
    x = slice_bottom()
    _, _, (top,) = forward(slice_layer(), x)
    assert top.shape == x.shape
    np.testing.assert_array_equal(top.data, x)


@pytest.mark.parametrize("body, n_top, axis, bounds", [
    ("axis: 0", 2, 0, [0, 3, 6]),                            # TestSliceAcrossNum
    ("slice_point: 2 slice_point: 8", 3, 1, [0, 2, 8, 12]),  # TestSliceAcrossChannels
], ids=["TestSliceAcrossNum", "TestSliceAcrossChannels"])
def test_slice_forward(body, n_top, axis, bounds):
    """test_slice_layer.cpp TestSliceAcrossNum and TestSliceAcrossChannels: top i is the
    bottom between the i-th and the next bound along the axis."""
    x = slice_bottom()
    _, _, top = forward(slice_layer(body), x, n_top=n_top)
    for t, lo, hi in zip(top, bounds, bounds[1:]):
        np.testing.assert_array_equal(t.data, np.take(x, range(lo, hi), axis=axis))


@pytest.mark.parametrize("body, n_top, shape", [
    ("", 1, (6, 12, 2, 3)),               # TestGradientTrivial
    ("axis: 0", 2, (4, 5, 2, 2)),         # TestGradientAcrossNum
    ("slice_point: 4", 2, (4, 5, 2, 2)),  # TestGradientAcrossChannels
], ids=["TestGradientTrivial", "TestGradientAcrossNum", "TestGradientAcrossChannels"])
def test_slice_gradient(body, n_top, shape):
    """test_slice_layer.cpp TestGradientTrivial, TestGradientAcrossNum,
    TestGradientAcrossChannels (the latter two on the reduced (4, 5, 2, 2) bottom)."""
    gradient(slice_layer(body), slice_bottom(3, shape), n_top=n_top)


@pytest.mark.parametrize("body, n_top, match", [
    ("", 5, r"number of top blobs \(5\) should evenly divide input slice axis \(12"),
    ("slice_point: 3", 3, r"1 slice_point\(s\) \[3\] need 2 tops, got 3"),
    ("slice_point: 5 slice_point: 3", 3, "must be strictly increasing"),
])
def test_slice_setup_checks(body, n_top, match):
    """slice_layer.cpp Reshape's CHECKs: as many slice points as tops less one (increasing:
    Caffe's CHECK_GT of each part's extent), or tops that divide the axis."""
    with pytest.raises(ValueError, match=rf"'slice'.*{match}"):
        setup(slice_layer(body), slice_bottom(), n_top=n_top)


# ------------------------------------------------------------------------------ Softmax
def test_softmax_forward():
    """test_softmax_layer.cpp TestForward: over the channels of each (n, h, w) the top sums
    to 1 and each value is exp(x) / sum exp(x), within 1e-4."""
    x = gaussian((2, 10, 2, 3))
    _, _, (top,) = forward('name: "softmax" type: "Softmax"', x)
    np.testing.assert_allclose(top.data.sum(axis=1), 1, atol=1e-3)
    e = np.exp(x)
    np.testing.assert_allclose(top.data, e / e.sum(axis=1, keepdims=True), atol=1e-4)


def test_softmax_gradient():
    """test_softmax_layer.cpp TestGradient."""
    gradient('name: "softmax" type: "Softmax"', gaussian((2, 10, 2, 3), seed=1))


# --------------------------------------------------------------------------------- TanH
def tanh_naive(x):
    """The test's tanh_naive: (e^2x - 1) / (e^2x + 1), +-1 beyond |x| > 40."""
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(2 * x)
        return np.where(x < -40, -1.0, np.where(x > 40, 1.0, (e - 1) / (e + 1)))


@pytest.mark.parametrize("std", [1.0, 10000.0], ids=["TestTanH", "TestTanHOverflow"])
def test_tanh_forward(std):
    """test_tanh_layer.cpp TestTanH and TestTanHOverflow: within max(1e-4 |y|, 1e-5) of the
    naive formula, also for a bottom of std 10000 (no overflow to NaN)."""
    x = gaussian((2, 3, 4, 5), seed=1701, std=std)
    _, _, (top,) = forward('name: "tanh" type: "TanH"', x)
    want = tanh_naive(x)
    assert np.all(np.abs(top.data - want) <= np.maximum(1e-4 * np.abs(want), 1e-5))


def test_tanh_gradient():
    """test_tanh_layer.cpp TestTanHGradient."""
    gradient('name: "tanh" type: "TanH"', gaussian((2, 3, 4, 5), seed=1702))


# ---------------------------------------------------------------------------- Threshold
def test_threshold_setup():
    """test_threshold_layer.cpp TestSetup: the top has the bottom's shape."""
    _, _, (top,) = setup('name: "thr" type: "Threshold"', gaussian((2, 3, 6, 5)))
    assert top.shape == (2, 3, 6, 5)


@pytest.mark.parametrize("body, threshold", [("", 0.0), ("threshold_param { threshold: 0.5 }",
                                                         0.5)], ids=["Test", "Test2"])
def test_threshold_forward(body, threshold):
    """test_threshold_layer.cpp Test (threshold 0, the default) and Test2 (0.5): the top is 1
    where the bottom exceeds the threshold, else 0."""
    x = gaussian((2, 3, 6, 5), seed=1701)
    layer, _, (top,) = forward(f'name: "thr" type: "Threshold" {body}', x)
    assert layer.param.threshold_param.threshold == threshold
    np.testing.assert_array_equal(top.data, (x > threshold).astype(float))
    assert 0 < top.data.mean() < 1


# --------------------------------------------------------------------------------- Tile
def tile(body):
    return f'name: "tile" type: "Tile" tile_param {{ {body} }}'


@pytest.mark.parametrize("tiles", [1, 3], ids=["TestTrivialSetup", "TestSetup"])
def test_tile_setup(tiles):
    """test_tile_layer.cpp TestTrivialSetup (tiles 1) and TestSetup (tiles 3): along each
    axis in turn, that axis multiplied by the tiles, the others kept."""
    x = gaussian((2, 3, 4, 5))
    for axis in range(4):
        _, _, (top,) = setup(tile(f"axis: {axis} tiles: {tiles}"), x)
        want = list(x.shape)
        want[axis] *= tiles
        assert top.shape == tuple(want)


@pytest.mark.parametrize("body, axis", [("axis: 0 tiles: 3", 0), ("tiles: 3", 1)],
                         ids=["TestForwardNum", "TestForwardChannels"])
def test_tile_forward(body, axis):
    """test_tile_layer.cpp TestForwardNum and TestForwardChannels (the default axis 1): top
    index i along the axis holds bottom index i % extent."""
    x = gaussian((2, 3, 4, 5), seed=1)
    _, _, (top,) = forward(tile(body), x)
    n = x.shape[axis]
    np.testing.assert_array_equal(top.data, np.take(x, np.arange(3 * n) % n, axis=axis))


@pytest.mark.parametrize("body", ["tiles: 1", "axis: 0 tiles: 3", "axis: 1 tiles: 3"],
                         ids=["TestTrivialGradient", "TestGradientNum", "TestGradientChannels"])
def test_tile_gradient(body):
    """test_tile_layer.cpp TestTrivialGradient, TestGradientNum, TestGradientChannels."""
    gradient(tile(body), gaussian((2, 3, 4, 5), seed=2))


def test_tile_needs_tiles():
    """tile_layer.cpp Reshape: ``CHECK(tile_param.has_tiles())`` and tiles > 0."""
    with pytest.raises(ValueError, match=r"'tile'.*number of tiles must be specified"):
        setup(tile("axis: 1"), np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"'tile'.*number of tiles must be positive"):
        setup(tile("tiles: 0"), np.zeros((2, 3)))


# ---------------------------------------------------------------------------- Reduction
def reduction_bottom(seed=1701):
    """ReductionLayerTest: (2, 3, 4, 5) uniform in [0, 1]."""
    return np.random.default_rng(seed).uniform(0, 1, (2, 3, 4, 5))


@pytest.mark.parametrize("body, shape", [("", ()), ("axis: 1", (2,)), ("axis: 2", (2, 3))],
                         ids=["TestSetUp", "TestSetUpWithAxis1", "TestSetUpWithAxis2"])
def test_reduction_setup(body, shape):
    """test_reduction_layer.cpp TestSetUp, TestSetUpWithAxis1, TestSetUpWithAxis2: the top
    keeps the axes before ``axis`` (default 0: a scalar)."""
    _, _, (top,) = setup(f'name: "red" type: "Reduction" reduction_param {{ {body} }}',
                         reduction_bottom())
    assert top.shape == shape


REDUCE = {"SUM": lambda v: v.sum(axis=1), "MEAN": lambda v: (v / v.shape[1]).sum(axis=1),
          "ASUM": lambda v: np.abs(v).sum(axis=1), "SUMSQ": lambda v: (v * v).sum(axis=1)}
CASES = [(1.0, 0), (2.3, 0), (2.3, 1)]   # plain, Coeff, CoeffAxis1


def reduction(op, coeff, axis):
    extra = (f"coeff: {coeff} " if coeff != 1.0 else "") + (f"axis: {axis}" if axis else "")
    return f'name: "red" type: "Reduction" reduction_param {{ operation: {op} {extra} }}'


@pytest.mark.parametrize("coeff, axis", CASES, ids=["plain", "Coeff", "CoeffAxis1"])
@pytest.mark.parametrize("op", sorted(REDUCE))
def test_reduction_forward(op, coeff, axis):
    """test_reduction_layer.cpp TestSum, TestSumCoeff, TestSumCoeffAxis1, TestMean...,
    TestAbsSum..., TestSumOfSquares...: per leading index, the op over the rest, times coeff
    (2.3 as the float field holds it)."""
    x = reduction_bottom()
    _, _, (top,) = forward(reduction(op, coeff, axis), x)
    rows = x.reshape(math.prod(x.shape[:axis]), -1)
    want = REDUCE[op](rows) * f32(coeff)
    np.testing.assert_allclose(top.data.reshape(-1), want, rtol=1e-12)


@pytest.mark.parametrize("coeff, axis", CASES, ids=["plain", "Coeff", "CoeffAxis1"])
@pytest.mark.parametrize("op", sorted(REDUCE))
def test_reduction_gradient(op, coeff, axis):
    """test_reduction_layer.cpp TestSumGradient ... TestSumOfSquaresCoeffAxis1Gradient (ASUM's
    kink at 0 is out of reach of a bottom in (0, 1))."""
    gradient(reduction(op, coeff, axis), reduction_bottom(7))


# -------------------------------------------------------------------------------- Embed
def embed(bias):
    fill = 'type: "uniform" min: -10 max: 10'
    bias_text = f"bias_term: true bias_filler {{ {fill} }}" if bias else "bias_term: false"
    return (f'name: "embed" type: "Embed" embed_param {{ num_output: 10 input_dim: 5 '
            f'weight_filler {{ {fill} }} {bias_text} }}')


@pytest.mark.parametrize("bias", [False, True], ids=["TestForward", "TestForwardWithBias"])
def test_embed_forward(bias):
    """test_embed_layer.cpp TestForward and TestForwardWithBias: weights (5, 10) (and a bias
    (10,)) from uniform [-10, 10] fillers; bottom (4, 1, 1, 1) of indices ``rand() % 5``; top
    [i, 0, 0, 0, :] = W[index i, :] (+ b)."""
    idx = np.random.default_rng(0).integers(0, 5, (4, 1, 1, 1)).astype(np.float64)
    layer, bottom, top = setup(embed(bias), idx)
    assert [b.shape for b in layer.blobs] == [(5, 10)] + [(10,)] * bias
    layer.forward(bottom, top)
    (top,) = top
    want = layer.blobs[0].data[idx.reshape(4).astype(int)]
    if bias:
        want = want + layer.blobs[1].data
    np.testing.assert_allclose(top.data.reshape(4, 10), want, rtol=1e-12)
    assert top.shape == (4, 1, 1, 1, 10)


@pytest.mark.parametrize("bias", [False, True], ids=["TestGradient", "TestGradientWithBias"])
def test_embed_gradient(bias):
    """test_embed_layer.cpp TestGradient and TestGradientWithBias: indices 4, 2, 2, 3, the
    params only (checker's -2; the indices get none); row 2 gets two diffs."""
    gradient(embed(bias), np.array([4, 2, 2, 3], float).reshape(4, 1, 1, 1), check_bottom=[])


# ---------------------------------------------------------------------------------- LRN
def lrn(body=""):
    return f'name: "lrn" type: "LRN" lrn_param {{ {body} }}'


def lrn_bottom(seed=1701):
    """LRNLayerTest: (2, 7, 3, 3) Gaussian."""
    return gaussian((2, 7, 3, 3), seed)


@pytest.mark.parametrize("body", ["", "norm_region: WITHIN_CHANNEL local_size: 3"],
                         ids=["TestSetupAcrossChannels", "TestSetupWithinChannel"])
def test_lrn_setup(body):
    """test_lrn_layer.cpp TestSetupAcrossChannels and TestSetupWithinChannel."""
    _, _, (top,) = setup(lrn(body), lrn_bottom())
    assert top.shape == (2, 7, 3, 3)


@pytest.mark.parametrize("body", ["", "local_size: 15",
                                  "norm_region: WITHIN_CHANNEL local_size: 3"],
                         ids=["TestGradientAcrossChannels",
                              "TestGradientAcrossChannelsLargeRegion",
                              "TestGradientWithinChannel"])
def test_lrn_gradient(body):
    """test_lrn_layer.cpp TestGradientAcrossChannels, TestGradientAcrossChannelsLargeRegion
    (a window of 15 over 7 channels), TestGradientWithinChannel.  Caffe's tests run a
    backward with top diffs of 1 first; the checker then sets its own."""
    layer, bottom, top = setup(lrn(body), lrn_bottom(1))
    layer.forward(bottom, top)
    top[0].diff[...] = 1
    layer.backward(top, [True], bottom)
    check_gradient(layer, bottom, top, setup=False)
