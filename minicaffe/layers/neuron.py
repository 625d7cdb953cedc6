"""Elementwise neuron layers: ReLU, Sigmoid, TanH, Dropout (Caffe's ``NeuronLayer`` family).

Each takes one bottom and gives one top of the same shape, and may run in
place (top is the bottom Blob). In place, forward overwrites the bottom data,
so backward must be written from what survives: the top data (which is the
bottom blob's data after forward) or a saved mask.

ReLU has a GPU fast path (:mod:`minicaffe.kernels.cuda_fused`): one launch
forward and one backward, with no temporary (the generic backward makes a
boolean mask first); the generic code stays the reference.
"""
from __future__ import annotations

import numpy as np

from ..kernels import cuda_fused
from ..layer import BackwardReads, Layer, register_layer
from ..proto import caffe_pb2
from ..rng import rng_for


class NeuronLayer(Layer):
    """One bottom, one top of the bottom's shape; in place allowed."""

    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        top[0].reshape_like(bottom[0])


@register_layer
class ReLULayer(NeuronLayer):
    """y = max(x, 0) + negative_slope * min(x, 0).

    Caffe's backward tests ``bottom_data > 0``. For ``negative_slope >= 0``
    the top has the sign of the bottom wherever the bottom is positive and is
    <= 0 elsewhere, so ``top_data > 0`` selects the same elements; we read the
    top, which keeps an in-place ReLU (the usual case) correct and lets the
    memory manager free the input. For ``negative_slope < 0`` that equivalence
    fails, so we read the bottom like Caffe does, which also reproduces
    Caffe's behaviour when such a layer runs in place (Caffe then reads the
    overwritten bottom, i.e. the top).
    """

    type = "ReLU"

    def layer_setup(self, bottom, top):
        self.negative_slope = float(self.param.relu_param.negative_slope)
        self._fused = cuda_fused.enabled_for(self.xp, self.dtype)  # decided once

    def _mask_source_is_top(self) -> bool:
        return self.negative_slope >= 0

    def backward_reads(self) -> BackwardReads:
        if self._mask_source_is_top():
            return BackwardReads(bottom=(), top=(0,))
        return BackwardReads(bottom=(0,), top=())

    def forward_impl(self, bottom, top):
        xp = self.xp
        x = bottom[0].data
        y = top[0].data
        if self._fused:
            cuda_fused.relu_forward(x, y, self.negative_slope)
        elif self.negative_slope == 0:
            xp.maximum(x, 0, out=y)
        else:
            # where() reads x fully before y (possibly x itself) is written.
            y[...] = xp.where(x > 0, x, x * self.dtype.type(self.negative_slope))

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        ref = top[0].data if self._mask_source_is_top() else bottom[0].data
        dy = top[0].diff
        dx = bottom[0].diff
        if self._fused:
            cuda_fused.relu_backward(ref, dy, dx, self.negative_slope)
        elif self.negative_slope == 0:
            xp.multiply(dy, ref > 0, out=dx)
        else:
            dx[...] = xp.where(ref > 0, dy, dy * self.dtype.type(self.negative_slope))


@register_layer
class SigmoidLayer(NeuronLayer):
    """y = 1 / (1 + exp(-x)); backward dy * y * (1 - y) reads only the top."""

    type = "Sigmoid"
    backward_reads_bottom = ()
    backward_reads_top = (0,)

    def forward_impl(self, bottom, top):
        xp = self.xp
        # Caffe's form 0.5 * tanh(0.5 x) + 0.5: no overflow in exp for large |x|.
        y = top[0].data
        xp.multiply(bottom[0].data, 0.5, out=y)
        xp.tanh(y, out=y)
        y *= 0.5
        y += 0.5

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data
        bottom[0].diff[...] = top[0].diff * y * (1 - y)


@register_layer
class TanHLayer(NeuronLayer):
    """y = tanh(x); backward dy * (1 - y^2) reads only the top."""

    type = "TanH"
    backward_reads_bottom = ()
    backward_reads_top = (0,)

    def forward_impl(self, bottom, top):
        self.xp.tanh(bottom[0].data, out=top[0].data)

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data
        bottom[0].diff[...] = top[0].diff * (1 - y * y)


@register_layer
class DropoutLayer(NeuronLayer):
    """TRAIN: y = x * mask / (1 - ratio), mask ~ Bernoulli(1 - ratio); TEST: y = x.

    The mask (Caffe's ``rand_vec_``, unsigned int per element, hence uint32
    here so that memory accounting matches) is a saved internal: forward draws
    it, backward applies it. A TEST-phase layer has no mask at all. Backward
    never reads data, so an in-place Dropout needs nothing but its mask.
    """

    type = "Dropout"
    backward_reads_bottom = ()
    backward_reads_top = ()

    def layer_setup(self, bottom, top):
        ratio = float(self.param.dropout_param.dropout_ratio)
        if not 0.0 < ratio < 1.0:
            raise ValueError(
                f"layer {self.name!r} of type Dropout: dropout_ratio must lie in (0, 1), "
                f"got {ratio}")
        self.ratio = ratio
        self.scale = 1.0 / (1.0 - ratio)
        self.train = self.phase == caffe_pb2.TRAIN

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if self.train:
            self.add_internal("mask", bottom[0].shape, saved=True, dtype=np.uint32)

    def forward_impl(self, bottom, top):
        if not self.train:
            if top[0] is not bottom[0]:
                top[0].data[...] = bottom[0].data
            return
        x = bottom[0].data
        y = top[0].data
        mask = self.internal("mask").data
        draw = rng_for(self.xp).random(size=x.shape, dtype=np.float32)
        mask[...] = draw >= self.ratio  # keep with probability 1 - ratio
        # dtype=: multiply in the layer's precision (uint32 x float32 would promote).
        self.xp.multiply(x, mask, out=y, dtype=self.dtype)
        y *= self.dtype.type(self.scale)

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if not self.train:
            if top[0] is not bottom[0]:
                bottom[0].diff[...] = top[0].diff
            return
        dx = bottom[0].diff
        self.xp.multiply(top[0].diff, self.internal("mask").data, out=dx, dtype=self.dtype)
        dx *= self.dtype.type(self.scale)
