"""Neuron layers against what BVLC Caffe's own unit tests assert.

* ``src/caffe/test/test_neuron_layer.cpp``: the forward checks of every neuron test, run as
  Caffe runs them, in float32 on a (2, 3, 4, 5) Gaussian bottom and within Caffe's
  tolerances (minicaffe's other tests are float64): AbsVal, ReLU and ReLU with
  ``negative_slope: 0.01``, ELU (alpha 0.5, and alpha 0 as a ReLU: TestELUasReLU), Sigmoid,
  TanH, the six Exp cases (base -1 meaning e, base 2, shift 1, scale 3) and the six Log
  cases on an exp'd bottom, BNLL (top >= 0 and top >= bottom), PReLU with its default 0.25
  slopes, per channel and channel_shared (TestPReLUForward*), Dropout with its 0.5 default
  (TestDropoutHalf: kept elements are x * 2), Swish (beta 1, 1.5, and 0 as x / 2:
  TestSwishAsLinear) and Clip (min -1, max 2); the gradients of the Exp, Log, ELU-as-ReLU and
  Swish-as-linear cases; TestPReLUConsistencyReLU (PReLU with its default slopes and ReLU with
  ``negative_slope: 0.25`` give the same top and bottom diff, bit for bit).
* ``src/caffe/test/test_power_layer.cpp``: TestPower, TestPowerShiftZero, TestPowerZero,
  TestPowerOne, TestPowerTwo, TestPowerTwoScaleHalf: y = (shift + scale x)^power, NaN exactly
  where Caffe's reference pow() is NaN (a negative base to 0.37), and the gradients, on a
  bottom reflected above -shift/scale for the non-integer power as Caffe's test does.
"""
import math

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.blob import Blob
from minicaffe.proto import caffe_pb2
from minicaffe.testing import check_gradient, make_blob, make_layer

SHAPE = (2, 3, 4, 5)   # NeuronLayerTest's and PowerLayerTest's bottom


def gaussian(rng):
    return rng.standard_normal(SHAPE)


def forward(text, x, dtype=np.float32, phase=None):
    layer = make_layer(text, dtype=dtype, phase=phase)
    bottom = make_blob(x, dtype=dtype, name="x")
    top = Blob(dtype=dtype, name="y")
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    return layer, bottom, top


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


EXP_LOG_CASES = [(-1, 1, 0), (-1, 1, 1), (2, 1, 0), (2, 1, 1), (2, 3, 0), (2, 3, 1)]


@pytest.mark.parametrize("base,scale,shift", EXP_LOG_CASES)
def test_exp_forward_float32(base, scale, shift, rng):
    """TestExpForward: base -1 is e; else pow(base, shift + scale x), relative tolerance."""
    x = gaussian(rng)
    _, bottom, top = forward(
        f'name: "e" type: "Exp" exp_param {{ base: {base} scale: {scale} shift: {shift} }}', x)
    x32 = bottom.data.astype(np.float64)
    y = top.data.astype(np.float64)
    if base == -1:
        np.testing.assert_allclose(y, np.exp(shift + scale * x32), rtol=0, atol=2e-4)
    else:
        np.testing.assert_allclose(y, np.power(float(base), shift + scale * x32), rtol=2e-4)


@pytest.mark.parametrize("base,scale,shift", EXP_LOG_CASES)
def test_log_forward_float32(base, scale, shift, rng):
    """TestLogForward on Caffe's exp'd Gaussian bottom: ln(shift + scale x) / ln(base)."""
    x = np.exp(gaussian(rng))
    _, bottom, top = forward(
        f'name: "l" type: "Log" log_param {{ base: {base} scale: {scale} shift: {shift} }}', x)
    x32 = bottom.data.astype(np.float64)
    want = np.log(shift + scale * x32) / (1.0 if base == -1 else math.log(base))
    np.testing.assert_allclose(top.data, want, rtol=0, atol=2e-4)


@pytest.mark.parametrize("kind", ["Exp", "Log"])
@pytest.mark.parametrize("base,scale,shift", EXP_LOG_CASES)
def test_exp_log_gradient(kind, base, scale, shift, rng):
    """TestExpGradient* and TestLogGradient* (Log on the exp'd bottom)."""
    x = gaussian(rng)[:1, :2]     # (1, 2, 4, 5): the same code path, fewer finite differences
    if kind == "Log":
        x = np.exp(x)
    field = "exp_param" if kind == "Exp" else "log_param"
    layer = make_layer(f'name: "n" type: "{kind}" {field} {{ base: {base} scale: {scale} '
                       f'shift: {shift} }}')
    check_gradient(layer, [make_blob(x, name="x")], rtol=1e-5, atol=1e-6)


