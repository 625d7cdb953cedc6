"""Layers that move no numbers: Flatten, Reshape, Split, Silence.

Flatten and Reshape give a new shape to the bottom's own storage: the top
shares the bottom's data and diff (Caffe's ShareData/ShareDiff), so forward
and backward have nothing to do. Split tops share the bottom's data but each
has its own diff, summed back in backward.
"""
from __future__ import annotations

from math import prod

from ..kernels import cuda_fused
from ..layer import Layer, register_layer


class _ViewLayer(Layer):
    """A top that is a reshaped alias of the bottom (data and diff shared)."""

    exact_num_bottom = 1
    exact_num_top = 1
    backward_reads_bottom = ()

    def top_shape(self, bottom) -> tuple:
        raise NotImplementedError

    def reshape(self, bottom, top):
        shape = self.top_shape(bottom[0])
        if prod(shape) != bottom[0].count:
            raise ValueError(
                f"layer {self.name!r} of type {self.type}: output count {prod(shape)} (shape "
                f"{shape}) must match input count {bottom[0].count} (bottom {bottom[0].name!r} "
                f"of shape {bottom[0].shape})")
        top[0].reshape(shape)
        top[0].share_data(bottom[0])
        top[0].share_diff(bottom[0])

    def forward_impl(self, bottom, top):
        pass  # the top aliases the bottom's data

    def backward_impl(self, top, propagate_down, bottom):
        pass  # the bottom's diff is the top's diff

    def flops(self, bottom, top):
        return 0.0, 0.0


@register_layer
class FlattenLayer(_ViewLayer):
    """Merge axes ``axis`` .. ``end_axis`` (inclusive; defaults 1 and -1) into one.

    (N, C, H, W) -> (N, C*H*W) by default. With ``end_axis`` one before ``axis`` the
    merged range is empty and an axis of extent 1 is inserted at ``axis``, as Caffe's
    ``count(axis, end_axis + 1)`` gives. Not allowed in place, as in Caffe.
    """

    type = "Flatten"

    def top_shape(self, b) -> tuple:
        p = self.param.flatten_param
        start = self.canonical_axis(b, p.axis)
        end = self.canonical_axis(b, p.end_axis, "end_axis")
        # Caffe takes count(start, end + 1), which Blob::count allows down to end + 1 ==
        # start: an empty product, so end_axis just before axis inserts an axis of extent 1.
        if end + 1 < start:
            raise ValueError(
                f"layer {self.name!r} of type Flatten: end_axis {p.end_axis} comes before axis "
                f"{p.axis} by more than one for bottom {b.name!r} of shape {b.shape}")
        return tuple(b.shape[:start]) + (prod(b.shape[start:end + 1]),) + tuple(b.shape[end + 1:])

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise ValueError(
                f"layer {self.name!r}: Flatten layer does not allow in-place computation")
        super().reshape(bottom, top)


