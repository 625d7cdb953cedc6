"""Spatial pyramid pooling (Caffe's ``SPPLayer``, ``src/caffe/layers/spp_layer.cpp``).

``spp_param``: ``pyramid_height`` L and ``pool`` (MAX, AVE, STOCHASTIC).  Caffe builds an
internal net: a Split of the bottom (N, C, H, W) into L copies, one Pooling layer per level,
a Flatten of each level's output and a Concat of the flattened levels along axis 1:

    top  (N, C * sum_l 4^l)          for L > 1, level l = 0..L-1 in order
    top  (N, C, 1, 1)                for L = 1: the level-0 Pooling's own top, not flattened

Level l pools into ``bins = 2^l`` windows per axis with Caffe's ``GetPoolingParam``:

    kernel = ceil(H / bins)          stride = kernel
    pad    = (kernel * bins - H + 1) / 2      (integer division)

and the same for W.  The pooling is Caffe's CAFFE-engine PoolingLayer (SPP constructs it
directly, not through the layer factory, so never cuDNN) in the TRAIN phase whatever the
net's (its LayerParameter is made afresh, phase unset: STOCHASTIC samples in a TEST net
too, and never takes the test-time weighted average): ceil rounding, the last window
dropped when it starts in the padding (which, for these parameters, always leaves exactly
``bins`` windows), AVE dividing by the window clipped to the padded input.  Each level is a
:class:`~minicaffe.layers.pooling.PoolingLayer` here too; Caffe's pooling checks apply, so a
level whose padding is not smaller than its kernel (H < 2^l roughly: for H = 5 the level
with 4 bins has kernel 2 and pad 2) is refused, as Caffe's ``CHECK_LT(pad_h_, kernel_h_)``
refuses it, with an error that names this layer and the level.

Buffers.  Caffe's internal net keeps, per level, a Split top diff of the bottom's size, a
pooled output (data and diff, shared by the Flatten) and MAX pooling's index mask.  Here the
levels run one after another through two scratch internals: ``pooled`` (N, C, b, b) of the
largest level, the pooled output in forward and the level's slice of the top diff in
backward, and ``bottom_diff`` (N, C, H, W), a level's gradient before it is added to the
bottom's diff (backward only).  The saved internals are the levels' masks ``level{l}/mask``
(int32, MAX) or sampled positions ``level{l}/rand_idx`` (STOCHASTIC); backward reads
nothing else (no bottom or top data).  Backward adds the levels' gradients in Caffe's
Split order, ``((d_0 + d_1) + d_2) + ...``.
"""
from __future__ import annotations

import math

from ..blob import Blob
from ..layer import BackwardReads, Layer, register_layer
from ..proto import caffe_pb2
from .pooling import _METHOD_NAMES, PoolingLayer

_CAFFE_ENGINE = 1  # PoolingParameter.Engine.CAFFE


def spp_pooling_geometry(level: int, height: int, width: int):
    """Caffe's ``GetPoolingParam`` for pyramid level ``level`` of an H x W input:
    ((kernel_h, kernel_w), (stride_h, stride_w), (pad_h, pad_w))."""
    bins = 2 ** level
    kernel_h = math.ceil(height / bins)
    kernel_w = math.ceil(width / bins)
    pad_h = (kernel_h * bins - height + 1) // 2  # remainder_h = kernel_h*bins - H
    pad_w = (kernel_w * bins - width + 1) // 2
    return (kernel_h, kernel_w), (kernel_h, kernel_w), (pad_h, pad_w)


class _Arrays:
    """The ``data``/``diff`` pair a PoolingLayer reads from a blob, as plain arrays: the
    levels pool views of this layer's blobs and internals."""

    __slots__ = ("data", "diff")

    def __init__(self, data=None, diff=None):
        self.data = data
        self.diff = diff


