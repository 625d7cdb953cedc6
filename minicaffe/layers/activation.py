"""More elementwise neuron layers of BVLC Caffe: PReLU, ELU, AbsVal, BNLL, Power, Exp, Log,
Threshold, Clip, Swish.

Each follows its Caffe source (``src/caffe/layers/<name>_layer.cpp``, upstream master):
the same formula, the same parameter semantics and defaults (``caffe.proto``), the same
special cases.  Like the layers of :mod:`minicaffe.layers.neuron` they take one bottom and
give one top of its shape, and may run in place (top is the bottom Blob), except AbsVal,
which Caffe refuses in place.

In place, forward overwrites the bottom, so a backward that needs the input ``x`` cannot
read it back.  Caffe's own answer differs per layer:

* PReLU copies ``x`` into ``bottom_memory_`` when in place; so does minicaffe (the saved
  internal ``bottom_copy``, the name minicaffe's Scale uses for the same thing).
* Exp, Swish and ELU (``alpha >= 0``) read only the top (and Swish its saved sigmoid), so
  in place is exact and costs nothing.
* BNLL, Power, Log and Clip read ``bottom[0]->cpu_data()`` in backward, which in place is
  the top: Caffe then computes its gradient from the output (Clip passes every gradient,
  BNLL takes the sigmoid of the output; Power, outside powers 1 and 2, also reads the top
  and divides the one by the other).  They do the same here, as ReLU with a negative
  slope does (:mod:`minicaffe.layers.neuron`): Caffe's behaviour is the reference, and
  a net trained in Caffe with such a layer in place trains the same way here.
* ELU with ``alpha < 0`` reads the bottom like Caffe, which in place reproduces Caffe's
  reading of the overwritten bottom (as ReLU with a negative slope does).

Threshold has no backward in Caffe (``NOT_IMPLEMENTED``); here asking it for a bottom
gradient raises an error that names the layer.

One code path for NumPy and CuPy (``self.xp``); no CUDA kernels of their own.  Constants
are cast to the net's type first, as Caffe's ``Dtype`` parameters are, so that a float32
net computes in float32.
"""
from __future__ import annotations

import math

import numpy as np

from ..fillers import fill
from ..layer import BackwardReads, register_layer
from ..proto import caffe_pb2
from .neuron import NeuronLayer


class InputGradientNeuron(NeuronLayer):
    """A neuron whose backward reads its input ``x``: the bottom data; in place, a saved
    copy of it (``bottom_copy``, the bottom's shape) where Caffe keeps one
    (``copies_input_in_place``: PReLU's ``bottom_memory_``), else the bottom as Caffe
    reads it, which in place holds the top.

    Subclasses call :meth:`save_input` in forward before writing the top and read ``x``
    in backward with :meth:`input_data`; :meth:`backward_needs_input` says whether
    backward reads ``x`` at all with the layer's settings (Power's linear cases do not).
    """

    copies_input_in_place = False

    def backward_needs_input(self) -> bool:
        return True

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self._in_place = top[0] is bottom[0]
        if self._in_place and self.copies_input_in_place and self.backward_needs_input():
            self.add_internal("bottom_copy", bottom[0].shape, saved=True)
        else:
            self.internals.pop("bottom_copy", None)

    def save_input(self, bottom):
        """In place: keep ``x`` for backward (call before the top is written)."""
        if "bottom_copy" in self.internals:
            self.internal("bottom_copy").data[...] = bottom[0].data

    def input_data(self, bottom):
        """``x`` as forward saw it."""
        if "bottom_copy" in self.internals:
            return self.internal("bottom_copy").data
        return bottom[0].data

    def backward_reads(self) -> BackwardReads:
        if not self.backward_needs_input():
            return BackwardReads()
        if "bottom_copy" in self.internals:
            return BackwardReads(internals=("bottom_copy",))
        return BackwardReads(bottom=(0,))


def _constant_filler(value: float):
    f = caffe_pb2.FillerParameter()
    f.type = "constant"
    f.value = value
    return f


def _scale_shift(x, scale, shift):
    """shift + scale * x, skipping the identities as Caffe's Power and Log do (x itself
    when both are identities: the caller must not write to the result then)."""
    if scale != 1:
        x = x * scale
    if shift != 0:
        x = x + shift
    return x


