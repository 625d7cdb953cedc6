"""MultinomialLogisticLoss, InfogainLoss, HingeLoss and ContrastiveLoss, as BVLC Caffe's
``multinomial_logistic_loss_layer.cpp``, ``infogain_loss_layer.cpp`` (upstream master: the
softmax inside, ``axis``, ``normalization`` and ``ignore_label``), ``hinge_loss_layer.cpp`` and
``contrastive_loss_layer.cpp``.

Every one writes a scalar loss (shape ``()``) to its first top, divides by a count of examples,
and takes its loss weight from that top's diff in backward (Caffe's convention). As in Caffe's
LossLayer, labels never get a gradient: ``allow_force_backward`` is False for them and a
backward asked for one raises an error that names the layer.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import blobproto_to_array, read_blobproto
from ..layer import Layer, register_layer
from .softmax import _Norm, _axis_dims, check_label_range, masked_normalizer, softmax

# Caffe's kLOG_THRESHOLD (loss_layer.hpp): probabilities are clipped here before the log.
# It is declared ``const float kLOG_THRESHOLD = 1e-20`` and used as Dtype(kLOG_THRESHOLD),
# so in double it is the float32 value widened (9.99999968e-21), not the double 1e-20.
LOG_THRESHOLD = float(np.float32(1e-20))


def _fail(layer, message: str):
    return ValueError(f"layer {layer.name!r} of type {layer.type}: {message}")


def _legacy_dim(layer, blob, index: int) -> int:
    """Caffe's Blob::LegacyShape: axis ``index`` of a blob of at most 4 axes, 1 past its end."""
    if blob.ndim > 4:
        raise _fail(layer, f"bottom {blob.name!r} of shape {blob.shape} has more than 4 axes, "
                           "which this layer's (num, channels, height, width) checks refuse")
    return blob.shape[index] if index < blob.ndim else 1


def _check_same_num(layer, data, label):
    """LossLayer::Reshape: the data and the label have the same first dimension."""
    if data.num != label.num:
        raise _fail(layer, f"the data and label should have the same number: bottom "
                           f"{data.name!r} has shape {data.shape}, bottom {label.name!r} has "
                           f"shape {label.shape}")


def _check_one_label_per_example(layer, data, label):
    """Caffe's CHECK_EQ(bottom[1]->channels() / height() / width(), 1): (N,), (N, 1), ..."""
    _check_same_num(layer, data, label)
    if any(_legacy_dim(layer, label, i) != 1 for i in (1, 2, 3)):
        raise _fail(layer, f"takes one label per example: bottom {label.name!r} has shape "
                           f"{label.shape}, expected ({data.num},) or ({data.num}, 1, 1, 1)")


def _refuse_label_gradient(layer, propagate_down, bottom, indices=(1,), what="label"):
    for i in indices:
        if i < len(propagate_down) and propagate_down[i]:
            raise _fail(layer, f"cannot backpropagate to {what} inputs (bottom "
                               f"{bottom[i].name!r})")


def _weight(layer, top, scale: float):
    """loss_weight * scale as a device scalar of the layer's dtype (no host sync)."""
    return (top[0].diff.reshape(-1)[0] * layer.dtype.type(scale)).astype(layer.dtype)


def _class_grid(layer, num: int, dim: int, label):
    """(N, dim) mask of each row's label column; ``label``, bottom[1] of ``layer`` (N
    values), truncated to int as C's cast.  A label outside 0..dim-1 (Caffe reads or writes
    past the row: undefined) is an error that names the layer and the blob, as
    SoftmaxWithLoss's."""
    xp = layer.xp
    lab = label.data.reshape(num, 1).astype(xp.int64)
    check_label_range(layer, label, lab, dim, None)
    return xp.arange(dim).reshape(1, dim) == lab, lab


