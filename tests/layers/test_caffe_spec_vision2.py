"""The cases of BVLC Caffe's vision layer tests that test_caffe_spec_vision.py does not port,
mostly their gradient checks (conventions as in test_caffe_spec_layers2.py: seeded NumPy
fills, float64 gradient checks of the bottoms and every param blob).

* ``test_convolution_layer.cpp``: Test1x1Convolution, TestGradient, TestDilatedGradient,
  Test1x1Gradient, TestGradientGroup.
* ``test_deconvolution_layer.cpp``: TestGradient, TestGradient3D.
* ``test_im2col_layer.cpp``: TestGradient, TestDilatedGradient, TestGradientForceND,
  TestDilatedGradientForceND, TestRectGradient.
* ``test_spp_layer.cpp``: TestForwardBackward, TestGradient.
* ``test_stochastic_pooling.cpp``: TestSetup (the CPU one: no pool method given, MAX),
  TestGradient.
* ``test_inner_product_layer.cpp``: TestSetUp, TestForward, TestGradient,
  TestGradientTranspose.
"""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.proto import caffe_pb2
from minicaffe.testing import check_gradient, make_layer
from test_caffe_spec_layers2 import blobs, forward, gaussian, setup, tops
from test_caffe_spec_vision import caffe_conv

GAUSS = 'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" }'


def conv(body, kind="Convolution"):
    return f'name: "conv" type: "{kind}" convolution_param {{ {body} }}'


def conv_bottoms(n=1, shape=(2, 3, 6, 4), seed=0):
    """ConvolutionLayerTest's bottoms: (2, 3, 6, 4) Gaussian, one or two."""
    return [gaussian(shape, seed + i) for i in range(n)]


def gradient_check(text, arrays, n_top=1, **kw):
    """Caffe's CheckGradientExhaustive on a fresh layer: every bottom and every param."""
    layer = make_layer(text, **kw)
    check_gradient(layer, blobs(*arrays), tops(n_top))
    return layer


