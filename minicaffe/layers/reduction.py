"""Reduction and ArgMax, as Caffe's ``reduction_layer.cpp`` and ``argmax_layer.cpp``."""
from __future__ import annotations

from math import prod

import numpy as np

from ..layer import BackwardReads, Layer, register_layer
from ..proto import caffe_pb2

_Op = caffe_pb2.ReductionParameter
_OP_NAMES = {_Op.SUM: "SUM", _Op.ASUM: "ASUM", _Op.SUMSQ: "SUMSQ", _Op.MEAN: "MEAN"}


@register_layer
class ReductionLayer(Layer):
    """Reduce every axis from ``axis`` on (default 0: all, a scalar top) to one number.

    The bottom is viewed as (num, dim), num = the count before ``axis``, dim =
    the count from it; the top keeps the axes before ``axis`` (Caffe reduces
    only tail axes). Per row: SUM sum(x), ASUM sum(|x|), SUMSQ sum(x^2), MEAN
    sum(x)/dim, each times ``coeff`` (default 1; Caffe folds MEAN's 1/dim into
    it). Backward, with g = dy * coeff per row: SUM and MEAN g, ASUM
    sign(x) * g (sign(0) = 0), SUMSQ 2 x g; only ASUM and SUMSQ read the bottom.
    """

    type = "Reduction"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        self.op = self.param.reduction_param.operation
        if self.op not in _OP_NAMES:
            raise ValueError(
                f"layer {self.name!r} of type Reduction: unknown reduction op {self.op} "
                f"(known: {', '.join(f'{v} ({k})' for k, v in _OP_NAMES.items())})")

    def reshape(self, bottom, top):
        b = bottom[0]
        p = self.param.reduction_param
        self.axis = self.canonical_axis(b, p.axis)
        self.num = prod(b.shape[:self.axis])
        self.dim = prod(b.shape[self.axis:])
        top[0].reshape(b.shape[:self.axis])
        dt = self.dtype.type
        # Caffe's coeff_ is a Dtype; MEAN divides it by dim (coeff_ /= dim_).
        self.coeff = dt(p.coeff) / dt(self.dim) if self.op == _Op.MEAN else dt(p.coeff)

    def backward_reads(self) -> BackwardReads:
        return BackwardReads(bottom=(0,) if self.op in (_Op.ASUM, _Op.SUMSQ) else ())

    def forward_impl(self, bottom, top):
        xp = self.xp
        x = bottom[0].data.reshape(self.num, self.dim)
        y = top[0].data.reshape(self.num)
        if self.op in (_Op.SUM, _Op.MEAN):
            x.sum(axis=1, out=y)
        elif self.op == _Op.ASUM:
            xp.abs(x).sum(axis=1, out=y)
        else:  # SUMSQ
            (x * x).sum(axis=1, out=y)
        if self.coeff != 1:
            y *= self.coeff

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        g = (top[0].diff.reshape(self.num, 1) * self.coeff)  # (num, 1): dy * coeff per row
        dx = bottom[0].diff.reshape(self.num, self.dim)
        if self.op in (_Op.SUM, _Op.MEAN):
            dx[...] = g
        elif self.op == _Op.ASUM:
            xp.sign(bottom[0].data.reshape(self.num, self.dim), out=dx)
            dx *= g
        else:  # SUMSQ
            xp.multiply(bottom[0].data.reshape(self.num, self.dim), 2 * g, out=dx)

    def flops(self, bottom, top):
        n = float(bottom[0].count)
        return (2.0 * n if self.op in (_Op.ASUM, _Op.SUMSQ) else n), n