# ------------------------------------------------------------ MultinomialLogisticLoss
@register_layer
class MultinomialLogisticLossLayer(Layer):
    """loss = -sum_n log(max(p[n, l_n], 1e-20)) / N, for probabilities p = bottom[0] viewed as
    (N, dim) and integer labels l = bottom[1], one per example.

    bottom[0] is expected to hold probabilities already (a Softmax before it); the clip at
    kLOG_THRESHOLD keeps the log finite. Backward reads both bottoms (no internal):
    dp[n, l_n] = -loss_weight / (N * max(p[n, l_n], 1e-20)), zero elsewhere.
    """

    type = "MultinomialLogisticLoss"
    exact_num_bottom = 2
    exact_num_top = 1
    is_loss = True
    backward_reads_bottom = (0, 1)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def reshape(self, bottom, top):
        _check_one_label_per_example(self, bottom[0], bottom[1])
        self.num = bottom[0].num
        self.dim = bottom[0].count // self.num if self.num else 0
        top[0].reshape(())

    def _label_probs(self, bottom):
        """(mask of the label columns (N, dim), clipped p[n, l_n] (N, 1))."""
        xp = self.xp
        p = bottom[0].data.reshape(self.num, self.dim)
        mask, lab = _class_grid(self, self.num, self.dim, bottom[1])
        pl = xp.take_along_axis(p, lab, axis=1)
        return mask, xp.maximum(pl, self.dtype.type(LOG_THRESHOLD))

    def forward_impl(self, bottom, top):
        _, pl = self._label_probs(bottom)
        top[0].data[...] = -self.xp.log(pl).sum() / self.dtype.type(self.num)

    def backward_impl(self, top, propagate_down, bottom):
        _refuse_label_gradient(self, propagate_down, bottom)
        if not propagate_down[0]:
            return
        xp = self.xp
        mask, pl = self._label_probs(bottom)
        scale = -_weight(self, top, 1.0 / self.num)
        dx = bottom[0].diff.reshape(self.num, self.dim)
        dx[...] = xp.where(mask, scale / pl, self.dtype.type(0))

    def flops(self, bottom, top):
        n = float(bottom[0].count)
        return 2.0 * bottom[0].num, n


