"""Scale and Bias: broadcast a (learned or given) operand along trailing axes.

Both follow Caffe's axis convention: the operand's shape must equal
``bottom[0].shape[axis : axis + operand.ndim]``; it is broadcast over the
``outer`` axes before ``axis`` and the ``inner`` axes after it. Viewing the
bottom as (outer, dim, inner) makes every op one broadcast. A 0-d (scalar)
operand is applied with axis 0, as Caffe does, whatever ``axis`` says.

With one bottom the operand is a learned blob of shape
``bottom[0].shape[axis : axis + num_axes]`` (``num_axes: -1`` runs to the end);
with two bottoms ``bottom[1]`` is the operand and receives the gradient.

GPU fast path of Scale (:mod:`minicaffe.kernels.cuda_fused`): in GPU mode, when
the fused kernels compile, forward is one launch (the in-place copy, the product
and the bias together) and backward two (one pass over the top diff that writes
the bottom diff and per-block partial sums of ``dy * x`` and ``dy``, then one
thread per channel that finishes the parameter gradients), for every
axis/num_axes and one or two bottoms, as long as the bias (if any) broadcasts
like the scale (always so in Caffe) and the operand has at most 65535 elements.
The generic code stays the reference.
"""
from __future__ import annotations

from math import prod

import numpy as np

from ..fillers import fill
from ..kernels import cuda_fused
from ..layer import BackwardReads, Layer, register_layer
from ..proto import caffe_pb2


def operand_shape(layer, bottom, axis: int, num_axes: int, what: str) -> tuple:
    """Shape of a learned operand: ``bottom.shape[axis : axis + num_axes]``."""
    axis = layer.canonical_axis(bottom, axis)
    if num_axes < -1:
        raise ValueError(
            f"layer {layer.name!r} of type {layer.type}: num_axes must be non-negative, or -1 to "
            f"extend to the end of bottom[0]; got {num_axes}")
    if num_axes >= 0 and bottom.ndim < axis + num_axes:
        raise ValueError(
            f"layer {layer.name!r} of type {layer.type}: {what} blob's shape extends past bottom "
            f"{bottom.name!r}'s shape {bottom.shape} when applied starting with axis {axis} "
            f"(num_axes {num_axes})")
    end = bottom.ndim if num_axes == -1 else axis + num_axes
    return tuple(bottom.shape[axis:end])


def broadcast_dims(layer, bottom, shape: tuple, axis: int, what: str) -> tuple:
    """(outer, dim, inner) for applying an operand of ``shape`` to ``bottom``."""
    axis = 0 if len(shape) == 0 else layer.canonical_axis(bottom, axis)
    if bottom.ndim < axis + len(shape):
        raise ValueError(
            f"layer {layer.name!r} of type {layer.type}: {what} of shape {shape} extends past "
            f"bottom {bottom.name!r}'s shape {bottom.shape} when applied starting with axis {axis}")
    for i, d in enumerate(shape):
        if bottom.shape[axis + i] != d:
            raise ValueError(
                f"layer {layer.name!r} of type {layer.type}: dimension mismatch between bottom "
                f"{bottom.name!r}.shape[{axis + i}] = {bottom.shape[axis + i]} and "
                f"{what}.shape[{i}] = {d} (bottom shape {bottom.shape}, {what} shape {shape}, "
                f"axis {axis})")
    return (prod(bottom.shape[:axis]), prod(shape), prod(bottom.shape[axis + len(shape):]))


def _default_filler(value: float):
    f = caffe_pb2.FillerParameter()
    f.type = "constant"
    f.value = value
    return f


