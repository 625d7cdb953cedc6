"""pycaffe's own net tests, as a spec: BVLC Caffe python/caffe/test/test_net.py.

Each upstream case is reproduced with its inputs and assertions (TestNet, TestLevels,
TestStages, TestAllInOne), written for pytest and run through ``import caffe``, which
reaches minicaffe where no real Caffe is installed.
"""
import os
from collections import OrderedDict

import numpy as np
import pytest

import minicaffe  # noqa: F401  (makes ``import caffe`` reach minicaffe)
import caffe

NUM_OUTPUT = 13


def simple_net_text(num_output):
    """The net of upstream's simple_net_file (after Caffe's test_net.cpp): DummyData ->
    Convolution -> InnerProduct (top 'ip_blob') -> SoftmaxWithLoss."""
    return """name: 'testnet' force_backward: true
    layer { type: 'DummyData' name: 'data' top: 'data' top: 'label'
      dummy_data_param { num: 5 channels: 2 height: 3 width: 4
        num: 5 channels: 1 height: 1 width: 1
        data_filler { type: 'gaussian' std: 1 }
        data_filler { type: 'constant' } } }
    layer { type: 'Convolution' name: 'conv' bottom: 'data' top: 'conv'
      convolution_param { num_output: 11 kernel_size: 2 pad: 3
        weight_filler { type: 'gaussian' std: 1 }
        bias_filler { type: 'constant' value: 2 } }
        param { decay_mult: 1 } param { decay_mult: 0 } }
    layer { type: 'InnerProduct' name: 'ip' bottom: 'conv' top: 'ip_blob'
      inner_product_param { num_output: %d
        weight_filler { type: 'gaussian' std: 2.5 }
        bias_filler { type: 'constant' value: -3 } } }
    layer { type: 'SoftmaxWithLoss' name: 'loss' bottom: 'ip_blob' bottom: 'label'
      top: 'loss' }""" % num_output


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
def net_file(tmp_path):
    return write(tmp_path, "net.prototxt", simple_net_text(NUM_OUTPUT))


@pytest.fixture
def net(net_file):
    n = caffe.Net(net_file, caffe.TRAIN)
    # valid labels, as upstream's setUp
    n.blobs['label'].data[...] = np.random.randint(NUM_OUTPUT,
                                                   size=n.blobs['label'].data.shape)
    return n


def test_memory(net):
    """Blob and param arrays stay readable after the Net is gone."""
    params = sum((list(p) for p in net.params.values()), [])
    blobs = list(net.blobs.values())
    shapes = [b.data.shape for b in blobs]
    del net
    total = 0
    for p in params:
        total += p.data.sum() + p.diff.sum()
    for bl, shape in zip(blobs, shapes):
        assert bl.data.shape == shape
        total += bl.data.sum() + bl.diff.sum()
    assert np.isfinite(total)


def test_layer_dict(net):
    layer_dict = net.layer_dict
    assert list(layer_dict.keys()) == list(net._layer_names)
    for i, name in enumerate(net._layer_names):
        assert layer_dict[name].type == net.layers[i].type
    assert [l.type for l in net.layers] == ['DummyData', 'Convolution', 'InnerProduct',
                                            'SoftmaxWithLoss']


def test_forward_backward(net):
    out = net.forward()
    assert list(out) == ['loss'] and np.isfinite(out['loss'])
    net.backward()
    assert np.abs(net.params['conv'][0].diff).sum() > 0


def test_forward_start_end(net):
    conv_blob = net.blobs['conv']
    ip_blob = net.blobs['ip_blob']
    sample = np.random.uniform(size=conv_blob.data.shape).astype(np.float32)
    conv_blob.data[:] = sample
    forward_blob = net.forward(start='ip', end='ip')
    assert 'ip_blob' in forward_blob
    w, b = net.params['ip'][0].data, net.params['ip'][1].data
    manual = np.array([np.dot(w, conv_blob.data[i].reshape(-1)) + b
                       for i in range(conv_blob.data.shape[0])])
    np.testing.assert_allclose(ip_blob.data, manual, rtol=1e-3, atol=1e-5)


def test_backward_start_end(net):
    conv_blob = net.blobs['conv']
    ip_blob = net.blobs['ip_blob']
    sample = np.random.uniform(size=ip_blob.data.shape).astype(np.float32)
    ip_blob.diff[:] = sample
    backward_blob = net.backward(start='ip', end='ip')
    assert 'conv' in backward_blob
    w = net.params['ip'][0].data
    manual = np.array([np.dot(w.transpose(), sample[i].reshape(-1))
                       for i in range(conv_blob.data.shape[0])])
    manual = manual.reshape(conv_blob.data.shape)
    np.testing.assert_allclose(conv_blob.diff, manual, rtol=1e-3, atol=1e-5)


def test_clear_param_diffs(net):
    net.forward()
    net.backward()
    diff = net.params['conv'][0].diff
    assert diff.max() > 0
    net.clear_param_diffs()
    # the very array read before is zeroed (clear works in place)
    assert (diff == 0).all()


def test_inputs_outputs(net):
    assert net.inputs == []
    assert net.outputs == ['loss']


def test_top_bottom_names(net):
    assert net.top_names == OrderedDict([('data', ['data', 'label']),
                                         ('conv', ['conv']),
                                         ('ip', ['ip_blob']),
                                         ('loss', ['loss'])])
    assert net.bottom_names == OrderedDict([('data', []),
                                            ('conv', ['data']),
                                            ('ip', ['conv']),
                                            ('loss', ['ip_blob', 'label'])])


