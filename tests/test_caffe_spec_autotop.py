"""Net construction against BVLC Caffe's ``src/caffe/net.cpp`` (``Net::Init``'s
``AutoTopBlobs``: a ``LossLayer`` given fewer tops than it needs gets anonymous
ones, which carry the loss but are no net outputs), as the nets of
``src/caffe/test/test_gradient_based_solver.cpp`` use it."""
import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.proto import caffe_pb2, parse_text

NET = """
name: "two_losses"
force_backward: true
layer { name: "in" type: "Input" top: "a" top: "b"
        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } } }
layer { name: "l1" type: "EuclideanLoss" bottom: "a" bottom: "b" }
layer { name: "l2" type: "EuclideanLoss" bottom: "a" bottom: "b" loss_weight: 3 }
layer { name: "acc" type: "Accuracy" bottom: "a" bottom: "b" top: "acc"
        include { phase: TEST } }
"""


def tops(net, *layers):
    return [net.layer_top_names[net.layer_names.index(n)] for n in layers]


def test_each_topless_loss_gets_its_own_automatic_top_and_counts():
    net = caffe.Net(parse_text(NET, caffe_pb2.NetParameter), caffe.TRAIN)
    assert tops(net, "l1", "l2") == [["(automatic)"], ["(automatic)_1"]]
    assert net.outputs == []
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((2, 3), np.float32)
    net.blobs["a"].data[...] = a
    net.blobs["b"].data[...] = b
    loss = float(net.forward_backward())
    one = float(np.sum((a - b) ** 2)) / (2 * 2)
    assert loss == pytest.approx(one * (1 + 3))
    assert float(net.blobs["(automatic)"].data) == pytest.approx(one)
    # both losses send their gradient back: (1 + 3) * (a - b) / N
    np.testing.assert_allclose(net.blobs["a"].diff, 4 * (a - b) / 2, rtol=1e-6)


def test_a_loss_with_a_top_gets_no_extra_one():
    text = NET.replace('bottom: "b" }', 'bottom: "b" top: "loss1" }', 1)
    net = caffe.Net(parse_text(text, caffe_pb2.NetParameter), caffe.TRAIN)
    assert tops(net, "l1", "l2") == [["loss1"], ["(automatic)"]]
    assert net.outputs == ["loss1"]
