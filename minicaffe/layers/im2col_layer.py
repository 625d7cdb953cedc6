"""Im2col (Caffe's ``Im2colLayer``, ``src/caffe/layers/im2col_layer.cpp``): the lowering of
a convolution as a layer of its own.

``convolution_param`` gives ``kernel_size`` (or ``kernel_h``/``kernel_w``), ``stride``,
``pad``, ``dilation`` (each once or once per spatial axis, or the ``_h``/``_w`` pairs) and
``axis`` (the channel axis, default 1); ``num_output``, ``group`` and the fillers are
ignored, as in Caffe.  For a bottom (N, C, H, W) (axes before ``axis`` are independent
images, two spatial axes after it):

    top  (N, C*kh*kw, OH, OW)      OH = (H + 2*pad_h - (dil_h*(kh-1)+1)) / stride_h + 1

with C++'s truncating division, and ``top[n, (c*kh + i)*kw + j, oh, ow] =
x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]`` (0 outside the image): each image's column
buffer, in Caffe's row order.  Backward is col2im: every top diff entry summed back into the
pixel it came from (the bottom's diff is overwritten).

Forward and backward run the batched lowering of :mod:`minicaffe.kernels.im2col` (the CUDA
kernels of :mod:`minicaffe.kernels.cuda_vision` on a GPU) straight between the bottom and
the top: no internal buffer, and backward reads only the top's diff.

N-d inputs (one, three or more spatial axes) are lowered as Caffe's ``im2col_nd`` does: top
(N, C*K1*...*KD, O1, ..., OD), the rows in the same channel-then-kernel order
(:func:`minicaffe.kernels.im2col.im2col_nd`, NumPy and CuPy alike, no CUDA fast path).  Two
spatial axes under ``force_nd_im2col`` give the same numbers through the 2-d lowering.
"""
from __future__ import annotations

import numpy as np

from ..kernels import cuda_vision
from ..kernels import im2col as im2col_mod
from ..layer import BackwardReads, Layer, register_layer
from .conv import conv_geometry, conv_output_hw


@register_layer
class Im2colLayer(Layer):
    """A convolution's column buffer as the top: (N, C, H, W) -> (N, C*kh*kw, OH, OW) (N-d
    alike)."""

    type = "Im2col"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.convolution_param
        where = f"layer {self.name!r} (Im2col): "
        self._where = where
        x = bottom[0]
        self.channel_axis = self.canonical_axis(x, p.axis)
        self.kernel, self.stride, self.pad, self.dilation = conv_geometry(
            p, x, self.channel_axis, where, "lowering", kernel_word="filter", min_spatial=1)

    def reshape(self, bottom, top):
        x = bottom[0]
        ax = self.channel_axis
        if x.ndim != ax + 1 + len(self.kernel):
            raise ValueError(f"{self._where}bottom num_axes may not change: {x.name!r} now has "
                             f"shape {x.shape}")
        self.in_hw, self.out_hw = conv_output_hw(self, x)
        self.channels = x.shape[ax]
        self.num = int(np.prod(x.shape[:ax], dtype=np.int64))
        self.kdim = self.channels * int(np.prod(self.kernel))
        self.nd = len(self.kernel) != 2
        top[0].reshape(x.shape[:ax] + (self.kdim,) + self.out_hw)

    def _images(self, arr):
        """A bottom array as (num, C, H, W)."""
        return arr.reshape((self.num, self.channels) + self.in_hw)

    def _columns(self, arr):
        """A top array as (num, C*kh*kw, OH*OW): the lowering's batch-major layout."""
        return arr.reshape(self.num, self.kdim, int(np.prod(self.out_hw)))

    def forward_impl(self, bottom, top):
        x, col = self._images(bottom[0].data), self._columns(top[0].data)
        if self.nd:
            im2col_mod.im2col_nd(x, self.kernel, self.pad, self.stride, self.dilation, out=col)
        elif cuda_vision.enabled_for(self.xp):
            cuda_vision.im2col(x, col, self.kernel, self.pad, self.stride, self.dilation,
                               self.out_hw, batch_major=True)
        else:
            im2col_mod.im2col(x, self.kernel, self.pad, self.stride, self.dilation, out=col)

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        col, dx = self._columns(top[0].diff), self._images(bottom[0].diff)
        if self.nd:
            im2col_mod.col2im_nd(col, dx.shape, self.kernel, self.pad, self.stride,
                                 self.dilation, out=dx)
        elif cuda_vision.enabled_for(self.xp):
            cuda_vision.col2im(col, dx, self.kernel, self.pad, self.stride, self.dilation,
                               self.out_hw, batch_major=True)
        else:
            im2col_mod.col2im(col, dx.shape, self.kernel, self.pad, self.stride, self.dilation,
                              out=dx)

    def backward_reads(self) -> BackwardReads:
        """col2im reads the top's diff only."""
        return BackwardReads()

    def flops(self, bottom, top):
        """A copy of every top element; backward one addition each."""
        n = float(top[0].count)
        return n, n
