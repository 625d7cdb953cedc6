"""MVN (mean-variance normalization), as Caffe's ``mvn_layer.cpp``."""
from __future__ import annotations

from ..layer import BackwardReads, Layer, register_layer


@register_layer
class MVNLayer(Layer):
    """y = (x - mean) / (std + eps) per row, or y = x - mean without ``normalize_variance``.

    Caffe talks in the legacy 4-d shape: a row is one (n, c) channel of H*W
    values, or with ``across_channels`` one item of C*H*W values; bottoms of
    more than 4 axes are refused and the top is (N, C, H, W), missing axes 1
    (a (N, C) bottom gives a (N, C, 1, 1) top, as in Caffe). std is the
    population standard deviation sqrt(mean((x - mean)^2)), and ``eps``
    (default 1e-9) is added to the std, not to the variance.

    Backward is Caffe's formula, dx = (dy - mean(dy) - y * mean(dy * y)) / (std + eps)
    (or dy - mean(dy)); it treats the std in d(std)/dx as std + eps, so it is the
    exact gradient only as eps -> 0. It reads the top data and the saved
    internal ``variance`` ((rows,): std + eps, Caffe's ``variance_`` after its
    forward); ``temp`` (Caffe's full-size ``temp_``) and ``mean`` are scratch.
    """

    type = "MVN"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.mvn_param
        self.normalize_variance = bool(p.normalize_variance)
        self.across_channels = bool(p.across_channels)
        self.eps = float(p.eps)

    def reshape(self, bottom, top):
        b = bottom[0]
        if b.ndim > 4:
            raise ValueError(
                f"layer {self.name!r} of type MVN: takes a bottom of at most 4 axes (Caffe's "
                f"legacy num/channels/height/width), bottom {b.name!r} has shape {b.shape}")
        shape = (b.num, b.channels, b.height, b.width)
        top[0].reshape(shape)
        self.rows = b.num if self.across_channels else b.num * b.channels
        self.dim = b.count // self.rows if self.rows else 0
        # (rows,): per-row mean (forward) and per-row sums (backward); scratch
        self.add_internal("mean", (self.rows,), saved=False)
        if self.normalize_variance:
            # (N, C, H, W): squares in forward, products in backward (Caffe's temp_); scratch
            self.add_internal("temp", shape, saved=False)
            # (rows,): std + eps, written by forward, divided by in backward
            self.add_internal("variance", (self.rows,), saved=True)

    def backward_reads(self) -> BackwardReads:
        if self.normalize_variance:
            return BackwardReads(top=(0,), internals=("variance",))
        return BackwardReads()

    def _rows(self, a):
        return a.reshape(self.rows, self.dim)

    def forward_impl(self, bottom, top):
        xp = self.xp
        x = self._rows(bottom[0].data)
        y = self._rows(top[0].data)
        mean = self.internal("mean").data
        x.mean(axis=1, out=mean)
        xp.subtract(x, mean[:, None], out=y)  # elementwise: safe in place
        if not self.normalize_variance:
            return
        temp = self._rows(self.internal("temp").data)
        var = self.internal("variance").data
        xp.multiply(y, y, out=temp)
        temp.mean(axis=1, out=var)
        xp.sqrt(var, out=var)
        var += self.dtype.type(self.eps)  # Caffe: eps added to the std
        y /= var[:, None]

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        dy = self._rows(top[0].diff)
        dx = self._rows(bottom[0].diff)
        sums = self.internal("mean").data
        inv_dim = self.dtype.type(1.0 / self.dim)
        if not self.normalize_variance:
            dy.mean(axis=1, out=sums)
            xp.subtract(dy, sums[:, None], out=dx)  # safe in place (dx may be dy)
            return
        y = self._rows(top[0].data)
        temp = self._rows(self.internal("temp").data)
        xp.multiply(y, dy, out=temp)
        temp.sum(axis=1, out=sums)                 # sum(dy * y) per row
        xp.multiply(y, sums[:, None], out=temp)    # y * sum(dy * y)
        dy.sum(axis=1, out=sums)                   # sum(dy) per row
        temp += sums[:, None]
        temp *= inv_dim
        xp.subtract(dy, temp, out=dx)              # safe in place (dx may be dy)
        dx /= self.internal("variance").data[:, None]

    def flops(self, bottom, top):
        n = float(bottom[0].count)
        return (6.0 if self.normalize_variance else 2.0) * n, \
            (8.0 if self.normalize_variance else 2.0) * n
