"""Softmax and SoftmaxWithLoss, as Caffe's ``softmax_layer.cpp`` and ``softmax_loss_layer.cpp``.

Both work on the bottom viewed as (outer, C, inner) around the softmax axis
(default 1): an (N, C, H, W) bottom gives one distribution over C for each of
the N*H*W positions.

With the CUDNN engine (``softmax_param.engine``; see :mod:`minicaffe.engine`)
the softmax of both layers, and the Softmax layer's backward, run through
cuDNN (``CUDNN_SOFTMAX_ACCURATE``: the maximum is subtracted first, as here) on
the (outer, C, inner, 1) view, which covers every axis; a view of more than
2^31-1 elements (cuDNN's legacy limit) runs the CAFFE engine, decided at reshape.
SoftmaxWithLoss's backward is the same elementwise formula for both engines.
"""
from __future__ import annotations

from math import prod

import numpy as np

from .. import engine as engines
from ..cudnn import ops as cudnn_ops
from ..layer import Layer, register_layer
from ..proto import caffe_pb2

# Caffe clips probabilities at FLT_MIN before the log, in float and double alike.
FLT_MIN = float(np.finfo(np.float32).tiny)

_Norm = caffe_pb2.LossParameter


def _axis_dims(layer, blob, axis: int) -> tuple:
    """(axis, outer, C, inner) for a softmax over ``axis`` of ``blob``."""
    axis = layer.canonical_axis(blob, axis)
    return axis, prod(blob.shape[:axis]), blob.shape[axis], prod(blob.shape[axis + 1:])


_CUDNN_MAX_ELEMENTS = (1 << 31) - 1  # the legacy API's int tensor sizes


def _setup_engine(layer):
    """Resolve ``softmax_param.engine`` once (layer_setup)."""
    layer.engine = engines.resolve(layer, "softmax_param")
    if layer.engine == engines.CUDNN and layer.dtype not in (np.float32, np.float64):
        engines.fall_back(layer, f"cuDNN softmax takes float32 or float64, not {layer.dtype}")


def _check_cudnn_shape(layer):
    """At reshape: the (outer, C, inner, 1) view must fit cuDNN's int sizes (else CAFFE)."""
    if layer.engine == engines.CUDNN and layer.outer * layer.c * layer.inner > _CUDNN_MAX_ELEMENTS:
        engines.fall_back(layer, f"the ({layer.outer}, {layer.c}, {layer.inner}) softmax view "
                                 "exceeds cuDNN's 2^31-1 elements")


def softmax(xp, x, out):
    """Softmax over axis 1 of an (outer, C, inner) array, written into ``out``.

    The maximum is subtracted first (as Caffe does) so exp never overflows;
    ``out`` may be ``x`` itself.
    """
    m = x.max(axis=1, keepdims=True)
    xp.subtract(x, m, out=out)
    xp.exp(out, out=out)
    out /= out.sum(axis=1, keepdims=True)
    return out


@register_layer
class SoftmaxLayer(Layer):
    """y = exp(x) / sum_c exp(x_c) along ``softmax_param.axis``.

    Backward dx = (dy - sum_c(dy * y)) * y reads only the top data, so the
    layer works in place and its input can be freed after forward.
    """

    type = "Softmax"
    exact_num_bottom = 1
    exact_num_top = 1
    backward_reads_bottom = ()
    backward_reads_top = (0,)
    engine = engines.CAFFE

    def layer_setup(self, bottom, top):
        _setup_engine(self)

    def reshape(self, bottom, top):
        _, self.outer, self.c, self.inner = _axis_dims(self, bottom[0],
                                                       self.param.softmax_param.axis)
        top[0].reshape_like(bottom[0])
        _check_cudnn_shape(self)

    def _view(self, a):
        return a.reshape(self.outer, self.c, self.inner)

    def forward_impl(self, bottom, top):
        if self.engine == engines.CUDNN:  # in place is fine (y may be x)
            cudnn_ops.softmax_forward(self._view(bottom[0].data), self._view(top[0].data), 1)
            return
        softmax(self.xp, self._view(bottom[0].data), self._view(top[0].data))

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.engine == engines.CUDNN:  # dx may be dy (in place)
            cudnn_ops.softmax_backward(self._view(top[0].data), self._view(top[0].diff),
                                       self._view(bottom[0].diff), 1)
            return
        y = self._view(top[0].data)
        dy = self._view(top[0].diff)
        dot = (dy * y).sum(axis=1, keepdims=True)  # (outer, 1, inner)
        dx = self._view(bottom[0].diff)
        self.xp.subtract(dy, dot, out=dx)  # safe when dx is dy (in place)
        dx *= y

    def flops(self, bottom, top):
        n = float(top[0].count)
        return 4.0 * n, 4.0 * n


