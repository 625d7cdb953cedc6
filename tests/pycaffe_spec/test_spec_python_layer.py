"""pycaffe's own Python-layer tests, as a spec: BVLC Caffe
python/caffe/test/test_python_layer.py (forward, backward, reshape, exception, parameter,
phase), written for pytest and run through ``import caffe``.

As upstream, the layers live in this very module, which the prototxts name in
``python_param.module`` (imported from sys.path, as Caffe does).
"""
import os

import numpy as np
import pytest

import minicaffe  # noqa: F401  (makes ``import caffe`` reach minicaffe)
import caffe

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.path.splitext(os.path.basename(__file__))[0]


class SimpleLayer(caffe.Layer):
    """Multiplies by ten."""

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = 10 * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = 10 * top[0].diff


class ExceptionLayer(caffe.Layer):
    """Raises in setup: the error must reach the caller of caffe.Net."""

    def setup(self, bottom, top):
        raise RuntimeError


class ParameterLayer(caffe.Layer):
    """Holds one learnable blob of one element; backward writes 1 to its diff."""

    def setup(self, bottom, top):
        self.blobs.add_blob(1)
        self.blobs[0].data[0] = 0

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] = 1


class PhaseLayer(caffe.Layer):
    """Writes its phase into a scalar top."""

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape()

    def forward(self, bottom, top):
        top[0].data[()] = self.phase


HEAD = "name: 'pythonnet' force_backward: true\n"
INPUT = "input: 'data' input_shape { dim: 10 dim: 9 dim: 8 }\n"


def py_layer(name, bottom, top, cls):
    bottom = "bottom: '%s'" % bottom if bottom else ""
    return ("layer { type: 'Python' name: '%s' %s top: '%s' "
            "python_param { module: '%s' layer: '%s' } }\n" % (name, bottom, top, MODULE, cls))


@pytest.fixture(autouse=True)
def _module_on_sys_path(monkeypatch):
    monkeypatch.syspath_prepend(HERE)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
def net(tmp_path):
    text = (HEAD + INPUT + py_layer('one', 'data', 'one', 'SimpleLayer')
            + py_layer('two', 'one', 'two', 'SimpleLayer')
            + py_layer('three', 'two', 'three', 'SimpleLayer'))
    return caffe.Net(write(tmp_path, "python.prototxt", text), caffe.TRAIN)


def test_python_in_layer_type_list():
    # upstream skips the whole class where Caffe was built without Python layers
    assert 'Python' in caffe.layer_type_list()


def test_forward(net):
    x = 8
    net.blobs['data'].data[...] = x
    net.forward()
    assert net.blobs['three'].data.size == 10 * 9 * 8
    for y in net.blobs['three'].data.flat:
        assert y == 10 ** 3 * x


def test_backward(net):
    x = 7
    net.blobs['three'].diff[...] = x
    net.backward()
    for y in net.blobs['data'].diff.flat:
        assert y == 10 ** 3 * x


def test_reshape(net):
    s = 4
    net.blobs['data'].reshape(s, s, s, s)
    net.forward()
    for blob in net.blobs.values():
        assert blob.data.shape == (s, s, s, s)


def test_exception(tmp_path):
    path = write(tmp_path, "exc.prototxt",
                 HEAD + INPUT + py_layer('layer', 'data', 'top', 'ExceptionLayer'))
    with pytest.raises(RuntimeError):
        caffe.Net(path, caffe.TEST)


def test_parameter(tmp_path):
    net_file = write(tmp_path, "param.prototxt",
                     HEAD + INPUT + py_layer('layer', 'data', 'top', 'ParameterLayer'))
    net = caffe.Net(net_file, caffe.TRAIN)
    net.forward()
    net.backward()
    layer = net.layers[list(net._layer_names).index('layer')]
    assert layer.blobs[0].data[0] == 0
    assert layer.blobs[0].diff[0] == 1
    layer.blobs[0].data[0] += layer.blobs[0].diff[0]
    assert layer.blobs[0].data[0] == 1

    # saving and loading: the Python layer's blob goes through the .caffemodel
    caffemodel_file = str(tmp_path / "param.caffemodel")
    net.save(caffemodel_file)
    layer.blobs[0].data[0] = -1
    assert layer.blobs[0].data[0] == -1
    net.copy_from(caffemodel_file)
    assert layer.blobs[0].data[0] == 1

    # weight sharing: net2 takes net's blob
    net2 = caffe.Net(net_file, caffe.TRAIN)
    net2.share_with(net)
    layer2 = net2.layers[list(net2._layer_names).index('layer')]
    assert layer2.blobs[0].data[0] == 1


def test_phase(tmp_path):
    path = write(tmp_path, "phase.prototxt",
                 HEAD + py_layer('layer', None, 'phase', 'PhaseLayer'))
    for phase in caffe.TRAIN, caffe.TEST:
        net = caffe.Net(path, phase)
        assert net.forward()['phase'] == phase