def _log_of_base(layer, base: float) -> float:
    """Caffe's Exp and Log set-up: base -1 means e (log_base exactly 1); any other base
    must be strictly positive with a finite logarithm."""
    if base == -1:
        return 1.0
    if not base > 0:
        raise ValueError(
            f"layer {layer.name!r} of type {layer.type}: base must be strictly positive, or -1 "
            f"for e; got {base}")
    log_base = float(np.log(layer.dtype.type(base)))
    if not math.isfinite(log_base):
        raise ValueError(
            f"layer {layer.name!r} of type {layer.type}: log(base) = log({base}) = {log_base}")
    return log_base


@register_layer
class PReLULayer(InputGradientNeuron):
    """y = max(x, 0) + a_c * min(x, 0), a learned slope per channel (axis 1).

    ``blobs[0]`` holds the slopes: shape (C,), or, with ``channel_shared``, one slope of
    shape () (Caffe's ``Blob(vector<int>(0))``: no axes, one element); filler
    ``prelu_param.filler``, default constant 0.25.  The bottom needs at least two axes,
    (N, C, ...).  Backward (``prelu_layer.cpp``): the slope gradient
    ``sum(dy * x * (x <= 0))`` over every axis but the channel (every axis when shared)
    accumulates into the param diff, before the bottom diff ``dy * ((x > 0) + a (x <= 0))``
    is written, which in place overwrites the top diff.  Both read ``x``: the bottom, or in
    place the saved copy (Caffe's ``bottom_memory_``).
    """

    type = "PReLU"
    copies_input_in_place = True

    def layer_setup(self, bottom, top):
        self._check_axes(bottom[0])
        p = self.param.prelu_param
        self.channel_shared = bool(p.channel_shared)
        channels = bottom[0].shape[1]
        if not self.blobs:
            slope = self.make_param_blob(() if self.channel_shared else (channels,), 0)
            fill(slope, p.filler if p.HasField("filler") else _constant_filler(0.25),
                 where=f"layer {self.name!r}: ")
            self.blobs = [slope]
        self.param_propagate_down = [True]

    def _check_axes(self, blob):
        if blob.ndim < 2:
            raise ValueError(
                f"layer {self.name!r} of type PReLU: bottom {blob.name!r} must have at least 2 "
                f"axes (N, C, ...), got shape {blob.shape}")

    def reshape(self, bottom, top):
        self._check_axes(bottom[0])
        want = 1 if self.channel_shared else bottom[0].shape[1]
        if self.blobs[0].count != want:
            raise ValueError(
                f"layer {self.name!r} of type PReLU: {self.blobs[0].count} negative slope(s) "
                f"for bottom {bottom[0].name!r} of shape {bottom[0].shape}, which needs {want} "
                f"(channel_shared: {str(self.channel_shared).lower()})")
        super().reshape(bottom, top)

    def _slope(self, ndim: int):
        """The slopes, broadcastable against (N, C, ...)."""
        a = self.blobs[0].data
        return a if self.channel_shared else a.reshape((1, -1) + (1,) * (ndim - 2))

    def forward_impl(self, bottom, top):
        self.save_input(bottom)
        x = bottom[0].data
        # where() reads x fully before y (possibly x itself) is written; equal to Caffe's
        # max(x, 0) + a min(x, 0) for every finite slope.
        top[0].data[...] = self.xp.where(x > 0, x, x * self._slope(x.ndim))

    def backward_impl(self, top, propagate_down, bottom):
        x = self.input_data(bottom)
        dy = top[0].diff
        if self.param_propagate_down[0]:
            # First: in place, the bottom diff written below is the top diff.
            axes = tuple(i for i in range(x.ndim) if self.channel_shared or i != 1)
            slope = self.blobs[0]
            slope.diff[...] += (dy * x * (x <= 0)).sum(axis=axes).reshape(slope.shape)
        if propagate_down[0]:
            bottom[0].diff[...] = self.xp.where(x > 0, dy, dy * self._slope(x.ndim))

    def flops(self, bottom, top):
        n = float(top[0].count)
        return n, 5 * n   # backward: the slope gradient (3 per element) and dx (2)