# ------------------------------------------------------------------- InfogainLoss
@register_layer
class InfogainLossLayer(Layer):
    """Softmax over ``infogain_loss_param.axis`` (default 1), then the loss of the infogain
    matrix H (K x K, K the number of classes on that axis):

        loss = -sum over non-ignored positions of sum_k H[l, k] log(max(p_k, 1e-20))

    divided by the normalizer of ``loss_param.normalization`` (VALID by default; the
    deprecated ``normalize`` is refused, as upstream Caffe does). With H = I this is
    SoftmaxWithLoss. H is bottom[2] when there are three bottoms, else the BlobProto file
    ``infogain_loss_param.source`` (read once at setup; any shape of K*K values).

    bottom[0] (N, K, ...) scores, bottom[1] the N*... integer labels; an optional second top
    receives the probabilities. The probabilities are the saved internal ``prob`` (Caffe's
    ``prob_``), computed by Softmax's CAFFE-engine function (Caffe's inner Softmax layer
    could take cuDNN; the same function). Backward reads them, the labels and H:

        dx_k = (p_k * sum_j H[l, j] - H[l, k]) * loss_weight / normalizer

    zero at ignored positions. H from a file and its row sums (Caffe's ``infogain_`` and
    ``sum_rows_H_``) are constants of (K, K) and (K,) values kept as layer attributes, like
    Pooling's index tables: not feature maps, never batch-scaled, outside the planner's arena.
    Neither labels nor a bottom H get a gradient.
    """

    type = "InfogainLoss"
    min_num_bottom = 2
    max_num_bottom = 3
    min_num_top = 1
    max_num_top = 2
    is_loss = True

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        if lp.HasField("normalize"):
            raise _fail(self, 'loss_param.normalize is deprecated for this layer; use '
                              '"normalization" (FULL, VALID, BATCH_SIZE or NONE)')
        self.normalization = lp.normalization
        if self.normalization not in (_Norm.FULL, _Norm.VALID, _Norm.BATCH_SIZE, _Norm.NONE):
            raise _fail(self, f"unknown normalization mode {self.normalization}")
        self.ignore_label = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.infogain = None      # (K, K) H read from infogain_loss_param.source
        self.sum_rows_h = None    # (K,) its row sums, once
        # backward reads the labels and a bottom H (not the scores: it has the probabilities)
        self.backward_reads_bottom = (1, 2) if len(bottom) == 3 else (1,)
        if len(bottom) < 3:
            ip = self.param.infogain_loss_param
            if not ip.HasField("source"):
                raise _fail(self, "infogain matrix source must be specified "
                                  "(infogain_loss_param.source, or H as a third bottom)")
            path = Path(ip.source)
            if not path.is_file():
                raise _fail(self, f"infogain matrix source {ip.source!r} is not a file")
            h = blobproto_to_array(read_blobproto(path))
            self.infogain = self.xp.asarray(h.reshape(-1), dtype=self.dtype)

    def allow_force_backward(self, bottom_index: int) -> bool:
        # Caffe's LossLayer allows bottom 2 and its backward then dies; refuse it up front.
        return bottom_index == 0

    def reshape(self, bottom, top):
        x, label = bottom[0], bottom[1]
        _check_same_num(self, x, label)
        axis = self.param.infogain_loss_param.axis
        _, self.outer, self.k, self.inner = _axis_dims(self, x, axis)
        if self.outer * self.inner != label.count:
            raise _fail(self, f"number of labels must match number of predictions; bottom "
                              f"{x.name!r} of shape {x.shape} with infogain axis {axis} needs "
                              f"{self.outer * self.inner} labels, bottom {label.name!r} of "
                              f"shape {label.shape} has {label.count}")
        if len(bottom) == 3:
            h_count, h_name = bottom[2].count, f"bottom {bottom[2].name!r} of shape " \
                                                f"{bottom[2].shape}"
        else:
            h_count, h_name = int(self.infogain.size), \
                f"the matrix of {self.param.infogain_loss_param.source!r}"
        if h_count != self.k * self.k:
            raise _fail(self, f"the infogain matrix H must be {self.k}x{self.k} for the {self.k} "
                              f"classes of bottom {x.name!r} (shape {x.shape}); {h_name} holds "
                              f"{h_count} values")
        if self.infogain is not None and self.sum_rows_h is None:
            self.sum_rows_h = self.infogain.reshape(self.k, self.k).sum(axis=1)
        top[0].reshape(())
        # (N, K, ...): the softmax of bottom[0], kept for backward.
        self.add_internal("prob", x.shape, saved=True)
        if len(top) > 1:
            top[1].reshape_like(x)

    def _h(self, bottom):
        return (bottom[2].data if len(bottom) == 3 else self.infogain).reshape(self.k, self.k)

    def _labels(self, bottom):
        """(labels, clipped to 0 where ignored, (outer, inner) int; valid mask or None)."""
        xp = self.xp
        label = bottom[1].data.reshape(self.outer, self.inner).astype(xp.int64)
        check_label_range(self, bottom[1], label, self.k, self.ignore_label)
        if self.ignore_label is None:
            return label, None
        valid = label != self.ignore_label
        return xp.where(valid, label, 0), valid

    def _normalizer(self, valid):
        return masked_normalizer(self, valid)

    def forward_impl(self, bottom, top):
        xp = self.xp
        prob = softmax(xp, bottom[0].data.reshape(self.outer, self.k, self.inner),
                       self.internal("prob").data.reshape(self.outer, self.k, self.inner))
        label, valid = self._labels(bottom)
        rows = self._h(bottom)[label]                        # (outer, inner, K): H[l, :]
        logp = xp.log(xp.maximum(prob, self.dtype.type(LOG_THRESHOLD)))
        per = (rows * logp.transpose(0, 2, 1)).sum(axis=2)   # (outer, inner)
        if valid is not None:
            per = xp.where(valid, per, self.dtype.type(0))
        top[0].data[...] = -per.sum() / self._normalizer(valid)
        if len(top) > 1:
            top[1].data[...] = self.internal("prob").data

    def backward_impl(self, top, propagate_down, bottom):
        _refuse_label_gradient(self, propagate_down, bottom)
        _refuse_label_gradient(self, propagate_down, bottom, (2,), "infogain")
        if not propagate_down[0]:
            return
        xp = self.xp
        h = self._h(bottom)
        # a bottom H may change between iterations: its row sums every time, as Caffe
        sums = h.sum(axis=1) if len(bottom) == 3 else self.sum_rows_h
        label, valid = self._labels(bottom)
        prob = self.internal("prob").data.reshape(self.outer, self.k, self.inner)
        dx = bottom[0].diff.reshape(self.outer, self.k, self.inner)
        # (outer, K, inner) = p * sum_j H[l, j] - H[l, k]
        xp.subtract(prob * sums[label][:, None, :], h[label].transpose(0, 2, 1), out=dx)
        if valid is not None:
            dx *= valid[:, None, :]
        dx *= (top[0].diff.reshape(-1)[0] / self._normalizer(valid)).astype(self.dtype)

    def flops(self, bottom, top):
        n = float(bottom[0].count)
        return 7.0 * n, 4.0 * n


