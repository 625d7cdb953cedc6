"""pycaffe's own param_str test, as a spec: BVLC Caffe
python/caffe/test/test_python_layer_with_param_str.py (forward, backward, reshape of three
ElemwiseScalarLayers configured by ``param_str``), written for pytest and run through
``import caffe``.  The layer lives in this module, which the prototxt names.
"""
import os

import pytest

import minicaffe  # noqa: F401  (makes ``import caffe`` reach minicaffe)
import caffe

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.path.splitext(os.path.basename(__file__))[0]


class ElemwiseScalarLayer(caffe.Layer):
    """Adds or multiplies by a scalar, as ``param_str`` (a Python dict literal) says."""

    def setup(self, bottom, top):
        # upstream reads the attribute with its trailing underscore, param_str_
        self.layer_params_ = eval(self.param_str)
        self.value_ = self.layer_params_['value']
        op = self.layer_params_['op'].lower()
        if op == 'add':
            self._forward, self._backward = self._forward_add, self._backward_add
        elif op == 'mul':
            self._forward, self._backward = self._forward_mul, self._backward_mul
        else:
            raise ValueError("Unknown operation type: '%s'" % op)

    def _forward_add(self, bottom, top):
        top[0].data[...] = bottom[0].data + self.value_

    def _backward_add(self, bottom, propagate_down, top):
        bottom[0].diff[...] = top[0].diff

    def _forward_mul(self, bottom, top):
        top[0].data[...] = bottom[0].data * self.value_

    def _backward_mul(self, bottom, propagate_down, top):
        bottom[0].diff[...] = top[0].diff * self.value_

    def reshape(self, bottom, top):
        # the legacy 4-D accessors of a blob
        top[0].reshape(bottom[0].num, bottom[0].channels, bottom[0].height, bottom[0].width)

    def forward(self, bottom, top):
        self._forward(bottom, top)

    def backward(self, top, propagate_down, bottom):
        self._backward(bottom, propagate_down, top)


def layer(name, bottom, top, param_str):
    return ("layer { type: 'Python' name: '%s' bottom: '%s' top: '%s' python_param { "
            "module: '%s' layer: 'ElemwiseScalarLayer' param_str: \"%s\" } }\n"
            % (name, bottom, top, MODULE, param_str))


@pytest.fixture(autouse=True)
def _module_on_sys_path(monkeypatch):
    monkeypatch.syspath_prepend(HERE)


@pytest.fixture
def net(tmp_path):
    text = ("name: 'pythonnet' force_backward: true\n"
            "input: 'data' input_dim: 10 input_dim: 9 input_dim: 8 input_dim: 7\n"
            + layer('one', 'data', 'one', "{'op': 'add', 'value': 2}")
            + layer('two', 'one', 'two', "{'op': 'mul', 'value': 3}")
            + layer('three', 'two', 'three', "{'op': 'add', 'value': 10}"))
    path = tmp_path / "param_str.prototxt"
    path.write_text(text)
    return caffe.Net(str(path), caffe.TRAIN)


def test_forward(net):
    x = 8
    net.blobs['data'].data[...] = x
    net.forward()
    assert net.blobs['three'].data.shape == (10, 9, 8, 7)
    for y in net.blobs['three'].data.flat:
        assert y == (x + 2) * 3 + 10


def test_backward(net):
    x = 7
    net.blobs['three'].diff[...] = x
    net.backward()
    for y in net.blobs['data'].diff.flat:
        assert y == 3 * x


def test_reshape(net):
    s = 4
    net.blobs['data'].reshape(s, s, s, s)
    net.forward()
    for blob in net.blobs.values():
        assert blob.data.shape == (s, s, s, s)
