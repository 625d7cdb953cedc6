"""SigmoidCrossEntropyLoss, as Caffe's ``sigmoid_cross_entropy_loss_layer.cpp``."""
from __future__ import annotations

from ..layer import Layer, register_layer
from .softmax import _Norm, masked_normalizer


@register_layer
class SigmoidCrossEntropyLossLayer(Layer):
    """Cross-entropy of sigmoid(x) against targets t in [0, 1], elementwise.

    bottom[0] x (N, ...) the scores, bottom[1] t the targets, of the same
    count. Per element, in Caffe's numerically stable form (no exp of a
    positive number):

        l = -(x * (t - [x >= 0]) - log(1 + exp(x - 2 x [x >= 0])))

    loss = sum of l over the elements whose target, truncated to an integer,
    is not ``loss_param.ignore_label``, divided by the normalizer (at least 1):
    FULL N * count(1), VALID the number of elements counted, BATCH_SIZE N,
    NONE 1. Without ``normalization`` the legacy ``normalize`` picks VALID
    (true) or BATCH_SIZE (false), and without either the mode is BATCH_SIZE
    (this layer's historical behaviour, not the proto's VALID default).

    Backward: dx = (sigmoid(x) - t) * loss_weight / normalizer, zero at ignored
    elements; it reads the saved internal ``sigmoid_output`` (Caffe's
    ``sigmoid_output_``) and the targets. Targets get no gradient.
    """

    type = "SigmoidCrossEntropyLoss"
    exact_num_bottom = 2
    exact_num_top = 1
    is_loss = True
    backward_reads_bottom = (1,)

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        if lp.HasField("normalization"):
            self.normalization = lp.normalization
        elif lp.HasField("normalize"):
            self.normalization = _Norm.VALID if lp.normalize else _Norm.BATCH_SIZE
        else:
            self.normalization = _Norm.BATCH_SIZE

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def reshape(self, bottom, top):
        x, t = bottom
        if x.ndim and t.ndim and x.shape[0] != t.shape[0]:
            raise ValueError(
                f"layer {self.name!r} of type SigmoidCrossEntropyLoss: the data and label should "
                f"have the same first dimension: bottom {x.name!r} has shape {x.shape}, bottom "
                f"{t.name!r} has shape {t.shape}")
        if x.count != t.count:
            raise ValueError(
                f"layer {self.name!r} of type SigmoidCrossEntropyLoss: inputs must have the same "
                f"count: bottom {x.name!r} of shape {x.shape} has {x.count}, bottom {t.name!r} "
                f"of shape {t.shape} has {t.count}")
        self.outer = x.shape[0] if x.ndim else 1
        self.inner = x.count_range(1)
        top[0].reshape(())
        # (N, ...): sigmoid(x), kept for backward.
        self.add_internal("sigmoid_output", x.shape, saved=True)

    def _valid(self, t):
        """Mask of the counted elements (None: all), from targets truncated as C's int cast."""
        if self.ignore_label is None:
            return None
        return self.xp.trunc(t) != self.ignore_label

    def _normalizer(self, valid):
        return masked_normalizer(self, valid)

    def forward_impl(self, bottom, top):
        xp = self.xp
        dt = self.dtype.type
        x = bottom[0].data.reshape(-1)
        t = bottom[1].data.reshape(-1)
        s = self.internal("sigmoid_output").data.reshape(-1)
        # Caffe's SigmoidLayer: 0.5 * tanh(0.5 x) + 0.5
        xp.multiply(x, dt(0.5), out=s)
        xp.tanh(s, out=s)
        s *= dt(0.5)
        s += dt(0.5)
        pos = (x >= 0).astype(self.dtype)
        loss = -(x * (t - pos) - xp.log(dt(1) + xp.exp(x - dt(2) * x * pos)))
        valid = self._valid(t)
        if valid is not None:
            loss = xp.where(valid, loss, dt(0))
        top[0].data[...] = loss.sum() / self._normalizer(valid)

    def backward_impl(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise ValueError(
                f"layer {self.name!r} of type SigmoidCrossEntropyLoss: cannot backpropagate to "
                f"label inputs (bottom {bottom[1].name!r})")
        if not propagate_down[0]:
            return
        xp = self.xp
        t = bottom[1].data.reshape(-1)
        dx = bottom[0].diff.reshape(-1)
        xp.subtract(self.internal("sigmoid_output").data.reshape(-1), t, out=dx)
        valid = self._valid(t)
        if valid is not None:
            dx *= valid
        # The loss weight lives in the top diff (Caffe's convention); stays on device.
        dx *= (top[0].diff.reshape(-1)[0] / self._normalizer(valid)).astype(self.dtype)

    def flops(self, bottom, top):
        n = float(bottom[0].count)
        return 12.0 * n, 3.0 * n