@register_layer
class ReshapeLayer(_ViewLayer):
    """Replace axes [axis, axis + num_axes) of the bottom by ``shape``.

    In ``shape``, 0 copies the bottom's dimension at the same position and
    one -1 is inferred from the count; ``axis`` may be negative (-1 = after the
    last axis) and ``num_axes: -1`` (default) covers all remaining axes.  Not allowed in
    place, as in Caffe.
    """

    type = "Reshape"

    def layer_setup(self, bottom, top):
        if top[0] is bottom[0]:     # ReshapeLayer::LayerSetUp's CHECK_NE(top[0], bottom[0])
            raise ValueError(
                f"layer {self.name!r}: Reshape layer does not allow in-place computation")
        dims = [int(d) for d in self.param.reshape_param.shape.dim]
        self.copy_axes = [i for i, d in enumerate(dims) if d == 0]
        inferred = [i for i, d in enumerate(dims) if d == -1]
        if len(inferred) > 1:
            raise ValueError(
                f"layer {self.name!r} of type Reshape: new shape {dims} contains multiple -1 "
                "dims; at most a single (1) value of -1 may be specified")
        bad = [d for d in dims if d < -1]
        if bad:
            raise ValueError(
                f"layer {self.name!r} of type Reshape: new shape {dims} has invalid dimension "
                f"{bad[0]} (use 0 to copy a dimension, -1 to infer one)")
        self.inferred_axis = inferred[0] if inferred else -1
        self.new_dims = dims

    def top_shape(self, b) -> tuple:
        p = self.param.reshape_param
        n = b.ndim
        start = p.axis if p.axis >= 0 else n + p.axis + 1
        if not 0 <= start <= n:
            raise ValueError(
                f"layer {self.name!r} of type Reshape: axis {p.axis} out of range for {n}-D "
                f"bottom {b.name!r} of shape {b.shape}")
        if p.num_axes < -1:
            raise ValueError(
                f"layer {self.name!r} of type Reshape: num_axes must be >= 0, or -1 for all; "
                f"got {p.num_axes}")
        end = n if p.num_axes == -1 else start + p.num_axes
        if end > n:
            raise ValueError(
                f"layer {self.name!r} of type Reshape: end axis = axis + num_axes = {end} is out "
                f"of range for bottom {b.name!r} of shape {b.shape}")
        shape = list(b.shape[:start]) + list(self.new_dims) + list(b.shape[end:])
        for i in self.copy_axes:
            if start + i >= n:
                raise ValueError(
                    f"layer {self.name!r} of type Reshape: new shape contains a 0 at position "
                    f"{i}, but there is no corresponding axis {start + i} of bottom {b.name!r} "
                    f"(shape {b.shape}) to copy")
            shape[start + i] = b.shape[start + i]
        if self.inferred_axis >= 0:
            explicit = prod(d for j, d in enumerate(shape) if j != start + self.inferred_axis)
            if explicit == 0 or b.count % explicit:
                raise ValueError(
                    f"layer {self.name!r} of type Reshape: bottom count ({b.count}, shape "
                    f"{b.shape}) must be divisible by the product of the specified dimensions "
                    f"({explicit})")
            shape[start + self.inferred_axis] = b.count // explicit
        return tuple(shape)


@register_layer
class SplitLayer(Layer):
    """Copy one bottom to several tops (Caffe inserts these where a blob has several readers).

    The tops share the bottom's data (no copy); each has its own diff, and
    backward sums them into the bottom diff. Backward reads no data.
    """

    type = "Split"
    exact_num_bottom = 1
    min_num_top = 1
    backward_reads_bottom = ()
    _fused = False

    def layer_setup(self, bottom, top):
        # decided once: backward's sums through the fused Eltwise kernel in GPU mode
        # (16-byte loads; a * 1 + b is a + b, bit for bit)
        self._fused = cuda_fused.enabled_for(self.xp, self.dtype)

    def reshape(self, bottom, top):
        for t in top:
            if t is bottom[0]:
                raise ValueError(
                    f"layer {self.name!r}: Split layer does not allow in-place computation")
            t.reshape_like(bottom[0])
            t.share_data(bottom[0])

    def forward_impl(self, bottom, top):
        pass  # the tops alias the bottom's data

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].diff
        if len(top) == 1:
            dx[...] = top[0].diff
            return
        if self._fused:
            cuda_fused.eltwise_sum2(top[0].diff, 1.0, top[1].diff, 1.0, dx)
            for t in top[2:]:
                cuda_fused.eltwise_sum2(dx, 1.0, t.diff, 1.0, dx)
            return
        self.xp.add(top[0].diff, top[1].diff, out=dx)
        for t in top[2:]:
            dx += t.diff

    def flops(self, bottom, top):
        return 0.0, float(bottom[0].count * max(len(top) - 1, 0))


@register_layer
class SilenceLayer(Layer):
    """Swallow bottoms that nothing else reads (no tops); their diff is zero."""

    type = "Silence"
    min_num_bottom = 1
    exact_num_top = 0
    backward_reads_bottom = ()

    def reshape(self, bottom, top):
        pass

    def forward_impl(self, bottom, top):
        pass

    def backward_impl(self, top, propagate_down, bottom):
        for b, prop in zip(bottom, propagate_down):
            if prop:
                b.diff[...] = 0

    def flops(self, bottom, top):
        return 0.0, 0.0