@register_layer
class ScaleLayer(Layer):
    """y = x * scale (+ bias), scale broadcast as described in the module doc.

    Params: ``blobs[0]`` the scale (one bottom only, filler default constant 1),
    then the bias when ``bias_term`` (filler ``bias_filler``, default constant 0),
    in Caffe's order. Backward reads the scale operand (bottom[1] when given)
    for the bottom gradient and the input ``x`` for the scale gradient: the
    bottom data, or when in place a saved copy of it (Caffe's ``temp_``),
    since forward overwrites the bottom. A learned scale's diff accumulates over
    backward calls, except where Caffe overwrites it (an outer dimension of 1:
    see ``reshape``).
    """

    type = "Scale"
    min_num_bottom = 1
    max_num_bottom = 2
    exact_num_top = 1
    # The BatchNorm layer this one is fused into (see minicaffe/layers/batchnorm.py),
    # or None; then forward does nothing and backward sums both layers' gradients.
    fused_bn = None
    # Set by a paired backward when it left BatchNorm's sums in its workspace.

    def layer_setup(self, bottom, top):
        p = self.param.scale_param
        self.blobs = []
        if len(bottom) == 1:
            shape = operand_shape(self, bottom[0], p.axis, p.num_axes, "scale")
            scale = self.make_param_blob(shape, 0)
            fill(scale, p.filler if p.HasField("filler") else _default_filler(1.0),
                 where=f"layer {self.name!r}: ")
            self.blobs.append(scale)
        self.bias_term = bool(p.bias_term)
        if self.bias_term:
            # Caffe's internal Bias layer: same axis; num_axes of bottom[1] when given.
            num_axes = bottom[1].ndim if len(bottom) > 1 else p.num_axes
            shape = operand_shape(self, bottom[0], p.axis, num_axes, "bias")
            bias = self.make_param_blob(shape, len(self.blobs))
            fill(bias, p.bias_filler, where=f"layer {self.name!r}: ")
            self.blobs.append(bias)
        self.param_propagate_down = [True] * len(self.blobs)
        self._fused_module = cuda_fused.enabled_for(self.xp, self.dtype)  # decided once
        self._fused = False  # and per shape, at reshape

    def _scale_blob(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        p = self.param.scale_param
        self._two_bottoms = len(bottom) > 1
        self._dims = broadcast_dims(self, bottom[0], self._scale_blob(bottom).shape, p.axis,
                                    "scale")
        if self.bias_term:
            self._bias_dims = broadcast_dims(self, bottom[0], self.blobs[-1].shape, p.axis, "bias")
        # Caffe's ScaleLayer::Backward_cpu (and _gpu) accumulates a learned scale's diff, as
        # every param diff, except where outer_dim_ == 1: there the product (eltwise case,
        # inner_dim_ == 1) or the gemv with beta 0 (scale_dim_ > 1) is written straight into
        # the scale's diff; only a single scale over inner_dim_ > 1 elements still adds.
        outer, dim, inner = self._dims
        self._scale_diff_overwritten = (not self._two_bottoms and outer == 1
                                        and (dim > 1 or inner == 1))
        self._in_place = top[0] is bottom[0]
        if self.fused_bn is not None:
            # Paired: the input is the BatchNorm's x_norm, and the workspace its.
            self.internals.pop("bottom_copy", None)
            self.internals.pop("fused_ws", None)
            self._fused = False
            return
        if self._in_place:
            # (N, C, ...): the input, kept for the scale gradient.
            self.add_internal("bottom_copy", bottom[0].shape, saved=True)
        else:
            top[0].reshape_like(bottom[0])
        self._fused = (getattr(self, "_fused_module", False)
                       and cuda_fused.channel_grid_ok(self._dims[1])
                       and (not self.bias_term or self._bias_dims == self._dims))
        if self._fused:
            outer, dim, inner = self._dims
            # (P, L): P blocks of L elements per channel of the (outer, dim, inner) view
            self._chunks = cuda_fused.channel_chunks(outer * inner, dim)
            # (dim * (2P + 1),) float64: per-block partial sums of the parameter
            # gradients; scratch within one backward call.
            self.add_internal("fused_ws", (cuda_fused.workspace_size(dim, self._chunks[0]),),
                              saved=False, batch_scaled=False, dtype=np.float64)

    def _scale_grad_needed(self) -> bool:
        # With two bottoms propagate_down[1] is only known at backward time.
        return self._two_bottoms or bool(self.param_propagate_down and self.param_propagate_down[0])

    def pairable(self, bottom) -> bool:
        """Whether a BatchNorm before this layer can take its forward over (given the
        structural conditions Net.set_bn_scale_fusion checks): one bottom, the
        fused kernels on, a per-channel scale and bias (axis 1, one axis)."""
        if len(bottom) != 1 or not getattr(self, "_fused_module", False):
            return False
        p = self.param.scale_param
        c = self._dims[1]
        return (bottom[0].ndim > 1 and self.canonical_axis(bottom[0], p.axis) == 1
                and self.blobs[0].shape == (c,) and c == bottom[0].shape[1]
                and (not self.bias_term or self.blobs[-1].shape == (c,)))

    def pair_operands(self):
        """(gamma, beta or None): the (C,) scale and bias a paired BatchNorm applies."""
        return self.blobs[0].data, (self.blobs[-1].data if self.bias_term else None)

    def backward_reads(self) -> BackwardReads:
        if self.fused_bn is not None:
            # Paired: the pair's backward runs here, on the BatchNorm's internals
            bn = self.fused_bn
            return BackwardReads(others=((bn, "x_norm"), (bn, "std"), (bn, "fused_ws")))
        bottoms, internals = [], []
        if self._scale_grad_needed():
            if self._in_place:
                internals.append("bottom_copy")
            else:
                bottoms.append(0)
        if self._two_bottoms:
            bottoms.append(1)
        return BackwardReads(bottom=tuple(bottoms), top=(), internals=tuple(internals))

    def forward_impl(self, bottom, top):
        if self.fused_bn is not None:
            return  # the paired BatchNorm wrote this layer's output
        xp = self.xp
        outer, dim, inner = self._dims
        x = bottom[0].data.reshape(outer, dim, inner)
        if self._fused:  # one launch: copy (in place), product and bias
            copy = (self.internal("bottom_copy").data.reshape(outer, dim, inner)
                    if self._in_place else None)
            cuda_fused.scale_forward(
                x, self._scale_blob(bottom).data,
                self.blobs[-1].data if self.bias_term else None,
                top[0].data.reshape(outer, dim, inner), copy, *self._chunks)
            return
        if self._in_place:
            self.internal("bottom_copy").data.reshape(outer, dim, inner)[...] = x
        y = top[0].data.reshape(outer, dim, inner)
        xp.multiply(x, self._scale_blob(bottom).data.reshape(1, dim, 1), out=y)
        if self.bias_term:
            bo, bd, bi = self._bias_dims
            top[0].data.reshape(bo, bd, bi)[...] += self.blobs[-1].data.reshape(1, bd, 1)

    def backward_impl(self, top, propagate_down, bottom):
        xp = self.xp
        outer, dim, inner = self._dims
        dy = top[0].diff.reshape(outer, dim, inner)
        if self._scale_diff_overwritten and self.param_propagate_down[0]:
            self.blobs[0].diff.fill(0)      # as Caffe: see reshape (every path below adds)
        if self.fused_bn is not None:
            return self._backward_paired(dy, propagate_down)
        if self._fused:
            return self._backward_fused(dy, propagate_down, bottom)
        if self.bias_term and self.param_propagate_down[-1]:
            bo, bd, bi = self._bias_dims
            bias = self.blobs[-1]
            bias.diff[...] += top[0].diff.reshape(bo, bd, bi).sum(axis=(0, 2)).reshape(bias.shape)
        scale = self._scale_blob(bottom)
        if (self._two_bottoms and propagate_down[1]) or \
                (not self._two_bottoms and self.param_propagate_down[0]):
            x = (self.internal("bottom_copy") if self._in_place else bottom[0]).data
            grad = (dy * x.reshape(outer, dim, inner)).sum(axis=(0, 2)).reshape(scale.shape)
            if self._two_bottoms:
                scale.diff[...] = grad
            else:
                scale.diff[...] += grad
        # Last: when in place this overwrites the top diff read above.
        if propagate_down[0]:
            dx = bottom[0].diff.reshape(outer, dim, inner)
            xp.multiply(dy, scale.data.reshape(1, dim, 1), out=dx)

    def _backward_paired(self, dy, propagate_down):
        """Paired with a BatchNorm, the pair's whole backward, in this layer's step: one pass
        over dy and x_norm sums this layer's and the BatchNorm's gradients into the
        BatchNorm's workspace, this layer's parameter gradients are finalized from it, and
        the BatchNorm's bottom diff is written (:meth:`BatchNormLayer.pair_backward_apply`;
        the BatchNorm's own backward then does nothing).  One step, so that a memory plan
        holds the workspace within it and a backward listener sees this layer's gradients
        final after it."""
        bn = self.fused_bn
        need_scale = bool(self.param_propagate_down[0])
        need_bias = self.bias_term and bool(self.param_propagate_down[-1])
        if not (need_scale or need_bias or propagate_down[0]):
            return
        ws = bn.internal("fused_ws").data
        p, length = bn._chunks
        x_norm = bn._ncs(bn.internal("x_norm").data)
        cuda_fused.bn_scale_backward_partial(dy, x_norm, self.blobs[0].data, ws, p, length)
        cuda_fused.scale_backward_finalize(ws, self.blobs[0].diff if need_scale else None,
                                           self.blobs[-1].diff if need_bias else None, p, 4)
        if propagate_down[0]:   # the BatchNorm's top needs a diff iff its bottom does
            bn.pair_backward_apply(dy)

    def _backward_fused(self, dy, propagate_down, bottom):
        """The backward above in two launches: dx and the partial sums in one pass
        over dy (safe in place: each element is read, then written, by one thread),
        then the parameter gradients (``+=`` for learned blobs, ``=`` for bottom[1])."""
        outer, dim, inner = self._dims
        scale = self._scale_blob(bottom)
        need_bias = self.bias_term and bool(self.param_propagate_down[-1])
        need_scale = bool(propagate_down[1]) if self._two_bottoms else \
            bool(self.param_propagate_down[0])
        x = None
        if need_scale:
            x = (self.internal("bottom_copy") if self._in_place else bottom[0]).data
            x = x.reshape(outer, dim, inner)
        dx = bottom[0].diff.reshape(outer, dim, inner) if propagate_down[0] else None
        cuda_fused.scale_backward(
            dy, x, scale.data, dx, scale.diff if need_scale else None, not self._two_bottoms,
            self.blobs[-1].diff if need_bias else None, self.internal("fused_ws").data,
            *self._chunks)


@register_layer
class BiasLayer(Layer):
    """y = x + bias, bias broadcast as described in the module doc.

    One bottom: ``blobs[0]`` is the learned bias (``bias_param.filler``,
    default constant 0). Backward reads no data at all: the bottom gradient is
    the top gradient, the bias gradient its sum over the broadcast axes.
    """

    type = "Bias"
    min_num_bottom = 1
    max_num_bottom = 2
    exact_num_top = 1
    backward_reads_bottom = ()

    def layer_setup(self, bottom, top):
        p = self.param.bias_param
        if len(bottom) == 1 and not self.blobs:
            shape = operand_shape(self, bottom[0], p.axis, p.num_axes, "bias")
            bias = self.make_param_blob(shape, 0)
            fill(bias, p.filler, where=f"layer {self.name!r}: ")
            self.blobs = [bias]
        self.param_propagate_down = [True] * len(self.blobs)

    def _bias_blob(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        self._dims = broadcast_dims(self, bottom[0], self._bias_blob(bottom).shape,
                                    self.param.bias_param.axis, "bias")
        if top[0] is not bottom[0]:
            top[0].reshape_like(bottom[0])

    def forward_impl(self, bottom, top):
        outer, dim, inner = self._dims
        b = self._bias_blob(bottom).data.reshape(1, dim, 1)
        y = top[0].data.reshape(outer, dim, inner)
        if top[0] is bottom[0]:
            y += b
        else:
            self.xp.add(bottom[0].data.reshape(outer, dim, inner), b, out=y)

    def backward_impl(self, top, propagate_down, bottom):
        outer, dim, inner = self._dims
        two = len(bottom) > 1
        if (two and propagate_down[1]) or (not two and self.param_propagate_down[0]):
            bias = self._bias_blob(bottom)
            grad = top[0].diff.reshape(outer, dim, inner).sum(axis=(0, 2)).reshape(bias.shape)
            if two:
                bias.diff[...] = grad
            else:
                bias.diff[...] += grad
        # In place the bottom diff is the top diff already.
        if propagate_down[0] and top[0] is not bottom[0]:
            bottom[0].diff[...] = top[0].diff
