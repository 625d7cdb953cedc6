"""Slice and Tile, as Caffe's ``slice_layer.cpp`` and ``tile_layer.cpp``.

Both view the bottom as (outer, D, inner) around one axis: Slice cuts D into
the tops' extents (the inverse of Concat), Tile repeats everything from the
axis on ``tiles`` times. Their backward passes move diffs only; they read no
data.
"""
from __future__ import annotations

from math import prod

from ..layer import Layer, register_layer


@register_layer
class SliceLayer(Layer):
    """Cut bottom[0] along ``axis`` (default 1, the channels) into the tops.

    With ``slice_point`` (one fewer than the tops, strictly increasing) top i
    takes [slice_point[i-1], slice_point[i]) of the axis, the last top the rest
    (empty where the last point is the axis' extent, as Caffe allows); without
    it the axis is split equally and the tops must divide it. The legacy
    ``slice_dim`` (non-negative only) stands for ``axis``; giving both is an
    error. With a single top, the top shares the bottom's data and diff, as in
    Caffe. Backward copies the top diffs back into place; it reads no data.
    """

    type = "Slice"
    exact_num_bottom = 1
    min_num_top = 1
    backward_reads_bottom = ()

    def layer_setup(self, bottom, top):
        p = self.param.slice_param
        if p.HasField("axis") and p.HasField("slice_dim"):
            raise ValueError(
                f"layer {self.name!r} of type Slice: either axis or slice_dim should be "
                "specified; not both")
        self.slice_points = [int(s) for s in p.slice_point]

    def _slice_axis(self, b) -> int:
        p = self.param.slice_param
        if p.HasField("slice_dim"):
            axis = int(p.slice_dim)
            if axis >= b.ndim:
                raise ValueError(
                    f"layer {self.name!r} of type Slice: slice_dim {axis} out of range for bottom "
                    f"{b.name!r} of shape {b.shape} (0 <= slice_dim < {b.ndim})")
            return axis
        return self.canonical_axis(b, p.axis)

    def _extents(self, b, n_top: int) -> list[int]:
        """The tops' extents along the slice axis."""
        d = b.shape[self.axis]
        points = self.slice_points
        if not points:
            if d % n_top:
                raise ValueError(
                    f"layer {self.name!r} of type Slice: number of top blobs ({n_top}) should "
                    f"evenly divide input slice axis ({d}; bottom {b.name!r} of shape "
                    f"{b.shape}, axis {self.axis})")
            return [d // n_top] * n_top
        if len(points) != n_top - 1:
            raise ValueError(
                f"layer {self.name!r} of type Slice: {len(points)} slice_point(s) {points} need "
                f"{len(points) + 1} tops, got {n_top}")
        if n_top > d:
            raise ValueError(
                f"layer {self.name!r} of type Slice: {n_top} tops cannot slice axis {self.axis} "
                f"of extent {d} (bottom {b.name!r} of shape {b.shape})")
        prev = 0
        extents = []
        for s in points:
            if s <= prev:
                raise ValueError(
                    f"layer {self.name!r} of type Slice: slice_point {points} must be strictly "
                    f"increasing and positive ({s} after {prev})")
            extents.append(s - prev)
            prev = s
        if prev > d:
            raise ValueError(
                f"layer {self.name!r} of type Slice: slice_point {prev} lies past the end of axis "
                f"{self.axis} (extent {d}) of bottom {b.name!r} of shape {b.shape}")
        extents.append(d - prev)
        return extents

    def reshape(self, bottom, top):
        b = bottom[0]
        self.axis = self._slice_axis(b)
        self.extents = self._extents(b, len(top))
        self.outer = prod(b.shape[:self.axis])
        self.inner = prod(b.shape[self.axis + 1:])
        for t, e in zip(top, self.extents):
            if t is b:
                raise ValueError(
                    f"layer {self.name!r}: Slice layer does not allow in-place computation")
            shape = list(b.shape)
            shape[self.axis] = e
            t.reshape(shape)
        if len(top) == 1:
            top[0].share_data(b)
            top[0].share_diff(b)

    def _pieces(self, whole, blobs, which: str):
        """(piece of ``whole`` as (outer, e, inner), the blob's array as the same) per top."""
        x = whole.reshape(self.outer, sum(self.extents), self.inner)
        offset = 0
        for t, e in zip(blobs, self.extents):
            yield x[:, offset:offset + e, :], getattr(t, which).reshape(self.outer, e, self.inner)
            offset += e

    def forward_impl(self, bottom, top):
        if len(top) == 1:
            return  # the top aliases the bottom
        for piece, y in self._pieces(bottom[0].data, top, "data"):
            y[...] = piece

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0] or len(top) == 1:
            return
        for piece, dy in self._pieces(bottom[0].diff, top, "diff"):
            piece[...] = dy

    def flops(self, bottom, top):
        """Copies only: the elements moved each way (the performance model's measure of a
        copy's work); none with one top, which shares the bottom."""
        if len(top) == 1:
            return 0.0, 0.0
        n = float(bottom[0].count)
        return n, n


@register_layer
class TileLayer(Layer):
    """Repeat bottom[0] ``tiles`` times along ``axis`` (default 1).

    The bottom is viewed as (outer, inner) with inner = the count from the
    axis on; the top is (outer, tiles, inner): each outer slice is copied
    ``tiles`` times, so (N, C, H, W) with axis 1 and tiles 2 gives
    (N, 2C, H, W) with the C channels twice in a row. Backward sums the tiles'
    diffs; it reads no data. ``tiles`` must be given and positive.
    """

    type = "Tile"
    exact_num_bottom = 1
    exact_num_top = 1
    backward_reads_bottom = ()

    def reshape(self, bottom, top):
        b = bottom[0]
        p = self.param.tile_param
        self.axis = self.canonical_axis(b, p.axis)
        if not p.HasField("tiles"):
            raise ValueError(f"layer {self.name!r} of type Tile: number of tiles must be specified")
        if p.tiles <= 0:
            raise ValueError(
                f"layer {self.name!r} of type Tile: number of tiles must be positive, got "
                f"{p.tiles}")
        if top[0] is b:
            raise ValueError(
                f"layer {self.name!r}: Tile layer does not allow in-place computation")
        self.tiles = int(p.tiles)
        self.outer = prod(b.shape[:self.axis])
        self.inner = prod(b.shape[self.axis:])
        shape = list(b.shape)
        shape[self.axis] *= self.tiles
        top[0].reshape(shape)

    def forward_impl(self, bottom, top):
        x = bottom[0].data.reshape(self.outer, 1, self.inner)
        top[0].data.reshape(self.outer, self.tiles, self.inner)[...] = x

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff.reshape(self.outer, self.tiles, self.inner)
        dy.sum(axis=1, out=bottom[0].diff.reshape(self.outer, self.inner))

    def flops(self, bottom, top):
        return 0.0, float(top[0].count)  # backward adds the tiles' diffs