@register_layer
class ELULayer(NeuronLayer):
    """y = max(x, 0) + alpha * (exp(min(x, 0)) - 1), ``elu_param.alpha`` (default 1).

    Caffe's backward is ``dy * ((x > 0) + (alpha + y) * (x <= 0))``: it reads the bottom
    for the mask and the top for ``alpha + y``.  For ``alpha >= 0``, y > 0 exactly where
    x > 0 (elsewhere y = alpha (e^x - 1) <= 0), so the mask is taken from the top and
    backward reads the top only, which keeps an in-place ELU exact.  For ``alpha < 0`` the
    mask is read from the bottom like Caffe, which in place is Caffe's reading of the
    overwritten bottom.
    """

    type = "ELU"

    def layer_setup(self, bottom, top):
        self.alpha = self.dtype.type(self.param.elu_param.alpha)

    def _mask_source_is_top(self) -> bool:
        return self.alpha >= 0

    def backward_reads(self) -> BackwardReads:
        if self._mask_source_is_top():
            return BackwardReads(top=(0,))
        return BackwardReads(bottom=(0,), top=(0,))

    def forward_impl(self, bottom, top):
        xp = self.xp
        x = bottom[0].data
        top[0].data[...] = xp.maximum(x, 0) + self.alpha * (xp.exp(xp.minimum(x, 0)) - 1)

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data
        ref = y if self._mask_source_is_top() else bottom[0].data
        bottom[0].diff[...] = top[0].diff * ((ref > 0) + (self.alpha + y) * (ref <= 0))


@register_layer
class AbsValLayer(NeuronLayer):
    """y = |x|; backward ``dy * sign(x)`` (sign(0) = 0) reads the bottom.

    Not in place: Caffe's AbsValLayer::LayerSetUp refuses it (``CHECK_NE(top[0],
    bottom[0])``), since |x| loses the sign backward needs.
    """

    type = "AbsVal"
    backward_reads_bottom = (0,)

    def layer_setup(self, bottom, top):
        if top[0] is bottom[0]:
            raise ValueError(
                f"layer {self.name!r} of type AbsVal: does not allow in-place computation "
                f"(top {top[0].name!r} is its bottom); give it a top of its own")

    def forward_impl(self, bottom, top):
        self.xp.abs(bottom[0].data, out=top[0].data)

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        self.xp.multiply(self.xp.sign(bottom[0].data), top[0].diff, out=bottom[0].diff)


@register_layer
class BNLLLayer(InputGradientNeuron):
    """Binomial normal log likelihood: y = log(1 + e^x), the softplus.

    Forward in Caffe's overflow-free form, x + log(1 + e^-x) for x > 0 and log(1 + e^x)
    otherwise, written as max(x, 0) + log1p(e^-|x|).  log1p keeps the tail
    (x << 0) accurate in the net's type, as Caffe's float code is through its ``1. +``
    in double.  Backward is Caffe's ``dy * e / (e + 1)`` with e = exp(min(x,
    kBNLL_THRESHOLD)), kBNLL_THRESHOLD = 50 (so e stays finite; for x >= 50 the factor
    is 1 to the last bit in float and double alike).
    """

    type = "BNLL"
    THRESHOLD = 50.0  # Caffe's kBNLL_THRESHOLD

    def forward_impl(self, bottom, top):
        xp = self.xp
        self.save_input(bottom)
        x = bottom[0].data
        top[0].data[...] = xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        e = xp.exp(xp.minimum(self.input_data(bottom), self.dtype.type(self.THRESHOLD)))
        bottom[0].diff[...] = top[0].diff * e / (e + 1)


