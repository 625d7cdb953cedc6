"""Concat, as Caffe's ``concat_layer.cpp``: join bottoms along one axis."""
from __future__ import annotations

from ..layer import Layer, register_layer


@register_layer
class ConcatLayer(Layer):
    """Top = the bottoms joined along ``axis`` (default 1, the channels).

    Every bottom must have the top's shape except along the concatenation
    axis. The legacy ``concat_dim`` (non-negative only) is accepted in place of
    ``axis``. With a single bottom, the top shares its data and diff, as in
    Caffe. Backward slices the top diff back; it reads no data.
    """

    type = "Concat"
    min_num_bottom = 1
    exact_num_top = 1
    backward_reads_bottom = ()

    def layer_setup(self, bottom, top):
        p = self.param.concat_param
        if p.HasField("axis") and p.HasField("concat_dim"):
            raise ValueError(
                f"layer {self.name!r} of type Concat: either axis or concat_dim should be "
                "specified; not both")

    def _concat_axis(self, b) -> int:
        p = self.param.concat_param
        n = b.ndim
        if p.HasField("concat_dim"):
            axis = int(p.concat_dim)
            if axis >= n:
                raise ValueError(
                    f"layer {self.name!r} of type Concat: concat_dim {axis} out of range for "
                    f"bottom {b.name!r} of shape {b.shape}")
            return axis
        axis = p.axis
        if not -n <= axis < n:
            raise ValueError(
                f"layer {self.name!r} of type Concat: axis {axis} out of range for bottom "
                f"{b.name!r} of shape {b.shape}")
        return axis + n if axis < 0 else axis

    def reshape(self, bottom, top):
        first = bottom[0]
        axis = self._concat_axis(first)
        shape = list(first.shape)
        for b in bottom[1:]:
            if b.ndim != first.ndim:
                raise ValueError(
                    f"layer {self.name!r} of type Concat: all inputs must have the same number of "
                    f"axes: bottom {first.name!r} has shape {first.shape}, bottom {b.name!r} "
                    f"has shape {b.shape}")
            for j in range(first.ndim):
                if j != axis and b.shape[j] != first.shape[j]:
                    raise ValueError(
                        f"layer {self.name!r} of type Concat: all inputs must have the same shape "
                        f"except at concat axis {axis}: bottom {first.name!r} has shape "
                        f"{first.shape}, bottom {b.name!r} has shape {b.shape} (axis {j} differs)")
            shape[axis] += b.shape[axis]
        self.axis = axis
        top[0].reshape(shape)
        if len(bottom) == 1:
            top[0].share_data(bottom[0])
            top[0].share_diff(bottom[0])

    def forward_impl(self, bottom, top):
        if len(bottom) == 1:
            return
        self.xp.concatenate([b.data for b in bottom], axis=self.axis, out=top[0].data)

    def backward_impl(self, top, propagate_down, bottom):
        if len(bottom) == 1:
            return
        dy = top[0].diff
        index = [slice(None)] * dy.ndim
        offset = 0
        for b, prop in zip(bottom, propagate_down):
            size = b.shape[self.axis]
            if prop:
                index[self.axis] = slice(offset, offset + size)
                b.diff[...] = dy[tuple(index)]
            offset += size

    def flops(self, bottom, top):
        """Copies only: the elements moved each way, the performance model's measure of the
        work (swap/model.py fits time against it; GoogLeNet's Concat steps take time in
        proportion to the minibatch).  None with one bottom: the top shares it."""
        if len(bottom) == 1:
            return 0.0, 0.0
        n = float(top[0].count)
        return n, n