@register_layer
class SPPLayer(Layer):
    """Spatial pyramid pooling: L levels of Caffe's pooling, flattened and concatenated."""

    type = "SPP"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.spp_param
        self._where = f"layer {self.name!r} (SPP): "
        if not p.HasField("pyramid_height") or p.pyramid_height < 1:
            # Caffe does not check; with 0 levels its Concat of no bottoms crashes
            raise ValueError(f"{self._where}spp_param.pyramid_height must be given and at "
                             f"least 1, got {p.pyramid_height}")
        self.pyramid_height = int(p.pyramid_height)
        self.method = int(p.pool)
        if self.method not in _METHOD_NAMES:
            raise ValueError(f"{self._where}unknown pooling method {self.method} (known: MAX, "
                             "AVE, STOCHASTIC)")
        self.pools: list[PoolingLayer] = []
        self._in_shape = None

    # ----------------------------------------------------------------- shape
    def reshape(self, bottom, top):
        x = bottom[0]
        if x.ndim != 4:
            raise ValueError(f"{self._where}input must have 4 axes, corresponding to (num, "
                             f"channels, height, width); {x.name!r} has shape {x.shape}")
        n, c, h, w = x.shape
        if h <= 0 or w <= 0:
            raise ValueError(f"{self._where}input dimensions cannot be zero: {x.name!r} has "
                             f"shape {x.shape}")
        if x.shape == self._in_shape:  # Caffe: nothing to do for an unchanged bottom
            top[0].reshape(self.top_shape)
            return
        self._in_shape = x.shape
        self.pools = [self._make_level(level, x) for level in range(self.pyramid_height)]
        self.bins = [pool.out_hw for pool in self.pools]
        if self.pyramid_height == 1:
            self.top_shape = (n, c) + self.bins[0]
        else:
            self.top_shape = (n, c * sum(bh * bw for bh, bw in self.bins))
        top[0].reshape(self.top_shape)
        # the levels' saved buffers, under this layer's name
        for name in [k for k in self.internals if k.startswith("level")]:
            del self.internals[name]
        for level, pool in enumerate(self.pools):
            for iname, it in pool.internals.items():
                self.internals[f"level{level}/{iname}"] = it
        if self.pyramid_height > 1:
            big = max(bh * bw for bh, bw in self.bins)
            # (N, C, b, b) of the largest level: a level's pooled output / top-diff slice
            self.add_internal("pooled", (n, c, big), saved=False)
            # (N, C, H, W): one level's gradient before it is added to the bottom's diff
            self.add_internal("bottom_diff", x.shape, saved=False)
            self.internals["bottom_diff"].uses = ("backward",)

    def _make_level(self, level: int, x) -> PoolingLayer:
        """A CAFFE-engine PoolingLayer with Caffe's GetPoolingParam for ``level``, set up on
        a bottom of ``x``'s shape (blobs that never allocate: the level runs on arrays)."""
        (kh, kw), (sh, sw), (ph, pw) = spp_pooling_geometry(level, x.shape[2], x.shape[3])
        lp = caffe_pb2.LayerParameter()
        lp.name = f"{self.name}/level{level}"
        lp.type = "Pooling"
        # GetPoolingParam starts from an empty LayerParameter, so each level has the proto
        # default phase TRAIN in any net: STOCHASTIC samples in TEST nets too (spp_layer.cpp)
        lp.phase = caffe_pb2.TRAIN
        pp = lp.pooling_param
        pp.pool = self.method
        pp.kernel_h, pp.kernel_w = kh, kw
        pp.stride_h, pp.stride_w = sh, sw
        pp.pad_h, pp.pad_w = ph, pw
        pp.engine = _CAFFE_ENGINE
        pool = PoolingLayer(lp, xp=self.xp, dtype=self.dtype)
        bottom = Blob(x.shape, xp=self.xp, dtype=self.dtype, name=x.name)
        top = Blob(xp=self.xp, dtype=self.dtype, name=f"{lp.name}/top")
        try:
            pool.setup([bottom], [top])
        except ValueError as e:
            raise ValueError(
                f"{self._where}pyramid level {level} ({2 ** level}x{2 ** level} bins) of the "
                f"{x.shape[2]}x{x.shape[3]} input {x.name!r} pools with kernel {(kh, kw)}, "
                f"stride {(sh, sw)}, pad {(ph, pw)}, which Caffe's pooling refuses: {e}") from None
        return pool

    # ------------------------------------------------------- forward/backward
    def forward_impl(self, bottom, top):
        x = _Arrays(data=bottom[0].data)
        if self.pyramid_height == 1:
            self.pools[0].forward_impl([x], [_Arrays(data=top[0].data)])
            return
        n, c = bottom[0].shape[:2]
        y = top[0].data  # (N, C * sum b^2)
        scratch = self.internal("pooled").data.reshape(-1)
        offset = 0
        for pool, (bh, bw) in zip(self.pools, self.bins):
            size = c * bh * bw
            pooled = scratch[:n * size].reshape(n, c, bh, bw)
            pool.forward_impl([x], [_Arrays(data=pooled)])
            y[:, offset:offset + size] = pooled.reshape(n, size)  # Flatten + Concat
            offset += size

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].diff
        if self.pyramid_height == 1:
            self.pools[0].backward_impl([_Arrays(diff=top[0].diff)], [True],
                                        [_Arrays(data=bottom[0].data, diff=dx)])
            return
        n, c = bottom[0].shape[:2]
        dy = top[0].diff
        scratch = self.internal("pooled").data.reshape(-1)
        level_dx = self.internal("bottom_diff").data
        offset = 0
        for level, (pool, (bh, bw)) in enumerate(zip(self.pools, self.bins)):
            size = c * bh * bw
            dpooled = scratch[:n * size].reshape(n, c, bh, bw)
            dpooled[...] = dy[:, offset:offset + size].reshape(n, c, bh, bw)
            offset += size
            # level 0 writes the bottom's diff, the others are added in turn (Split's order)
            out = dx if level == 0 else level_dx
            pool.backward_impl([_Arrays(diff=dpooled)], [True], [_Arrays(diff=out)])
            if level > 0:
                dx += level_dx

    # ---------------------------------------------------------- declarations
    def backward_reads(self) -> BackwardReads:
        """The levels' masks (MAX) or sampled positions (STOCHASTIC); AVE reads nothing."""
        saved = tuple(k for k, it in self.internals.items() if it.saved)
        return BackwardReads(internals=saved)

    def flops(self, bottom, top):
        """The levels' pooling, plus the copies into and out of the top, and the sum of the
        levels' gradients in backward."""
        fwd = bwd = 0.0
        for pool in self.pools:
            n = pool.out_hw[0] * pool.out_hw[1] * bottom[0].shape[0] * bottom[0].shape[1]
            f, b = pool.kernel[0] * pool.kernel[1] * n, pool.kernel[0] * pool.kernel[1] * n
            fwd += f + n
            bwd += b + n
        if self.pyramid_height > 1:
            bwd += (self.pyramid_height - 1) * bottom[0].count
        return float(fwd), float(bwd)