@register_layer
class PowerLayer(InputGradientNeuron):
    """y = (shift + scale * x) ^ power (``power_param``: power 1, scale 1, shift 0).

    As ``power_layer.cpp``: with ``diff_scale = power * scale`` zero the input is ignored
    (y = 1 if power is 0, else shift^power, and dx = 0); with power 1 the derivative is the
    constant diff_scale; neither reads x.  Otherwise backward reads x (the saved copy in
    place): for power 2 Caffe's ``dy * (diff_scale * scale * x + diff_scale * shift)``; for
    other powers ``dy * diff_scale * (shift + scale * x)^(power - 1)``.  Caffe writes the
    latter as ``diff_scale * y / (shift + scale * x)``, which is 0/0 = NaN wherever the base
    is 0 (an exact zero after a ReLU, say) although the derivative is finite for power > 1;
    the direct form gives the same values elsewhere, to rounding, and reads no top.  In place
    x is overwritten by y, and Caffe's quotient form reads y for both x and y: it gives
    ``power`` (shift 0) or ``diff_scale * y / (shift + scale * y)``, which is not the
    derivative at y; in place this layer computes that quotient, as the module doc says of
    in-place layers (Caffe's behaviour is the reference).
    """

    type = "Power"

    def layer_setup(self, bottom, top):
        p = self.param.power_param
        t = self.dtype.type
        self.power, self.scale, self.shift = t(p.power), t(p.scale), t(p.shift)
        self.diff_scale = self.power * self.scale

    def backward_needs_input(self) -> bool:
        return not (self.diff_scale == 0 or self.power == 1)

    def forward_impl(self, bottom, top):
        y = top[0].data
        if self.diff_scale == 0:
            y.fill(1 if self.power == 0 else self.shift ** self.power)
            return
        self.save_input(bottom)
        v = _scale_shift(bottom[0].data, self.scale, self.shift)
        if self.power != 1:
            v = self.xp.power(v, self.power)
        if v is not y:
            y[...] = v

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].diff
        if self.diff_scale == 0:
            dx.fill(0)
            return
        dy = top[0].diff
        if self.power == 1:
            self.xp.multiply(dy, self.diff_scale, out=dx)
            return
        x = self.input_data(bottom)
        if self.power == 2:
            grad = (self.diff_scale * self.scale) * x
            if self.shift != 0:
                grad += self.diff_scale * self.shift
        elif self._in_place:
            # power_layer.cpp's quotient form, reading bottom_data and top_data as Caffe does:
            # in place both hold y, so Caffe computes power * y / y (shift 0) or
            # diff_scale * y / (shift + scale * y), not the derivative at y.
            y = top[0].data
            if self.shift == 0:
                grad = self.power * (y / x)
            else:
                grad = self.diff_scale * (y / _scale_shift(x, self.scale, self.shift))
        else:
            grad = self.diff_scale * self.xp.power(_scale_shift(x, self.scale, self.shift),
                                                   self.power - 1)
        self.xp.multiply(dy, grad, out=dx)


@register_layer
class ExpLayer(NeuronLayer):
    """y = base ^ (shift + scale * x) (``exp_param``: base -1 meaning e, scale 1, shift 0).

    As ``exp_layer.cpp``: y = outer_scale * exp(inner_scale * x) with inner_scale =
    log(base) * scale and outer_scale = base^shift (e^shift for base -1, 1 for shift 0);
    base must be -1 or strictly positive.  Backward ``dy * y * inner_scale`` reads only
    the top, so in place is exact.
    """

    type = "Exp"
    backward_reads_bottom = ()
    backward_reads_top = (0,)

    def layer_setup(self, bottom, top):
        p = self.param.exp_param
        t = self.dtype.type
        log_base = _log_of_base(self, p.base)
        self.inner_scale = t(log_base) * t(p.scale)
        if p.shift == 0:
            self.outer_scale = t(1)
        elif p.base == -1:
            self.outer_scale = np.exp(t(p.shift))
        else:
            self.outer_scale = t(p.base) ** t(p.shift)

    def forward_impl(self, bottom, top):
        xp = self.xp
        x, y = bottom[0].data, top[0].data
        if self.inner_scale == 1:
            xp.exp(x, out=y)
        else:
            xp.multiply(x, self.inner_scale, out=y)
            xp.exp(y, out=y)
        if self.outer_scale != 1:
            y *= self.outer_scale

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].diff
        self.xp.multiply(top[0].data, top[0].diff, out=dx)
        if self.inner_scale != 1:
            dx *= self.inner_scale


@register_layer
class LogLayer(InputGradientNeuron):
    """y = log_base(shift + scale * x) (``log_param``: base -1 meaning e, scale 1, shift 0).

    As ``log_layer.cpp``: y = ln(shift + scale * x) * base_scale with base_scale =
    1 / ln(base) (base -1: exactly 1; base must be -1 or strictly positive, and not 1).
    Backward ``dy * (shift + scale * x)^-1 * (scale / ln(base))`` reads x (the saved copy
    in place).
    """

    type = "Log"

    def layer_setup(self, bottom, top):
        p = self.param.log_param
        t = self.dtype.type
        log_base = t(_log_of_base(self, p.base))
        if log_base == 0:
            raise ValueError(
                f"layer {self.name!r} of type Log: 1/log(base) = 1/log({p.base}) is infinite; "
                "base must not be 1")
        self.base_scale = t(1) / log_base
        self.scale, self.shift = t(p.scale), t(p.shift)
        self.backward_num_scale = self.scale / log_base

    def forward_impl(self, bottom, top):
        self.save_input(bottom)
        y = top[0].data
        self.xp.log(_scale_shift(bottom[0].data, self.scale, self.shift), out=y)
        if self.base_scale != 1:
            y *= self.base_scale

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        grad = self.xp.reciprocal(_scale_shift(self.input_data(bottom), self.scale, self.shift))
        if self.backward_num_scale != 1:
            grad *= self.backward_num_scale
        self.xp.multiply(top[0].diff, grad, out=bottom[0].diff)


