"""Pooling (Caffe's ``PoolingLayer``): MAX, AVE and STOCHASTIC over (N, C, H, W).

Geometry, per spatial axis (Caffe's ``Reshape``):

    pooled = ceil((H + 2*pad - kernel) / stride) + 1     (floor with round_mode FLOOR)
    if any pad: drop the last window when (pooled - 1) * stride >= H + pad

so a window may overhang the padded input.  Window ``ph`` covers input rows
``[ph*stride - pad, ph*stride - pad + kernel)``:

* MAX looks at the rows inside the image only, starts from -FLT_MAX and keeps
  the *first* strict maximum in row-major order; the mask (``h * W + w`` of that
  maximum within its plane, -1 for a window with no pixel) goes to the second
  top if there is one, otherwise to the saved int32 internal ``mask``.
  Backward sends each output's diff to its mask position.
* AVE sums the rows inside the image and divides by the window clipped to the
  padded input, ``min(start + kernel, H + pad) - start``: padding counts, the
  overhang past it does not.  Backward spreads ``diff / pool_size``.
* STOCHASTIC (no padding; Caffe implements it on the GPU only) samples, in
  TRAIN, a pixel with probability proportional to its (non-negative) value, and
  in TEST outputs ``sum(x^2) / sum(x)``.  The sampled position is the saved
  internal ``rand_idx`` (Caffe's buffer of the layer's dtype; here it holds the
  in-plane index ``h * W + w``).

The generic code works on strided views of a padded copy of the input; on a
GPU, MAX and AVE use the CUDA kernels of :mod:`minicaffe.kernels.cuda_vision`.

The CUDNN engine (see :mod:`minicaffe.engine`) runs MAX and AVE through
cuDNN's pooling, with Caffe's output size given explicitly, where
:func:`minicaffe.cudnn.ops.pool2d_supported` says that cuDNN computes exactly
Caffe's numbers for the geometry (padding, ceil rounding, no empty windows:
decided at reshape, probed once per process on the GPU).  Otherwise, and for
STOCHASTIC or a second (mask) top, the layer runs the CAFFE engine, as Caffe's
layer factory does for a mask top.  cuDNN keeps no mask: its MAX backward
recomputes the argmax from the bottom and top data, which it therefore reads
(a later layer must not work in place on the top; see
:func:`minicaffe.engine.in_place_hazards`); AVE backward reads neither.
"""
from __future__ import annotations

import numpy as np

from .. import engine as engines
from ..cudnn import ops as cudnn_ops
from ..kernels import cuda_vision
from ..layer import BackwardReads, Layer, register_layer
from ..rng import rng_for

MAX, AVE, STOCHASTIC = 0, 1, 2
CEIL, FLOOR = 0, 1
TRAIN = 0
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)
_METHOD_NAMES = {MAX: "MAX", AVE: "AVE", STOCHASTIC: "STOCHASTIC"}


