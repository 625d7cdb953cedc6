"""The cases of BVLC Caffe's ``src/caffe/test/test_neuron_layer.cpp`` that
test_caffe_spec_neuron.py does not port: the gradients of the neuron layers, the rest of the
Dropout tests and the PReLU param tests (conventions as in test_caffe_spec_layers2.py: a
seeded Gaussian (2, 3, 4, 5) bottom, float64 gradient checks).

* TestAbsGradient, TestReLUGradient, TestReLUGradientWithNegativeSlope, TestELUGradient,
  TestSigmoidGradient, TestTanHGradient, TestBNLLGradient, TestSwishGradient,
  TestSwishWithBetaGradient, TestClipGradient (Caffe's checker skips |x| < 0.01 around the
  kinks at 0; here the bottom's values that close to a kink are moved off it, as the test's
  TestClipGradient does for Clip's kinks at min and max).
* TestDropoutThreeQuarters, TestDropoutTestPhase, TestDropoutGradient,
  TestDropoutGradientTest.
* TestPReLUParam, TestPReLUGradient, TestPReLUGradientChannelShared, TestPReLUInPlace.
"""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.blob import Blob
from minicaffe.proto import caffe_pb2
from minicaffe.rng import set_random_seed
from minicaffe.testing import check_gradient, make_blob, make_layer

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def bottom_values(seed=1701, kinks=(0.0,), margin=0.01):
    """NeuronLayerTest's (2, 3, 4, 5) Gaussian bottom, each value within ``margin`` of a kink
    moved ``margin`` away from it (the test's TestClipGradient rule)."""
    x = np.random.default_rng(seed).standard_normal((2, 3, 4, 5))
    for k in kinks:
        near = np.abs(x - k) <= margin
        x[near] += np.where(x[near] >= k, margin, -margin)
    return x


def run(text, x, phase=None, in_place=False):
    layer = make_layer(text, phase=phase)
    bottom = make_blob(x, name="x")
    top = bottom if in_place else Blob(dtype=np.float64, name="y")
    layer.setup([bottom], [top])
    layer.forward([bottom], [top])
    return layer, bottom, top


@pytest.mark.parametrize("text, kinks", [
    ('type: "AbsVal"', (0.0,)),                                        # TestAbsGradient
    ('type: "ReLU"', (0.0,)),                                          # TestReLUGradient
    ('type: "ReLU" relu_param { negative_slope: 0.01 }', (0.0,)),      # ...WithNegativeSlope
    ('type: "ELU"', (0.0,)),                                           # TestELUGradient
    ('type: "Sigmoid"', ()),                                           # TestSigmoidGradient
    ('type: "TanH"', ()),                                              # TestTanHGradient
    ('type: "BNLL"', ()),                                              # TestBNLLGradient
    ('type: "Swish"', ()),                                             # TestSwishGradient
    ('type: "Swish" swish_param { beta: 1.5 }', ()),                   # ...WithBetaGradient
    ('type: "Clip" clip_param { min: -1 max: 2 }', (-1.0, 2.0)),       # TestClipGradient
], ids=["TestAbsGradient", "TestReLUGradient", "TestReLUGradientWithNegativeSlope",
        "TestELUGradient", "TestSigmoidGradient", "TestTanHGradient", "TestBNLLGradient",
        "TestSwishGradient", "TestSwishWithBetaGradient", "TestClipGradient"])
def test_neuron_gradient(text, kinks):
    """test_neuron_layer.cpp's elementwise gradient tests (ELU with its default alpha 1)."""
    layer = make_layer(f'name: "neuron" {text}')
    check_gradient(layer, [make_blob(bottom_values(kinks=kinks), name="x")],
                   [Blob(dtype=np.float64, name="y")])