@register_layer
class ThresholdLayer(NeuronLayer):
    """y = 1 if x > threshold else 0 (``threshold_param.threshold``, default 0).

    No backward, as in Caffe (``Backward_cpu`` is ``NOT_IMPLEMENTED``): the step has no
    useful gradient.  A net whose layers below need a gradient must stop it at this layer
    (``propagate_down: false``); asking for a bottom gradient raises an error naming the
    layer.  Caffe aborts whenever the net calls this layer's Backward at all, which it does
    even with ``propagate_down: false`` when the bottom needs a gradient for another reader
    and the top's reader propagates down; here a backward that asks for nothing does
    nothing.  Backward reads nothing.
    """

    type = "Threshold"
    backward_reads_bottom = ()

    def layer_setup(self, bottom, top):
        self.threshold = self.dtype.type(self.param.threshold_param.threshold)

    def forward_impl(self, bottom, top):
        top[0].data[...] = (bottom[0].data > self.threshold).astype(self.dtype)

    def backward_impl(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise NotImplementedError(
                f"layer {self.name!r} of type Threshold has no backward (Caffe's is "
                "NOT_IMPLEMENTED); set propagate_down: false on it, or keep the layers below "
                "it from needing a gradient")


@register_layer
class ClipLayer(InputGradientNeuron):
    """y = max(min, min(x, max)) (``clip_param``: min and max, both required).

    Backward as ``clip_layer.cpp``: the gradient passes where ``min <= x <= max``, both
    ends included, and is 0 elsewhere; it reads x (the saved copy in place: the clipped
    top cannot tell x = max from x > max).
    """

    type = "Clip"

    def layer_setup(self, bottom, top):
        p = self.param.clip_param
        if not (self.param.HasField("clip_param") and p.HasField("min") and p.HasField("max")):
            raise ValueError(
                f"layer {self.name!r} of type Clip: clip_param {{ min: ... max: ... }} is "
                "required (both bounds)")
        self.min, self.max = self.dtype.type(p.min), self.dtype.type(p.max)

    def forward_impl(self, bottom, top):
        xp = self.xp
        self.save_input(bottom)
        # Caffe's order: min first, then max, so that min > max gives min (np.clip gives max)
        top[0].data[...] = xp.maximum(xp.minimum(bottom[0].data, self.max), self.min)

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = self.input_data(bottom)
        bottom[0].diff[...] = top[0].diff * ((x >= self.min) & (x <= self.max))


@register_layer
class SwishLayer(NeuronLayer):
    """y = x * sigmoid(beta * x) (``swish_param.beta``, default 1).

    As ``swish_layer.cpp``, with Caffe's two buffers: ``sigmoid_input`` (beta * x, scratch
    of forward) and ``sigmoid_output`` (s = sigmoid(beta * x), saved), both the bottom's
    shape; the sigmoid is Caffe's 0.5 * tanh(0.5 t) + 0.5.  Backward
    ``dy * (beta * y + s * (1 - beta * y))`` reads the top and s, not x, so in place is
    exact.
    """

    type = "Swish"

    def layer_setup(self, bottom, top):
        self.beta = self.dtype.type(self.param.swish_param.beta)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.add_internal("sigmoid_input", bottom[0].shape, saved=False)
        self.internals["sigmoid_input"].uses = ("forward",)
        self.add_internal("sigmoid_output", bottom[0].shape, saved=True)

    def backward_reads(self) -> BackwardReads:
        return BackwardReads(top=(0,), internals=("sigmoid_output",))

    def forward_impl(self, bottom, top):
        xp = self.xp
        x = bottom[0].data
        t = self.internal("sigmoid_input").data
        s = self.internal("sigmoid_output").data
        xp.multiply(x, self.beta, out=t)
        xp.multiply(t, 0.5, out=s)
        xp.tanh(s, out=s)
        s *= 0.5
        s += 0.5
        xp.multiply(x, s, out=top[0].data)

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        by = self.beta * top[0].data
        s = self.internal("sigmoid_output").data
        bottom[0].diff[...] = top[0].diff * (by + s * (1 - by))

    def flops(self, bottom, top):
        n = float(top[0].count)
        return 5 * n, 5 * n
