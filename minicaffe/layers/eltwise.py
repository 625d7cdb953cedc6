"""Eltwise, as Caffe's ``eltwise_layer.cpp``: PROD, SUM (with coefficients) or MAX of bottoms.

SUM has a GPU fast path (:mod:`minicaffe.kernels.cuda_fused`): one launch per
pair of bottoms forward (the usual residual sum of two bottoms: one launch
instead of two) and backward (both bottom diffs from one read of the top diff);
the generic code stays the reference.
"""
from __future__ import annotations

import numpy as np

from ..kernels import cuda_fused
from ..layer import BackwardReads, Layer, register_layer
from ..proto import caffe_pb2

_Op = caffe_pb2.EltwiseParameter
_OP_NAMES = {_Op.PROD: "PROD", _Op.SUM: "SUM", _Op.MAX: "MAX"}


@register_layer
class EltwiseLayer(Layer):
    """Elementwise combination of two or more bottoms of one shape.

    SUM: y = sum_i coeff_i x_i; backward reads nothing.
    PROD: y = prod_i x_i; backward of bottom i is dy * prod_{j != i} x_j
    (``stable_prod_grad``, the default) or dy * y / x_i, so it reads the
    bottoms (and the top in the second form).
    MAX: y = max_i x_i, with the winning bottom index saved as the internal
    ``mask`` (Caffe's ``max_idx_``, one int per element); backward routes dy to
    the winner. Caffe's tie rule: between bottoms 0 and 1 a tie goes to bottom
    1 (it tests ``x0 > x1``), a later bottom wins only when strictly greater.
    """

    type = "Eltwise"
    min_num_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.eltwise_param
        self.op = p.operation
        if self.op not in _OP_NAMES:
            raise ValueError(f"layer {self.name!r} of type Eltwise: unknown operation {self.op}")
        if len(p.coeff) not in (0, len(bottom)):
            raise ValueError(
                f"layer {self.name!r} of type Eltwise: takes one coefficient per bottom blob "
                f"({len(bottom)} bottoms, {len(p.coeff)} coeffs)")
        if self.op == _Op.PROD and len(p.coeff):
            raise ValueError(
                f"layer {self.name!r} of type Eltwise: only takes coefficients for summation "
                "(operation SUM), not for PROD")
        self.coeffs = [float(c) for c in p.coeff] if len(p.coeff) else [1.0] * len(bottom)
        self.stable_prod_grad = bool(p.stable_prod_grad)
        # decided once: fused CUDA kernels for SUM in GPU mode when they compile
        self._fused = self.op == _Op.SUM and cuda_fused.enabled_for(self.xp, self.dtype)

    def reshape(self, bottom, top):
        first = bottom[0]
        for b in bottom[1:]:
            if b.shape != first.shape:
                raise ValueError(
                    f"layer {self.name!r} of type Eltwise: all bottoms must have the same shape: "
                    f"bottom {first.name!r} has shape {first.shape}, bottom {b.name!r} has shape "
                    f"{b.shape}")
        top[0].reshape_like(first)
        if self.op == _Op.MAX:
            # (N, C, H, W) int32: index of the winning bottom per element.
            self.add_internal("mask", first.shape, saved=True, dtype=np.int32)

    def backward_reads(self) -> BackwardReads:
        if self.op == _Op.SUM:
            return BackwardReads()
        if self.op == _Op.MAX:
            return BackwardReads(internals=("mask",))
        bottoms = tuple(range(self._num_bottom))
        return BackwardReads(bottom=bottoms, top=() if self.stable_prod_grad else (0,))

    def forward_impl(self, bottom, top):
        xp = self.xp
        y = top[0].data
        if self._fused:
            # y = c0*x0 + c1*x1, then y += c_i*x_i per further bottom, as below
            cuda_fused.eltwise_sum2(bottom[0].data, self.coeffs[0], bottom[1].data,
                                    self.coeffs[1], y)
            for b, c in zip(bottom[2:], self.coeffs[2:]):
                cuda_fused.eltwise_sum2(y, 1.0, b.data, c, y)
        elif self.op == _Op.PROD:
            xp.multiply(bottom[0].data, bottom[1].data, out=y)
            for b in bottom[2:]:
                y *= b.data
        elif self.op == _Op.SUM:
            xp.multiply(bottom[0].data, self.dtype.type(self.coeffs[0]), out=y)
            for b, c in zip(bottom[1:], self.coeffs[1:]):
                if c == 1.0:
                    y += b.data
                else:
                    y += b.data * self.dtype.type(c)
        else:
            mask = self.internal("mask").data
            a, b1 = bottom[0].data, bottom[1].data
            mask[...] = 1
            xp.copyto(mask, np.int32(0), where=a > b1)
            xp.maximum(a, b1, out=y)
            for i, b in enumerate(bottom[2:], start=2):
                xp.copyto(mask, np.int32(i), where=b.data > y)
                xp.maximum(y, b.data, out=y)

    def backward_impl(self, top, propagate_down, bottom):
        xp = self.xp
        dy = top[0].diff
        # In place with a coefficient other than 1 the loop below rescales dy itself
        # before later bottoms read it (as Caffe's loop does): keep that order there.
        if self._fused and (all(c == 1.0 for c in self.coeffs)
                            or not any(b is top[0] for b in bottom)):
            outs = [(b.diff, c) for b, c, prop in zip(bottom, self.coeffs, propagate_down)
                    if prop]
            for k in range(0, len(outs), 2):
                (dx0, c0), (dx1, c1) = outs[k], (outs[k + 1] if k + 1 < len(outs)
                                                 else (None, 1.0))
                cuda_fused.eltwise_sum_backward2(dy, dx0, c0, dx1, c1)
            return
        for i, (b, prop) in enumerate(zip(bottom, propagate_down)):
            if not prop:
                continue
            dx = b.diff
            if self.op == _Op.PROD:
                if self.stable_prod_grad:
                    others = [o.data for j, o in enumerate(bottom) if j != i]
                    dx[...] = others[0]
                    for o in others[1:]:
                        dx *= o
                else:
                    xp.divide(top[0].data, b.data, out=dx)
                dx *= dy
            elif self.op == _Op.SUM:
                c = self.coeffs[i]
                if c == 1.0:
                    dx[...] = dy
                else:
                    xp.multiply(dy, self.dtype.type(c), out=dx)
            else:
                xp.multiply(dy, self.internal("mask").data == i, out=dx)
