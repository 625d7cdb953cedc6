"""The cases of partly ported BVLC Caffe layer test files that no other spec test covers
(conventions as in test_caffe_spec_layers2.py: seeded NumPy fills, float64 gradient checks).

* ``test_reshape_layer.cpp``: TestFlattenOutputSizes, TestFlattenValues, TestCopyDimensions,
  TestInferenceOfUnspecified, TestInferenceOfUnspecifiedWithStartAxis,
  TestInsertSingletonAxesStart, TestInsertSingletonAxesMiddle, TestInsertSingletonAxesEnd,
  TestFlattenMiddle, TestForward, TestGradient (TestForwardAfterReshape is in
  test_caffe_spec_shape.py).
* ``test_split_layer.cpp``: SplitLayerTest TestSetup, Test, TestGradient (the
  SplitLayerInsertionTest cases are in tests/test_caffe_spec_net.py).
* ``test_softmax_with_loss_layer.cpp``: TestGradient (``loss_weight: 3``),
  TestGradientIgnoreLabel, TestGradientUnnormalized (TestForwardIgnoreLabel is in
  test_caffe_spec_layers.py).
* ``test_pooling_layer.cpp``: TestSetupGlobalPooling, TestGradientMax,
  TestGradientMaxTopMask, TestGradientAve, TestGradientAvePadded (the setups and forwards
  are in test_caffe_spec_layers.py).
"""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.testing import check_gradient, make_layer
from test_caffe_spec_layers2 import blobs, gaussian, setup, tops


# ------------------------------------------------------------------------------ Reshape
def reshape(dims, extra=""):
    shape = " ".join(f"dim: {d}" for d in dims)
    return f'name: "reshape" type: "Reshape" reshape_param {{ shape {{ {shape} }} {extra} }}'


@pytest.mark.parametrize("dims, extra, shape", [
    ((0, -1, 1, 1), "", (2, 90, 1, 1)),                    # TestFlattenOutputSizes
    ((0, 0, 0, 0), "", (2, 3, 6, 5)),                      # TestCopyDimensions
    ((0, 3, 10, -1), "", (2, 3, 10, 3)),                   # TestInferenceOfUnspecified
    ((3, 10, -1), "axis: 1", (2, 3, 10, 3)),               # ...WithStartAxis
    ((1, 1, 1), "axis: 0 num_axes: 0", (1, 1, 1, 2, 3, 6, 5)),   # TestInsertSingletonAxesStart
    ((1, 1, 1), "axis: 2 num_axes: 0", (2, 3, 1, 1, 1, 6, 5)),   # ...Middle
    ((1, 1, 1), "axis: -1 num_axes: 0", (2, 3, 6, 5, 1, 1, 1)),  # ...End
    ((-1,), "axis: 1 num_axes: 2", (2, 18, 5)),            # TestFlattenMiddle
], ids=["TestFlattenOutputSizes", "TestCopyDimensions", "TestInferenceOfUnspecified",
        "TestInferenceOfUnspecifiedWithStartAxis", "TestInsertSingletonAxesStart",
        "TestInsertSingletonAxesMiddle", "TestInsertSingletonAxesEnd", "TestFlattenMiddle"])
def test_reshape_setup(dims, extra, shape):
    """test_reshape_layer.cpp's setup tests on a (2, 3, 6, 5) bottom: 0 copies the bottom's
    dimension, -1 is inferred from the count, ``axis``/``num_axes`` choose the axes replaced
    (``num_axes: 0`` inserts, ``axis: -1`` after the last)."""
    _, _, (top,) = setup(reshape(dims, extra), gaussian((2, 3, 6, 5)))
    assert top.shape == shape


@pytest.mark.parametrize("dims", [(0, -1, 1, 1), (6, 2, 3, 5)],
                         ids=["TestFlattenValues", "TestForward"])