def test_relu_and_negative_slope_forward_float32(rng):
    """TestReLU: top >= 0 and top is 0 or the bottom; TestReLUWithNegativeSlope (0.01)."""
    x = gaussian(rng)
    _, bottom, top = forward('name: "r" type: "ReLU"', x)
    assert (top.data >= 0).all()
    assert ((top.data == 0) | (top.data == bottom.data)).all()
    _, bottom, top = forward('name: "r" type: "ReLU" relu_param { negative_slope: 0.01 }', x)
    pos = top.data >= 0
    np.testing.assert_array_equal(top.data[pos], bottom.data[pos])
    np.testing.assert_allclose(top.data[~pos], bottom.data[~pos] * 0.01, rtol=0, atol=1e-6)
    assert (~pos).any()


def test_absval_sigmoid_tanh_bnll_forward_float32(rng):
    """TestAbsVal (exact), TestSigmoid (within 1e-6, in [0, 1]), TestTanH (within 1e-4 of
    (e^2x - 1) / (e^2x + 1)), TestBNLL (top >= 0 and top >= bottom)."""
    x = gaussian(rng)
    _, bottom, top = forward('name: "a" type: "AbsVal"', x)
    np.testing.assert_array_equal(top.data, np.abs(bottom.data))
    x64 = bottom.data.astype(np.float64)
    _, _, top = forward('name: "s" type: "Sigmoid"', x)
    np.testing.assert_allclose(top.data, sigmoid(x64), rtol=0, atol=1e-6)
    assert (top.data >= 0).all() and (top.data <= 1).all()
    _, _, top = forward('name: "t" type: "TanH"', x)
    np.testing.assert_allclose(top.data, (np.exp(2 * x64) - 1) / (np.exp(2 * x64) + 1),
                               rtol=0, atol=1e-4)
    _, bottom, top = forward('name: "b" type: "BNLL"', x)
    assert (top.data >= 0).all() and (top.data >= bottom.data).all()


def test_elu_forward_float32(rng):
    """TestELU (alpha 0.5): x where x > 0, else 0.5 (e^x - 1) within 2e-4;
    TestELUasReLU (alpha 0): top >= 0 and top is 0 or the bottom."""
    x = gaussian(rng)
    _, bottom, top = forward('name: "e" type: "ELU" elu_param { alpha: 0.5 }', x)
    pos = bottom.data > 0
    np.testing.assert_array_equal(top.data[pos], bottom.data[pos])
    np.testing.assert_allclose(top.data[~pos], 0.5 * (np.exp(bottom.data[~pos].astype(
        np.float64)) - 1), rtol=0, atol=2e-4)
    _, bottom, top = forward('name: "e" type: "ELU" elu_param { alpha: 0 }', x)
    assert (top.data >= 0).all()
    assert ((top.data == 0) | (top.data == bottom.data)).all()


def test_elu_as_relu_gradient(rng):
    """TestELUasReLUGradient: alpha 0 has ReLU's gradient (0 below zero)."""
    x = gaussian(rng)[:1]
    x[np.abs(x) < 0.05] = 0.5          # Caffe's checker skips a kink of 0.01 around zero
    check_gradient(make_layer('name: "e" type: "ELU" elu_param { alpha: 0 }'),
                   [make_blob(x, name="x")])


@pytest.mark.parametrize("shared", [False, True])
def test_prelu_forward_float32(shared, rng):
    """TestPReLUForward (Gaussian slopes, one per channel) and
    TestPReLUForwardChannelShared (the default 0.25): max(x, 0) + a_c min(x, 0)."""
    x = gaussian(rng)
    text = 'name: "p" type: "PReLU"' + (" prelu_param { channel_shared: true }" if shared else "")
    layer = make_layer(text, dtype=np.float32)
    bottom, top = make_blob(x, dtype=np.float32, name="x"), Blob(dtype=np.float32, name="y")
    layer.setup([bottom], [top])
    if not shared:
        layer.blobs[0].data[...] = rng.standard_normal(3)
    layer.forward([bottom], [top])
    a = layer.blobs[0].data.astype(np.float64)
    a = a if shared else a.reshape(1, 3, 1, 1)
    x64 = bottom.data.astype(np.float64)
    np.testing.assert_allclose(top.data, np.maximum(x64, 0) + a * np.minimum(x64, 0),
                               rtol=0, atol=1e-6)


def test_prelu_is_relu_with_the_default_slope(rng):
    """TestPReLUConsistencyReLU: PReLU with its default filler (0.25) and ReLU with
    negative_slope 0.25 give equal tops and, for the same top diff, equal bottom diffs."""
    x = gaussian(rng)
    dy = rng.standard_normal(SHAPE)
    out = []
    for text in ('name: "p" type: "PReLU"',
                 'name: "r" type: "ReLU" relu_param { negative_slope: 0.25 }'):
        layer, bottom, top = forward(text, x)
        top.diff[...] = dy
        layer.backward([top], [True], [bottom])
        out.append((top.data.copy(), bottom.diff.copy()))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


