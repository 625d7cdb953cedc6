"""Layers that pick items of the batch: BatchReindex and Filter (Caffe's
``src/caffe/layers/batch_reindex_layer.cpp`` and ``filter_layer.cpp``).

Both read their index bottom on the host, as Caffe does (``cpu_data()``, also in its GPU
path): one explicit device-to-host copy of a small (N,) blob per forward, which
synchronizes.  What backward needs of it is kept on the host as Caffe keeps
``indices_to_forward_`` (a ``std::vector``): no device buffer, so neither layer declares an
internal, and neither backward reads a bottom's or a top's data.
"""
from __future__ import annotations

import numpy as np

from ..backend import to_numpy
from ..layer import BackwardReads, Layer, register_layer


@register_layer
class BatchReindexLayer(Layer):
    """top[i] = bottom[0][int(bottom[1][i])]: items of the batch, in any order, repeated or not.

    Shapes: bottom[0] (N, ...), bottom[1] (M,) of indices held as floats, top (M, ...).
    An index is checked as Caffe checks it, as a float, ``0 <= v < N``, then truncated toward
    zero (``static_cast<int>``): 2.7 picks item 2, -0.5 is refused.  Backward sums the top's
    diff into the bottom's (overwritten first): an item picked k times gets the sum of its
    k diffs, added in top order as Caffe's CPU loop adds them.  The index bottom gets no
    gradient (Caffe: ``Cannot backprop to index``).
    """

    type = "BatchReindex"
    exact_num_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        self._where = f"layer {self.name!r} (BatchReindex): "
        self._index = None  # host (M,) int64 of the last forward
        self._rounds = []   # [(top positions, bottom items)] per repetition, see _plan_sums

    def reshape(self, bottom, top):
        x, idx = bottom
        if idx.ndim != 1:
            raise ValueError(f"{self._where}the index bottom {idx.name!r} must have 1 axis, "
                             f"has shape {idx.shape}")
        if x.ndim < 1:
            raise ValueError(f"{self._where}bottom {x.name!r} has no batch axis")
        top[0].reshape((idx.shape[0],) + x.shape[1:])

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index == 0

    def forward_impl(self, bottom, top):
        x, idx = bottom
        n = x.shape[0]
        values = to_numpy(idx.data)  # device -> host: syncs (Caffe reads cpu_data() too)
        bad = ~((values >= 0) & (values < n))  # NaN fails both, as Caffe's CHECKs
        if bad.any():
            i = int(np.argmax(bad))
            what = "negative" if values[i] < 0 else "greater than batch size"
            raise ValueError(f"{self._where}index specified for reindex layer was {what}: "
                             f"{idx.name!r}[{i}] = {values[i]!r}, batch size {n}")
        self._index = values.astype(np.int64)  # truncates toward zero
        self._rounds = None
        if top[0].count == 0:
            return
        top[0].data[...] = x.data[self.xp.asarray(self._index)]

    def _plan_sums(self):
        """Split the top positions into rounds with distinct bottom items: round r holds the
        r-th pick of every item picked more than r times, so that adding round after round
        sums each item's diffs in top order."""
        index = self._index
        order = np.argsort(index, kind="stable")
        sorted_idx = index[order]
        first = np.searchsorted(sorted_idx, sorted_idx, side="left")
        rank = np.empty_like(index)
        rank[order] = np.arange(index.size) - first
        xp = self.xp
        rounds = []
        for r in range(int(rank.max()) + 1 if index.size else 0):
            pos = np.nonzero(rank == r)[0]
            rounds.append((xp.asarray(pos), xp.asarray(index[pos])))
        return rounds

    def backward_impl(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise ValueError(f"{self._where}cannot backprop to index (bottom "
                             f"{bottom[1].name!r})")
        if not propagate_down[0]:
            return
        if self._rounds is None:
            self._rounds = self._plan_sums()
        dx, dy = bottom[0].diff, top[0].diff
        dx[...] = 0
        for pos, items in self._rounds:
            dx[items] += dy[pos]

    def backward_reads(self) -> BackwardReads:
        """The index is kept on the host by forward; backward reads only the top's diff."""
        return BackwardReads()

    def flops(self, bottom, top):
        n = float(top[0].count)
        return n, n + float(bottom[0].count)


@register_layer
class FilterLayer(Layer):
    """Forward the items whose selector is non-zero (Caffe's ``FilterLayer``).

    Bottoms: K blobs to filter, then the selector (N, 1, ..., 1); K tops.  Item n of every
    bottom goes to the tops when ``selector[n] != 0`` (NaN counts as non-zero, as C++'s
    truth test), in batch order.  The tops' first axis is the number selected, so it changes
    with the data: forward reshapes the tops (Caffe's Layer::Forward reshapes before every
    forward) and minicaffe's Net reshapes the layers after them as it meets their new
    bottom shapes.  Backward copies each top diff back to its item and sets the other
    items' diffs to 0; the selector gets no gradient.

    ``reshape`` shapes the tops for the whole batch, as Caffe's first Reshape does: that is
    the most a forward can select, so a memory plan made from the shapes after a reshape
    (swap.runtime.install reshapes the net) bounds every later forward; Caffe's later
    Reshapes (within each Forward) select, and here the forward does.
    """

    type = "Filter"
    min_num_bottom = 2
    min_num_top = 1

    def layer_setup(self, bottom, top):
        self._where = f"layer {self.name!r} (Filter): "
        if len(top) != len(bottom) - 1:
            raise ValueError(f"{self._where}needs one top per filtered bottom: {len(bottom)} "
                             f"bottoms (the last is the selector) and {len(top)} tops")
        self._indices = np.zeros(0, dtype=np.int64)  # host: Caffe's indices_to_forward_

    def _check(self, bottom):
        sel = bottom[-1]
        if sel.ndim < 1 or any(d != 1 for d in sel.shape[1:]):
            raise ValueError(f"{self._where}selector blob dimensions must be singletons (1), "
                             f"except the first: {sel.name!r} has shape {sel.shape}")
        for b in bottom[:-1]:
            if b.ndim < 1 or b.shape[0] != sel.shape[0]:
                raise ValueError(f"{self._where}each bottom should have the same 0th dimension "
                                 f"as the selector blob: {b.name!r} {b.shape}, selector "
                                 f"{sel.name!r} {sel.shape}")

    def reshape(self, bottom, top):
        self._check(bottom)
        for b, t in zip(bottom, top):
            t.reshape(b.shape)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != self._num_bottom - 1

    def forward_impl(self, bottom, top):
        self._check(bottom)
        sel = to_numpy(bottom[-1].data).reshape(-1)  # device -> host: syncs, as Caffe's
        self._indices = np.nonzero(sel)[0]
        k = self._indices.size
        index = self.xp.asarray(self._indices)
        for b, t in zip(bottom, top):
            t.reshape((k,) + b.shape[1:])
            if k:
                t.data[...] = b.data[index]

    def backward_impl(self, top, propagate_down, bottom):
        if propagate_down[-1]:
            raise ValueError(f"{self._where}layer cannot backpropagate to filter index inputs "
                             f"(the selector {bottom[-1].name!r})")
        index = self.xp.asarray(self._indices)
        for i, (t, b) in enumerate(zip(top, bottom)):
            if not propagate_down[i]:
                continue
            dx = b.diff
            dx[...] = 0
            if self._indices.size:
                dx[index] = t.diff

    def backward_reads(self) -> BackwardReads:
        """The selected items are kept on the host; backward reads only the tops' diffs."""
        return BackwardReads()

    def flops(self, bottom, top):
        n = float(sum(t.count for t in top))
        return n, float(sum(b.count for b in bottom[:-1]))