def assert_same_params(a, b):
    assert list(a.params) == list(b.params)
    for name in a.params:
        assert len(a.params[name]) == len(b.params[name])
        for i in range(len(a.params[name])):
            assert abs(a.params[name][i].data - b.params[name][i].data).sum() == 0


def test_save_and_read(net, net_file, tmp_path):
    weights = str(tmp_path / "w.caffemodel")
    net.save(weights)
    # the legacy constructor Net(file, weights, phase) (pycaffe prints a deprecation note)
    legacy = caffe.Net(net_file, weights, caffe.TRAIN)
    assert legacy.phase == caffe.TRAIN
    assert_same_params(net, legacy)
    # the named constructor
    net2 = caffe.Net(net_file, caffe.TRAIN, weights=weights)
    assert_same_params(net, net2)


def test_save_hdf5(net, net_file, tmp_path):
    pytest.importorskip("h5py")
    weights = str(tmp_path / "w.caffemodel.h5")
    net.save_hdf5(weights)
    net2 = caffe.Net(net_file, caffe.TRAIN)
    net2.load_hdf5(weights)
    assert_same_params(net, net2)


LEVELS_NET = """
layer { name: "data" type: "DummyData" top: "data"
  dummy_data_param { shape { dim: 1 dim: 1 dim: 10 dim: 10 } } }
layer { name: "NoLevel" type: "InnerProduct" bottom: "data" top: "NoLevel"
  inner_product_param { num_output: 1 } }
layer { name: "Level0Only" type: "InnerProduct" bottom: "data" top: "Level0Only"
  include { min_level: 0 max_level: 0 } inner_product_param { num_output: 1 } }
layer { name: "Level1Only" type: "InnerProduct" bottom: "data" top: "Level1Only"
  include { min_level: 1 max_level: 1 } inner_product_param { num_output: 1 } }
layer { name: "Level>=0" type: "InnerProduct" bottom: "data" top: "Level>=0"
  include { min_level: 0 } inner_product_param { num_output: 1 } }
layer { name: "Level>=1" type: "InnerProduct" bottom: "data" top: "Level>=1"
  include { min_level: 1 } inner_product_param { num_output: 1 } }
"""


def non_data_blobs(net):
    return [b for b in net.blobs.keys() if 'data' not in b]


def test_levels_0(tmp_path):
    net = caffe.Net(write(tmp_path, "levels.prototxt", LEVELS_NET), caffe.TEST)
    assert non_data_blobs(net) == ['NoLevel', 'Level0Only', 'Level>=0']


def test_levels_1(tmp_path):
    net = caffe.Net(write(tmp_path, "levels.prototxt", LEVELS_NET), caffe.TEST, level=1)
    assert non_data_blobs(net) == ['NoLevel', 'Level1Only', 'Level>=0', 'Level>=1']


STAGES_NET = """
layer { name: "data" type: "DummyData" top: "data"
  dummy_data_param { shape { dim: 1 dim: 1 dim: 10 dim: 10 } } }
layer { name: "A" type: "InnerProduct" bottom: "data" top: "A"
  include { stage: "A" } inner_product_param { num_output: 1 } }
layer { name: "B" type: "InnerProduct" bottom: "data" top: "B"
  include { stage: "B" } inner_product_param { num_output: 1 } }
layer { name: "AorB" type: "InnerProduct" bottom: "data" top: "AorB"
  include { stage: "A" } include { stage: "B" } inner_product_param { num_output: 1 } }
layer { name: "AandB" type: "InnerProduct" bottom: "data" top: "AandB"
  include { stage: "A" stage: "B" } inner_product_param { num_output: 1 } }
"""


@pytest.mark.parametrize("stages, expected", [
    (['A'], ['A', 'AorB']),
    (['B'], ['B', 'AorB']),
    (['A', 'B'], ['A', 'B', 'AorB', 'AandB']),
])
def test_stages(tmp_path, stages, expected):
    net = caffe.Net(write(tmp_path, "stages.prototxt", STAGES_NET), caffe.TEST, stages=stages)
    assert non_data_blobs(net) == expected


ALL_IN_ONE_NET = """
layer { name: "train_data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 1 dim: 1 dim: 10 dim: 10 }
                     shape { dim: 1 dim: 1 dim: 1 dim: 1 } }
  include { phase: TRAIN stage: "train" } }
layer { name: "val_data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 1 dim: 1 dim: 10 dim: 10 }
                     shape { dim: 1 dim: 1 dim: 1 dim: 1 } }
  include { phase: TEST stage: "val" } }
layer { name: "deploy_data" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 1 dim: 10 dim: 10 } }
  include { phase: TEST stage: "deploy" } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss"
  include: { phase: TRAIN stage: "train" }
  include: { phase: TEST stage: "val" } }
layer { name: "pred" type: "Softmax" bottom: "ip" top: "pred"
  include: { phase: TEST stage: "deploy" } }
"""


@pytest.mark.parametrize("phase, stage, outputs", [
    ("TRAIN", 'train', ['loss']),
    ("TEST", 'val', ['loss']),
    ("TEST", 'deploy', ['pred']),
])
def test_all_in_one(tmp_path, phase, stage, outputs):
    net = caffe.Net(write(tmp_path, "all.prototxt", ALL_IN_ONE_NET), getattr(caffe, phase),
                    stages=[stage])
    assert list(net.blobs['data'].shape) == [1, 1, 10, 10]
    assert net.outputs == outputs