# ---------------------------------------------------------------------- HingeLoss
@register_layer
class HingeLossLayer(Layer):
    """One-vs-all hinge loss of scores x = bottom[0] viewed as (N, dim) against integer labels
    bottom[1], one per example. With t[n, k] = +1 for k = l_n and -1 otherwise,

        L1 (default): loss = sum max(0, 1 - t x) / N
        L2:           loss = sum max(0, 1 - t x)^2 / N

    (``hinge_loss_param.norm``). Backward: dx = -t [1 - t x > 0] w / N (L1; the subgradient
    0 at the kink, as caffe_cpu_sign) or -2 t max(0, 1 - t x) w / N (L2). Caffe keeps the
    margins in bottom[0]'s diff between forward and backward; here backward recomputes them
    from both bottoms' data, so it reads them and the layer needs no buffer of its own.
    """

    type = "HingeLoss"
    exact_num_bottom = 2
    exact_num_top = 1
    is_loss = True
    backward_reads_bottom = (0, 1)

    def layer_setup(self, bottom, top):
        self.norm = self.param.hinge_loss_param.norm
        if self.norm not in (1, 2):
            raise _fail(self, f"unknown norm {self.norm} (L1 = 1 or L2 = 2)")

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def reshape(self, bottom, top):
        _check_same_num(self, bottom[0], bottom[1])
        self.num = bottom[0].num
        self.dim = bottom[0].count // self.num if self.num else 0
        if bottom[1].count != self.num:
            raise _fail(self, f"takes one label per example: bottom {bottom[1].name!r} has "
                              f"shape {bottom[1].shape}, bottom {bottom[0].name!r} has "
                              f"{self.num} examples")
        top[0].reshape(())

    def _margins(self, bottom):
        """(-t, max(0, 1 - t x)), both (N, dim)."""
        xp = self.xp
        dt = self.dtype.type
        mask, _ = _class_grid(self, self.num, self.dim, bottom[1])
        sign = xp.where(mask, dt(-1), dt(1))                 # -t: Caffe flips the label's sign
        x = bottom[0].data.reshape(self.num, self.dim)
        return sign, xp.maximum(dt(0), dt(1) + sign * x)

    def forward_impl(self, bottom, top):
        _, m = self._margins(bottom)
        flat = m.reshape(-1)
        total = flat.sum() if self.norm == 1 else self.xp.vdot(flat, flat)
        top[0].data[...] = total / self.dtype.type(self.num)

    def backward_impl(self, top, propagate_down, bottom):
        _refuse_label_gradient(self, propagate_down, bottom)
        if not propagate_down[0]:
            return
        sign, m = self._margins(bottom)
        dx = bottom[0].diff.reshape(self.num, self.dim)
        if self.norm == 1:
            self.xp.multiply(sign, m > 0, out=dx, dtype=self.dtype)
            dx *= _weight(self, top, 1.0 / self.num)
        else:
            self.xp.multiply(sign, m, out=dx)
            dx *= _weight(self, top, 2.0 / self.num)

    def flops(self, bottom, top):
        n = float(bottom[0].count)
        return 4.0 * n, 4.0 * n


