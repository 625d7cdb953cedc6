"""BatchNorm, as Caffe's ``batch_norm_layer.cpp`` (normalization only, no affine part).

Caffe's BatchNorm normalizes each channel of an (N, C, ...) bottom and leaves
the learned scale and shift to a following Scale layer (``bias_term: true``).
It keeps three blobs that are statistics, not parameters:

* ``blobs[0]`` (C,): running sum of batch means,
* ``blobs[1]`` (C,): running sum of unbiased batch variances,
* ``blobs[2]`` (1,): the matching sum of weights (the scale factor),

updated in TRAIN as ``s <- maf * s + 1``, ``mean_sum <- maf * mean_sum + mean``,
``var_sum <- maf * var_sum + m / (m - 1) * var`` with ``m = N * H * W``; the
estimates used in TEST are ``mean_sum / s`` and ``var_sum / s``. Caffe masks
them from the solver by forcing ``lr_mult: 0`` on their ParamSpecs.

GPU fast path (:mod:`minicaffe.kernels.cuda_fused`): in GPU mode, when the
fused kernels compile, forward is two launches in TRAIN (per-channel partial
sums in float64, then one pass that finishes the statistics, updates the three
blobs and writes ``y`` and ``x_norm``) and one with global statistics; backward
likewise two and one.  The generic code below stays the reference (CPU mode, or
``MINICAFFE_FUSED=0``); the fast path computes the same function.  It needs a
small float64 scratch internal ``fused_ws`` (C * (2P + 1) values) and leaves the
declared ``temp`` untouched, so that buffer is never allocated outside a memory
plan (it stays declared: Caffe allocates it, and the ``none`` baseline counts it).

Pairing with a Scale (GPU fast path): Caffe's nets follow a TRAIN BatchNorm
with a Scale (``bias_term: true``) that runs in place on the BatchNorm's top.
:meth:`minicaffe.net.Net.set_bn_scale_fusion` pairs the two (``fused_scale`` here,
``fused_bn`` on the Scale) when both fast paths are on (a memory plan keeps the pairs
whose BatchNorm is in place too, swap.runtime.install); then this layer's forward
writes ``x_norm`` and the Scale's output ``x_norm * gamma + beta`` in one pass and
the Scale's forward does nothing; the pair's whole backward runs in the Scale's: one
pass over its top diff and ``x_norm`` sums both layers' gradients (and finalizes
the Scale's parameter gradients), one more applies ``dx = BN'(dy * gamma)``
(:meth:`pair_backward_apply`), and this layer's backward does nothing.  The Scale
declares the internals of this layer it uses (``BackwardReads.others``), so that a
memory plan holds them for its step.  Each product is rounded as the separate
kernels round it, so every output is bit for bit the unpaired one; the Scale
keeps no copy of its input (``x_norm`` is that input), which saves one
activation per pair.  Seen from outside (blobs, diffs, statistics, parameter
gradients) the pair computes exactly what the two layers compute.

Recomputation (``swap``'s ``recompute`` strategy, SuperNeurons-style): the memory
manager may drop a BatchNorm top after its last forward use and run the layer's
forward again in backward to rebuild it.  Caffe's statistics must see each
minibatch once, so while ``recompute`` is True (the executor sets it around such
a call) forward writes its statistics updates into throwaway copies: the top,
``x_norm`` and ``std`` come out bit for bit as in the first forward (the same
batch statistics), the three blobs stay as they were.
"""
from __future__ import annotations

import numpy as np

from ..kernels import cuda_fused
from ..layer import BackwardReads, Layer, register_layer
from ..proto import caffe_pb2


