"""Deconvolution (Caffe's ``DeconvolutionLayer``): the transpose of a convolution.

A deconvolution is the convolution run backwards: its forward pass is the bottom
gradient of the convolution that would map its top to its bottom (FCN's upsampling
layers).  Shapes, for a bottom (N, C, H, W) with ``axis`` = 1 (axes before ``axis``
are independent inputs, the two after it spatial):

    weight  (C, M/G, kh, kw)          M = num_output, G = group (Caffe's shape: that of
                                      the convolution from (N, M, OH, OW) to (N, C, H, W))
    bias    (M,)
    top     (N, M, OH, OW)            OH = sh*(H - 1) + dh*(kh - 1) + 1 - 2*ph
    col     (B, M*kh*kw, H*W)         scratch for a chunk of B images

Per group g, with ``x[g]`` the bottom (C/G, H*W) of one image:

* forward: ``col[g] = W[g]^T @ x[g]``, folded back into the top by col2im, plus the
  bias (Caffe's ``backward_cpu_gemm`` then ``forward_cpu_bias``);
* weight diff: ``dW[g] += x[g] @ im2col(dtop)[g]^T`` (the convolution's weight gradient
  with the top diff as its input and the bottom data as its output diff: backward reads
  the bottom data for this product only);
* bottom diff: ``W[g] @ im2col(dtop)[g]``, the convolution's forward of the top diff
  (overwritten); bias diff: the top diff summed over images and pixels (accumulated).

Caffe's ``BaseConvolutionLayer`` serves both layers through ``reverse_dimensions()``, and
so does this one: it is a :class:`ConvolutionLayer` whose GEMM attributes describe that
convolution.  ``channels`` and ``num_output`` are the channels the GEMMs read and write
(Caffe's ``conv_in_channels_`` and ``conv_out_channels_``), reversed here: ``channels`` is
the prototxt's num_output M and ``num_output`` the bottom's C; ``bottom_channels`` and
``top_channels`` keep the deconvolution's own view.  Likewise ``in_hw`` is the top's
(OH, OW), ``out_hw`` the bottom's (H, W), ``kdim`` = M*kh*kw and ``out_spatial`` = H*W, so
the convolution's lowering, chunking, scratch internals (``col``, ``top_diff_t``), cuBLAS
branches and memory declarations apply unchanged.  Where Caffe lowers the top diff once
for both backward products, the two convolution routines used here lower it once each.

Engines: BVLC Caffe has no cuDNN deconvolution (its layer factory always builds this
one), nor has minicaffe: ``engine: CUDNN`` (or a CUDNN default) runs the CAFFE engine,
with the reason recorded as ``engine_fallback``.
"""
from __future__ import annotations

from .. import cublas
from .. import engine as engines
from ..blob import Blob
from ..fillers import fill
from ..layer import register_layer
from .conv import ConvolutionLayer, conv_geometry


def deconv_out_size(size: int, kernel: int, pad: int, stride: int, dilation: int = 1) -> int:
    """Caffe's DeconvolutionLayer::compute_output_shape for one spatial axis: the input
    size of the convolution whose output has ``size``."""
    return stride * (size - 1) + dilation * (kernel - 1) + 1 - 2 * pad


