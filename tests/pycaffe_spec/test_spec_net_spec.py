"""pycaffe's own NetSpec tests, as a spec: BVLC Caffe python/caffe/test/test_net_spec.py
(LeNet named and anonymous, top-less layers, the TypeError for a non-Top input), written for
pytest and run through ``import caffe`` / ``from caffe import layers as L, params as P``.
"""
import pytest

import minicaffe  # noqa: F401  (makes ``import caffe`` reach minicaffe)
import caffe
from caffe import layers as L
from caffe import params as P


def lenet(batch_size):
    n = caffe.NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[batch_size, 1, 28, 28]),
                                         dict(dim=[batch_size, 1, 1, 1])],
                                  transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type='xavier'))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50,
                            weight_filler=dict(type='xavier'))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type='xavier'))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type='xavier'))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    return n.to_proto()


def anon_lenet(batch_size):
    data, label = L.DummyData(shape=[dict(dim=[batch_size, 1, 28, 28]),
                                     dict(dim=[batch_size, 1, 1, 1])],
                              transform_param=dict(scale=1. / 255), ntop=2)
    conv1 = L.Convolution(data, kernel_size=5, num_output=20,
                          weight_filler=dict(type='xavier'))
    pool1 = L.Pooling(conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    conv2 = L.Convolution(pool1, kernel_size=5, num_output=50,
                          weight_filler=dict(type='xavier'))
    pool2 = L.Pooling(conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    ip1 = L.InnerProduct(pool2, num_output=500, weight_filler=dict(type='xavier'))
    relu1 = L.ReLU(ip1, in_place=True)
    ip2 = L.InnerProduct(relu1, num_output=10, weight_filler=dict(type='xavier'))
    loss = L.SoftmaxWithLoss(ip2, label)
    return loss.to_proto()


def silent_net():
    n = caffe.NetSpec()
    n.data, n.data2 = L.DummyData(shape=dict(dim=3), ntop=2)
    n.silence_data = L.Silence(n.data, ntop=0)
    n.silence_data2 = L.Silence(n.data2, ntop=0)
    return n.to_proto()


def load_net(tmp_path, net_proto):
    # upstream writes str(proto): the text format
    path = tmp_path / "net.prototxt"
    path.write_text(str(net_proto))
    return caffe.Net(str(path), caffe.TEST)


@pytest.mark.parametrize("make", [lenet, anon_lenet])
def test_lenet(tmp_path, make):
    net_proto = make(50)
    # the ReLU is in place
    assert net_proto.layer[6].bottom == net_proto.layer[6].top
    net = load_net(tmp_path, net_proto)
    assert len(net.layers) == 9


def test_lenet_names():
    # NetSpec names each layer and top by its attribute; the anonymous net by type and
    # order (net_spec.py's autonames: Convolution1, Pooling2 ...)
    named = lenet(50)
    assert [l.name for l in named.layer] == ['data', 'conv1', 'pool1', 'conv2', 'pool2',
                                             'ip1', 'relu1', 'ip2', 'loss']
    assert list(named.layer[0].top) == ['data', 'label']
    assert list(named.layer[6].top) == ['ip1']
    anon = anon_lenet(50)
    assert [l.name for l in anon.layer] == ['DummyData1', 'Convolution1', 'Pooling1',
                                            'Convolution2', 'Pooling2', 'InnerProduct1',
                                            'ReLU1', 'InnerProduct2', 'SoftmaxWithLoss1']
    assert list(anon.layer[0].top) == ['DummyData1', 'DummyData2']


def test_zero_tops(tmp_path):
    net = load_net(tmp_path, silent_net())
    assert len(net.forward()) == 0


def test_type_error():
    data = L.DummyData(ntop=2)  # a 2-tuple of Tops
    r = r"^Silence input 0 is not a Top \(type is <(type|class) 'tuple'>\)$"
    with pytest.raises(TypeError, match=r):
        L.Silence(data, ntop=0)
    L.Silence(*data, ntop=0)  # each element is a Top: no error