def pooled_size(size: int, kernel: int, pad: int, stride: int, round_mode: int = CEIL,
                clip: bool | None = None) -> int:
    """Caffe's pooled extent along one axis.

    ``clip`` (drop a last window that starts in the padding) defaults to
    ``pad > 0``; Caffe applies it to both axes as soon as either axis is padded.
    """
    num = size + 2 * pad - kernel
    q = -(-num // stride) if round_mode == CEIL else num // stride
    out = q + 1
    if clip is None:
        clip = pad > 0
    if clip and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _windows(xp, arr, kh, kw, sh, sw, ph, pw):
    """(N, C, PH, PW, kh, kw) view of windows of ``arr`` (N, C, Hp, Wp)."""
    s_n, s_c, s_h, s_w = arr.strides
    n, c = arr.shape[:2]
    return xp.lib.stride_tricks.as_strided(
        arr, shape=(n, c, ph, pw, kh, kw), strides=(s_n, s_c, sh * s_h, sw * s_w, s_h, s_w))


@register_layer
class PoolingLayer(Layer):
    """MAX / AVE / STOCHASTIC pooling with Caffe's rounding and padding rules."""

    type = "Pooling"
    exact_num_bottom = 1
    min_num_top = 1
    max_num_top = 2  # the second (the mask) for MAX only; checked in layer_setup
    engine = engines.CAFFE

    def layer_setup(self, bottom, top):
        p = self.param.pooling_param
        where = f"layer {self.name!r} (Pooling): "
        self._where = where
        self.method = int(p.pool)
        if self.method not in _METHOD_NAMES:
            raise ValueError(f"{where}unknown pooling method {self.method} (known: MAX, AVE, "
                             "STOCHASTIC)")
        if len(top) > 1 and self.method != MAX:
            raise ValueError(f"{where}only MAX pooling has a second top (the mask); "
                             f"{_METHOD_NAMES[self.method]} pooling takes exactly 1 top")
        self.global_pooling = bool(p.global_pooling)
        self.round_mode = int(p.round_mode)
        if self.round_mode not in (CEIL, FLOOR):
            raise ValueError(f"{where}unknown round_mode {self.round_mode} (known: CEIL, FLOOR)")
        has = p.HasField
        if self.global_pooling:
            if has("kernel_size") or has("kernel_h") or has("kernel_w"):
                raise ValueError(f"{where}with global_pooling: true, filter size cannot be "
                                 "specified")
        else:
            if not (has("kernel_size") or has("kernel_h") or has("kernel_w")):
                raise ValueError(f"{where}filter size must be given: kernel_size, or kernel_h "
                                 "and kernel_w")
            if not has("kernel_size") and not (has("kernel_h") and has("kernel_w")):
                raise ValueError(f"{where}for non-square filters both kernel_h and kernel_w "
                                 "are required")
            if has("kernel_size") and has("kernel_h") and has("kernel_w"):
                raise ValueError(f"{where}filter size is kernel_size OR kernel_h and kernel_w; "
                                 "not both")
        if not ((not has("pad") and has("pad_h") and has("pad_w"))
                or (not has("pad_h") and not has("pad_w"))):
            raise ValueError(f"{where}pad is pad OR pad_h and pad_w are required")
        if not ((not has("stride") and has("stride_h") and has("stride_w"))
                or (not has("stride_h") and not has("stride_w"))):
            raise ValueError(f"{where}stride is stride OR stride_h and stride_w are required")
        if self.global_pooling:
            self.kernel = (bottom[0].height, bottom[0].width)
        elif has("kernel_size"):
            self.kernel = (int(p.kernel_size),) * 2
        else:
            self.kernel = (int(p.kernel_h), int(p.kernel_w))
        if min(self.kernel) <= 0:
            raise ValueError(f"{where}filter dimensions cannot be zero, got {self.kernel}")
        self.pad = ((int(p.pad_h), int(p.pad_w)) if has("pad_h") else (int(p.pad),) * 2)
        self.stride = ((int(p.stride_h), int(p.stride_w)) if has("stride_h")
                       else (int(p.stride),) * 2)
        if min(self.stride) <= 0:
            raise ValueError(f"{where}stride must be positive, got {self.stride}")
        if self.global_pooling and (self.pad != (0, 0) or self.stride != (1, 1)):
            raise ValueError(f"{where}with global_pooling: true; only pad = 0 and stride = 1")
        if self.pad != (0, 0):
            if self.method not in (MAX, AVE):
                raise ValueError(f"{where}padding implemented only for average and max pooling")
            if self.pad[0] >= self.kernel[0] or self.pad[1] >= self.kernel[1]:
                raise ValueError(f"{where}pad {self.pad} must be smaller than the kernel "
                                 f"{self.kernel}")
        # Caffe's engine field, once (see minicaffe.engine); the geometry is checked at reshape
        self.engine = engines.resolve(self, "pooling_param")
        if self.engine == engines.CUDNN:
            self._cudnn = engines.cudnn_options()
            if self.method == STOCHASTIC:
                engines.fall_back(self, "cuDNN has no STOCHASTIC pooling")
            elif len(top) > 1:
                engines.fall_back(self, "cuDNN keeps no mask, and this layer has a mask top")
            elif self.dtype not in (np.float32, np.float64):
                engines.fall_back(self, f"cuDNN pooling takes float32 or float64, not "
                                        f"{self.dtype}")

    # ----------------------------------------------------------------- shape
    def reshape(self, bottom, top):
        x = bottom[0]
        if x.ndim != 4:
            raise ValueError(f"{self._where}input must have 4 axes, corresponding to (num, "
                             f"channels, height, width); {x.name!r} has shape {x.shape}")
        n, c, h, w = x.shape
        if self.global_pooling:
            self.kernel = (h, w)
        (kh, kw), (sh, sw), (padh, padw) = self.kernel, self.stride, self.pad
        clip = padh > 0 or padw > 0
        ph = pooled_size(h, kh, padh, sh, self.round_mode, clip)
        pw = pooled_size(w, kw, padw, sw, self.round_mode, clip)
        if ph <= 0 or pw <= 0:
            raise ValueError(f"{self._where}a {kh}x{kw} window does not fit the {h}x{w} input of "
                             f"{x.name!r} padded by {self.pad} (output {ph}x{pw})")
        self.in_hw, self.out_hw = (h, w), (ph, pw)
        for t in top:
            t.reshape(n, c, ph, pw)
        if self.engine == engines.CUDNN:
            ok, why = cudnn_ops.pool2d_supported(self.in_hw, self.out_hw, self.method,
                                                 self.kernel, self.stride, self.pad)
            if not ok:
                engines.fall_back(self, f"cuDNN cannot pool this geometry as Caffe does: {why}")
        if self.method == MAX and len(top) == 1 and self.engine == engines.CAFFE:
            self.add_internal("mask", (n, c, ph, pw), saved=True, dtype=np.int32)
        if self.method == STOCHASTIC:
            self.add_internal("rand_idx", (n, c, ph, pw), saved=True)
        self._make_geometry()

    def _make_geometry(self):
        """Per-window constants of the generic path, made on the host once per shape."""
        (h, w), (ph, pw) = self.in_hw, self.out_hw
        (kh, kw), (sh, sw), (padh, padw) = self.kernel, self.stride, self.pad
        hs = np.arange(ph) * sh - padh  # window starts, input coordinates
        ws = np.arange(pw) * sw - padw
        # AVE divisor: the window clipped to the padded input
        size_h = np.minimum(hs + kh, h + padh) - hs
        size_w = np.minimum(ws + kw, w + padw) - ws
        self._pool_size = self.xp.asarray(np.outer(size_h, size_w).astype(self.dtype))
        # in-plane index of each window's first element
        self._base = self.xp.asarray((hs[:, None] * w + ws[None, :]).astype(np.int64))
        # padded extent: the image at offset pad, plus any overhang of the last window
        self._padded_hw = (max(padh + h, (ph - 1) * sh + kh), max(padw + w, (pw - 1) * sw + kw))
        if self.method == STOCHASTIC:
            # (kh*kw, PH, PW): is offset (i, j) of window (ph, pw) inside the image?
            ii = (hs[None, :] + np.arange(kh)[:, None]) < h  # (kh, PH)
            jj = (ws[None, :] + np.arange(kw)[:, None]) < w  # (kw, PW)
            valid = ii[:, None, :, None] & jj[None, :, None, :]  # (kh, kw, PH, PW)
            self._valid = self.xp.asarray(valid.reshape(kh * kw, ph, pw))

    # --------------------------------------------------------------- helpers
    def _padded(self, x, value):
        """(N, C, Hp, Wp) copy of x with ``value`` in the padding and overhang."""
        xp = self.xp
        n, c, h, w = x.shape
        hp, wp = self._padded_hw
        if (hp, wp) == (h, w):
            return x
        out = xp.full((n, c, hp, wp), value, dtype=x.dtype)
        out[:, :, self.pad[0]:self.pad[0] + h, self.pad[1]:self.pad[1] + w] = x
        return out

    def _win(self, arr):
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.out_hw
        return _windows(self.xp, arr, kh, kw, sh, sw, ph, pw)

    def _scatter(self, idx, values, out):
        """out (N, C, H, W) = sum of ``values`` at in-plane positions ``idx`` (-1: none)."""
        xp = self.xp
        n, c, h, w = out.shape
        total = n * c * h * w
        plane = xp.arange(n * c, dtype=np.int64).reshape(n, c, 1, 1) * (h * w)
        idx = idx.astype(np.int64)
        flat = xp.where(idx >= 0, plane + idx, total)  # -1 goes to a discarded slot
        acc = xp.bincount(flat.ravel(), weights=values.ravel(), minlength=total + 1)
        out[...] = acc[:total].reshape(out.shape)

    # --------------------------------------------------------------- forward
    def forward_impl(self, bottom, top):
        x = bottom[0].data
        if self.engine == engines.CUDNN:
            cudnn_ops.pool2d_forward(x, top[0].data, self.method, self.kernel, self.stride,
                                     self.pad, deterministic=self._cudnn.deterministic)
            return
        if self.method == MAX:
            mask = top[1].data if len(top) > 1 else self.internal("mask").data
            if cuda_vision.enabled_for(self.xp):
                cuda_vision.max_pool_forward(x, top[0].data, mask, self.kernel, self.stride,
                                             self.pad)
            else:
                self._max_forward(x, top[0].data, mask)
        elif self.method == AVE:
            if cuda_vision.enabled_for(self.xp):
                cuda_vision.ave_pool_forward(x, top[0].data, self.kernel, self.stride, self.pad)
            else:
                win = self._win(self._padded(x, 0))
                with np.errstate(divide="ignore", invalid="ignore"):  # empty windows: as Caffe
                    top[0].data[...] = win.sum(axis=(4, 5)) / self._pool_size
        elif self.phase == TRAIN:
            self._stochastic_train_forward(x, top[0].data)
        else:
            win = self._win(self._padded(x, 0))
            top[0].data[...] = ((win * win).sum(axis=(4, 5))
                                / (FLT_MIN + win.sum(axis=(4, 5))))

    def _max_forward(self, x, top, mask):
        xp = self.xp
        kw, w = self.kernel[1], self.in_hw[1]
        win = self._win(self._padded(x, -np.inf))
        flat = win.reshape(win.shape[:4] + (-1,))  # (N, C, PH, PW, kh*kw), a copy
        r = flat.argmax(axis=-1)  # first maximum in row-major window order
        best = flat.max(axis=-1)
        found = best > -FLT_MAX   # Caffe starts at -FLT_MAX and needs a strict >
        top[...] = xp.where(found, best, -FLT_MAX)
        idx = self._base + (r // kw) * w + r % kw
        mask[...] = xp.where(found, idx, -1)

    def _stochastic_train_forward(self, x, top):
        """Caffe's StoPoolForwardTrain: a pixel drawn with probability x / sum(window)."""
        xp = self.xp
        kh, kw = self.kernel
        w = self.in_hw[1]
        rand_idx = self.internal("rand_idx").data
        u = rng_for(xp).random(rand_idx.shape, dtype=self.dtype)
        xpad = self._padded(x, 0)
        win = self._win(xpad)  # (N, C, PH, PW, kh, kw), zeros past the image
        thres = u * win.sum(axis=(4, 5))
        cum = xp.zeros_like(thres)
        found = xp.zeros(thres.shape, dtype=bool)
        out = xp.zeros_like(thres)
        idx = xp.full(thres.shape, -1, dtype=np.int64)
        for i in range(kh):
            for j in range(kw):
                v = win[:, :, :, :, i, j]
                cum += v
                hit = self._valid[i * kw + j] & ~found & (cum >= thres)
                out = xp.where(hit, v, out)
                idx = xp.where(hit, self._base + i * w + j, idx)
                found |= hit
        top[...] = out
        rand_idx[...] = idx

    # -------------------------------------------------------------- backward
    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff
        dx = bottom[0].diff
        if self.engine == engines.CUDNN:
            # MAX recomputes the argmax from x and y; AVE needs neither
            x, y = (bottom[0].data, top[0].data) if self.method == MAX else (None, None)
            cudnn_ops.pool2d_backward(y, dy, x, dx, self.method, self.kernel, self.stride,
                                      self.pad, deterministic=self._cudnn.deterministic)
            return
        if self.method == MAX:
            mask = top[1].data if len(top) > 1 else self.internal("mask").data
            if cuda_vision.enabled_for(self.xp):
                cuda_vision.max_pool_backward(dy, mask, dx, self.kernel, self.stride, self.pad)
            else:
                self._scatter(mask, dy, dx)
        elif self.method == AVE:
            if cuda_vision.enabled_for(self.xp):
                cuda_vision.ave_pool_backward(dy, dx, self.kernel, self.stride, self.pad)
            else:
                self._ave_backward(dy, dx)
        else:
            if self.phase != TRAIN:
                raise RuntimeError(f"{self._where}STOCHASTIC pooling has no backward in the TEST "
                                   "phase (its test output is a weighted average, as in Caffe)")
            self._scatter(self.internal("rand_idx").data, dy, dx)

    def _ave_backward(self, dy, dx):
        xp = self.xp
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.out_hw
        n, c, h, w = dx.shape
        hp, wp = self._padded_hw
        with np.errstate(divide="ignore", invalid="ignore"):
            g = dy / self._pool_size
        acc = xp.zeros((n, c, hp, wp), dtype=dx.dtype)
        if sh >= kh and sw >= kw:  # disjoint windows (global pooling too): one write
            self._win(acc)[...] = g[:, :, :, :, None, None]
        else:
            for i in range(kh):
                for j in range(kw):  # for one offset the targets are distinct
                    acc[:, :, i:i + sh * (ph - 1) + 1:sh, j:j + sw * (pw - 1) + 1:sw] += g
        dx[...] = acc[:, :, self.pad[0]:self.pad[0] + h, self.pad[1]:self.pad[1] + w]

    # ---------------------------------------------------------- declarations
    def backward_reads(self) -> BackwardReads:
        """MAX reads its mask (the internal or the second top), STOCHASTIC its
        sampled positions; AVE needs nothing but the top diff.  With the CUDNN
        engine MAX reads the bottom and top data instead of a mask."""
        if self.engine == engines.CUDNN:
            return BackwardReads(bottom=(0,), top=(0,)) if self.method == MAX else BackwardReads()
        if self.method == MAX:
            if "mask" in self.internals:
                return BackwardReads(internals=("mask",))
            return BackwardReads(top=(1,))
        if self.method == STOCHASTIC:
            return BackwardReads(internals=("rand_idx",))
        return BackwardReads()

    def flops(self, bottom, top):
        """One comparison or addition per window element, both ways."""
        n = top[0].count * self.kernel[0] * self.kernel[1]
        return float(n), float(n)
