"""Embed, as Caffe's ``embed_layer.cpp``: a lookup table of learned rows."""
from __future__ import annotations

from ..fillers import fill
from ..layer import BackwardReads, Layer, register_layer


def _scatter_add(xp, target, index, values):
    """target[index[i]] += values[i] for every i, repeated indices summed."""
    if hasattr(xp.add, "at"):        # NumPy, and CuPy >= 13
        xp.add.at(target, index, values)
    else:
        import cupyx                 # older CuPy: the same through atomicAdd
        cupyx.scatter_add(target, index, values)


@register_layer
class EmbedLayer(Layer):
    """top[..., :] = W[x[...], :] + b for integer indices x in [0, input_dim).

    Equivalent to an InnerProduct on one-hot vectors of length ``input_dim``,
    with the weight W stored (input_dim, num_output), Caffe's layout (the
    transpose of InnerProduct's). The top is the bottom's shape with
    ``num_output`` appended; the bias (num_output,) is there unless
    ``bias_term: false``. An index with a fraction is truncated toward zero, as
    Caffe's ``static_cast<int>`` does in a release build (a debug build's DCHECK
    stops there); one that then lies out of [0, input_dim) is an error naming
    the layer (a debug build's DCHECK; a release build reads out of bounds).

    Backward accumulates dy into the rows of W the indices pick (a row picked
    twice gets both), reading the bottom (the indices); the indices get no
    gradient (Caffe: "Can't backpropagate to EmbedLayer input"), so
    ``allow_force_backward`` refuses them.
    """

    type = "Embed"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.embed_param
        if p.num_output <= 0:
            raise ValueError(
                f"layer {self.name!r} of type Embed: num_output must be positive, got "
                f"{p.num_output}")
        if p.input_dim <= 0:
            raise ValueError(
                f"layer {self.name!r} of type Embed: input_dim must be positive, got "
                f"{p.input_dim}")
        self.num_output = int(p.num_output)
        self.input_dim = int(p.input_dim)
        self.bias_term = bool(p.bias_term)
        if not self.blobs:  # else loaded from a .caffemodel or shared
            weight = self.make_param_blob((self.input_dim, self.num_output), 0)
            fill(weight, p.weight_filler, where=f"layer {self.name!r}: ")
            self.blobs = [weight]
            if self.bias_term:
                bias = self.make_param_blob((self.num_output,), 1)
                fill(bias, p.bias_filler, where=f"layer {self.name!r}: ")
                self.blobs.append(bias)
        self.param_propagate_down = [True] * len(self.blobs)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return False

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise ValueError(
                f"layer {self.name!r}: Embed layer does not allow in-place computation")
        self.m = bottom[0].count
        top[0].reshape(tuple(bottom[0].shape) + (self.num_output,))

    def backward_reads(self) -> BackwardReads:
        weight_grad = bool(self.param_propagate_down and self.param_propagate_down[0])
        return BackwardReads(bottom=(0,) if weight_grad else ())

    def _indices(self, bottom, check: bool):
        """The bottom as (M,) int64 row indices; ``check`` raises on a bad one."""
        xp = self.xp
        raw = bottom[0].data.reshape(-1)
        x = xp.trunc(raw)
        if check:
            bad = (x < 0) | (x >= self.input_dim)
            # syncs: one device-to-host read of a bool per forward.  Caffe's GPU Forward
            # reads nothing back (nor checks); kept so that a bad index is an error that
            # names it rather than CuPy's take silently wrapping it into range.
            if bool(bad.any()):
                i = int(xp.argmax(bad))
                raise ValueError(
                    f"layer {self.name!r} of type Embed: bottom {bottom[0].name!r} holds "
                    f"{float(raw[i])!r} at flat position {i}; indices (truncated toward "
                    f"zero) must lie in [0, input_dim = {self.input_dim})")
        return x.astype(xp.int64)

    def forward_impl(self, bottom, top):
        idx = self._indices(bottom, check=True)
        y = top[0].data.reshape(self.m, self.num_output)
        self.xp.take(self.blobs[0].data, idx, axis=0, out=y)
        if self.bias_term:
            y += self.blobs[1].data[None, :]

    def backward_impl(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise ValueError(
                f"layer {self.name!r} of type Embed: can't backpropagate to EmbedLayer input "
                f"(bottom {bottom[0].name!r} holds indices)")
        dy = top[0].diff.reshape(self.m, self.num_output)
        if self.param_propagate_down[0]:
            # param diffs accumulate (Caffe's rule), rows picked twice get both
            _scatter_add(self.xp, self.blobs[0].diff, self._indices(bottom, check=False), dy)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff[...] += dy.sum(axis=0)

    def flops(self, bottom, top):
        n = float(top[0].count)
        return (n if self.bias_term else 0.0), (2.0 if self.bias_term else 1.0) * n
