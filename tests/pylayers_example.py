"""Python layers for tests/test_python_layer.py, written pycaffe's way (``class L(caffe.Layer)``
with setup/reshape/forward/backward).  Prototxts name this module in ``python_param.module``;
it is imported from sys.path (tests/ is on it), as Caffe imports a Python layer's module.

SimpleLayer, SimpleParamLayer, PhaseLayer, ParameterLayer, ExceptionLayer and
SimpleDataLayer follow BVLC Caffe's python/caffe/test/test_python_layer*.py;
EuclideanLossLayer follows examples/pycaffe/layers/pyloss.py, scaled by the loss weight.
Every layer uses array methods only, so that it runs on NumPy and CuPy blobs alike.
"""
import json

import minicaffe as caffe


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


class SimpleParamLayer(caffe.Layer):
    """Multiplies by the number its param_str holds."""

    def setup(self, bottom, top):
        try:
            self.value = float(self.param_str)
        except ValueError:
            raise ValueError("Parameter string must be a legible float") from None

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.value * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = self.value * top[0].diff


class PhaseLayer(caffe.Layer):
    """Writes its phase (caffe.TRAIN or caffe.TEST) into a 0-axis top."""

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape()

    def forward(self, bottom, top):
        top[0].data[()] = self.phase


class ParameterLayer(caffe.Layer):
    """One learnable scalar (add_blob(1)) whose gradient is always 1."""

    def setup(self, bottom, top):
        self.blobs.add_blob(1)
        self.blobs[0].data[0] = 0

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] = 1


class ExceptionLayer(caffe.Layer):
    """Fails in setup."""

    def setup(self, bottom, top):
        raise RuntimeError("ExceptionLayer refuses to set up")


class ForwardFailsLayer(SimpleLayer):
    """Sets up, then fails in forward."""

    def forward(self, bottom, top):
        raise KeyError("no such thing")


class NoForwardLayer(caffe.Layer):
    """Forgets forward."""

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].shape)


class NotALayer:
    """Not derived from caffe.Layer."""

    def setup(self, bottom, top):
        pass


class SimpleDataLayer(caffe.Layer):
    """Outputs 0, 1, 2, ..., max - 1, 0, 1, ... batch_size at a time; shapes its top once."""

    def setup(self, bottom, top):
        self.max = 1000
        self.batch_size = 10
        top[0].reshape(self.batch_size)
        self.current_index = 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        nxt = self.current_index + self.batch_size
        top[0].data[...] = self.xp.arange(self.current_index, nxt) % self.max
        self.current_index = nxt % self.max

    def backward(self, top, propagate_down, bottom):
        pass


class AffineLayer(caffe.Layer):
    """y = x * scale[c] + bias[c] over axis 1 (Caffe's Scale layer with bias_term), with
    two learnable blobs of shape (C,).  param_str is JSON: {"scale": s0, "bias": b0}, the
    initial values (default 1 and 0).

    bottom[0]: (N, C, ...); top[0]: the same shape.
    """

    def setup(self, bottom, top):
        init = json.loads(self.param_str or "{}")
        channels = bottom[0].shape[1]
        self.blobs.add_blob(channels)
        self.blobs.add_blob(channels)
        self.blobs[0].data[...] = init.get("scale", 1.0)
        self.blobs[1].data[...] = init.get("bias", 0.0)

    def reshape(self, bottom, top):
        if bottom[0].shape[1] != self.blobs[0].count:
            raise ValueError(f"bottom has {bottom[0].shape[1]} channels, the layer "
                             f"{self.blobs[0].count}")
        top[0].reshape(*bottom[0].shape)

    def _per_channel(self, blob, ndim):
        # (C,) -> (1, C, 1, ...) to broadcast over (N, C, ...)
        return blob.data.reshape((1, -1) + (1,) * (ndim - 2))

    def forward(self, bottom, top):
        x = bottom[0].data
        top[0].data[...] = x * self._per_channel(self.blobs[0], x.ndim) \
            + self._per_channel(self.blobs[1], x.ndim)

    def backward(self, top, propagate_down, bottom):
        dy, x = top[0].diff, bottom[0].data
        axes = (0,) + tuple(range(2, x.ndim))
        # parameter diffs accumulate, as every Caffe layer's
        self.blobs[0].diff[...] += (dy * x).sum(axis=axes)
        self.blobs[1].diff[...] += dy.sum(axis=axes)
        if propagate_down[0]:
            bottom[0].diff[...] = dy * self._per_channel(self.blobs[0], x.ndim)


class EuclideanLossLayer(caffe.Layer):
    """loss = sum((a - b)^2) / (2 N); keeps a - b as its own array between forward and
    backward (memory no plan sees).  Give it ``loss_weight: 1`` in the prototxt."""

    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise ValueError("Need two inputs to compute distance.")

    def reshape(self, bottom, top):
        if bottom[0].count != bottom[1].count:
            raise ValueError("Inputs must have the same dimension.")
        top[0].reshape(1)

    def forward(self, bottom, top):
        self.diff = bottom[0].data - bottom[1].data.reshape(bottom[0].shape)
        top[0].data[...] = (self.diff ** 2).sum() / bottom[0].num / 2

    def backward(self, top, propagate_down, bottom):
        weight = top[0].diff[0]          # the loss weight (or a gradient check's projection)
        for i, sign in ((0, 1), (1, -1)):
            if propagate_down[i]:
                bottom[i].diff[...] = (sign * weight / bottom[i].num * self.diff).reshape(
                    bottom[i].shape)


class RoidbLayer(caffe.Layer):
    """A data layer fed from outside by a method of its own, as py-faster-rcnn's RoIDataLayer
    is (``solver.net.layers[0].set_roidb(roidb)``)."""

    def setup(self, bottom, top):
        self.rows = [0.0]         # until the caller sets them

    def set_rows(self, rows):
        self.rows = rows

    def reshape(self, bottom, top):
        top[0].reshape(len(self.rows), 1)

    def forward(self, bottom, top):
        top[0].data[:, 0] = self.rows

    def backward(self, top, propagate_down, bottom):
        pass
