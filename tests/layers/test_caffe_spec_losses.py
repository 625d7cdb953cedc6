"""Loss layers against what BVLC Caffe's own unit tests assert, where minicaffe's other
tests do not already.

* ``src/caffe/test/test_sigmoid_cross_entropy_loss_layer.cpp``: TestSigmoidCrossEntropyLoss
  (float32 (10, 5, 1, 1) scores and uniform targets, ``loss_weight: 3.7``, no
  normalization field: Forward returns 3.7 times the reference summed over every element
  and divided by num, within 2e-2, trial after trial) and TestIgnoreGradient
  (``ignore_label: -1`` on the first half of the targets; Backward right after Forward,
  with the top diff that SetUp's loss weight left there: the ignored half gets exactly
  0, the other half a nonzero diff).
* ``src/caffe/test/test_infogain_loss_layer.cpp`` (upstream master): TestInfogainLoss
  (``axis: 2``, scores (4, 2, 5, 2), labels (4, 2, 1, 2), H (1, 1, 5, 5), tops weighted 1
  and 0: the second top is the softmax over axis 2 within 1e-6, the loss is
  -sum_j H[l, j] log(max(p_j, kLOG_THRESHOLD)) over the 16 positions, divided by 16).
"""
import math

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.blob import Blob
from minicaffe.testing import make_blob, make_layer


def sigmoid_ce_reference(x, t):
    """Caffe's SigmoidCrossEntropyLossReference (the + (t == 0) keeps log's argument > 0)."""
    p = 1.0 / (1.0 + np.exp(-x))
    loss = -(t * np.log(p + (t == 0)) + (1 - t) * np.log(1 - p + (t == 1))).sum()
    return loss / x.shape[0]


def test_sigmoid_cross_entropy_forward_float32():
    rng = np.random.default_rng(1701)
    for trial in range(20):
        x = rng.standard_normal((10, 5, 1, 1))
        t = rng.uniform(0, 1, (10, 5, 1, 1))
        layer = make_layer('name: "l" type: "SigmoidCrossEntropyLoss" loss_weight: 3.7',
                           dtype=np.float32)
        bottom = [make_blob(x, dtype=np.float32, name="x"),
                  make_blob(t, dtype=np.float32, name="t")]
        top = [Blob(dtype=np.float32, name="loss")]
        layer.setup(bottom, top)
        loss = float(layer.forward(bottom, top))
        want = 3.7 * sigmoid_ce_reference(bottom[0].data.astype(np.float64),
                                          bottom[1].data.astype(np.float64))
        assert abs(loss - want) <= 2e-2, (trial, loss, want)
        assert abs(float(top[0].data) * 3.7 - loss) <= 1e-5 * abs(loss)   # top: unweighted


def test_sigmoid_cross_entropy_ignore_gradient(rng):
    x = rng.standard_normal((10, 5, 1, 1))
    t = rng.uniform(0, 1, (10, 5, 1, 1))
    t.reshape(-1)[:25] = -1
    layer = make_layer('name: "l" type: "SigmoidCrossEntropyLoss" '
                       'loss_param { ignore_label: -1 }')
    bottom = [make_blob(x, name="x"), make_blob(t, name="t")]
    top = [Blob(dtype=np.float64, name="loss")]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    layer.backward(top, [True, False], bottom)
    diff = bottom[0].diff.reshape(-1)
    np.testing.assert_array_equal(diff[:25], 0.0)
    assert (diff[25:] != 0).all()


def test_infogain_loss_axis_2_with_prob_top(rng):
    x = rng.standard_normal((4, 2, 5, 2))
    labels = rng.integers(0, 5, (4, 2, 1, 2)).astype(np.float64)
    h = rng.uniform(0.1, 2.0, (1, 1, 5, 5))
    layer = make_layer('name: "l" type: "InfogainLoss" infogain_loss_param { axis: 2 } '
                       'loss_weight: 1 loss_weight: 0')
    bottom = [make_blob(x, name="x"), make_blob(labels, name="label"), make_blob(h, name="H")]
    top = [Blob(dtype=np.float64, name="loss"), Blob(dtype=np.float64, name="prob")]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    assert top[1].shape == x.shape
    e = np.exp(x)
    prob = e / e.sum(axis=2, keepdims=True)
    np.testing.assert_allclose(top[1].data, prob, rtol=0, atol=1e-6)
    hm = h.reshape(5, 5)
    loss = 0.0
    for n in range(4):
        for c in range(2):
            for w in range(2):
                label = int(labels[n, c, 0, w])
                loss -= sum(hm[label, j] * math.log(max(prob[n, c, j, w], 1e-20))
                            for j in range(5))
    assert float(top[0].data) == pytest.approx(loss / 16, abs=1e-6)   # outer 8 x inner 2