@register_layer
class DeconvolutionLayer(ConvolutionLayer):
    """Transposed convolution (2-d, or N-d as Caffe's) with groups, dilation, per-axis
    kernel/stride/pad."""

    type = "Deconvolution"

    def layer_setup(self, bottom, top):
        p = self.param.convolution_param
        where = f"layer {self.name!r} (Deconvolution): "
        self._where = where
        x = bottom[0]
        self.channel_axis = x.canonical_axis(p.axis)
        self.kernel, self.stride, self.pad, self.dilation = conv_geometry(
            p, x, self.channel_axis, where, "deconvolution")
        self._set_lowering_kind()

        c, m, g = x.shape[self.channel_axis], int(p.num_output), int(p.group)
        if m <= 0:
            raise ValueError(f"{where}num_output must be positive, got {m}")
        if g <= 0:
            raise ValueError(f"{where}group must be positive, got {g}")
        if c % g:
            raise ValueError(f"{where}the {c} input channels of {x.name!r} are not a multiple "
                             f"of group {g}")
        if m % g:
            raise ValueError(f"{where}num_output {m} should be a multiple of group {g}")
        self.bottom_channels, self.top_channels, self.group = c, m, g
        # the convolution's view (Caffe's reverse_dimensions): it reads M channels, writes C
        self.channels, self.num_output = m, c
        self.bias_term = bool(p.bias_term)

        # (C, M/G, kh, kw): the fillers' fan-in is M/G*kh*kw, as in Caffe
        weight = self.make_param_blob((c, m // g) + self.kernel, 0)
        fill(weight, p.weight_filler, where)
        self.blobs = [weight]
        if self.bias_term:
            bias = self.make_param_blob((m,), 1)
            fill(bias, p.bias_filler, where)
            self.blobs.append(bias)
        self.engine = engines.resolve(self, "convolution_param")
        if self.engine == engines.CUDNN:
            engines.fall_back(self, "there is no cuDNN deconvolution (BVLC Caffe's factory "
                                    "builds its own one for every engine)")

    # ----------------------------------------------------------------- shape
    def reshape(self, bottom, top):
        self.check_bottoms(bottom, self.bottom_channels, "deconvolution")
        x = bottom[0]
        ax = self.channel_axis
        size = tuple(x.shape[ax + 1:])
        out = tuple(deconv_out_size(n, k, p, st, d) for n, k, p, st, d in
                    zip(size, self.kernel, self.pad, self.stride, self.dilation))
        if min(out, default=1) <= 0:
            raise ValueError(
                f"{self._where}the {'x'.join(map(str, size))} input of {x.name!r} with kernel "
                f"{self.kernel}, stride {self.stride}, dilation {self.dilation} and pad "
                f"{self.pad} gives an empty {'x'.join(map(str, out))} output")
        top_shape = x.shape[:ax] + (self.top_channels,) + out
        for t in top:
            t.reshape(top_shape)
        # Shape the convolution this layer transposes (input shaped like our top, output like
        # our bottom) with the convolution's own reshape: it sets num, in_hw, out_hw, kdim,
        # out_spatial and declares the same scratch internals.  The stand-in blobs carry
        # shapes only (storage is lazy: nothing is allocated).
        conv_in = Blob(top_shape, xp=self.xp, dtype=self.dtype, name=top[0].name)
        conv_out = Blob(xp=self.xp, dtype=self.dtype, name=x.name)
        super().reshape([conv_in], [conv_out])
        assert conv_out.shape == x.shape, (conv_out.shape, x.shape)

    def _bias_by_gemm(self) -> bool:
        """The bias gradient is one reduction over (images, pixels): the convolution's GEMM
        path sizes its ``bias_sums`` for the convolution's output channels, not ours."""
        return False

    # ------------------------------------------------------- forward/backward
    def _transposed_chunk(self, x, dtop, out, need_w):
        """The convolution's backward on one chunk, with our bottom data ``x`` (b, C, H*W)
        in the role of its top diff: ``out`` (b, M, OH, OW) = col2im(W^T x) (overwritten),
        or, with ``need_w``, dW += x @ im2col(dtop)^T for our top diff ``dtop``."""
        if self.is_1x1:
            self._backward_1x1(x, dtop, out, need_w)
        else:
            self._backward_chunk(x, dtop, out, need_w)

    def _conv_forward_chunk(self, x, y):
        """The convolution's forward (no bias) on one chunk: ``y`` (b, C, H*W) = W @
        im2col(x) for ``x`` (b, M, OH, OW); our bottom diff from our top diff."""
        b = x.shape[0]
        weight = self._grouped_weight(self.blobs[0].data)  # (G, C/G, M/G*kh*kw)
        fast = cublas.enabled_for(self.xp)
        if b > 1 and not self.is_1x1:
            # one GEMM per group over the chunk's columns (through ``top_diff_t``)
            self._forward_flat(x, y, weight, None, fast)
            return
        g, cg, kg = self.group, self.num_output // self.group, self.kdim // self.group
        col = self._lower(x, b).reshape(b, g, kg, self.out_spatial)
        yg = y.reshape(b, g, cg, self.out_spatial)
        if fast:  # y[b, g] = W[g] @ col[b, g]
            self._grouped_gemms(weight, col, yg)
        else:
            self.xp.matmul(weight, col, out=yg)  # (G, C/G, K/G) @ (b, G, K/G, L)

    def forward_impl(self, bottom, top):
        c, m = self.bottom_channels, self.top_channels
        chunk = self._run_chunk()
        for b_blob, t_blob in zip(bottom, top):
            x = b_blob.data.reshape(self.num, c, self.out_spatial)  # (N, C, H*W)
            y = self._images(t_blob.data)  # (N, M, OH, OW)
            for n0 in range(0, self.num, chunk):
                n1 = min(n0 + chunk, self.num)
                self._transposed_chunk(x[n0:n1], None, y[n0:n1], need_w=False)
            if self.bias_term:  # (N, M, OH*OW) += (1, M, 1)
                t_blob.data.reshape(self.num, m, -1)[...] += self.blobs[1].data.reshape(1, m, 1)

    def backward_impl(self, top, propagate_down, bottom):
        """Bias and weight diffs accumulate; the bottom diff is overwritten."""
        need_w = bool(self.param_propagate_down[0])
        need_b = self.bias_term and bool(self.param_propagate_down[1])
        c = self.bottom_channels
        for i, (t_blob, b_blob) in enumerate(zip(top, bottom)):
            if need_b:
                self._bias_diff(t_blob.diff.reshape(self.num, self.top_channels, -1))
            if not (need_w or propagate_down[i]):
                continue
            dy = self._images(t_blob.diff)  # (N, M, OH, OW)
            x = b_blob.data.reshape(self.num, c, self.out_spatial) if need_w else None
            dx = b_blob.diff.reshape(self.num, c, self.out_spatial) if propagate_down[i] else None
            chunk = self._run_chunk()
            for n0 in range(0, self.num, chunk):
                n1 = min(n0 + chunk, self.num)
                if need_w:
                    self._transposed_chunk(x[n0:n1], dy[n0:n1], None, need_w=True)
                if dx is not None:
                    self._conv_forward_chunk(dy[n0:n1], dx[n0:n1])

    # ---------------------------------------------------------- declarations
    # backward_reads (inherited): the bottom data, for the weight gradient only.

    def flops(self, bottom, top):
        """2 * multiply-adds: forward one GEMM (the convolution's backward-data; the
        multiply-adds of the convolution it transposes) plus the bias; backward one GEMM
        for the weight gradient and one for the bottom gradient."""
        macs = self.num * self.num_output * (self.kdim // self.group) * self.out_spatial
        fwd = 2.0 * macs * len(bottom)
        if self.bias_term:
            fwd += float(sum(t.count for t in top))
        return fwd, 2.0 * fwd
