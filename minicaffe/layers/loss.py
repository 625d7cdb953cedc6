"""EuclideanLoss, as Caffe's ``euclidean_loss_layer.cpp``."""
from __future__ import annotations

from ..layer import Layer, register_layer


@register_layer
class EuclideanLossLayer(Layer):
    """loss = sum((a - b)^2) / (2 N), N = the first dimension of bottom[0].

    The difference a - b is kept as the saved internal ``diff`` (Caffe's
    ``diff_``); backward reads only it: da = w * (a - b) / N and db = -da,
    with w the loss weight held in the top diff. Unlike other losses, both
    bottoms may receive a gradient (Caffe's AllowForceBackward returns true).
    """

    type = "EuclideanLoss"
    exact_num_bottom = 2
    exact_num_top = 1
    is_loss = True
    backward_reads_bottom = ()

    def reshape(self, bottom, top):
        a, b = bottom
        if a.ndim and b.ndim and a.shape[0] != b.shape[0]:
            raise ValueError(
                f"layer {self.name!r} of type EuclideanLoss: the inputs should have the same first "
                f"dimension: bottom {a.name!r} has shape {a.shape}, bottom {b.name!r} has shape "
                f"{b.shape}")
        if a.count_range(1) != b.count_range(1):
            raise ValueError(
                f"layer {self.name!r} of type EuclideanLoss: inputs must have the same dimension: "
                f"bottom {a.name!r} has shape {a.shape}, bottom {b.name!r} has shape {b.shape}")
        top[0].reshape(())
        # (N, ...): a - b, kept for backward.
        self.add_internal("diff", a.shape, saved=True)

    def forward_impl(self, bottom, top):
        d = self.internal("diff").data
        self.xp.subtract(bottom[0].data, bottom[1].data.reshape(d.shape), out=d)
        flat = d.reshape(-1)
        top[0].data[...] = self.xp.vdot(flat, flat) / self.dtype.type(2 * bottom[0].num)

    def backward_impl(self, top, propagate_down, bottom):
        d = self.internal("diff").data
        weight = top[0].diff.reshape(-1)[0]
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                alpha = (weight * self.dtype.type(sign / bottom[i].num)).astype(self.dtype)
                self.xp.multiply(d, alpha, out=bottom[i].diff.reshape(d.shape))

    def flops(self, bottom, top):
        n = float(bottom[0].count)
        return 3.0 * n, 2.0 * n