# ----------------------------------------------------------------- ContrastiveLoss
@register_layer
class ContrastiveLossLayer(Layer):
    """Contrastive loss of feature pairs a = bottom[0], b = bottom[1], both (N, C) (or
    (N, C, 1, 1)), with y = bottom[2] (N values, truncated to int: nonzero = similar):

        d_n = ||a_n - b_n||
        loss = sum_n [y_n d_n^2 + (1 - y_n) max(margin - d_n, 0)^2] / (2 N)

    and with ``contrastive_loss_param.legacy_version`` the dissimilar term max(margin - d_n^2,
    0) instead. Backward, alpha = +-loss_weight / N for a and b: similar pairs alpha (a - b);
    dissimilar pairs -alpha (a - b) (legacy) or -alpha (margin - d) / (d + 1e-4) (a - b) where
    margin - d (or margin - d^2) > 0, else 0. The 1e-4 is Caffe's, so this gradient differs
    from the exact one by a relative 1e-4 / d.

    Saved internals: ``diff`` (N, C) = a - b and ``dist_sq`` (N,) (Caffe's ``diff_``,
    ``dist_sq_``); backward reads them and y, not a or b. Scratch ``diff_sq`` (N, C) holds
    (a - b)^2 within forward (Caffe's ``diff_sq_``). Caffe's ``summer_vec_`` (C ones for a
    GEMV) is not needed: the sum is a reduction here. y gets no gradient.
    """

    type = "ContrastiveLoss"
    exact_num_bottom = 3
    exact_num_top = 1
    is_loss = True
    backward_reads_bottom = (2,)

    def layer_setup(self, bottom, top):
        cp = self.param.contrastive_loss_param
        self.margin = float(cp.margin)
        self.legacy = bool(cp.legacy_version)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 2

    def reshape(self, bottom, top):
        a, b, y = bottom
        _check_same_num(self, a, b)
        if _legacy_dim(self, a, 1) != _legacy_dim(self, b, 1):
            raise _fail(self, f"the two inputs must have the same channels: bottom {a.name!r} "
                              f"has shape {a.shape}, bottom {b.name!r} has shape {b.shape}")
        for blob in (a, b):
            if _legacy_dim(self, blob, 2) != 1 or _legacy_dim(self, blob, 3) != 1:
                raise _fail(self, f"bottom {blob.name!r} of shape {blob.shape} must be (N, C) "
                                  "or (N, C, 1, 1)")
        if y.count != a.num or any(_legacy_dim(self, y, i) != 1 for i in (1, 2, 3)):
            raise _fail(self, f"takes one similarity label per pair: bottom {y.name!r} has "
                              f"shape {y.shape}, expected ({a.num},) or ({a.num}, 1, 1, 1)")
        self.num, self.channels = a.num, _legacy_dim(self, a, 1)
        top[0].reshape(())
        # (N, C): a - b, and (N,): its squared norms, kept for backward.
        self.add_internal("diff", (self.num, self.channels), saved=True)
        self.add_internal("dist_sq", (self.num,), saved=True)
        # (N, C): (a - b)^2, within forward only.
        self.add_internal("diff_sq", (self.num, self.channels), saved=False)
        self.internals["diff_sq"].uses = ("forward",)

    def _similar(self, bottom):
        return bottom[2].data.reshape(self.num).astype(self.xp.int64) != 0

    def forward_impl(self, bottom, top):
        xp = self.xp
        dt = self.dtype.type
        d = self.internal("diff").data
        xp.subtract(bottom[0].data.reshape(d.shape), bottom[1].data.reshape(d.shape), out=d)
        sq = self.internal("diff_sq").data
        xp.multiply(d, d, out=sq)
        dist_sq = self.internal("dist_sq").data
        sq.sum(axis=1, out=dist_sq)
        if self.legacy:
            far = xp.maximum(dt(self.margin) - dist_sq, dt(0))
        else:
            far = xp.maximum(dt(self.margin) - xp.sqrt(dist_sq), dt(0)) ** 2
        per = xp.where(self._similar(bottom), dist_sq, far)
        top[0].data[...] = per.sum() / dt(self.num) / dt(2)

    def backward_impl(self, top, propagate_down, bottom):
        _refuse_label_gradient(self, propagate_down, bottom, (2,))
        if not (propagate_down[0] or propagate_down[1]):
            return
        xp = self.xp
        dt = self.dtype.type
        d = self.internal("diff").data
        dist_sq = self.internal("dist_sq").data
        if self.legacy:
            mdist = dt(self.margin) - dist_sq
            far = xp.full_like(dist_sq, -1)
        else:
            dist = xp.sqrt(dist_sq)
            mdist = dt(self.margin) - dist
            far = -mdist / (dist + dt(1e-4))
        # per pair, the factor of alpha (a - b): 1 similar, far where the margin is not met
        coeff = xp.where(self._similar(bottom), dt(1), xp.where(mdist > 0, far, dt(0)))
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                alpha = _weight(self, top, sign / self.num)
                xp.multiply(d, (coeff * alpha)[:, None], out=bottom[i].diff.reshape(d.shape))

    def flops(self, bottom, top):
        n = float(bottom[0].count)
        return 4.0 * n, 4.0 * n
