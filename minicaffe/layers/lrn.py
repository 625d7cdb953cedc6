"""Local response normalization (Caffe's ``LRNLayer``) over (N, C, H, W).

ACROSS_CHANNELS (AlexNet's), with n = local_size and a window centred on the
channel (``(n-1)/2`` channels each side, zero outside):

    scale[c] = k + alpha/n * sum_{|c'-c| <= (n-1)/2} x[c']^2
    top      = x * scale^-beta
    dx[c]    = dy[c] * scale[c]^-beta
               - 2*alpha*beta/n * x[c] * sum_{|c'-c| <= (n-1)/2} dy[c'] * top[c'] / scale[c']

WITHIN_CHANNEL: Caffe builds a sub-net (square, AVE pooling over n x n with
pad (n-1)/2 and stride 1, power with scale alpha, shift 1 and power -beta,
product).  With that padding the pooling always divides by n^2 and ``k`` is not
used, so directly:

    scale = 1 + alpha/n^2 * sum_{n x n window} x^2      (zero outside the image)
    top   = x * scale^-beta
    dx    = dy * scale^-beta - 2*alpha*beta/n^2 * x * sum_{window} dy * top / scale

(the window is symmetric, so the adjoint of the window sum is the window sum).
``scale`` is kept as the saved internal ``scale`` (Caffe's ``scale_``); backward
reads the bottom data, the top data and ``scale``.  On a GPU both regions use
the CUDA kernels of :mod:`minicaffe.kernels.cuda_vision`.

The CUDNN engine (see :mod:`minicaffe.engine`) computes ACROSS_CHANNELS with
cuDNN's cross-channel LRN (the same formula: cuDNN divides ``alpha`` by ``n``
itself) when :func:`minicaffe.cudnn.ops.lrn_supported` accepts the parameters
(``local_size`` <= 16, ``k`` >= 1e-5, ``beta`` >= 0.01); it keeps no ``scale``
(its backward recomputes it from the bottom and top data, which it reads).
WITHIN_CHANNEL, and parameters cuDNN refuses, run the CAFFE engine.
"""
from __future__ import annotations

import numpy as np

from .. import engine as engines
from ..cudnn import ops as cudnn_ops
from ..kernels import cuda_vision
from ..layer import Layer, register_layer

ACROSS_CHANNELS, WITHIN_CHANNEL = 0, 1


def _window_sum(xp, a, axis: int, half: int):
    """Sum over ``[i - half, i + half]`` along ``axis``, zero outside (same shape)."""
    out = a.copy()
    n = a.shape[axis]

    def sl(start, stop):
        idx = [slice(None)] * a.ndim
        idx[axis] = slice(start, stop)
        return tuple(idx)

    for d in range(1, min(half, n - 1) + 1):
        out[sl(d, None)] += a[sl(None, n - d)]
        out[sl(None, n - d)] += a[sl(d, None)]
    return out


@register_layer
class LRNLayer(Layer):
    """Local response normalization across or within channels."""

    type = "LRN"
    exact_num_bottom = 1
    exact_num_top = 1
    backward_reads_bottom = (0,)
    backward_reads_top = (0,)
    engine = engines.CAFFE

    def layer_setup(self, bottom, top):
        p = self.param.lrn_param
        self._where = f"layer {self.name!r} (LRN): "
        self.size = int(p.local_size)
        if self.size % 2 != 1:
            raise ValueError(f"{self._where}LRN only supports odd values for local_size, "
                             f"got {self.size}")
        self.pre_pad = (self.size - 1) // 2
        self.alpha = float(p.alpha)
        self.beta = float(p.beta)
        self.k = float(p.k)
        self.region = int(p.norm_region)
        if self.region not in (ACROSS_CHANNELS, WITHIN_CHANNEL):
            raise ValueError(f"{self._where}unknown norm_region {self.region} "
                             "(known: ACROSS_CHANNELS, WITHIN_CHANNEL)")
        # Caffe's engine field, once (see minicaffe.engine)
        self.engine = engines.resolve(self, "lrn_param")
        if self.engine == engines.CUDNN:
            ok, why = cudnn_ops.lrn_supported(self.size, self.alpha, self.beta, self.k)
            if self.region != ACROSS_CHANNELS:
                engines.fall_back(self, "cuDNN's LRN binding covers ACROSS_CHANNELS only")
            elif not ok:
                engines.fall_back(self, f"cuDNN cannot take these LRN parameters: {why}")
            elif self.dtype not in (np.float32, np.float64):
                engines.fall_back(self, f"cuDNN LRN takes float32 or float64, not {self.dtype}")

    def reshape(self, bottom, top):
        x = bottom[0]
        if x.ndim != 4:
            raise ValueError(f"{self._where}input must have 4 axes, corresponding to (num, "
                             f"channels, height, width); {x.name!r} has shape {x.shape}")
        top[0].reshape(x.shape)
        if self.engine == engines.CUDNN:
            return  # cuDNN keeps no scale
        # (N, C, H, W): written by forward, read by backward
        self.add_internal("scale", x.shape, saved=True)

    def _window(self, a):
        """The normalization window's sum of ``a`` (N, C, H, W)."""
        xp, h = self.xp, self.pre_pad
        if self.region == ACROSS_CHANNELS:
            return _window_sum(xp, a, 1, h)
        return _window_sum(xp, _window_sum(xp, a, 2, h), 3, h)

    def forward_impl(self, bottom, top):
        x = bottom[0].data
        if self.engine == engines.CUDNN:
            cudnn_ops.lrn_forward(x, top[0].data, self.size, self.alpha, self.beta, self.k)
            return
        scale = self.internal("scale").data
        if cuda_vision.enabled_for(self.xp):
            if self.region == ACROSS_CHANNELS:
                cuda_vision.lrn_across_forward(x, scale, top[0].data, self.size, self.alpha,
                                               self.beta, self.k)
            else:
                cuda_vision.lrn_within_forward(x, scale, top[0].data, self.size, self.alpha,
                                               self.beta)
            return
        if self.region == ACROSS_CHANNELS:
            scale[...] = self.k + (self.alpha / self.size) * self._window(x * x)
        else:
            scale[...] = 1.0 + (self.alpha / (self.size * self.size)) * self._window(x * x)
        top[0].data[...] = x * self.xp.power(scale, -self.beta)

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = bottom[0].data
        y = top[0].data
        dy = top[0].diff
        if self.engine == engines.CUDNN:
            cudnn_ops.lrn_backward(y, dy, x, bottom[0].diff, self.size, self.alpha, self.beta,
                                   self.k)
            return
        scale = self.internal("scale").data
        n = self.size if self.region == ACROSS_CHANNELS else self.size * self.size
        if cuda_vision.enabled_for(self.xp):
            fn = (cuda_vision.lrn_across_backward if self.region == ACROSS_CHANNELS
                  else cuda_vision.lrn_within_backward)
            fn(x, y, scale, dy, bottom[0].diff, self.size, self.alpha, self.beta)
            return
        acc = self._window(dy * y / scale)
        bottom[0].diff[...] = (dy * self.xp.power(scale, -self.beta)
                               - (2.0 * self.alpha * self.beta / n) * x * acc)

    def flops(self, bottom, top):
        """Per element: the window's squares and sums, a power and a product
        forward; about twice that backward."""
        per = (2 * self.size + 4) if self.region == ACROSS_CHANNELS else (4 * self.size + 4)
        n = bottom[0].count * per
        return float(n), float(2 * n)