def normalizer(xp, mode: int, outer: int, inner: int, valid_count):
    """Caffe's SoftmaxWithLossLayer::get_normalizer, as a device scalar.

    ``valid_count`` is a device scalar (the number of non-ignored labels); the
    result is at least 1, so a batch whose labels are all ignored gives a
    zero loss, not NaN.
    """
    if mode == _Norm.FULL:
        n = float(outer * inner)
    elif mode == _Norm.VALID:
        return xp.maximum(valid_count, 1)
    elif mode == _Norm.BATCH_SIZE:
        n = float(outer)
    elif mode == _Norm.NONE:
        n = 1.0
    else:
        raise ValueError(f"unknown loss normalization mode {mode}")
    return max(n, 1.0)


def masked_normalizer(layer, valid):
    """:func:`normalizer` for a loss layer (``xp``, ``normalization``, ``outer``, ``inner``,
    ``dtype``) whose counted elements are ``valid`` (a device mask; None: all of them)."""
    if valid is None:
        # full(), not asarray(): a fill kernel, no host-to-device copy
        count = layer.xp.full((), float(layer.outer * layer.inner), dtype=layer.dtype)
    else:
        count = valid.sum().astype(layer.dtype)
    return normalizer(layer.xp, layer.normalization, layer.outer, layer.inner, count)


def normalization_mode(layer) -> int:
    """LossParameter.normalization, or the legacy ``normalize`` when only it is set."""
    lp = layer.param.loss_param
    if not lp.HasField("normalization") and lp.HasField("normalize"):
        return _Norm.VALID if lp.normalize else _Norm.BATCH_SIZE
    return lp.normalization


def check_label_range(layer, blob, label, classes: int, ignore_label):
    """Caffe's DCHECK_GE(label_value, 0) and DCHECK_LT(label_value, classes): a label out of
    range is the user's data (a class count that does not match num_output), so it gets an
    error naming the layer, the blob and the range instead of NumPy's IndexError.

    Host arrays only: on the GPU the check would be a device-to-host sync on every
    iteration, so there an out-of-range label is not caught (as in Caffe's release builds).
    """
    if not isinstance(label, np.ndarray) or label.size == 0:
        return
    bad = (label < 0) | (label >= classes)
    if ignore_label is not None:
        bad &= label != ignore_label
    if bad.any():
        raw = blob.data.reshape(label.shape)[bad].flat[0]     # NaN shows as nan, not as -2^63
        value = int(raw) if np.isfinite(raw) and raw == int(raw) else raw
        ignore = f" or ignore_label {ignore_label}" if ignore_label is not None else ""
        raise ValueError(
            f"layer {layer.name!r} of type {layer.type}: label {value} in bottom {blob.name!r} "
            f"is out of range: the scores have {classes} classes, so labels must be 0 to "
            f"{classes - 1}{ignore} (does num_output match the data's labels?)")