@register_layer
class BatchNormLayer(Layer):
    """y = (x - mean) / sqrt(var + eps) per channel (axis 1).

    TRAIN (``use_global_stats`` false): mean and biased variance of the batch
    over all axes but the channel axis; backward is Caffe's

        dE/dx = (dE/dy - mean(dE/dy) - mean(dE/dy * y) * y) / sqrt(var + eps)

    so it reads the normalized output ``y`` (saved as ``x_norm``, because later
    in-place layers such as Scale and ReLU overwrite the top) and the
    per-channel ``std`` = sqrt(var + eps). TEST (global statistics): backward is
    ``dE/dy / std`` and reads ``std`` only.

    In place (top is bottom) the top diff and the bottom diff are one array;
    backward reduces the top diff to its per-channel sums before overwriting
    it, which replaces Caffe's full-size copy of the top diff.
    """

    type = "BatchNorm"
    exact_num_bottom = 1
    exact_num_top = 1
    backward_reads_bottom = ()
    # True while the memory manager re-runs forward to rebuild a dropped top (module
    # doc): the running statistics are then left alone.
    recompute = False
    # The Scale layer fused into this one (module doc), or None.
    fused_scale = None
    pair_vecs = None      # (bottom, top) while paired
    # The ReLU in place on the paired Scale's top whose forward this one runs too
    # (Net.set_bn_scale_fusion), or None.
    fused_relu = None

    def layer_setup(self, bottom, top):
        p = self.param.batch_norm_param
        self.moving_average_fraction = float(p.moving_average_fraction)
        self.use_global_stats = self.phase == caffe_pb2.TEST
        if p.HasField("use_global_stats"):
            self.use_global_stats = bool(p.use_global_stats)
        self.eps = float(p.eps)
        self.channels = 1 if bottom[0].ndim == 1 else bottom[0].shape[1]
        if not self.blobs:
            c = self.channels
            self.blobs = [self.make_param_blob((c,), 0), self.make_param_blob((c,), 1),
                          self.make_param_blob((1,), 2)]
            for b in self.blobs:
                b.data[...] = 0
        # Caffe masks the statistics from optimization: a missing ParamSpec is
        # added with lr_mult 0, a given one must say lr_mult 0.
        for i in range(len(self.blobs)):
            if len(self.param.param) == i:
                self.param.param.add().lr_mult = 0.0
            elif self.param.param[i].lr_mult != 0:
                raise ValueError(
                    f"layer {self.name!r} of type BatchNorm: param {i} has lr_mult "
                    f"{self.param.param[i].lr_mult}; batch normalization statistics cannot be "
                    "configured as layer parameters (lr_mult must be 0)")
        self.param_propagate_down = [False] * len(self.blobs)
        # decided once: fused CUDA kernels in GPU mode when they compile
        self._fused = (cuda_fused.enabled_for(self.xp, self.dtype)
                       and cuda_fused.channel_grid_ok(self.channels))

    def reshape(self, bottom, top):
        b = bottom[0]
        if b.ndim > 1 and b.shape[1] != self.channels:
            raise ValueError(
                f"layer {self.name!r} of type BatchNorm: bottom {b.name!r} of shape {b.shape} has "
                f"{b.shape[1]} channels, the layer was set up for {self.channels}")
        top[0].reshape_like(b)
        # (C,): sqrt(var + eps), written by forward, read by backward.
        self.add_internal("std", (self.channels,), saved=True, batch_scaled=False)
        if not self.use_global_stats:
            # (N, C, ...): scratch for squares and products (Caffe's temp_).
            self.add_internal("temp", b.shape, saved=False)
            # (N, C, ...): the normalized output y (Caffe's x_norm_).
            self.add_internal("x_norm", b.shape, saved=True)
        if self._fused:
            # (P, L): P blocks of L elements per channel of the (N, C, S) view
            self._chunks = cuda_fused.channel_chunks(b.count // self.channels, self.channels)
            if not self.use_global_stats:
                # float64: the fused kernels' per-block partial sums and per-channel
                # pivots, (C * (2P + 1),); with a paired Scale, whose backward sums into
                # it for this layer's, (C * 4P,).  Scratch within one forward call, and
                # within the paired Scale's backward (this layer's then uses none).
                paired = self.fused_scale is not None
                self.add_internal("fused_ws", (cuda_fused.workspace_size(
                    self.channels, self._chunks[0], 4 if paired else 2),), saved=False,
                    batch_scaled=False, dtype=np.float64)
                self.internals["fused_ws"].uses = ("forward",) if paired else \
                    ("forward", "backward")

    def backward_reads(self) -> BackwardReads:
        if self.fused_scale is not None:
            return BackwardReads()     # paired: the Scale's backward ran this one's
        internals = ("std",) if self.use_global_stats else ("x_norm", "std")
        return BackwardReads(bottom=(), top=(), internals=internals)

    def _ncs(self, a):
        """View an (N, C, ...) array as (N, C, S) with S the spatial size."""
        n = a.shape[0] if a.ndim else 1
        return a.reshape(n, self.channels, -1)

    def forward_impl(self, bottom, top):
        if self._fused:
            return self._forward_fused(bottom, top)
        xp = self.xp
        dt = self.dtype.type
        x = self._ncs(bottom[0].data)
        y = self._ncs(top[0].data)
        std = self.internal("std").data
        if self.use_global_stats:
            s = self.blobs[2].data[0]
            # 1/s, or 0 while no statistics were accumulated (Caffe's convention);
            # computed on the device, no host sync.
            factor = xp.where(s == 0, dt(0), dt(1) / xp.where(s == 0, dt(1), s))
            mean = self.blobs[0].data * factor
            var = self.blobs[1].data * factor
        else:
            mean = x.mean(axis=(0, 2))
        xp.subtract(x, mean[None, :, None], out=y)  # elementwise: safe in place
        if not self.use_global_stats:
            temp = self._ncs(self.internal("temp").data)
            xp.multiply(y, y, out=temp)
            var = temp.mean(axis=(0, 2))
            maf = dt(self.moving_average_fraction)
            m = bottom[0].count // self.channels
            correction = dt(m / (m - 1) if m > 1 else 1.0)
            mean_sum, var_sum, factor = self._statistics()
            factor *= maf
            factor += dt(1)
            mean_sum[...] = mean_sum * maf + mean
            var_sum[...] = var_sum * maf + var * correction
        xp.sqrt(var + dt(self.eps), out=std)
        y /= std[None, :, None]
        if not self.use_global_stats:
            self.internal("x_norm").data[...] = top[0].data

    def _statistics(self) -> list:
        """The arrays a TRAIN forward updates: the three blobs' data ((C,), (C,), (1,)), or
        copies of them while ``recompute`` is set, so that a recomputation updates nothing
        (one small copy each; both the generic path and the fused kernels write here)."""
        arrays = [b.data for b in self.blobs]
        if self.recompute:
            arrays = [a.copy() for a in arrays]
        return arrays

    def backward_impl(self, top, propagate_down, bottom):
        # Caffe's BatchNormLayer::Backward_cpu/gpu never reads propagate_down: whenever the
        # net runs it, the bottom diff is written, also the data's (a BatchNorm written
        # without ``param`` needs backward even where its bottom does not: see Net._init),
        # unless a memory plan left that unasked-for diff out.
        if not propagate_down[0] and not bottom[0].diff_placeable:
            return
        if self._fused:
            return self._backward_fused(top, bottom)
        xp = self.xp
        std = self.internal("std").data[None, :, None]
        dy = self._ncs(top[0].diff)
        dx = self._ncs(bottom[0].diff)  # the same array as dy when in place
        if self.use_global_stats:
            xp.divide(dy, std, out=dx)
            return
        y = self._ncs(self.internal("x_norm").data)
        temp = self._ncs(self.internal("temp").data)
        mean_dy = dy.mean(axis=(0, 2))
        xp.multiply(dy, y, out=temp)
        mean_dy_y = temp.mean(axis=(0, 2))
        # temp <- mean(dy) + mean(dy * y) * y; then dx <- (dy - temp) / std.
        xp.multiply(y, mean_dy_y[None, :, None], out=temp)
        temp += mean_dy[None, :, None]
        xp.subtract(dy, temp, out=dx)
        dx /= std

    # ------------------------------------------------------ GPU fast path
    def _forward_fused(self, bottom, top):
        """The forward above in one (global statistics) or two (TRAIN) launches."""
        x = self._ncs(bottom[0].data)
        y = self._ncs(top[0].data)          # may be x (in place)
        std = self.internal("std").data     # (C,)
        p, length = self._chunks
        if self.use_global_stats:
            mean_sum, var_sum, factor = (b.data for b in self.blobs)
            cuda_fused.bn_forward_global(x, y, std, mean_sum, var_sum, factor, self.eps, p,
                                         length)
            return
        mean_sum, var_sum, factor = self._statistics()    # copies when recomputing
        m = bottom[0].count // self.channels
        correction = m / (m - 1) if m > 1 else 1.0
        gamma = beta = slope = None
        if self.fused_scale is not None:  # the paired Scale's forward, in the same pass
            gamma, beta = self.fused_scale.pair_operands()
            if self.fused_relu is not None:     # and the ReLU in place after it
                slope = self.fused_relu.negative_slope
        cuda_fused.bn_forward_train(
            x, y, self._ncs(self.internal("x_norm").data), self.internal("fused_ws").data, std,
            mean_sum, var_sum, factor, self.eps, self.moving_average_fraction, correction, p,
            length, gamma, beta, slope)

    def _backward_fused(self, top, bottom):
        """The backward above in one (global statistics) or two (TRAIN) launches; nothing
        when paired (the Scale's backward ran this layer's, :meth:`pair_backward_apply`)."""
        if self.fused_scale is not None:
            return
        dy = self._ncs(top[0].diff)
        dx = self._ncs(bottom[0].diff)      # the same array as dy when in place
        std = self.internal("std").data
        p, length = self._chunks
        if self.use_global_stats:
            cuda_fused.bn_backward_global(dy, std, dx, p, length)
            return
        cuda_fused.bn_backward_train(dy, self._ncs(self.internal("x_norm").data), std, dx,
                                     self.internal("fused_ws").data, p, length)

    def pair_backward_apply(self, dy):
        """The paired Scale's last launch, in its own backward: ``dx = BN'(dy * gamma)`` from
        the sums its first launch left in ``fused_ws``; ``dy`` is the Scale's top diff.  The
        Scale's bottom diff (this layer's top diff) is left as Caffe leaves it, ``dy * gamma``,
        when this layer is not in place (in place, dx overwrites it anyway).  ``pair_vecs``
        (this layer's bottom and top vectors) is set by Net.set_bn_scale_fusion."""
        bottom, top = self.pair_vecs
        gamma, _ = self.fused_scale.pair_operands()
        dy = self._ncs(dy)
        dx = self._ncs(bottom[0].diff)
        dy_out = None if top[0] is bottom[0] else dy
        p, length = self._chunks
        cuda_fused.bn_scale_backward_apply(dy, self._ncs(self.internal("x_norm").data),
                                           self.internal("std").data, gamma, dx, dy_out,
                                           self.internal("fused_ws").data, p, length)