@register_layer
class ArgMaxLayer(Layer):
    """The indices (or values) of the ``top_k`` largest entries.

    With ``axis``: along that axis; the top is the bottom's shape with the axis
    cut to top_k, holding indices, or with ``out_max_val`` the values instead.
    Without ``axis``: over all axes after the first, per item; the top is
    (N, 1, top_k) padded with ones to the bottom's number of axes (at least 3),
    holding indices, or with ``out_max_val`` (N, 2, top_k, ...): indices in
    channel 0, values in channel 1. Indices are stored as the blob's float type.

    Caffe sorts (value, index) pairs with ``std::greater``: equal values rank
    the larger index first, so a tie's argmax is its last position; kept here.
    No backward (Caffe's is NOT_IMPLEMENTED); ``allow_force_backward`` refuses.
    """

    type = "ArgMax"
    exact_num_bottom = 1
    exact_num_top = 1
    backward_reads_bottom = ()

    def layer_setup(self, bottom, top):
        p = self.param.argmax_param
        self.out_max_val = bool(p.out_max_val)
        self.top_k = int(p.top_k)
        self.has_axis = p.HasField("axis")
        if self.top_k < 1:
            raise ValueError(
                f"layer {self.name!r} of type ArgMax: top k must not be less than 1, got "
                f"{self.top_k}")

    def allow_force_backward(self, bottom_index: int) -> bool:
        return False

    def reshape(self, bottom, top):
        b = bottom[0]
        if self.has_axis:
            self.axis = self.canonical_axis(b, self.param.argmax_param.axis)
            self.outer = prod(b.shape[:self.axis])
            self.dim = b.shape[self.axis]
            self.inner = prod(b.shape[self.axis + 1:])
            if self.top_k > self.dim:
                raise ValueError(
                    f"layer {self.name!r} of type ArgMax: top_k ({self.top_k}) must be less than "
                    f"or equal to the dimension of axis {self.axis} ({self.dim}) of bottom "
                    f"{b.name!r} of shape {b.shape}")
            shape = list(b.shape)
            shape[self.axis] = self.top_k
        else:
            if b.ndim == 0:
                raise ValueError(
                    f"layer {self.name!r} of type ArgMax: bottom {b.name!r} has no axes")
            self.outer = b.shape[0]
            self.dim = b.count_range(1)
            self.inner = 1
            if self.top_k > self.dim:
                raise ValueError(
                    f"layer {self.name!r} of type ArgMax: top_k ({self.top_k}) must be less than "
                    f"or equal to the dimension of the flattened bottom blob per instance "
                    f"({self.dim}; bottom {b.name!r} of shape {b.shape})")
            shape = [1] * max(b.ndim, 3)
            shape[0] = b.shape[0]
            shape[1] = 2 if self.out_max_val else 1
            shape[2] = self.top_k
        top[0].reshape(shape)

    def _ranked(self, x):
        """Indices (outer, top_k, inner) of the top_k largest along axis 1 of ``x``
        (outer, dim, inner), ties ranked by the larger index first (Caffe's order)."""
        xp = self.xp
        flipped = x[:, ::-1, :]  # position j holds index dim-1-j: the first tie is the last
        if self.top_k == 1:
            pos = xp.argmax(flipped, axis=1)[:, None, :]
        else:
            # a stable sort of -x keeps ties in flipped order.  CuPy's argsort is always
            # stable (thrust) and older releases refuse a ``kind`` keyword, so it goes to
            # NumPy alone.
            stable = {"kind": "stable"} if xp is np else {}
            pos = xp.argsort(-flipped, axis=1, **stable)[:, :self.top_k, :]
        return (self.dim - 1) - pos

    def forward_impl(self, bottom, top):
        xp = self.xp
        x = bottom[0].data.reshape(self.outer, self.dim, self.inner)
        idx = self._ranked(x)
        if self.has_axis:
            y = top[0].data.reshape(self.outer, self.top_k, self.inner)
            y[...] = xp.take_along_axis(x, idx, axis=1) if self.out_max_val else idx
            return
        y = top[0].data.reshape(self.outer, -1)  # (N, top_k) or (N, 2 * top_k)
        y[:, :self.top_k] = idx[:, :, 0]
        if self.out_max_val:
            y[:, self.top_k:] = xp.take_along_axis(x, idx, axis=1)[:, :, 0]

    def flops(self, bottom, top):
        return float(bottom[0].count), 0.0
