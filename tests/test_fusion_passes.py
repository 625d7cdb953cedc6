"""Layer pairs (Convolution + in-place ReLU, minicaffe.net.Net.set_conv_relu_fusion) are
invisible to pycaffe-style passes: any sequence of whole and partial forward passes and
backward passes leaves every blob as a net whose layers run apart leaves it (NumPy, bit for
bit)."""
import numpy as np
import pytest

from minicaffe.net import Net
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.rng import set_random_seed

NET = """
name: "passes"
layer { name: "data" type: "Input" top: "data" top: "target"
  input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } shape { dim: 2 dim: 5 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool" type: "Pooling" bottom: "conv1" top: "pool"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool" top: "conv2"
  convolution_param { num_output: 6 kernel_size: 3
    weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" relu_param { negative_slope: 0.1 } }
layer { name: "ip" type: "InnerProduct" bottom: "conv2" top: "ip"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""


def _net(paired: bool) -> Net:
    set_random_seed(3)
    net = Net(parse_text(NET, caffe_pb2.NetParameter), caffe_pb2.TRAIN)
    if not paired:
        net.set_conv_relu_fusion(False)
    rng = np.random.default_rng(4)
    for name in ("data", "target"):
        net.blobs[name].data[...] = rng.standard_normal(net.blobs[name].shape)
    return net


@pytest.mark.parametrize("seed", range(24))
def test_any_sequence_of_passes_sees_the_layers_run_apart(seed):
    rng = np.random.default_rng(seed)
    net, ref = _net(True), _net(False)
    assert net.conv_relu_pairs == [(1, 2), (4, 5)] and ref.conv_relu_pairs == []
    names = net.layer_names
    for step in range(6):
        op = rng.integers(3)
        if op == 0:
            args = {}
        else:
            a, b = sorted(rng.integers(len(names), size=2))
            args = {"start": names[a], "end": names[b]}
        if op == 2:
            for n in (net, ref):
                n.forward()
                n.backward()
        else:
            out, want = net.forward(**args), ref.forward(**args)
            assert out.keys() == want.keys()
        for name, blob in ref.blobs.items():
            np.testing.assert_array_equal(net.blobs[name].data, blob.data,
                                          err_msg=f"step {step} {op} {args}: {name}")
            np.testing.assert_array_equal(net.blobs[name].diff, blob.diff,
                                          err_msg=f"step {step} {op} {args}: {name} diff")