def test_dropout_default_ratio_is_half(rng):
    """TestDropoutHalf sets no dropout_param, to test that 0.5 is the default: in TRAIN every
    kept element is x * 2, and about half are dropped (Caffe's 1.96 standard errors; with
    4800 elements here, so that the bound is tight)."""
    x = rng.standard_normal((2, 3, 40, 20))
    layer, bottom, top = forward('name: "d" type: "Dropout"', x, phase=caffe_pb2.TRAIN)
    assert layer.ratio == 0.5
    kept = top.data != 0
    np.testing.assert_array_equal(top.data[kept], bottom.data[kept] * np.float32(2))
    std_error = math.sqrt(0.5 * 0.5 / x.size)
    assert abs((1 - kept.mean()) - 0.5) <= 1.96 * std_error * 2   # 3.92 sigma: no flakes


@pytest.mark.parametrize("beta", [1.0, 1.5])
def test_swish_forward_float32(beta, rng):
    """TestSwish / TestSwishWithBeta: x / (1 + e^(-beta x)) within 1e-6."""
    x = gaussian(rng)
    text = f'name: "s" type: "Swish" swish_param {{ beta: {beta} }}'
    _, bottom, top = forward(text, x)
    x64 = bottom.data.astype(np.float64)
    np.testing.assert_allclose(top.data, x64 * sigmoid(beta * x64), rtol=0, atol=1e-6)


def test_swish_as_linear(rng):
    """TestSwishAsLinear and its gradient: beta 0 gives x / 2 exactly, gradient 1/2."""
    x = gaussian(rng)
    _, bottom, top = forward('name: "s" type: "Swish" swish_param { beta: 0 }', x)
    np.testing.assert_array_equal(top.data, bottom.data / 2)
    layer = make_layer('name: "s" type: "Swish" swish_param { beta: 0 }')
    check_gradient(layer, [make_blob(x[:1], name="x")])


def test_clip_forward_float32(rng):
    """TestClip (min -1, max 2): top within [-1, 2], equal to the bottom inside."""
    x = 2 * gaussian(rng)
    _, bottom, top = forward('name: "c" type: "Clip" clip_param { min: -1 max: 2 }', x)
    assert (top.data >= -1).all() and (top.data <= 2).all()
    inside = (bottom.data >= -1) & (bottom.data <= 2)
    np.testing.assert_array_equal(top.data[inside], bottom.data[inside])
    assert (top.data[bottom.data < -1] == -1).all() and (top.data[bottom.data > 2] == 2).all()


# --------------------------------------------------------------- test_power_layer.cpp
POWER_CASES = {                  # Caffe's test name: (power, scale, shift)
    "TestPower": (0.37, 0.83, -2.4),
    "TestPowerShiftZero": (0.37, 0.83, 0.0),
    "TestPowerZero": (0.0, 0.83, -2.4),
    "TestPowerOne": (1.0, 0.83, -2.4),
    "TestPowerTwo": (2.0, 0.34, -2.4),
    "TestPowerTwoScaleHalf": (2.0, 0.5, -2.4),
}


def power_text(power, scale, shift):
    return (f'name: "p" type: "Power" power_param {{ power: {power} scale: {scale} '
            f'shift: {shift} }}')


@pytest.mark.parametrize("case", POWER_CASES)
def test_power_forward_float32(case, rng):
    """PowerLayerTest::TestForward: expected pow(shift + scale x, power); for powers 0, 1
    and 2 it is never NaN; where it is NaN (a negative base to 0.37) the top is NaN too;
    elsewhere the top is within 1e-4 (relative, at least absolute 1e-4 near zero)."""
    power, scale, shift = POWER_CASES[case]
    x = gaussian(rng)
    with np.errstate(invalid="ignore"):
        _, bottom, top = forward(power_text(power, scale, shift), x)
        want = np.power(shift + scale * bottom.data.astype(np.float64), power)
    if power in (0, 1, 2):
        assert not np.isnan(want).any()
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(top.data), nan)
    if power == 0.37 and shift != 0:
        assert nan.any()                                   # the case Caffe's test exercises
    np.testing.assert_allclose(top.data[~nan], want[~nan], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", POWER_CASES)
def test_power_gradient(case, rng):
    """PowerLayerTest::TestBackward: for powers other than 0, 1 and 2 every bottom value
    below -shift/scale is reflected above it (x -> 2 min - x), so the base is positive."""
    power, scale, shift = POWER_CASES[case]
    x = gaussian(rng)[:1, :2]
    if power not in (0, 1, 2):
        lo = -shift / scale
        x = np.where(x < lo, 2 * lo - x, x)
        x[np.abs(x - lo) < 0.05] += 0.1               # keep the finite difference off the kink
    check_gradient(make_layer(power_text(power, scale, shift)), [make_blob(x, name="x")],
                   rtol=1e-5, atol=1e-6)