# -------------------------------------------------------------------------- Convolution
def test_conv_1x1_against_the_reference():
    """test_convolution_layer.cpp Test1x1Convolution: kernel 1, stride 1, 4 outputs (Gaussian
    weights, bias 0.1) against the test's caffe_conv."""
    (x,) = conv_bottoms()
    layer, _, (top,) = forward(conv('kernel_size: 1 stride: 1 num_output: 4 '
                                    'weight_filler { type: "gaussian" } '
                                    'bias_filler { type: "constant" value: 0.1 }'), x)
    want = caffe_conv(x, layer.blobs[0].data, layer.blobs[1].data, (1, 1), (0, 0), (1, 1), 1)
    np.testing.assert_allclose(top.data, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("body, n, shape", [
    ("kernel_size: 3 stride: 2 num_output: 2", 2, (2, 3, 6, 4)),            # TestGradient
    ("kernel_size: 3 dilation: 2 num_output: 2", 1, (2, 3, 5, 6)),          # TestDilatedGradient
    ("kernel_size: 1 stride: 1 num_output: 2", 2, (2, 3, 6, 4)),            # Test1x1Gradient
    ("kernel_size: 3 stride: 2 num_output: 3 group: 3", 1, (2, 3, 6, 4)),   # TestGradientGroup
], ids=["TestGradient", "TestDilatedGradient", "Test1x1Gradient", "TestGradientGroup"])
def test_conv_gradient(body, n, shape):
    """test_convolution_layer.cpp TestGradient (two bottoms, two tops, one set of weights),
    TestDilatedGradient ((2, 3, 5, 6), dilation 2), Test1x1Gradient, TestGradientGroup."""
    gradient_check(conv(f"{body} {GAUSS}"), conv_bottoms(n, shape, seed=1), n_top=n)


# ------------------------------------------------------------------------ Deconvolution
@pytest.mark.parametrize("body, n, shape", [
    ("kernel_size: 2 stride: 1 num_output: 1", 2, (2, 3, 6, 4)),           # TestGradient
    ("kernel_size: 2 stride: 2 pad: 1 num_output: 2", 1, (2, 3, 2, 3, 2)),  # TestGradient3D
], ids=["TestGradient", "TestGradient3D"])
def test_deconv_gradient(body, n, shape):
    """test_deconvolution_layer.cpp TestGradient (two bottoms and tops, kernel 2, stride 1,
    one output) and TestGradient3D ((2, 3, 2, 3, 2), kernel 2, stride 2, pad 1)."""
    gradient_check(conv(f"{body} {GAUSS}", kind="Deconvolution"), conv_bottoms(n, shape, seed=2),
                   n_top=n)


# ------------------------------------------------------------------------------- Im2col
@pytest.mark.parametrize("body, shape", [
    ("kernel_size: 3 stride: 2", (2, 3, 6, 5)),                                  # TestGradient
    ("kernel_size: 3 stride: 2 dilation: 3", (2, 3, 10, 9)),             # TestDilatedGradient
    ("kernel_size: 3 stride: 2 force_nd_im2col: true", (2, 3, 6, 5)),    # TestGradientForceND
    ("kernel_size: 3 stride: 2 dilation: 3 force_nd_im2col: true", (2, 3, 10, 9)),
    ("kernel_h: 5 kernel_w: 3 stride: 2", (2, 3, 6, 5)),                     # TestRectGradient
], ids=["TestGradient", "TestDilatedGradient", "TestGradientForceND",
        "TestDilatedGradientForceND", "TestRectGradient"])
def test_im2col_gradient(body, shape):
    """test_im2col_layer.cpp TestGradient, TestDilatedGradient, TestGradientForceND,
    TestDilatedGradientForceND, TestRectGradient: col2im is im2col's gradient."""
    gradient_check(conv(body, kind="Im2col"), [gaussian(shape, 1701)])


# ---------------------------------------------------------------------------------- SPP
SPP = 'name: "spp" type: "SPP" spp_param { pyramid_height: 3 }'


def test_spp_forward_backward():
    """test_spp_layer.cpp TestForwardBackward: a (2, 3, 9, 8) bottom goes forward to (2, 63)
    and back (Caffe's test only runs them; here the bottom diff has the bottom's shape and
    is finite)."""
    layer, bottom, top = forward(SPP, gaussian((2, 3, 9, 8), 1701))
    assert top[0].shape == (2, 63)
    top[0].diff[...] = 1
    layer.backward(top, [True], bottom)
    assert np.isfinite(bottom[0].diff).all() and bottom[0].diff.any()


def test_spp_gradient():
    """test_spp_layer.cpp TestGradient: pyramid height 3 (MAX pooling), the bottom."""
    gradient_check(SPP, [gaussian((2, 3, 9, 8), 1702)])


# ----------------------------------------------------------------------- Stochastic pool
def stochastic_bottom(seed=1701):
    """StochasticPoolingLayerTest: (2, 3, 6, 5) uniform in [0.1, 1]."""
    return np.random.default_rng(seed).uniform(0.1, 1, (2, 3, 6, 5))


def test_stochastic_pooling_setup():
    """test_stochastic_pooling.cpp CPUStochasticPoolingLayerTest TestSetup: kernel 3, stride
    2 over 6 x 5 gives 3 x 2."""
    _, _, (top,) = setup('name: "pool" type: "Pooling" pooling_param { kernel_size: 3 '
                         'stride: 2 }', stochastic_bottom())
    assert top.shape == (2, 3, 3, 2)


def test_stochastic_pooling_gradient():
    """test_stochastic_pooling.cpp TestGradient: TRAIN; the sampled positions get the top's
    diff (the checker reseeds before each forward, so each evaluation samples the same
    positions)."""
    gradient_check('name: "pool" type: "Pooling" pooling_param { kernel_size: 3 stride: 2 '
                   'pool: STOCHASTIC }', [stochastic_bottom(3)], phase=caffe_pb2.TRAIN)


# ------------------------------------------------------------------------- InnerProduct
def ip(body):
    return f'name: "ip" type: "InnerProduct" inner_product_param {{ {body} }}'


def ip_bottom(seed=0):
    """InnerProductLayerTest: (2, 3, 4, 5) uniform in [0, 1]."""
    return np.random.default_rng(seed).uniform(0, 1, (2, 3, 4, 5))


def test_ip_setup():
    """test_inner_product_layer.cpp TestSetUp: 10 outputs from (2, 3, 4, 5) give (2, 10)."""
    _, _, (top,) = setup(ip("num_output: 10"), ip_bottom())
    assert top.shape == (2, 10)


def test_ip_forward():
    """test_inner_product_layer.cpp TestForward: uniform [0, 1] weights, bias uniform in
    [1, 2], a non-negative bottom: every output at least 1."""
    layer, bottom, (top,) = forward(ip('num_output: 10 weight_filler { type: "uniform" } '
                                       'bias_filler { type: "uniform" min: 1 max: 2 }'),
                                    ip_bottom())
    assert np.all(top.data >= 1)
    want = ip_bottom().reshape(2, 60) @ layer.blobs[0].data.T + layer.blobs[1].data
    np.testing.assert_allclose(top.data, want, rtol=1e-12)


@pytest.mark.parametrize("body", ["num_output: 10", "num_output: 11 transpose: true"],
                         ids=["TestGradient", "TestGradientTranspose"])
def test_ip_gradient(body):
    """test_inner_product_layer.cpp TestGradient and TestGradientTranspose (11 outputs, the
    weight stored (60, 11)): the bottom, the weight and the bias."""
    layer = gradient_check(ip(f"{body} {GAUSS}"), [ip_bottom(1)])
    assert layer.blobs[0].shape == ((60, 11) if "transpose" in body else (10, 60))