# ------------------------------------------------------------------------------ Dropout
def test_dropout_three_quarters():
    """test_neuron_layer.cpp TestDropoutThreeQuarters: ``dropout_ratio: 0.75`` in TRAIN;
    every kept value is x * 4 (scale 1 / (1 - 0.75)), and the share dropped is within 1.96
    standard errors of 0.75."""
    set_random_seed(1701)
    x = bottom_values()
    _, _, top = run('name: "drop" type: "Dropout" dropout_param { dropout_ratio: 0.75 }', x,
                    phase=TRAIN)
    kept = top.data != 0
    np.testing.assert_array_equal(top.data[kept], x[kept] * 4)
    std_error = np.sqrt(0.75 * 0.25 / x.size)
    assert abs((1 - kept.mean()) - 0.75) <= 1.96 * std_error


def test_dropout_test_phase():
    """test_neuron_layer.cpp TestDropoutTestPhase: in TEST the top is the bottom."""
    x = bottom_values()
    _, _, top = run('name: "drop" type: "Dropout"', x, phase=TEST)
    np.testing.assert_array_equal(top.data, x)


@pytest.mark.parametrize("phase", [TRAIN, TEST], ids=["TestDropoutGradient",
                                                     "TestDropoutGradientTest"])
def test_dropout_gradient(phase):
    """test_neuron_layer.cpp TestDropoutGradient (TRAIN: the same mask for every
    evaluation, the checker reseeding as Caffe's does) and TestDropoutGradientTest (TEST:
    the identity)."""
    layer = make_layer('name: "drop" type: "Dropout"', phase=phase)
    check_gradient(layer, [make_blob(bottom_values(), name="x")],
                   [Blob(dtype=np.float64, name="y")])


# -------------------------------------------------------------------------------- PReLU
def test_prelu_param():
    """test_neuron_layer.cpp TestPReLUParam: one slope per channel (3), each 0.25."""
    layer, _, _ = run('name: "prelu" type: "PReLU"', bottom_values())
    np.testing.assert_array_equal(layer.blobs[0].data, np.full(3, 0.25))


@pytest.mark.parametrize("shared", [False, True], ids=["TestPReLUGradient",
                                                       "TestPReLUGradientChannelShared"])
def test_prelu_gradient(shared):
    """test_neuron_layer.cpp TestPReLUGradient (Gaussian slopes per channel) and
    TestPReLUGradientChannelShared (the default 0.25, one slope): the bottom and the
    slopes."""
    text = 'name: "prelu" type: "PReLU"' + (" prelu_param { channel_shared: true }"
                                           if shared else "")
    layer = make_layer(text)
    bottom, top = [make_blob(bottom_values(), name="x")], [Blob(dtype=np.float64, name="y")]
    layer.setup(bottom, top)
    if not shared:
        layer.blobs[0].data[...] = np.random.default_rng(5).standard_normal(3)
    check_gradient(layer, bottom, top, setup=False)
    assert layer.blobs[0].shape == (() if shared else (3,))   # shared: a 0-axis blob, as Caffe


def test_prelu_in_place():
    """test_neuron_layer.cpp TestPReLUInPlace: InnerProduct (3 outputs, Gaussian weights)
    then PReLU in place on its top give the top, the bottom diff, both InnerProduct param
    diffs and the slopes' diff of the same two layers run out of place."""
    x = bottom_values()
    dy = np.random.default_rng(6).standard_normal((2, 3))
    ip_text = 'name: "ip" type: "InnerProduct" inner_product_param { num_output: 3 ' \
              'weight_filler { type: "gaussian" } }'
    results = []
    for in_place in (True, False):
        ip, prelu = make_layer(ip_text), make_layer('name: "prelu" type: "PReLU"')
        bottom = make_blob(x, name="x")
        middle = Blob(dtype=np.float64, name="ip")
        top = middle if in_place else Blob(dtype=np.float64, name="prelu")
        ip.setup([bottom], [middle])
        prelu.setup([middle], [top])
        ip.blobs[0].data[...] = np.random.default_rng(7).standard_normal((3, 60))
        ip.forward([bottom], [middle])
        prelu.forward([middle], [top])
        y = top.data.copy()
        top.diff[...] = dy
        prelu.backward([top], [True], [middle])
        ip.backward([middle], [True], [bottom])
        results.append([y, bottom.diff.copy()] + [b.diff.copy() for b in ip.blobs + prelu.blobs])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