@register_layer
class SoftmaxWithLossLayer(Layer):
    """Multinomial logistic loss of the softmax of bottom[0] against integer labels bottom[1].

    loss = -sum over non-ignored positions of log(max(p[label], FLT_MIN)),
    divided by the normalizer of ``loss_param.normalization`` (FULL:
    outer*inner, VALID (default): the count of non-ignored labels, BATCH_SIZE:
    outer, NONE: 1; never below 1). An optional second top receives the
    probabilities. The probabilities are kept as the saved internal ``prob``
    (Caffe's ``prob_``); backward reads them and the labels:
    dx = (prob - onehot(label)) * loss_weight / normalizer, zero at ignored
    positions. Labels get no gradient.
    """

    type = "SoftmaxWithLoss"
    exact_num_bottom = 2
    min_num_top = 1
    max_num_top = 2
    is_loss = True
    backward_reads_bottom = (1,)
    engine = engines.CAFFE

    def layer_setup(self, bottom, top):
        _setup_engine(self)  # of its softmax (Caffe builds it from the same softmax_param)
        lp = self.param.loss_param
        self.ignore_label = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.normalization = normalization_mode(self)
        if self.normalization not in (_Norm.FULL, _Norm.VALID, _Norm.BATCH_SIZE, _Norm.NONE):
            raise ValueError(
                f"layer {self.name!r} of type SoftmaxWithLoss: unknown normalization mode "
                f"{self.normalization}")

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def reshape(self, bottom, top):
        b, label = bottom
        if b.ndim and label.ndim and b.shape[0] != label.shape[0]:
            raise ValueError(
                f"layer {self.name!r} of type SoftmaxWithLoss: the data and label should have "
                f"the same first dimension: bottom {b.name!r} has shape {b.shape}, bottom "
                f"{label.name!r} has shape {label.shape}")
        _, self.outer, self.c, self.inner = _axis_dims(self, b, self.param.softmax_param.axis)
        if self.outer * self.inner != label.count:
            raise ValueError(
                f"layer {self.name!r} of type SoftmaxWithLoss: number of labels must match number "
                f"of predictions; bottom {b.name!r} of shape {b.shape} with softmax axis "
                f"{self.param.softmax_param.axis} needs {self.outer * self.inner} labels, bottom "
                f"{label.name!r} of shape {label.shape} has {label.count}")
        top[0].reshape(())
        # (N, C, H, W): the softmax of bottom[0], kept for backward.
        self.add_internal("prob", b.shape, saved=True)
        _check_cudnn_shape(self)
        if len(top) > 1:
            top[1].reshape_like(b)

    def _labels(self, bottom):
        """(labels clipped to a valid index, valid mask), both (outer, 1, inner)."""
        xp = self.xp
        label = bottom[1].data.reshape(self.outer, 1, self.inner).astype(xp.int64)
        check_label_range(self, bottom[1], label, self.c, self.ignore_label)
        if self.ignore_label is None:
            return label, None
        valid = label != self.ignore_label
        return xp.where(valid, label, 0), valid

    def _valid_count(self, valid):
        if valid is None:
            # full(), not asarray(): a fill kernel, where asarray would copy a host value
            # (a copy that a captured CUDA graph would replay from a stale staging buffer)
            return self.xp.full((), float(self.outer * self.inner), dtype=self.dtype)
        return valid.sum().astype(self.dtype)

    def forward_impl(self, bottom, top):
        xp = self.xp
        prob_blob = self.internal("prob")
        if self.engine == engines.CUDNN:
            prob = cudnn_ops.softmax_forward(
                bottom[0].data.reshape(self.outer, self.c, self.inner),
                prob_blob.data.reshape(self.outer, self.c, self.inner), 1)
        else:
            prob = softmax(xp, bottom[0].data.reshape(self.outer, self.c, self.inner),
                           prob_blob.data.reshape(self.outer, self.c, self.inner))
        label, valid = self._labels(bottom)
        p = xp.take_along_axis(prob, label, axis=1)  # (outer, 1, inner)
        logp = xp.log(xp.maximum(p, self.dtype.type(FLT_MIN)))
        if valid is not None:
            logp = xp.where(valid, logp, 0)
        norm = normalizer(xp, self.normalization, self.outer, self.inner,
                          self._valid_count(valid))
        top[0].data[...] = -logp.sum() / norm
        if len(top) > 1:
            top[1].data[...] = prob_blob.data

    def backward_impl(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise ValueError(
                f"layer {self.name!r} of type SoftmaxWithLoss: cannot backpropagate to label "
                f"inputs (bottom {bottom[1].name!r})")
        if not propagate_down[0]:
            return
        xp = self.xp
        prob = self.internal("prob").data.reshape(self.outer, self.c, self.inner)
        label, valid = self._labels(bottom)
        dx = bottom[0].diff.reshape(self.outer, self.c, self.inner)
        classes = xp.arange(self.c).reshape(1, self.c, 1)
        xp.subtract(prob, classes == label, out=dx, dtype=self.dtype)
        if valid is not None:
            dx *= valid
        norm = normalizer(xp, self.normalization, self.outer, self.inner,
                          self._valid_count(valid))
        # The loss weight lives in the top diff (Caffe's convention); stays on device.
        dx *= (top[0].diff.reshape(-1)[0] / norm).astype(self.dtype)
