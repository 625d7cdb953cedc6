"""Accuracy, as Caffe's ``accuracy_layer.cpp`` (upstream master's tie rule)."""
from __future__ import annotations

from math import prod

from ..layer import Layer, register_layer
from .softmax import check_label_range


@register_layer
class AccuracyLayer(Layer):
    """Top-k accuracy of scores bottom[0] (outer, C, inner) against labels bottom[1].

    A prediction is correct when fewer than ``top_k`` classes other than the
    true one score at least as high as the true class: ties count against the
    true class (Caffe counts ``score >= true_score`` over all classes, the true
    class included, starting from -1). Positions whose label equals
    ``ignore_label`` are skipped; with none left the accuracy is 0. An optional
    second top gets the per-class accuracy (C,), 0 for classes absent from the
    batch. Computed on the device with no host synchronisation.

    No backward: a gradient asked for raises NotImplementedError, and
    ``allow_force_backward`` refuses both bottoms so that ``force_backward``
    never asks.
    """

    type = "Accuracy"
    exact_num_bottom = 2
    min_num_top = 1
    max_num_top = 2
    backward_reads_bottom = ()

    def layer_setup(self, bottom, top):
        p = self.param.accuracy_param
        self.top_k = int(p.top_k)
        self.ignore_label = int(p.ignore_label) if p.HasField("ignore_label") else None

    def allow_force_backward(self, bottom_index: int) -> bool:
        return False

    def reshape(self, bottom, top):
        scores, label = bottom
        if label.count == 0 or self.top_k > scores.count // label.count:
            raise ValueError(
                f"layer {self.name!r} of type Accuracy: top_k ({self.top_k}) must be less than or "
                f"equal to the number of classes ({scores.count // max(label.count, 1)}; bottom "
                f"{scores.name!r} of shape {scores.shape}, labels {label.name!r} of shape "
                f"{label.shape})")
        axis = self.param.accuracy_param.axis
        n = scores.ndim
        if not -n <= axis < n:
            raise ValueError(
                f"layer {self.name!r} of type Accuracy: axis {axis} out of range for bottom "
                f"{scores.name!r} of shape {scores.shape}")
        axis = axis + n if axis < 0 else axis
        self.outer = prod(scores.shape[:axis])
        self.c = scores.shape[axis]
        self.inner = prod(scores.shape[axis + 1:])
        if self.outer * self.inner != label.count:
            raise ValueError(
                f"layer {self.name!r} of type Accuracy: number of labels must match number of "
                f"predictions; bottom {scores.name!r} of shape {scores.shape} with label axis "
                f"{axis} needs {self.outer * self.inner} labels (e.g. N*H*W for (N, C, H, W) and "
                f"axis 1), bottom {label.name!r} of shape {label.shape} has {label.count}")
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape((self.c,))

    def forward_impl(self, bottom, top):
        xp = self.xp
        dt = self.dtype
        x = bottom[0].data.reshape(self.outer, self.c, self.inner)
        label = bottom[1].data.reshape(self.outer, 1, self.inner).astype(xp.int64)
        check_label_range(self, bottom[1], label, self.c, self.ignore_label)
        if self.ignore_label is not None:
            valid = label != self.ignore_label
            label = xp.where(valid, label, 0)
        else:
            valid = xp.ones(label.shape, dtype=bool)
        true_score = xp.take_along_axis(x, label, axis=1)  # (outer, 1, inner)
        # classes scoring at least the true class, the true class itself excluded
        better = (x >= true_score).sum(axis=1, keepdims=True) - 1
        correct = (better < self.top_k) & valid  # (outer, 1, inner)
        count = valid.sum()
        top[0].data[...] = (correct.sum() / xp.maximum(count, 1)).astype(dt)
        if len(top) > 1:
            # (C, outer*inner) one-hot of the labels: a sync-free bincount.
            onehot = xp.arange(self.c).reshape(self.c, 1) == label.reshape(1, -1)
            nums = (onehot & valid.reshape(1, -1)).sum(axis=1)
            hits = (onehot & correct.reshape(1, -1)).sum(axis=1)
            top[1].data[...] = xp.where(nums == 0, 0, hits / xp.maximum(nums, 1)).astype(dt)

    def backward_impl(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise NotImplementedError(
                f"layer {self.name!r} of type Accuracy has no backward (asked to propagate to "
                f"bottoms {[i for i, p in enumerate(propagate_down) if p]})")
