"""Shape and broadcast layers against what BVLC Caffe's own unit tests assert, where
minicaffe's other tests do not already.

* ``src/caffe/test/test_scale_layer.cpp``: TestForwardEltwiseInPlace / TestBackwardEltwiseInPlace
  and TestForwardBroadcastMiddleInPlace / TestBackwardBroadcastMiddleInPlace (the scale as a
  second bottom, of bottom[0]'s full shape or (3, 4) at axis 1: in place gives the
  out-of-place top, bottom diff and scale diff); TestForwardEltwiseWithParam (``axis: 0
  num_axes: -1``: a learned scale of bottom[0]'s whole shape).
* ``src/caffe/test/test_bias_layer.cpp``: the same in-place cases for Bias, and
  TestForwardEltwiseWithParam.
* ``src/caffe/test/test_reshape_layer.cpp``: TestForwardAfterReshape (the bottom reshaped to
  one axis of 180 and the layer reshaped: the top keeps its (6, 2, 3, 5) and the data).
* ``src/caffe/test/test_spp_layer.cpp``: TestSetup, TestEqualOutputDims and
  TestEqualOutputDims2 (C * (4^h - 1) / 3 outputs per item, for a 1024 x 765 input too).
"""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.blob import Blob
from minicaffe.testing import make_blob, make_layer

SHAPE = (2, 3, 4, 5)   # ScaleLayerTest's and BiasLayerTest's bottom


def run_forward_backward(text, xs, dy, in_place):
    """Forward and backward with every gradient; (top, bottom diffs, param diffs)."""
    layer = make_layer(text)
    bottom = [make_blob(x, name=f"b{i}") for i, x in enumerate(xs)]
    top = [bottom[0] if in_place else Blob(dtype=np.float64, name="top")]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    y = top[0].data.copy()
    top[0].diff[...] = dy
    layer.backward(top, [True] * len(bottom), bottom)
    return y, [b.diff.copy() for b in bottom], [p.diff.copy() for p in layer.blobs]


@pytest.mark.parametrize("kind", ["Scale", "Bias"])
@pytest.mark.parametrize("axis,operand_shape", [(0, SHAPE), (1, (3, 4))])
def test_second_bottom_in_place_matches_out_of_place(kind, axis, operand_shape, rng):
    """Test{Forward,Backward}{Eltwise,BroadcastMiddle}InPlace: the operand as bottom[1]."""
    field = "scale_param" if kind == "Scale" else "bias_param"
    text = f'name: "s" type: "{kind}" {field} {{ axis: {axis} }}'
    x = rng.standard_normal(SHAPE)
    operand = rng.uniform(0.5, 1.5, operand_shape)
    dy = rng.standard_normal(SHAPE)
    y, diffs, _ = run_forward_backward(text, [x, operand], dy, in_place=False)
    yi, diffs_i, _ = run_forward_backward(text, [x, operand], dy, in_place=True)
    view = operand.reshape((1,) * axis + operand_shape + (1,) * (4 - axis - len(operand_shape)))
    np.testing.assert_allclose(y, x * view if kind == "Scale" else x + view, rtol=1e-15)
    np.testing.assert_array_equal(yi, y)
    np.testing.assert_allclose(diffs_i[0], diffs[0], rtol=1e-14)
    np.testing.assert_allclose(diffs_i[1], diffs[1], rtol=1e-12)
    # the operand's gradient: dy (times x for Scale) summed over the broadcast axes
    summed = tuple(i for i in range(4) if i < axis or i >= axis + len(operand_shape))
    want = (dy * x if kind == "Scale" else dy).sum(axis=summed)
    np.testing.assert_allclose(diffs[1], want, rtol=1e-12)


@pytest.mark.parametrize("kind", ["Scale", "Bias"])
def test_eltwise_with_param(kind, rng):
    """TestForwardEltwiseWithParam: axis 0, num_axes -1 learns an operand of bottom[0]'s
    whole shape, applied element by element."""
    field = "scale_param" if kind == "Scale" else "bias_param"
    layer = make_layer(f'name: "s" type: "{kind}" {field} {{ axis: 0 num_axes: -1 }}')
    x = rng.standard_normal(SHAPE)
    bottom, top = [make_blob(x, name="x")], [Blob(dtype=np.float64, name="y")]
    layer.setup(bottom, top)
    assert [p.shape for p in layer.blobs] == [SHAPE]
    w = rng.standard_normal(SHAPE)
    layer.blobs[0].data[...] = w
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, x * w if kind == "Scale" else x + w)


def test_reshape_forward_after_the_bottom_is_reshaped(rng):
    """TestForwardAfterReshape: dims (6, 2, 3, 5) from a (2, 3, 6, 5) bottom, then the bottom
    becomes (180,) with new data: after Reshape the top is (6, 2, 3, 5) holding that data."""
    layer = make_layer('name: "r" type: "Reshape" '
                       'reshape_param { shape { dim: 6 dim: 2 dim: 3 dim: 5 } }')
    bottom = [make_blob(rng.standard_normal((2, 3, 6, 5)), name="x")]
    top = [Blob(dtype=np.float64, name="y")]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    bottom[0].reshape((180,))
    layer.reshape(bottom, top)
    bottom[0].data[...] = rng.standard_normal(180)
    layer.forward(bottom, top)
    assert top[0].shape == (6, 2, 3, 5)
    np.testing.assert_array_equal(top[0].data.reshape(-1), bottom[0].data)


@pytest.mark.parametrize("shape,height,expected", [
    ((2, 3, 9, 8), 3, (2, 63)),          # TestSetup: 3 * (1 + 4 + 16)
    ((4, 3, 1024, 765), 5, (4, 1023)),   # TestEqualOutputDims: 3 * 341
    ((10, 3, 7, 7), 3, (10, 63)),        # TestEqualOutputDims2
])
def test_spp_output_dims(shape, height, expected):
    """Caffe's tests read num(), channels() == C * (4^h - 1) / 3, height() == width() == 1;
    Caffe's top is the 2-axis Concat of the flattened levels, whose legacy height and width
    are 1."""
    layer = make_layer(f'name: "spp" type: "SPP" spp_param {{ pyramid_height: {height} }}',
                       dtype=np.float32)
    bottom = [Blob(shape, dtype=np.float32, name="x")]
    top = [Blob(dtype=np.float32, name="y")]
    layer.setup(bottom, top)
    assert top[0].shape == expected
