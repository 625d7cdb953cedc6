"""Parameter (Caffe's ``ParameterLayer``, ``include/caffe/layers/parameter_layer.hpp``): a
learnable blob offered as a top.

``parameter_param.shape`` (a BlobShape) is the shape of the layer's one parameter blob and
of its top.  No bottom, one top.  Caffe fills nothing: the blob starts at zero (its memory
is zeroed on first use) and is meant to be learned or copied from a ``.caffemodel`` (by
layer name, as every layer's parameters) or from the prototxt's ``blobs`` field, in which
case Caffe skips the initialization and keeps the given blob.

Caffe's top *is* the parameter: ``Forward`` makes it share the parameter's data and diff
(``ShareData``/``ShareDiff``), so the diff the layers above write into the top is the
parameter's gradient.  Here the top is a blob of its own: forward copies the parameter into
it and backward copies the top's diff into the parameter's diff.  The numbers are Caffe's,
including a consequence of its sharing: bottom diffs are overwritten, so the parameter's diff
holds the last backward's gradient, not a sum over backward calls (with ``iter_size`` > 1
Caffe's solver sees the last minibatch's gradient only, and so does this layer's).  The
copy costs a top's data and diff (parameter-sized, not batch-sized) beyond Caffe's memory;
in exchange a memory plan sees the parameter and the top as the separate buffers they are
(a parameter stays resident; a top may be released or offloaded after use, which a shared
storage could not survive).
"""
from __future__ import annotations

from math import prod

from ..layer import BackwardReads, Layer, register_layer


@register_layer
class ParameterLayer(Layer):
    """One learnable blob of ``parameter_param.shape``, shared with the top."""

    type = "Parameter"
    exact_num_bottom = 0
    exact_num_top = 1
    backward_reads_bottom = ()

    def layer_setup(self, bottom, top):
        where = f"layer {self.name!r} (Parameter): "
        self._where = where
        p = self.param.parameter_param
        self.shape = tuple(int(d) for d in p.shape.dim)
        if any(d < 0 for d in self.shape):
            raise ValueError(f"{where}parameter_param.shape has a negative dimension: "
                             f"{self.shape}")
        if self.blobs:
            return  # Caffe: "Skipping parameter initialization"
        if len(self.param.blobs):
            # blobs given in the LayerParameter (Caffe's Layer constructor copies them)
            for i, proto in enumerate(self.param.blobs):
                blob = self.make_param_blob((), i)
                blob.from_proto(proto, reshape=True, layer=self.name)
                self.blobs.append(blob)
        else:
            blob = self.make_param_blob(self.shape, 0)
            blob.data[...] = 0  # Caffe's fresh blob: zeroed memory, no filler
            self.blobs = [blob]
        if self.blobs[0].count != prod(self.shape):
            raise ValueError(f"{where}the parameter blob of shape {self.blobs[0].shape} does not "
                             f"have the {prod(self.shape)} elements of parameter_param.shape "
                             f"{self.shape}")

    def reshape(self, bottom, top):
        top[0].reshape(self.shape)

    def forward_impl(self, bottom, top):
        # Caffe: top[0]->ShareData(*blobs_[0]); a copy here (see the module doc)
        top[0].data[...] = self.blobs[0].data.reshape(self.shape)

    def backward_impl(self, top, propagate_down, bottom):
        # Caffe: the shared diff; overwritten, not accumulated, as the layer above wrote it
        if self.param_propagate_down[0]:
            self.blobs[0].diff[...] = top[0].diff.reshape(self.blobs[0].shape)

    def backward_reads(self) -> BackwardReads:
        return BackwardReads()

    def flops(self, bottom, top):
        return 0.0, 0.0