def test_reshape_forward(dims):
    """test_reshape_layer.cpp TestFlattenValues and TestForward: the values in memory order,
    unchanged (top[n, c] = bottom[n, c / 30, (c / 5) % 6, c % 5] for the flattening)."""
    x = gaussian((2, 3, 6, 5), seed=1)
    layer, bottom, top = setup(reshape(dims), x)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data.reshape(-1), x.reshape(-1))
    if dims[1] == -1:
        c = np.arange(90)
        np.testing.assert_array_equal(top[0].data[1, :, 0, 0], x[1, c // 30, (c // 5) % 6, c % 5])


def test_reshape_gradient():
    """test_reshape_layer.cpp TestGradient: to (6, 2, 3, 5)."""
    check_gradient(make_layer(reshape((6, 2, 3, 5))), blobs(gaussian((2, 3, 6, 5), seed=2)),
                   tops(1))


@pytest.mark.parametrize("dims, extra, match", [
    ((-1, -1), "", "contains multiple -1 dims"),
    ((0, 0, 0, 0, 0), "", "new shape contains a 0 at position 4, but there is no corresponding"),
    ((7, -1), "", r"bottom count \(180.*must be divisible by the product of the specified "
                  r"dimensions \(7\)"),
    ((2, 2), "", "output count 4 .* must match input count 180"),
    ((1,), "axis: 5", "axis 5 out of range"),
    ((1,), "axis: 3 num_axes: 2", "end axis = axis \\+ num_axes = 5 is out of range"),
])
def test_reshape_checks(dims, extra, match):
    """reshape_layer.cpp's CHECKs: one -1 at most, a 0 only where the bottom has an axis to
    copy, a count the specified dimensions divide, the top's count the bottom's, an axis and
    an end axis in range."""
    with pytest.raises(ValueError, match=rf"'reshape'.*{match}"):
        setup(reshape(dims, extra), np.zeros((2, 3, 6, 5)))


# -------------------------------------------------------------------------------- Split
def test_split_setup_and_forward():
    """test_split_layer.cpp SplitLayerTest TestSetup and Test: two tops of the bottom's shape
    (2, 3, 6, 5), each equal to it."""
    x = gaussian((2, 3, 6, 5))
    layer, bottom, top = setup('name: "split" type: "Split"', x, n_top=2)
    assert [t.shape for t in top] == [(2, 3, 6, 5)] * 2
    layer.forward(bottom, top)
    for t in top:
        np.testing.assert_array_equal(t.data, x)


def test_split_gradient():
    """test_split_layer.cpp SplitLayerTest TestGradient: the bottom's diff is the sum of the
    two tops' diffs."""
    check_gradient(make_layer('name: "split" type: "Split"'), blobs(gaussian((2, 3, 6, 5), 1)),
                   tops(2))


def test_split_refuses_in_place():
    """split_layer.cpp Reshape: no top may be the bottom."""
    layer = make_layer('name: "split" type: "Split"')
    (b,) = blobs(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"'split'.*does not allow in-place computation"):
        layer.setup([b], [b, tops(1)[0]])


# ---------------------------------------------------------------------- SoftmaxWithLoss
def softmax_loss_bottoms(seed=1701):
    """SoftmaxWithLossLayerTest: scores (10, 5, 2, 3) Gaussian of std 10, labels
    (10, 1, 2, 3) in [0, 5)."""
    rng = np.random.default_rng(seed)
    return (10 * rng.standard_normal((10, 5, 2, 3)),
            rng.integers(0, 5, (10, 1, 2, 3)).astype(np.float64))


@pytest.mark.parametrize("body", ["loss_weight: 3", "loss_param { ignore_label: 0 }",
                                  "loss_param { normalize: false }"],
                         ids=["TestGradient", "TestGradientIgnoreLabel",
                              "TestGradientUnnormalized"])
def test_softmax_loss_gradient(body):
    """test_softmax_with_loss_layer.cpp TestGradient (``loss_weight: 3``: the diff SetUp
    seeds scales the gradient), TestGradientIgnoreLabel (a fifth of the positions ignored)
    and TestGradientUnnormalized (summed, not averaged): bottom 0."""
    x, lab = softmax_loss_bottoms()
    text = f'name: "loss" type: "SoftmaxWithLoss" {body}'
    check_gradient(make_layer(text), blobs(x, lab), tops(1), check_bottom=[0])
    if "loss_weight" in body:
        layer, bottom, top = setup(text, x, lab)
        loss = float(layer.forward(bottom, top))
        assert loss == pytest.approx(3 * float(top[0].data), rel=1e-12)
        layer.backward(top, [True, False], bottom)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        p[np.arange(10)[:, None, None], lab[:, 0].astype(int),
          np.arange(2)[None, :, None], np.arange(3)[None, None, :]] -= 1
        np.testing.assert_allclose(bottom[0].diff, 3 * p / 60, rtol=1e-9, atol=1e-15)


# ------------------------------------------------------------------------------ Pooling
def pooling(body):
    return f'name: "pool" type: "Pooling" pooling_param {{ {body} }}'


def pooling_bottom(seed=1701):
    """PoolingLayerTest: (2, 3, 6, 5) Gaussian."""
    return gaussian((2, 3, 6, 5), seed)


def test_pooling_setup_global():
    """test_pooling_layer.cpp TestSetupGlobalPooling: AVE over the whole image, 1 x 1."""
    _, _, (top,) = setup(pooling("global_pooling: true pool: AVE"), pooling_bottom())
    assert top.shape == (2, 3, 1, 1)


KERNELS = [(kh, kw) for kh in (3, 4) for kw in (3, 4)]


@pytest.mark.parametrize("pool, extra, n_top", [
    ("MAX", "pad: 1", 1),       # TestGradientMax
    ("MAX", "", 2),             # TestGradientMaxTopMask
    ("AVE", "", 1),             # TestGradientAve
    ("AVE", "pad: 2", 1),       # TestGradientAvePadded
], ids=["TestGradientMax", "TestGradientMaxTopMask", "TestGradientAve",
        "TestGradientAvePadded"])
def test_pooling_gradient(pool, extra, n_top):
    """test_pooling_layer.cpp TestGradientMax (pad 1), TestGradientMaxTopMask (the index top
    as well: it has no gradient), TestGradientAve, TestGradientAvePadded (pad 2), each for
    kernels 3 and 4 high and wide, stride 2."""
    for kh, kw in KERNELS:
        layer = make_layer(pooling(f"kernel_h: {kh} kernel_w: {kw} stride: 2 pool: {pool} "
                                   f"{extra}"))
        check_gradient(layer, blobs(pooling_bottom(kh * 10 + kw)), tops(n_top))
