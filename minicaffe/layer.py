"""The layer contract and the registry keyed by Caffe's type string.

The contract is Caffe's (``include/caffe/layer.hpp``):

* ``setup(bottom, top)``: check blob counts, ``layer_setup`` (read the
  parameter message, create ``self.blobs``), ``reshape`` (shape the tops and
  the internal buffers), then set the loss weights into the tops' diffs.
* ``forward(bottom, top)`` returns the weighted loss of this layer's tops.
* ``backward(top, propagate_down, bottom)``: bottom diffs are *overwritten*;
  parameter diffs *accumulate* (the solver clears them).

On top of Caffe's contract every layer declares what the memory manager needs
to know without reading its code:

* ``backward_reads()``: which bottom data, top data and saved internal buffers
  its backward pass reads (the liveness of feature maps, as Chainer's
  ``retain_inputs``/``retain_outputs``);
* ``self.internals``: every buffer the layer keeps besides its tops and params,
  each created with :meth:`Layer.add_internal`, marked ``saved`` (written in
  forward, read in backward: a mask, an index map, normalized data) or scratch
  (used within one forward or backward step only: an im2col buffer);
* ``flops(bottom, top)``: floating-point operations of forward and backward,
  for the performance model.

One code path serves NumPy and CuPy: ``self.xp`` is the array module of the
net the layer belongs to.
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field

import numpy as np

from .blob import Blob, proto_shape

ALL = "all"

LAYER_REGISTRY: dict[str, type] = {}


def register_layer(cls):
    """Class decorator: register ``cls`` under its Caffe type string ``cls.type``."""
    if not cls.type:
        raise TypeError(f"{cls.__name__} has no Caffe type string")
    if cls.type in LAYER_REGISTRY and LAYER_REGISTRY[cls.type] is not cls:
        raise TypeError(f"layer type {cls.type!r} registered twice")
    LAYER_REGISTRY[cls.type] = cls
    return cls


def _register_all():
    # importing the package registers every layer; import_module, not `from . import layers`,
    # which would resolve the package attribute `layers` (pycaffe's NetSpec factory alias)
    importlib.import_module("minicaffe.layers")


def known_layer_types() -> list[str]:
    _register_all()
    return sorted(LAYER_REGISTRY)


class UnknownLayerTypeError(ValueError):
    """A layer whose type no registered layer implements (Caffe's "Unknown layer type")."""

    def __init__(self, param, where: str = ""):
        self.layer_name, self.layer_type = param.name, param.type
        known = known_layer_types()
        # a typo ('Convolutoin', 'relu'): the closest known type, as the prototxt field hint
        lower = {t.lower(): t for t in known}
        close = difflib.get_close_matches(param.type.lower(), list(lower), n=1, cutoff=0.8)
        hint = f"; did you mean {lower[close[0]]!r}?" if close else ""
        super().__init__(
            f"{where}layer {param.name!r}: unknown layer type {param.type!r} "
            f"(known types: {', '.join(known)}){hint}")


def create_layer(param, xp=np, dtype=np.float32, where: str = ""):
    """Instantiate the layer class registered for ``param.type``.

    Raises UnknownLayerTypeError (a ValueError) naming the layer and listing the known types.
    """
    _register_all()
    cls = LAYER_REGISTRY.get(param.type)
    if cls is None:
        raise UnknownLayerTypeError(param, where)
    return cls(param, xp=xp, dtype=dtype)


class ParamBlobs(list):
    """A layer's parameter blobs (``layer.blobs``, pycaffe's ``net.params[name]``): a list
    whose index past the end is an IndexError naming the layer and the blobs it has, where
    a bare "list index out of range" named nothing (``net.params['conv1'][1]`` of a
    convolution with ``bias_term: false``)."""

    def __init__(self, blobs=(), layer_name: str = ""):
        super().__init__(blobs)
        self.layer_name = layer_name

    def __getitem__(self, index):
        try:
            return super().__getitem__(index)
        except IndexError:
            n = len(self)
            have = ", ".join(f"{i}: {tuple(b.shape)}" for i, b in enumerate(self))
            raise IndexError(f"layer {self.layer_name!r} has {n} param blob"
                             f"{'' if n == 1 else 's'}{f' ({have})' if have else ''}; "
                             f"no param {index}") from None


@dataclass(frozen=True)
class BackwardReads:
    """What a layer's backward pass reads, besides its tops' diffs.

    bottom: indices of bottoms whose *data* backward reads.
    top: indices of tops whose *data* backward reads.
    internals: names of saved internal buffers (see ``Layer.add_internal``).
    others: (layer, internal name) of another layer's internals that this backward reads
        (saved ones) or uses as scratch within its call (a fused pair's, see
        minicaffe/layers/batchnorm.py).
    """
    bottom: tuple = ()
    top: tuple = ()
    internals: tuple = ()
    others: tuple = ()


@dataclass
class Internal:
    """A buffer a layer owns besides its tops and params.

    saved: written by forward, read by backward (lives between the two).
    scratch: otherwise; used within a single forward or backward call.
    batch_scaled: its size is linear in the minibatch (feature-map-like).
    """
    blob: Blob
    saved: bool
    batch_scaled: bool = True
    uses: tuple = field(default=("forward", "backward"))


class Layer:
    """Base class of every layer; subclasses set ``type`` and override hooks."""

    type = ""
    # Blob-count constraints, as Caffe's ExactNumBottomBlobs() and friends;
    # None means unconstrained.
    exact_num_bottom: int | None = None
    min_num_bottom: int | None = None
    max_num_bottom: int | None = None
    exact_num_top: int | None = None
    min_num_top: int | None = None
    max_num_top: int | None = None
    equal_num_bottom_top = False
    # Loss layers weigh their first top by 1 when the prototxt gives no loss_weight.
    is_loss = False
    # Param blobs written in the net definition (LayerParameter.blobs) are in self.blobs
    # before layer_setup, as Caffe's Layer constructor puts them (Python layers, whose
    # setup may look); else they replace, after layer_setup, the values it filled.
    definition_blobs_first = False
    # The net reshapes a layer before its forward only when the bottoms' shapes changed (a
    # built-in layer's reshape is a function of those shapes and its params).  A layer
    # whose reshape may depend on its own state (a Python layer) sets this and reshapes
    # itself at every forward, as Caffe's Layer::Forward does for every layer.
    reshapes_in_forward = False
    # Declared liveness of backward (see module doc). ALL = every bottom.
    backward_reads_bottom = ALL
    backward_reads_top: tuple = ()

    def __init__(self, param, xp=np, dtype=np.float32):
        self.param = param
        self.name = param.name
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.phase = param.phase
        self.blobs: list[Blob] = []
        self.internals: dict[str, Internal] = {}
        self.param_propagate_down: list[bool] = []
        self.loss_weights: list[float] = []
        self._num_bottom = 0

    # --------------------------------------------------------------- set up
    def setup(self, bottom: list[Blob], top: list[Blob]):
        self.check_blob_counts(bottom, top)
        self._num_bottom = len(bottom)
        given = len(self.param.blobs) > 0
        if given and self.definition_blobs_first:
            self.blobs.extend(self._definition_blobs())      # the user's setup sees them
        self.layer_setup(bottom, top)
        if given and not self.definition_blobs_first:
            self._take_blobs_from_definition()
        if len(self.param_propagate_down) != len(self.blobs):
            self.param_propagate_down = [True] * len(self.blobs)
        if not isinstance(self.blobs, ParamBlobs):   # layer_setup made a plain list
            self.blobs = ParamBlobs(self.blobs, self.name)
        self.reshape(bottom, top)
        self.set_loss_weights(top)

    def _take_blobs_from_definition(self):
        """Caffe's Layer constructor copies ``LayerParameter.blobs`` into ``blobs_``, and each
        layer's LayerSetUp then skips its fillers ("Skipping parameter initialization"): param
        values written in the net definition (a NetParameter that carries weights, as
        Net::ToProto writes one) are the layer's starting values.  A layer without params of
        its own keeps them as params, as Caffe does; one with params needs as many, of its
        shapes (Caffe's convolution CHECKs both; other layers would read past them)."""
        given = self.param.blobs
        if not self.blobs:
            self.blobs.extend(self._definition_blobs())
            return
        if len(given) != len(self.blobs):
            raise ValueError(
                f"layer {self.name!r} of type {self.type}: the net definition gives "
                f"{len(given)} param blob(s) (blobs {{ }}), the layer has {len(self.blobs)} "
                f"of shapes {[b.shape for b in self.blobs]}")
        for blob, proto in zip(self.blobs, given):
            blob.from_proto(proto, reshape=False, layer=self.name)

    def _definition_blobs(self) -> list[Blob]:
        return [self.make_param_blob(proto_shape(p), i).from_proto(p, layer=self.name)
                for i, p in enumerate(self.param.blobs)]

    def layer_setup(self, bottom, top):
        """Read the parameter message; create ``self.blobs``. Once per layer."""

    def reshape(self, bottom, top):
        """Shape the tops (and internal buffers) for the bottoms' shapes."""
        raise NotImplementedError(f"{type(self).__name__}.reshape")

    def check_blob_counts(self, bottom, top):
        nb, nt = len(bottom), len(top)

        def fail(what, n, rule):
            raise ValueError(
                f"layer {self.name!r} of type {self.type}: takes {rule} {what} blob(s), got {n}")

        if self.exact_num_bottom is not None and nb != self.exact_num_bottom:
            fail("bottom", nb, f"exactly {self.exact_num_bottom}")
        if self.min_num_bottom is not None and nb < self.min_num_bottom:
            fail("bottom", nb, f"at least {self.min_num_bottom}")
        if self.max_num_bottom is not None and nb > self.max_num_bottom:
            fail("bottom", nb, f"at most {self.max_num_bottom}")
        if self.exact_num_top is not None and nt != self.exact_num_top:
            fail("top", nt, f"exactly {self.exact_num_top}")
        if self.min_num_top is not None and nt < self.min_num_top:
            fail("top", nt, f"at least {self.min_num_top}")
        if self.max_num_top is not None and nt > self.max_num_top:
            fail("top", nt, f"at most {self.max_num_top}")
        if self.equal_num_bottom_top and nb != nt:
            raise ValueError(
                f"layer {self.name!r} of type {self.type}: needs as many tops as bottoms "
                f"({nb} bottoms, {nt} tops)")

    def set_loss_weights(self, top):
        """Caffe's SetLossWeights: each weighted top's diff holds its weight."""
        weights = list(self.param.loss_weight)
        if self.is_loss and not weights:
            # LossLayer::LayerSetUp adds it to the layer's LayerParameter, which Net::ToProto
            # writes (a saved .caffemodel's loss layers say loss_weight: 1)
            self.param.loss_weight.append(1.0)
            weights = [1.0]
        if weights and len(weights) != len(top):
            raise ValueError(
                f"layer {self.name!r}: loss_weight must be given for all {len(top)} tops or none "
                f"(got {len(weights)})")
        self.loss_weights = weights + [0.0] * (len(top) - len(weights))
        for t, w in zip(top, self.loss_weights):
            if w != 0:
                t.diff[...] = w

    @property
    def auto_top_blobs(self) -> bool:
        """Caffe's AutoTopBlobs(): true for loss layers (LossLayer), whose missing tops the
        net creates as anonymous blobs (a loss layer written without ``top``)."""
        return self.is_loss

    def loss_weight(self, top_index: int) -> float:
        return self.loss_weights[top_index] if top_index < len(self.loss_weights) else 0.0

    # ----------------------------------------------------- forward/backward
    def forward(self, bottom, top):
        """Run forward; return this layer's weighted loss (a 0-d array or 0.0).

        The loss stays on the device (no host sync); callers convert it when
        they need a Python number.
        """
        self.forward_impl(bottom, top)
        loss = 0.0
        for t, w in zip(top, self.loss_weights):
            if w == 0:
                continue
            if t.diff_storage.external:
                # a memory plan holds this diff: the loss weight it was seeded with (the same
                # dot, so that a planned pass gives the plain pass's loss bit for bit)
                w_vec = self.xp.full(t.count, w, dtype=self.dtype)
                loss = loss + self.xp.vdot(t.data.reshape(-1), w_vec)
            else:
                # Caffe's Layer::Forward: loss += dot(top data, top diff), the diff holding
                # whatever is there now: the loss weight SetLossWeights wrote, or what a
                # consumer's backward wrote over it (a loss top read by another layer, no
                # Split between them), or zeros after a reshape grew the top
                loss = loss + self.xp.vdot(t.data.reshape(-1), t.diff.reshape(-1))
        return loss

    def forward_impl(self, bottom, top):
        raise NotImplementedError(f"{type(self).__name__}.forward_impl")

    def backward(self, top, propagate_down, bottom):
        """Compute bottom diffs (overwrite) and param diffs (accumulate)."""
        self.backward_impl(top, propagate_down, bottom)

    def backward_impl(self, top, propagate_down, bottom):
        if any(propagate_down) or any(self.param_propagate_down):
            raise NotImplementedError(f"layer {self.name!r} of type {self.type} has no backward")

    def allow_force_backward(self, bottom_index: int) -> bool:
        """False for inputs that cannot get a gradient (labels)."""
        return True

    # ---------------------------------------------------------- declarations
    def backward_reads(self) -> BackwardReads:
        """What backward reads; the default follows the class attributes and
        reads every saved internal."""
        nb = self._num_bottom
        b = tuple(range(nb)) if self.backward_reads_bottom == ALL else tuple(self.backward_reads_bottom)
        saved = tuple(n for n, i in self.internals.items() if i.saved)
        return BackwardReads(bottom=b, top=tuple(self.backward_reads_top), internals=saved)

    def canonical_axis(self, blob, axis: int, what: str = "axis") -> int:
        """Caffe's ``CanonicalAxisIndex``: ``axis`` of ``blob`` counted from the front (a
        negative one from the back); out of range, an error that names the layer and the
        blob."""
        n = blob.ndim
        if not -n <= axis < n:
            raise ValueError(
                f"layer {self.name!r} of type {self.type}: {what} {axis} out of range for "
                f"bottom {blob.name!r} of shape {blob.shape} ({n} axes)")
        return axis + n if axis < 0 else axis

    def add_internal(self, name: str, shape, saved: bool, batch_scaled: bool = True,
                     dtype=None) -> Blob:
        """Create (or reshape) an internal buffer; see ``Internal``."""
        it = self.internals.get(name)
        if it is None:
            blob = Blob(shape, xp=self.xp, dtype=dtype or self.dtype, name=f"{self.name}/{name}")
            self.internals[name] = Internal(blob, saved=saved, batch_scaled=batch_scaled)
            return blob
        it.blob.reshape(shape)
        return it.blob

    def internal(self, name: str) -> Blob:
        return self.internals[name].blob

    def flops(self, bottom, top) -> tuple[float, float]:
        """(forward, backward) floating-point operations; elementwise by default."""
        n = sum(t.count for t in top)
        return float(n), float(2 * n)

    # --------------------------------------------------------------- helpers
    def make_param_blob(self, shape, index: int) -> Blob:
        return Blob(shape, xp=self.xp, dtype=self.dtype, name=f"{self.name}/param{index}")

    def __repr__(self):
        return f"<{self.type} layer {self.name!r}>"
