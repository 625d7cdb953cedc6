"""Net: layers wired by blob names, built from a NetParameter as Caffe's net.cpp.

Construction follows Caffe step by step, because model-zoo files depend on
every one of these details:

1. upgrade legacy definitions (V1 ``layers``, ``input``/``input_dim``);
2. filter layers by the NetState (phase, level, stages) and the layers'
   include/exclude rules (``Net::FilterNet``);
3. insert Split layers after the last writer of every blob read by several
   layers (``InsertSplits``), so that each consumer gets its own diff;
4. create and set up the layers in order; a top named like one of its layer's
   bottoms is computed in place (same Blob object);
5. decide which layers and bottoms need backward (parameters with non-zero
   lr_mult, blobs that lead to a loss, ``propagate_down``,
   ``force_backward``);
6. share parameters named alike in ``param { name: }`` (data and diff).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from itertools import zip_longest

import numpy as np

from .backend import array_module, normalize_mode, to_numpy
from .blob import Blob, proto_shape, shape_equals
from .hdf5_util import is_hdf5
from .layer import UnknownLayerTypeError, create_layer
from .log import log
from .proto import caffe_pb2, read_binary, read_net_param, upgrade_net, write_binary
from .proto.coverage import unread_fields, warn_unread_fields
from .proto.text import layer_blocks, layer_line

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST
ENV_FUSE_BN_SCALE = "MINICAFFE_FUSE_BN_SCALE"
ENV_FUSE_CONV_RELU = "MINICAFFE_FUSE_CONV_RELU"
ENV_FUSE_BN_RELU = "MINICAFFE_FUSE_BN_RELU"


def fusion_default(name: str = ENV_FUSE_BN_SCALE, default: str = "1") -> bool:
    """Whether new nets pair BatchNorm and Scale layers for the fused GPU path
    (``$MINICAFFE_FUSE_BN_SCALE``, default on; 0/false/off/no turns it off); with ``name``
    another such variable: ``ENV_FUSE_CONV_RELU`` (Convolution and in-place ReLU pairs),
    ``ENV_FUSE_BN_RELU`` (a ReLU joining a BatchNorm+Scale pair; its own default "0": its
    GPU tests pass, but on the H200 it bought no time that rose above the noise at
    ResNet-152's 16 and 64, ResNet-101's 23 or ResNet-50's 128, session 38)."""
    return os.environ.get(name, default).strip().lower() not in ("0", "false", "off", "no")


class _ByName(OrderedDict):
    """A net's blobs, layers or params by name (``net.blobs``, ``net.layer_dict``,
    ``net.params``): a name the net lacks is a KeyError that names the net and the names it
    has, where pycaffe's bare KeyError('conv2') named nothing else."""

    def __init__(self, items=(), what: str = "blob", net_name: str = "", plural: str = ""):
        super().__init__(items)
        self.what, self.net_name, self.plural = what, net_name, plural or what + "s"

    def __missing__(self, key):
        raise KeyError(f"net {self.net_name!r} has no {self.what} {key!r} (its "
                       f"{self.plural}: {', '.join(self) or 'none'})")


# --------------------------------------------------------------- filtering
def state_meets_rule(state, rule, layer_name: str) -> bool:
    """Caffe's Net::StateMeetsRule."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(s not in stages for s in rule.stage):
        return False
    if any(s in stages for s in rule.not_stage):
        return False
    return True


def filter_net(param, state):
    """Keep the layers whose include/exclude rules admit ``state``."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    for layer in param.layer:
        if len(layer.include) and len(layer.exclude):
            err = ValueError(
                f"layer {layer.name!r}: specify either include rules or exclude rules, not both")
            err.layer = layer     # Net._init says the layer's line in the file
            raise err
        if admits(state, layer):
            out.layer.add().CopyFrom(layer)
    return out


def admits(state, layer) -> bool:
    """Whether Net::FilterNet keeps ``layer`` in ``state``: any include rule met, or (with
    none) no exclude rule met."""
    keep = not len(layer.include)
    for rule in layer.exclude:
        if state_meets_rule(state, rule, layer.name):
            keep = False
    for rule in layer.include:
        if state_meets_rule(state, rule, layer.name):
            keep = True
    return keep


# ---------------------------------------------------------- split insertion
def split_layer_name(layer_name, blob_name, blob_idx):
    return f"{blob_name}_{layer_name}_{blob_idx}_split"


def split_blob_name(layer_name, blob_name, blob_idx, split_idx):
    return f"{blob_name}_{layer_name}_{blob_idx}_split_{split_idx}"


def insert_splits(param):
    """Caffe's InsertSplits: a Split layer after the last writer of every blob
    read more than once (a loss-weighted top counts as one reader)."""
    last_top = {}            # blob name -> (layer idx, top idx) of its last writer
    source = {}              # (layer idx, bottom idx) -> (layer idx, top idx)
    readers = {}             # (layer idx, top idx) -> number of readers
    loss_weight = {}         # (layer idx, top idx) -> explicit loss weight
    for i, layer in enumerate(param.layer):
        for j, name in enumerate(layer.bottom):
            if name not in last_top:
                err = ValueError(
                    f"layer {layer.name!r}: unknown bottom blob {name!r} (bottom index {j}); "
                    f"blobs defined so far: {sorted(last_top) or 'none'}")
                err.layer_index = i   # Net._init says the layer's line in the file
                raise err
            src = last_top[name]
            source[(i, j)] = src
            readers[src] = readers.get(src, 0) + 1
        for j, name in enumerate(layer.top):
            last_top[name] = (i, j)
        for j in range(min(len(layer.loss_weight), len(layer.top))):
            src = last_top[layer.top[j]]
            loss_weight[src] = layer.loss_weight[j]
            if loss_weight[src]:
                readers[src] = readers.get(src, 0) + 1

    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    next_split = {}
    for i, layer in enumerate(param.layer):
        new = out.layer.add()
        new.CopyFrom(layer)
        for j in range(len(new.bottom)):
            src = source[(i, j)]
            if readers.get(src, 0) > 1:
                k = next_split.get(src, 0)
                next_split[src] = k + 1
                new.bottom[j] = split_blob_name(param.layer[src[0]].name, new.bottom[j], src[1], k)
        for j, name in enumerate(new.top):
            count = readers.get((i, j), 0)
            if count <= 1:
                continue
            split = out.layer.add()
            split.name = split_layer_name(layer.name, name, j)
            split.type = "Split"
            split.bottom.append(name)
            w = loss_weight.get((i, j), 0.0)
            for k in range(count):
                split.top.append(split_blob_name(layer.name, name, j, k))
                if w:
                    split.loss_weight.append(w if k == 0 else 0.0)
            if w:
                del new.loss_weight[:]
                next_split[(i, j)] = next_split.get((i, j), 0) + 1
    return out


# --------------------------------------------------------------------- Net
class Net:
    """A network of layers for one phase, like ``caffe::Net`` / pycaffe's Net.

    Args:
        model: a prototxt path or a NetParameter.
        phase: ``TRAIN`` or ``TEST`` (pycaffe's ``caffe.TRAIN``/``caffe.TEST``).
        weights: optional ``.caffemodel`` to copy parameters from.
        mode: ``"CPU"`` or ``"GPU"`` (default: the current default mode).
        dtype: float32 normally; float64 for numerical checks.
        stages, level: the NetState's other fields. As in Caffe, the net's own
            ``state { }`` block (if any) is the starting point: ``phase`` and ``level``
            replace its phase and level, ``stages`` are added to its stages.

    pycaffe's older call ``Net(model, weights, phase)`` is accepted too.
    """

    # --- swap/ hook (begin): an optional swap.runtime.Executor that replays a memory plan.
    # When set, whole passes (forward_backward, a full forward) delegate to it; partial
    # passes are refused, since the plan owns the memory of every blob.
    executor = None
    # --- swap/ hook (end)

    # --- ps/ hook (begin): an optional ``listener(li)``, called right after layer li's
    # backward has been issued, whether the pass runs here or under a swap executor's plan
    # (whose backward steps call backward_layer).  Only layers that run backward report.
    # On the GPU "issued" is not "done": the layer's kernels are queued on the current
    # stream, so a listener that hands the diffs to another stream records an event there.
    # ps.overlap.GradientOverlap turns these calls into "these parameter diffs are final",
    # so that gradient communication overlaps the rest of backward.
    backward_listener = None
    # ``forward_listener(li)``, called right before layer li's forward is issued (here or
    # under a swap plan): a parameter-server worker makes the current stream wait there
    # for the copy of layer li's new parameters (ps.worker.ForwardCopyUp).
    forward_listener = None
    # --- ps/ hook (end)

    def __init__(self, model=None, phase=TEST, weights=None, *, network_file=None, mode=None,
                 dtype=np.float32, stages=(), level=0, state=None, source=None):
        # source: the file a NetParameter ``model`` was read from (a solver's net: file), so
        # that its errors say file:line and its paths resolve as if the path had been given
        if network_file is not None:         # pycaffe's keyword for the first argument
            if model is not None:
                raise TypeError("Net(): the net is given twice (as the first argument and as "
                                "network_file)")
            model = network_file
        if model is None:
            raise TypeError("Net() needs the net: a .prototxt path (network_file) or a "
                            "NetParameter")
        if isinstance(phase, (str, os.PathLike)) and isinstance(weights, int):
            phase, weights = weights, phase  # Net(model, weights, phase)
        if isinstance(phase, bool) or phase not in (TRAIN, TEST, "TRAIN", "TEST"):
            # pycaffe refuses it (boost.python's ArgumentError); protobuf said only 'unknown
            # enum label "w.caffemodel"'
            hint = ""
            if isinstance(phase, (str, os.PathLike)) and weights is None:
                hint = (f"; to load weights, give the phase too: caffe.Net(model, "
                        f"caffe.TEST, weights={os.fspath(phase)!r})")
            raise TypeError(f"Net(): phase {phase!r} is no phase: give caffe.TRAIN or "
                            f"caffe.TEST{hint}")
        self.mode = normalize_mode(mode)
        self.xp = array_module(self.mode)
        self.dtype = np.dtype(dtype)
        self.source = os.fspath(source) if source else None
        if isinstance(model, (str, os.PathLike)):
            self.source = os.fspath(model)
            param = read_net_param(self.source)
        else:
            param = model
        if state is None:
            # Caffe's Net(param_file, phase, level, stages) starts from the file's own
            # ``state { }`` block: it sets the phase and the level and adds the stages, so
            # the file's stages stay in force (FilterNet then reads the merged state).
            state = caffe_pb2.NetState()
            state.CopyFrom(param.state)
            state.phase = phase
            state.level = level
            state.stage.extend(stages or ())     # pycaffe's default is None
        elif not state.HasField("phase"):
            state = caffe_pb2.NetState(phase=phase, level=state.level, stage=list(state.stage))
        self.state = state
        self.phase = state.phase
        self._init(param)
        if weights is not None:
            self.copy_from(weights)

    # ---------------------------------------------------------- building
    def _where(self) -> str:
        return f"{self.source}: " if self.source else ""

    def _layer_line(self, lp):
        """The line of layer ``lp``'s block in the prototxt this net was read from, or None."""
        if not self.source:
            return None
        try:
            with open(self.source, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return None
        # Two layers of one name (a TRAIN and a TEST data layer, as most train_val files
        # have): the block of the one this net's state admits, not the first of that name.
        # The file's top-level blocks are the upgraded layers in order (after an Input layer
        # that Caffe's upgrade makes of legacy ``input:`` fields); where they do not line up
        # by name, the first block of that name below.
        blocks = layer_blocks(text)
        upgraded = list(getattr(self, "_upgraded_layers", ()))[-len(blocks):] if blocks else []
        if len(upgraded) == len(blocks) and all(
                b["name"] is None or b["name"] == u.name for b, u in zip(blocks, upgraded)):
            hits = [b["line"] for b, u in zip(blocks, upgraded)
                    if u.name == lp.name and admits(self.state, u)]
            if len(hits) == 1:
                return hits[0]
        line = layer_line(text, lp.name, lp.type)
        if line is None:   # a V1 file says 'type: ACCURACY' where the upgraded layer says "Accuracy"
            line = layer_line(text, lp.name)
        return line

    def _at(self, lp) -> str:
        """``file:line: `` of layer ``lp``'s block, else ``file: `` (or nothing for a
        NetParameter that came from no file): the start of every error about one layer."""
        line = self._layer_line(lp)
        return f"{self.source}:{line}: " if line is not None else self._where()

    def _init(self, param):
        where = self._where()
        try:
            param = upgrade_net(param)
        except ValueError as e:
            raise ValueError(f"{where}{e}") from None
        self._upgraded_layers = list(param.layer)   # every layer of the file, for _layer_line
        try:
            filtered = filter_net(param, self.state)
        except ValueError as e:
            lp = getattr(e, "layer", None)
            raise ValueError(f"{self._at(lp) if lp is not None else where}{e}") from None
        try:
            param = insert_splits(filtered)
        except ValueError as e:
            # a deploy file that kept its Accuracy layer (LightenedCNN_B_deploy.prototxt) reads
            # a 'label' that no layer makes: say where that layer is
            li = getattr(e, "layer_index", None)
            line = self._layer_line(filtered.layer[li]) if li is not None else None
            at = f"{self.source}:{line}: " if line is not None else where
            raise ValueError(f"{at}net {param.name!r}: {e}") from None
        self.param = param
        self.name = param.name
        self.force_backward = param.force_backward
        # Net::debug_info_: per-layer mean |data| / |diff| logs; the solver sets it for the
        # iterations it displays when its own debug_info is on (Solver::Step)
        self.debug_info = bool(param.debug_info)

        self.layers = []
        # pycaffe's net.before_forward(run) ... after_backward(run): run(layer index) around
        # each layer of forward_from_to / backward_from_to (Caffe's Net::Callback)
        self._callbacks = {"before_forward": [], "after_forward": [], "before_backward": [],
                           "after_backward": []}
        self.layer_names: list[str] = []
        self.bottom_vecs: list[list[Blob]] = []
        self.top_vecs: list[list[Blob]] = []
        self.layer_bottom_names: list[list[str]] = []   # per layer index
        self.layer_top_names: list[list[str]] = []
        self.blobs: "OrderedDict[str, Blob]" = _ByName(what="blob", net_name=param.name)
        self.blob_need_backward: dict[str, bool] = {}
        self.bottom_need_backward: list[list[bool]] = []
        self.layer_need_backward: list[bool] = []
        self.inputs: list[str] = []
        self.param_specs = []   # per layer: list of ParamSpec (possibly default)
        available = set()       # blobs produced and not yet consumed
        self._producer = {}     # blob name -> the first layer that wrote it (for errors)
        # the name the user wrote for each blob that insert_splits renamed (for errors)
        split_origin = {t: sp.bottom[0] for sp in param.layer if sp.type == "Split"
                        for t in sp.top}
        source_dir = os.path.dirname(os.path.abspath(self.source)) if self.source else None

        # Caffe's Net::Init accepts two layers of one name (test_net.cpp's TinyTestNetwork
        # with an accuracy layer has two 'loss' layers); copying weights by name then fills
        # the first of them (CopyTrainedLayersFrom), as copy_from does.
        for li, lp in enumerate(param.layer):
            if not lp.HasField("phase"):
                lp.phase = self.phase
            if len(lp.propagate_down) and len(lp.propagate_down) != len(lp.bottom):
                raise ValueError(
                    f"{self._at(lp)}layer {lp.name!r}: propagate_down has {len(lp.propagate_down)} "
                    f"entries but the layer has {len(lp.bottom)} bottoms")
            if unread_fields(lp):   # a field set that does not act here (proto/coverage.py)
                warn_unread_fields(lp, self._at(lp))
            try:
                layer = create_layer(lp, xp=self.xp, dtype=self.dtype, where=where)
            except UnknownLayerTypeError:
                line = self._layer_line(lp)
                if line is None:
                    raise
                # a fork's layer (SSD, Faster R-CNN, ...): say where it is in the file
                raise UnknownLayerTypeError(lp, f"{self.source}:{line}: ") from None
            except ImportError as e:    # a Python layer's module or class (python_layer.py)
                raise ImportError(f"{self._at(lp)}{e}") from e
            layer.source_dir = source_dir
            bottoms, bnames, bneed = [], [], []
            need_backward = False
            for bi, name in enumerate(lp.bottom):
                if name not in self.blobs:
                    raise ValueError(f"{self._at(lp)}layer {lp.name!r}: unknown bottom blob "
                                     f"{name!r}")
                available.discard(name)
                bottoms.append(self.blobs[name])
                bnames.append(name)
                nb = self.blob_need_backward[name]
                if len(lp.propagate_down):
                    nb = bool(lp.propagate_down[bi])
                bneed.append(nb)
                need_backward |= self.blob_need_backward[name]
            tops, tnames = [], []
            for ti, name in enumerate(lp.top):
                if ti < len(lp.bottom) and lp.bottom[ti] == name:
                    blob = self.blobs[name]  # in place: the very same Blob (Caffe's rule)
                elif name in self.blobs:
                    # Caffe's Net::AppendTop: "Top blob 'x' produced by multiple sources."
                    raise ValueError(
                        f"{self._at(lp)}layer {lp.name!r}: top blob {name!r} is produced by "
                        f"multiple sources (layer {self._producer.get(name, '?')!r} makes it "
                        "already; a top may only repeat one of its own layer's bottoms, "
                        "in place)")
                else:
                    blob = Blob(xp=self.xp, dtype=self.dtype, name=name)
                    self.blobs[name] = blob
                    if lp.type == "Input":
                        self.inputs.append(name)
                tops.append(blob)
                tnames.append(name)
                available.add(name)
                self._producer.setdefault(name, lp.name)
            # Caffe's Net::Init: a layer whose AutoTopBlobs() is true (a loss layer) and that
            # has fewer tops than it needs gets anonymous ones, named "(automatic)" (AppendTop
            # with no name); they are no net output and no other layer can read them.  Here
            # each has its own key in ``blobs`` (a second one is "(automatic)_1", ...).
            if layer.auto_top_blobs:
                needed = max(layer.min_num_top or 0, layer.exact_num_top or 0)
                for _ in range(len(tops), needed):
                    name, k = "(automatic)", 0
                    while name in self.blobs:
                        k += 1
                        name = f"(automatic)_{k}"
                    blob = Blob(xp=self.xp, dtype=self.dtype, name=name)
                    self.blobs[name] = blob
                    tops.append(blob)
                    tnames.append(name)
            # The ParamSpecs as the file gives them: a layer's setup may add its own (BatchNorm
            # adds lr_mult 0 for its statistics), in Caffe to the layer's copy of the
            # LayerParameter only; here to ``lp``, which the layer holds.
            file_specs = [caffe_pb2.ParamSpec() for _ in lp.param]
            for copy, spec in zip(file_specs, lp.param):
                copy.CopyFrom(spec)
            # a top computed in place over its bottom (the same Blob) must keep its shape
            in_place = [(ti, tops[ti].shape) for ti in range(min(len(tops), len(bottoms)))
                        if tops[ti] is bottoms[ti]]
            # Layers whose top count is free (e.g. data layers) see the tops given.
            try:
                layer.setup(bottoms, tops)
                for ti, shape in in_place:
                    if tops[ti].shape != shape:
                        after = tops[ti].shape
                        tops[ti].reshape(shape)     # the message shows the bottom as it was
                        raise ValueError(self._in_place_error(lp, ti, shape, after))
            except (ValueError, IndexError, TypeError, OSError, ImportError) as e:
                raise self._setup_error(e, lp, bnames, bottoms, split_origin) from e
            except Exception as e:      # a Python layer's own KeyError...: its type kept
                self._mark(e, lp)
                raise
            if len(file_specs) > len(layer.blobs):
                raise ValueError(
                    f"{self._at(lp)}layer {lp.name!r}: {len(file_specs)} param specs given but "
                    f"the layer has {len(layer.blobs)} parameter blobs")
            # Caffe's Net::Init decides param_propagate_down, and whether the layer needs
            # backward, from the file's ParamSpecs (a missing one has lr_mult 1), while
            # AppendParam takes each param's lr_mult and decay_mult, which the solver uses,
            # from the layer's own copy.  So a BatchNorm layer without param specs needs
            # backward even where its bottom does not (its statistics' lr_mult is 1 here),
            # and its tops then need backward too.
            specs = []
            for pi in range(len(layer.blobs)):
                specs.append(lp.param[pi] if pi < len(lp.param) else caffe_pb2.ParamSpec())
                spec = file_specs[pi] if pi < len(file_specs) else caffe_pb2.ParamSpec()
                p_need = spec.lr_mult != 0
                layer.param_propagate_down[pi] = p_need
                need_backward |= p_need
            self.param_specs.append(specs)
            for name in tnames:
                self.blob_need_backward[name] = need_backward
            self.layers.append(layer)
            self.layer_names.append(lp.name)
            self.bottom_vecs.append(bottoms)
            self.top_vecs.append(tops)
            self.layer_bottom_names.append(bnames)
            self.layer_top_names.append(tnames)
            self.bottom_need_backward.append(bneed)
            self.layer_need_backward.append(need_backward)

        self._prune_backward()
        if self.force_backward:
            for li, layer in enumerate(self.layers):
                self.layer_need_backward[li] = True
                for bi in range(len(self.bottom_vecs[li])):
                    nb = self.bottom_need_backward[li][bi] or layer.allow_force_backward(bi)
                    self.bottom_need_backward[li][bi] = nb
                    name = self.layer_bottom_names[li][bi]
                    self.blob_need_backward[name] = self.blob_need_backward[name] or nb
                layer.param_propagate_down = [True] * len(layer.blobs)
        # Caffe keeps available blobs in a std::set: outputs come in name order
        self.outputs = sorted(n for n in self.blobs if n in available)
        self._share_params()
        self._shapes_seen = [None] * len(self.layers)
        self.bn_scale_pairs: list[tuple[int, int]] = []
        self.bn_relu_links: list[tuple[int, int]] = []
        # off unless asked for: its kernel path is checked through the CPU emulator only
        # (session 37); docs/results/tuner_s38/call_a.sh runs it on a GPU
        self._bn_relu_on = fusion_default(ENV_FUSE_BN_RELU, "0")
        self.set_bn_scale_fusion(fusion_default())
        self.conv_relu_pairs: list[tuple[int, int]] = []
        self.set_conv_relu_fusion(fusion_default(ENV_FUSE_CONV_RELU))

    @staticmethod
    def _in_place_error(lp, ti: int, before, after) -> str:
        """A layer whose top ``ti`` is its bottom (in place) gave it another shape: the
        bottom's data is then read through the top's shape (Caffe does not check; its
        Pooling reads past the shrunk blob, and a net input shrinks at every pass)."""
        name = lp.top[ti]
        return (f"layer {lp.name!r}: computes top {name!r} in place (it is bottom {ti}), but "
                f"its output has shape {after} where {name!r} has {before}: only a layer "
                "whose output keeps the input's shape (ReLU, BatchNorm, Scale, Dropout, ...) "
                f"can work in place; give the top a name of its own (top: \"{lp.name}\")")

    def _setup_error(self, e, lp, bnames, bottoms, split_origin):
        """Layer ``lp``'s setup error ``e``, said once with the file, the layer's line, its
        type and its bottoms' shapes, and the blob names as the file spells them (not the
        names of the Split layers' tops that insert_splits made)."""
        text = str(e)
        for own in (f"layer {lp.name!r} ({lp.type}): ", f"layer {lp.name!r} of type {lp.type}: ",
                    f"layer {lp.name!r}: "):
            if text.startswith(own):     # the layer named itself already
                text = text[len(own):]
                break
        for split, origin in split_origin.items():
            text = text.replace(f"'{split}'", f"'{origin}'")
        shapes = ", ".join(f"{split_origin.get(n, n)} {b.shape}" for n, b in zip(bnames, bottoms))
        cls = (FileNotFoundError if isinstance(e, FileNotFoundError)
               else OSError if isinstance(e, OSError)
               else ImportError if isinstance(e, ImportError) else ValueError)
        return cls(f"{self._at(lp)}layer {lp.name!r} (type {lp.type}, bottoms: "
                   f"{shapes or 'none'}): {text}")

    def _prune_backward(self):
        """Caffe: layers that lead to no loss, or whose every top skips
        backpropagation, need no backward."""
        under_loss, skip = set(), set()
        for li in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[li]
            contributes = False
            skip_prop = True
            for ti, name in enumerate(self.layer_top_names[li]):
                if layer.loss_weight(ti) != 0 or name in under_loss:
                    contributes = True
                if name not in skip:
                    skip_prop = False
                if contributes and not skip_prop:
                    break
            if self.layer_need_backward[li] and skip_prop:
                self.layer_need_backward[li] = False
                self.bottom_need_backward[li] = [False] * len(self.bottom_vecs[li])
            if not contributes:
                self.layer_need_backward[li] = False
            for bi, name in enumerate(self.layer_bottom_names[li]):
                if contributes:
                    under_loss.add(name)
                else:
                    self.bottom_need_backward[li][bi] = False
                if not self.bottom_need_backward[li][bi]:
                    skip.add(name)

    def _share_params(self):
        """Params named alike in ``param { name: }`` share data and diff with
        their first owner; ``learnable_params`` holds owners only (Net::AppendParam)."""
        owners = {}
        self.learnable_params: list[Blob] = []
        self.param_owner: list[int] = []          # per flat param: owner index or -1
        self.param_lr_mult: list[float] = []
        self.param_decay_mult: list[float] = []
        self.param_layer_index: list[tuple[int, int]] = []
        self.all_params: list[Blob] = []
        has_lr: list[bool] = []                   # per learnable param: lr_mult given yet
        has_decay: list[bool] = []
        for li, layer in enumerate(self.layers):
            for pi, blob in enumerate(layer.blobs):
                spec = self.param_specs[li][pi]
                flat = len(self.all_params)
                self.all_params.append(blob)
                self.param_layer_index.append((li, pi))
                name = spec.name
                if name and name in owners:
                    owner = owners[name]
                    obj = self.all_params[owner]
                    owner_layer = self.layer_names[self.param_layer_index[owner][0]]
                    # Net::AppendParam: PERMISSIVE checks the count only, STRICT (the
                    # default) the whole shape.
                    permissive = spec.share_mode == caffe_pb2.ParamSpec.PERMISSIVE
                    if obj.count != blob.count or (not permissive and obj.shape != blob.shape):
                        what = "count" if permissive else "shape"
                        raise ValueError(
                            f"{self._at(self.param.layer[li])}cannot share param {name!r} "
                            f"owned by layer "
                            f"{owner_layer!r} with layer {layer.name!r}; {what} mismatch: "
                            f"owner param shape is {obj.shape}, sharing layer's is {blob.shape}")
                    blob.share_data(obj)
                    blob.share_diff(obj)
                    self.param_owner.append(owner)
                    # Net::AppendParam: the first lr_mult (decay_mult) given explicitly, by the
                    # owner or a sharer, is the shared param's; a later explicit one must agree.
                    oi = self.learnable_params.index(obj)
                    for field, values, given in (("lr_mult", self.param_lr_mult, has_lr),
                                                 ("decay_mult", self.param_decay_mult,
                                                  has_decay)):
                        if not spec.HasField(field):
                            continue
                        value = getattr(spec, field)
                        if not given[oi]:
                            given[oi] = True
                            values[oi] = value
                        elif value != values[oi]:
                            raise ValueError(
                                f"{self._at(self.param.layer[li])}layer {layer.name!r}: "
                                f"shared param {name!r} "
                                f"has mismatched {field}: {value}, while {values[oi]} was "
                                f"given before (owner layer {owner_layer!r})")
                    continue
                if name:
                    owners[name] = flat
                self.param_owner.append(-1)
                self.learnable_params.append(blob)
                self.param_lr_mult.append(spec.lr_mult)
                self.param_decay_mult.append(spec.decay_mult)
                has_lr.append(spec.HasField("lr_mult"))
                has_decay.append(spec.HasField("decay_mult"))

    # --------------------------------------------------- pycaffe accessors
    @property
    def params(self) -> "OrderedDict[str, list[Blob]]":
        return _ByName(((n, l.blobs) for n, l in zip(self.layer_names, self.layers) if l.blobs),
                       "layer with params", self.name, "layers with params")

    @property
    def layer_dict(self):
        return _ByName(zip(self.layer_names, self.layers), "layer", self.name)

    def layer_index(self, name: str) -> int:
        try:
            return self.layer_names.index(name)
        except ValueError:
            raise KeyError(f"net {self.name!r} has no layer {name!r}") from None

    # ------------------------------------------------------- layer fusion
    def find_bn_scale_pairs(self, planned: bool = False) -> list[tuple[int, int]]:
        """(BatchNorm index, Scale index) of every pair that can run fused: a TRAIN
        BatchNorm (batch statistics) on the fused GPU kernels, followed directly by a
        Scale with one bottom that runs in place on the BatchNorm's top, with a
        per-channel scale (and bias), neither with an explicit ``propagate_down``.
        See minicaffe/layers/batchnorm.py.

        ``planned``: for a memory plan about to be made (swap.runtime.install), which
        also needs the BatchNorm in place, so that the pair's backward, run in the Scale's
        step, writes no diff but the Scale's own (swap/gmap.py); otherwise none while a
        plan is installed (its GMAP was made for the layers as they were)."""
        pairs = []
        if self.executor is not None and not planned:
            return pairs
        for i in range(len(self.layers) - 1):
            bn, sc = self.layers[i], self.layers[i + 1]
            if bn.type != "BatchNorm" or sc.type != "Scale":
                continue
            if not getattr(bn, "_fused", False) or bn.use_global_stats:
                continue
            bb, top = self.bottom_vecs[i], self.top_vecs[i]
            sb, st = self.bottom_vecs[i + 1], self.top_vecs[i + 1]
            if len(top) != 1 or len(sb) != 1 or sb[0] is not top[0] or st[0] is not sb[0]:
                continue
            if planned and bb[0] is not top[0]:
                continue
            explicit = any(len(self.param.layer[k].propagate_down) for k in (i, i + 1))
            if explicit or not sc.pairable(sb):
                continue
            pairs.append((i, i + 1))
        return pairs

    def set_bn_scale_fusion(self, enabled: bool, planned: bool = False):
        """Pair (or unpair) BatchNorm and Scale layers for the fused GPU path
        (:meth:`find_bn_scale_pairs`, ``planned`` for a memory plan about to be made); the
        affected layers are reshaped, so a Scale drops or regains its copy of the input."""
        for i, j in self.bn_scale_pairs:
            self.layers[i].fused_scale = None
            self.layers[i].pair_vecs = None
            self.layers[j].fused_bn = None
        changed = {k for pair in self.bn_scale_pairs for k in pair}
        self.bn_scale_pairs = self.find_bn_scale_pairs(planned) if enabled else []
        for i, j in self.bn_scale_pairs:
            self.layers[i].fused_scale = self.layers[j]
            self.layers[i].pair_vecs = (self.bottom_vecs[i], self.top_vecs[i])
            self.layers[j].fused_bn = self.layers[i]
            changed |= {i, j}
        for li in sorted(changed):
            self.layers[li].reshape(self.bottom_vecs[li], self.top_vecs[li])
        self.set_bn_relu_fusion(self._bn_relu_on)

    def set_bn_relu_fusion(self, enabled: bool):
        """Link (or unlink) each ReLU that runs in place on the top of a paired Scale
        (:meth:`set_bn_scale_fusion`) to the pair's BatchNorm, whose one forward pass then
        applies it (``cuda_fused.bn_forward_train``'s ``relu_slope``; the values bit for bit
        those of the ReLU run after it) while the ReLU's forward does nothing.  Backward is
        unchanged.  For new nets ``$MINICAFFE_FUSE_BN_RELU=1`` turns it on (off by default: no
        measured gain, :func:`fusion_default`)."""
        self._bn_relu_on = bool(enabled)
        for i, r in self.bn_relu_links:
            self.layers[i].fused_relu = None
            self.layers[r].fused_into = None
        self.bn_relu_links = []
        if not enabled:
            return
        for i, j in self.bn_scale_pairs:
            r = j + 1
            if r >= len(self.layers) or self.layers[r].type != "ReLU":
                continue
            top, rb, rt = self.top_vecs[j], self.bottom_vecs[r], self.top_vecs[r]
            if len(rb) == 1 and rb[0] is top[0] and rt[0] is rb[0]:
                self.layers[i].fused_relu = self.layers[r]
                self.layers[r].fused_into = self.layers[i]
                self.bn_relu_links.append((i, r))

    def find_conv_relu_pairs(self) -> list[tuple[int, int]]:
        """(Convolution index, ReLU index) of every pair whose forward can run as one: a
        Convolution with one top, followed directly by a ReLU running in place on it.  The
        Convolution's forward then applies the ReLU too (on a GPU with cuDNN, the bias and
        the ReLU in one pass over the top instead of two, cuda_fused.bias_relu_forward; the
        same values bit for bit), and the ReLU's forward does nothing.  The backward passes
        are unchanged, and so is every step of a memory plan (the pair's forward steps run
        in order, a recomputation reruns the in-place chain as a whole)."""
        pairs = []
        for i in range(len(self.layers) - 1):
            conv, relu = self.layers[i], self.layers[i + 1]
            if conv.type != "Convolution" or relu.type != "ReLU":
                continue
            top, rb, rt = self.top_vecs[i], self.bottom_vecs[i + 1], self.top_vecs[i + 1]
            if len(top) == 1 and len(rb) == 1 and rb[0] is top[0] and rt[0] is rb[0]:
                pairs.append((i, i + 1))
        return pairs

    def set_conv_relu_fusion(self, enabled: bool):
        """Pair (or unpair) Convolution and in-place ReLU layers (:meth:`find_conv_relu_pairs`;
        on by default, ``$MINICAFFE_FUSE_CONV_RELU=0`` turns it off for new nets)."""
        for i, j in self.conv_relu_pairs:
            self.layers[i].fused_relu = None
            self.layers[j].fused_into = None
        self.conv_relu_pairs = self.find_conv_relu_pairs() if enabled else []
        for i, j in self.conv_relu_pairs:
            self.layers[i].fused_relu = self.layers[j]
            self.layers[j].fused_into = self.layers[i]

    def _unpair_if_split(self, start: int, end: int, forward: bool = False):
        """A forward or backward over layers start..end (inclusive, either order) that
        runs one layer of a pair without the other cannot run it fused: unpair the net
        (for good; logged once).  A forward (``forward``) that shows each layer's top, to a
        callback or to debug_info, unpairs every pair too: a paired layer's top would show
        its partner's work (a BatchNorm's top scaled, a Convolution's top after the ReLU)."""
        from .log import log
        lo, hi = min(start, end), max(start, end)
        shows = None
        if forward:
            shows = ("debug_info shows each layer's top" if self.debug_info else
                     "a forward callback may read each layer's top"
                     if self._callbacks["before_forward"] or self._callbacks["after_forward"]
                     else None)
        if self.bn_scale_pairs:
            why = shows
            if any((lo <= i <= hi) != (lo <= j <= hi) for i, j in self.bn_scale_pairs):
                why = f"a partial pass over layers {lo}..{hi} splits a fused BatchNorm+Scale pair"
            if why is not None:
                log(f"net {self.name!r}: {why}; the pairs run unfused from now on")
                self.set_bn_scale_fusion(False)
        if not forward:
            return
        for links, what, unlink in (
                (self.conv_relu_pairs, "Convolution", self.set_conv_relu_fusion),
                (self.bn_relu_links, "BatchNorm+Scale", self.set_bn_relu_fusion)):
            if not links:
                continue
            why = shows
            if any((lo <= i <= hi) != (lo <= j <= hi) for i, j in links):
                why = f"a partial forward over layers {lo}..{hi} splits a {what} and its ReLU"
            if why is not None:
                log(f"net {self.name!r}: {why}; {what} and ReLU layers run apart from now on")
                unlink(False)

    # ----------------------------------------------------- forward/backward
    def reshape(self):
        for li, layer in enumerate(self.layers):
            try:
                layer.reshape(self.bottom_vecs[li], self.top_vecs[li])
            except (ValueError, RuntimeError) as e:
                located = self._located(e, li)
                if located is None:
                    raise
                raise located from e
            self._shapes_seen[li] = tuple(b.shape for b in self.bottom_vecs[li])

    def _mark(self, e, lp):
        """Keep ``file:line: `` of layer ``lp`` on an exception that passes through
        unchanged (its type is the user's: a Python layer's KeyError), for the command
        line's one line (cli.main); the innermost layer's place is kept."""
        if self.source and not getattr(e, "caffe_where", None):
            try:
                e.caffe_where = self._at(lp)
            except AttributeError:      # an exception type without a __dict__
                pass

    def _located(self, e, li: int):
        """A layer's ValueError or RuntimeError from reshape or forward (a bottom reshaped
        to a size the layer's parameters do not fit, a label out of range, an image that a
        data layer's prefetch thread could not load), with the file and line of the layer's
        block in front; None for other errors (and subclasses), which pass unchanged."""
        text = str(e)
        if (type(e) not in (ValueError, RuntimeError) or not self.source
                or text.startswith(self.source)):
            return None
        lp = self.param.layer[li]
        if f"'{lp.name}'" not in text:    # a Python layer's own words: say which layer
            text = f"layer {lp.name!r} (type {lp.type}): {text}"
        return type(e)(f"{self._at(lp)}{text}")

    def forward_layer(self, li: int):
        """Forward one layer (reshaping it first if its bottoms changed shape)."""
        layer, bottom, top = self.layers[li], self.bottom_vecs[li], self.top_vecs[li]
        shapes = tuple(b.shape for b in bottom)
        try:
            if shapes != self._shapes_seen[li]:
                if not layer.reshapes_in_forward:   # else its forward reshapes it
                    layer.reshape(bottom, top)
                self._shapes_seen[li] = shapes
            if self.forward_listener is not None:  # ps/ hook
                self.forward_listener(li)
            return layer.forward(bottom, top)
        except (ValueError, RuntimeError) as e:
            located = self._located(e, li)
            if located is None:
                self._mark(e, self.param.layer[li])
                raise
            raise located from e
        except Exception as e:
            self._mark(e, self.param.layer[li])
            raise

    def backward_layer(self, li: int):
        if self.layer_need_backward[li]:
            try:
                self.layers[li].backward(self.top_vecs[li], self.bottom_need_backward[li],
                                         self.bottom_vecs[li])
            except Exception as e:
                self._mark(e, self.param.layer[li])
                raise
            if self.backward_listener is not None:  # ps/ hook
                self.backward_listener(li)

    def forward_from_to(self, start: int = 0, end: int | None = None):
        """Forward layers start..end inclusive; returns the summed loss (on device)."""
        end = len(self.layers) - 1 if end is None else end
        if self.executor is not None:  # swap/ hook
            return self._executor_pass("forward", start == 0 and end == len(self.layers) - 1)
        if self.bn_scale_pairs or self.conv_relu_pairs:     # (bn_relu_links need pairs)
            self._unpair_if_split(start, end, forward=True)
        loss = 0.0
        before, after = self._callbacks["before_forward"], self._callbacks["after_forward"]
        for li in range(start, end + 1):
            for run in before:
                run(li)
            loss = loss + self.forward_layer(li)
            if self.debug_info:
                self._forward_debug_info(li)
            for run in after:
                run(li)
        return loss

    def backward_from_to(self, start: int | None = None, end: int = 0):
        start = len(self.layers) - 1 if start is None else start
        if self.executor is not None:  # swap/ hook
            self._executor_pass("backward", False)
        if self.bn_scale_pairs:
            self._unpair_if_split(start, end)
        before, after = self._callbacks["before_backward"], self._callbacks["after_backward"]
        for li in range(start, end - 1, -1):
            for run in before:      # Caffe calls them for layers that skip backward too
                run(li)
            self.backward_layer(li)
            if self.debug_info and self.layer_need_backward[li]:
                self._backward_debug_info(li)
            for run in after:
                run(li)

    def forward_backward(self):
        """One forward and backward pass; returns the loss as a device scalar."""
        if self.executor is not None:  # swap/ hook
            return self.executor.forward_backward()
        loss = self.forward_from_to()
        self.backward_from_to()
        if self.debug_info:   # Net::Backward (the whole pass) ends with the norms of all params
            self._params_norm_debug_info()
        return loss

    # Caffe's Net::ForwardDebugInfo / BackwardDebugInfo / Backward (src/caffe/net.cpp), each a
    # host sync per blob (a reduction on the device, one number read back): they run only
    # while debug_info is on
    def _mean_abs(self, arr, count: int) -> float:
        return float(self.xp.abs(arr).sum()) / max(count, 1)

    def _param_display_name(self, li: int, pi: int) -> str:
        specs = self.param_specs[li]
        name = specs[pi].name if pi < len(specs) else ""
        return name or str(pi)

    def _forward_debug_info(self, li: int):
        name = self.layer_names[li]
        for bname, blob in zip(self.layer_top_names[li], self.top_vecs[li]):
            mean = self._mean_abs(blob.data, blob.count)
            log(f"    [Forward] Layer {name}, top blob {bname} data: {mean:.6g}", where="net")
        for pi, blob in enumerate(self.layers[li].blobs):
            mean = self._mean_abs(blob.data, blob.count)
            log(f"    [Forward] Layer {name}, param blob {self._param_display_name(li, pi)} "
                f"data: {mean:.6g}", where="net")

    def _backward_debug_info(self, li: int):
        name, layer = self.layer_names[li], self.layers[li]
        for bi, (bname, blob) in enumerate(zip(self.layer_bottom_names[li], self.bottom_vecs[li])):
            if not self.bottom_need_backward[li][bi]:
                continue
            mean = self._mean_abs(blob.diff, blob.count)
            log(f"    [Backward] Layer {name}, bottom blob {bname} diff: {mean:.6g}", where="net")
        for pi, blob in enumerate(layer.blobs):
            if not layer.param_propagate_down[pi]:
                continue
            mean = self._mean_abs(blob.diff, blob.count)
            log(f"    [Backward] Layer {name}, param blob {pi} diff: {mean:.6g}", where="net")

    def _params_norm_debug_info(self):
        asum_data = asum_diff = sumsq_data = sumsq_diff = 0.0
        xp = self.xp
        for blob in self.learnable_params:
            d, g = blob.data.astype(np.float64), blob.diff.astype(np.float64)
            asum_data += float(xp.abs(d).sum())
            asum_diff += float(xp.abs(g).sum())
            sumsq_data += float((d * d).sum())
            sumsq_diff += float((g * g).sum())
        log(f"    [Backward] All net params (data, diff): L1 norm = ({asum_data:.6g}, "
            f"{asum_diff:.6g}); L2 norm = ({np.sqrt(sumsq_data):.6g}, {np.sqrt(sumsq_diff):.6g})",
            level="E", where="net")

    def _executor_pass(self, what: str, whole: bool):  # swap/ hook
        if what == "forward" and whole:
            return self.executor.forward()
        raise RuntimeError(
            f"net {self.name!r} runs under a memory plan ({self.executor.plan.strategy!r}): only "
            f"whole passes (forward_backward, a full forward) can run; a partial {what} pass "
            "would touch blobs the plan does not hold")

    def _pass_index(self, name: str) -> int:
        """The index of layer ``name`` for forward/backward's ``start`` and ``end``; pycaffe
        looks it up with ``list.index``, so an unknown name is a ValueError."""
        try:
            return self.layer_names.index(name)
        except ValueError:
            raise ValueError(f"net {self.name!r} has no layer {name!r} (its layers: "
                             f"{', '.join(self.layer_names)})") from None

    def _feed(self, kwargs, names, which: str):
        """Write pycaffe's forward inputs (``which`` "data") or backward top diffs ("diff"):
        the arrays must name exactly ``names`` (the net's inputs or outputs) and each must
        have the blob's batch size; the rest of its shape only has to broadcast to the
        blob's, as pycaffe's ``blob.data[...] = array`` does."""
        if set(kwargs) != set(names):
            what = ("Input blob arguments do not match net inputs" if which == "data" else
                    "Top diff arguments do not match net outputs")
            raise ValueError(f"{what}. (net {self.name!r} takes {sorted(names)}, got "
                             f"{sorted(kwargs)})")
        for name, value in kwargs.items():
            blob = self.blobs[name]
            shape = np.shape(value)
            # pycaffe: ``if blob.shape[0] != self.blobs[in_].shape[0]: raise``; a 0-d array,
            # or a blob with no axes (a loss top: LossLayer::Reshape gives it 0 axes), fails
            # there too (IndexError), so a loss diff cannot be given by name
            if not shape or not blob.shape or shape[0] != blob.shape[0]:
                what = "Input" if which == "data" else "Diff"
                raise ValueError(f"{what} is not batch sized. ({name!r} has shape {shape}, the "
                                 f"blob {blob.shape})")
            target = blob.data if which == "data" else blob.diff
            try:
                target[...] = self.xp.asarray(value, dtype=self.dtype)
            except ValueError as e:
                raise ValueError(f"net {self.name!r}: {which} of shape {shape} does not fit blob "
                                 f"{name!r} of shape {blob.shape}: {e}") from None

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """pycaffe's Net.forward: run layers ``start`` to ``end`` (names; all by default),
        the inputs first set from ``kwargs`` (all of them, by name).  Returns {blob name:
        data} for the net's outputs (or ``end``'s tops) and the names in ``blobs``; the
        arrays are the blobs' own, overwritten by the next pass."""
        s = 0 if start is None else self._pass_index(start)
        e = len(self.layers) - 1 if end is None else self._pass_index(end)
        for n in blobs or []:   # before the pass: pycaffe runs it, then fails on the name
            self.blobs[n]
        # pycaffe.py: ``set(self.top_names[end] + blobs)``: top_names is keyed by layer name,
        # so where layers share a name it gives the last one's tops (the pass ends at the first)
        outs = set(self.outputs if end is None else self.top_names[end]) | set(blobs or [])
        if kwargs:
            self._feed(kwargs, self.inputs, "data")
        self.forward_from_to(s, e)
        return {n: self.blobs[n].data for n in outs}

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """pycaffe's Net.backward: run layers ``start`` down to ``end``, the outputs' diffs
        first set from ``kwargs`` (all of them, by name).  Returns {blob name: diff} for
        the net's inputs (or ``end``'s bottoms) and the names in ``diffs``."""
        s = len(self.layers) - 1 if start is None else self._pass_index(start)
        e = 0 if end is None else self._pass_index(end)
        for n in diffs or []:   # before the pass, as forward's blobs
            self.blobs[n]
        # pycaffe.py: ``set(self.bottom_names[end] + diffs)``, the last layer named ``end``
        names = set(self.inputs if end is None else self.bottom_names[end]) | set(diffs or [])
        if kwargs:
            self._feed(kwargs, self.outputs, "diff")
        self.backward_from_to(s, e)
        return {n: self.blobs[n].diff for n in names}

    # ------------------------------------------- pycaffe's batched passes
    def _batch(self, arrays):
        """pycaffe's ``Net._batch``: yield {name: one batch} over the first axis
        of ``arrays`` ({name: array}, all of one length), in batches of the size
        of the net's first blob; the last batch is padded with zeros.  Nothing
        is yielded for no arrays."""
        if not arrays:
            return
        num = len(next(iter(arrays.values())))
        batch_size = next(iter(self.blobs.values())).num
        for start in range(0, num - num % batch_size, batch_size):
            yield {name: a[start:start + batch_size] for name, a in arrays.items()}
        remainder = num % batch_size
        if remainder:
            yield {name: np.concatenate([a[-remainder:],
                                         np.zeros((batch_size - remainder,) + a.shape[1:],
                                                  dtype=a.dtype)])
                   for name, a in arrays.items()}

    @staticmethod
    def _as_batched_arrays(kwargs, what: str) -> tuple[dict, int]:
        """{name: array} from keyword arguments, and their common length."""
        arrays = {name: np.asarray(value) for name, value in kwargs.items()}
        lengths = {name: len(a) for name, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{what}: the arrays have different lengths {lengths}; each holds "
                             "one item per row of its first axis")
        return arrays, next(iter(lengths.values()), 0)

    def _stack_batches(self, parts: list, num: int) -> np.ndarray:
        """One output's per-batch arrays joined along the first axis, the rows
        that padded the last batch cut off.  A per-batch scalar (a loss) gives
        one value per batch; an array whose first axis is not the batch's is
        joined uncut."""
        if not parts:
            return np.zeros((0,), dtype=self.dtype)
        if parts[0].ndim == 0:
            return np.stack(parts)
        out = np.concatenate(parts)
        batch_size = next(iter(self.blobs.values())).num
        return out[:num] if parts[0].shape[0] == batch_size else out

    @staticmethod
    def _host_copy(a) -> np.ndarray:
        """A host copy of a blob's array: a blocking device-to-host copy on the
        GPU, a memcpy on the CPU (the blob's memory is reused by the next batch)."""
        host = to_numpy(a)
        return host.copy() if host is a else host

    def forward_all(self, blobs=None, **kwargs):
        """pycaffe's ``Net.forward_all``: forward ``kwargs`` ({input name: (M, ...)
        array}) in batches of the net's batch size; returns {output (and each
        name in ``blobs``): (M, ...) array}.

        As pycaffe, the last batch is padded with zeros and the padding's rows
        are cut from the outputs.  Without inputs pycaffe fails; here that is
        a ValueError.
        """
        if not kwargs:
            raise ValueError(f"net {self.name!r}: forward_all needs the inputs by name, e.g. "
                             f"forward_all({(self.inputs or ['data'])[0]}=array)")
        arrays, num = self._as_batched_arrays(kwargs, "forward_all")
        names = set(self.outputs) | set(blobs or [])
        parts = {n: [] for n in names}
        for batch in self._batch(arrays):
            outs = self.forward(blobs=blobs, **batch)
            for n in names:
                parts[n].append(self._host_copy(outs[n]))
        return {n: self._stack_batches(parts[n], num) for n in names}

    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        """pycaffe's ``Net.forward_backward_all``: forward and backward in
        batches.  ``kwargs`` name inputs (fed to forward) and outputs (their
        diffs, fed to backward), all of one length M; a pass without arrays of
        its kind uses what the blobs hold.  Returns ({output and ``blobs``:
        data}, {input and ``diffs``: diff}), padding rows cut as in
        :meth:`forward_all`.

        pycaffe ignores a name that is neither an input nor an output and
        cuts the diffs only for as many names as there are outputs; here the
        first is a ValueError and every array is cut.
        """
        fwd = {n: kwargs[n] for n in self.inputs if n in kwargs}
        bwd = {n: kwargs[n] for n in self.outputs if n in kwargs}
        unknown = sorted(set(kwargs) - set(fwd) - set(bwd))
        if unknown:
            raise ValueError(f"net {self.name!r}: forward_backward_all takes arrays for the "
                             f"inputs {self.inputs} and outputs {self.outputs}; got {unknown}")
        if not kwargs:
            raise ValueError(f"net {self.name!r}: forward_backward_all needs arrays by name")
        arrays, num = self._as_batched_arrays(kwargs, "forward_backward_all")
        fwd = {n: arrays[n] for n in fwd}
        bwd = {n: arrays[n] for n in bwd}
        out_names = set(self.outputs) | set(blobs or [])
        diff_names = set(self.inputs) | set(diffs or [])
        out_parts = {n: [] for n in out_names}
        diff_parts = {n: [] for n in diff_names}
        for fb, bb in zip_longest(self._batch(fwd), self._batch(bwd), fillvalue={}):
            outs = self.forward(blobs=blobs, **fb)
            grads = self.backward(diffs=diffs, **bb)
            for n in out_names:
                out_parts[n].append(self._host_copy(outs[n]))
            for n in diff_names:
                diff_parts[n].append(self._host_copy(grads[n]))
        return ({n: self._stack_batches(out_parts[n], num) for n in out_names},
                {n: self._stack_batches(diff_parts[n], num) for n in diff_names})

    # ------------------------------------ pycaffe's read-only conveniences
    @property
    def _layer_names(self) -> list[str]:
        """pycaffe's ``net._layer_names``: the layer names in order."""
        return list(self.layer_names)

    @property
    def _blob_names(self) -> list[str]:
        """pycaffe's ``net._blob_names``: the blob names in creation order."""
        return list(self.blobs)

    @property
    def _blobs(self) -> list[Blob]:
        """pycaffe's ``net._blobs``: the blobs in creation order."""
        return list(self.blobs.values())

    @property
    def _inputs(self) -> list[int]:
        """pycaffe's ``net._inputs``: the input blobs' indices in ``_blobs``."""
        index = {n: i for i, n in enumerate(self.blobs)}
        return [index[n] for n in self.inputs]

    @property
    def _outputs(self) -> list[int]:
        """pycaffe's ``net._outputs``: the output blobs' indices in ``_blobs``."""
        index = {n: i for i, n in enumerate(self.blobs)}
        return [index[n] for n in self.outputs]

    def _bottom_ids(self, i: int) -> list[int]:
        """pycaffe's ``net._bottom_ids(i)``: layer i's bottoms as indices in ``_blobs``."""
        index = {n: j for j, n in enumerate(self.blobs)}
        return [index[n] for n in self.layer_bottom_names[i]]

    def _top_ids(self, i: int) -> list[int]:
        """pycaffe's ``net._top_ids(i)``: layer i's tops as indices in ``_blobs``."""
        index = {n: j for j, n in enumerate(self.blobs)}
        return [index[n] for n in self.layer_top_names[i]]

    @property
    def _blob_loss_weights(self) -> list[float]:
        """pycaffe's ``net._blob_loss_weights``: the loss weight of each blob of ``_blobs``."""
        return list(self.blob_loss_weights.values())

    def _check_layer_range(self, start: int, end: int, what: str):
        n = len(self.layers)
        for name, i in (("start", start), ("end", end)):
            if not 0 <= i < n:
                raise IndexError(f"net {self.name!r}: {what} {name} {i} is not a layer index "
                                 f"(0 to {n - 1})")

    def _forward(self, start: int, end: int) -> float:
        """pycaffe's ``net._forward(start, end)`` (Net::ForwardFromTo): layers ``start`` to
        ``end`` by index, inclusive; returns their summed loss as a float (a host sync)."""
        self._check_layer_range(start, end, "_forward")
        return float(self.forward_from_to(start, end))

    def _backward(self, start: int, end: int):
        """pycaffe's ``net._backward(start, end)`` (Net::BackwardFromTo): layers ``start``
        down to ``end`` by index, inclusive."""
        self._check_layer_range(start, end, "_backward")
        self.backward_from_to(start, end)

    def _add_callback(self, when: str, run):
        if not callable(run):
            from .common import NCCL
            if isinstance(run, NCCL):
                raise TypeError(f"net.{when}(nccl): this build has no NCCL (caffe.has_nccl() "
                                "is False), so a net cannot take one as a callback")
            raise TypeError(f"net.{when}(run): run must be callable with the layer index, got "
                            f"{type(run).__name__}")
        self._callbacks[when].append(run)

    def before_forward(self, run):
        """pycaffe's ``net.before_forward(run)``: ``run(i)`` before layer i's forward."""
        self._add_callback("before_forward", run)

    def after_forward(self, run):
        """pycaffe's ``net.after_forward(run)``: ``run(i)`` after layer i's forward."""
        self._add_callback("after_forward", run)

    def before_backward(self, run):
        """pycaffe's ``net.before_backward(run)``: ``run(i)`` before layer i's backward (for
        every layer of the pass, also those that need none)."""
        self._add_callback("before_backward", run)

    def after_backward(self, run):
        """pycaffe's ``net.after_backward(run)``: ``run(i)`` after layer i's backward."""
        self._add_callback("after_backward", run)

    @property
    def has_callbacks(self) -> bool:
        return any(self._callbacks.values())

    @property
    def top_names(self) -> "OrderedDict[str, list[str]]":
        """pycaffe's ``net.top_names``: {layer name: its top blob names}, in layer order
        (by index: :attr:`layer_top_names`)."""
        return OrderedDict(zip(self.layer_names, (list(n) for n in self.layer_top_names)))

    @property
    def bottom_names(self) -> "OrderedDict[str, list[str]]":
        """pycaffe's ``net.bottom_names``: {layer name: its bottom blob names}, in layer
        order (by index: :attr:`layer_bottom_names`)."""
        return OrderedDict(zip(self.layer_names, (list(n) for n in self.layer_bottom_names)))

    @property
    def blob_loss_weights(self) -> "OrderedDict[str, float]":
        """pycaffe's ``net.blob_loss_weights``: {blob name: the loss weight its
        last writer gives it} (Caffe's ``blob_loss_weights_``; 0 for most)."""
        weights = OrderedDict((n, 0.0) for n in self.blobs)
        for layer, names in zip(self.layers, self.layer_top_names):
            for ti, name in enumerate(names):
                weights[name] = float(layer.loss_weight(ti))
        return weights

    def clear_param_diffs(self):
        """Zero every learnable parameter's diff (``fill``: a memset on the GPU)."""
        for p in self.learnable_params:
            p.diff.fill(0)

    # ------------------------------------------------------ weights I/O
    def to_proto(self, write_diff: bool = False):
        """A NetParameter with every layer and its blobs (a ``.caffemodel``)."""
        out = caffe_pb2.NetParameter()
        out.name = self.name
        for lp, layer in zip(self.param.layer, self.layers):
            dst = out.layer.add()
            dst.CopyFrom(lp)
            del dst.blobs[:]
            for blob in layer.blobs:
                blob.to_proto(dst.blobs.add(), write_diff=write_diff)
        return out

    def save(self, path: str, write_diff: bool = False):
        """Write a binary ``.caffemodel`` atomically."""
        write_binary(self.to_proto(write_diff), path)

    def save_hdf5(self, path: str, write_diff: bool = False):
        """Write the parameters as Caffe's ``Net::ToHDF5`` does (``.caffemodel.h5``, pycaffe's
        ``net.save_hdf5``, ``snapshot_format: HDF5``), atomically: group ``data`` (and
        ``diff``) holds a group for every layer, parameters or not (Split layers too), and
        in it dataset ``"j"`` for its param j, shaped as the blob, in the net's dtype.
        A param shared from another layer has its data written by the owner only, but
        its diff (the owner's) under every layer that uses it, as Caffe does."""
        from .hdf5_util import write_atomic
        flat_of = {lp: flat for flat, lp in enumerate(self.param_layer_index)}
        # Net::ToHDF5 makes one group per layer name: H5Gcreate2 of a second group of one
        # name fails, and Caffe dies with "Error saving weights to <file>." Say which name,
        # before anything is written (the .caffemodel form keeps both layers).
        seen = set()
        for name in self.layer_names:
            if name in seen:
                raise ValueError(f"{os.fspath(path)}: cannot save weights: two layers are "
                                 f"named {name!r}, and an HDF5 model holds one group per "
                                 "layer name (Caffe's Net::ToHDF5 fails the same way); "
                                 "rename one, or save a .caffemodel")
            seen.add(name)

        def fill(f):
            data = f.create_group("data")
            diff = f.create_group("diff") if write_diff else None
            for li, (name, layer) in enumerate(zip(self.layer_names, self.layers)):
                layer_data = data.create_group(name)
                layer_diff = diff.create_group(name) if write_diff else None
                for pi, blob in enumerate(layer.blobs):
                    if self.param_owner[flat_of[(li, pi)]] == -1:
                        # host copy: syncs with the device where the net runs on a GPU
                        layer_data.create_dataset(str(pi), data=to_numpy(blob.data))
                    if write_diff:
                        layer_diff.create_dataset(str(pi), data=to_numpy(blob.diff))

        write_atomic(path, fill)

    def copy_from_hdf5(self, path: str):
        """Caffe's ``CopyTrainedLayersFromHDF5`` (pycaffe's ``net.load_hdf5``): for each layer
        of this net with a group under ``data``, its datasets ``"0"``, ``"1"``, ... into its
        params; a missing dataset is allowed only for a param shared from another layer."""
        import h5py
        where = f"{os.fspath(path)}: "
        flat_of = {lp: flat for flat, lp in enumerate(self.param_layer_index)}
        with h5py.File(os.fspath(path), "r") as f:
            if "data" not in f:
                raise ValueError(f"{where}no 'data' group: not a Caffe HDF5 model")
            data = f["data"]
            # Caffe looks each source group up in layer_names_index_, which holds the last
            # layer of a name (the .caffemodel path, CopyTrainedLayersFrom, fills the first)
            index = {n: i for i, n in enumerate(self.layer_names)}
            copies, filled = [], set()
            for name in data:
                li = index.get(name)
                if li is None:
                    log(f"Ignoring source layer {name}")
                    continue
                group, target = data[name], self.layers[li].blobs
                if len(group) > len(target):
                    raise ValueError(f"{where}incompatible number of blobs for layer {name!r}: "
                                     f"source has {len(group)}, target {len(target)}")
                for pi, blob in enumerate(target):
                    if str(pi) not in group:
                        if self.param_owner[flat_of[(li, pi)]] != -1:
                            continue         # shared: its owner's dataset fills it
                        raise ValueError(f"{where}incompatible number of blobs for layer "
                                         f"{name!r}: no dataset {pi}")
                    values = group[str(pi)][...]
                    if tuple(values.shape) != tuple(blob.shape):
                        raise ValueError(
                            f"{where}cannot copy param {pi} weights from layer {name!r}: shape "
                            f"{tuple(values.shape)} in the file, {tuple(blob.shape)} in the "
                            "net; to learn this layer's parameters from scratch rather than "
                            "copying from a saved net, rename the layer")
                    copies.append((blob, values))
                filled.add(li)
        for blob, values in copies:     # all checked first: a misfit file leaves the net as is
            blob.data[...] = self.xp.asarray(values, dtype=self.dtype)
        self._log_unfilled(filled, where)
        return self

    load_hdf5 = copy_from_hdf5

    def copy_from(self, weights):
        """Copy parameters by layer name from a ``.caffemodel`` path or NetParameter
        (Caffe's CopyTrainedLayersFrom, which reads an HDF5 file, ``.caffemodel.h5``, as
        such).  A source layer whose name the net lacks is ignored; a layer of the net that
        the source lacks keeps its values.  Every matched layer is checked (blob count, shapes,
        value counts) before any is copied, so a model that does not fit leaves the net as it
        was; the errors name the file, the layer, the param and both shapes."""
        where = ""
        if isinstance(weights, (str, os.PathLike)):
            where = f"{os.fspath(weights)}: "
            if is_hdf5(weights):
                return self.copy_from_hdf5(weights)
            if os.path.isfile(weights) and os.path.getsize(weights) == 0:
                # Caffe parses an empty file as an empty NetParameter and copies nothing
                raise ValueError(f"{where}the weights file is empty (0 bytes): no parameters "
                                 "to copy")
            weights = read_binary(os.fspath(weights), caffe_pb2.NetParameter)
        try:
            src = upgrade_net(weights)
        except ValueError as e:
            raise ValueError(f"{where}{e}") from None
        index = {}
        for i, n in enumerate(self.layer_names):
            index.setdefault(n, i)  # Caffe: the first target layer of that name
        copies, filled = [], set()
        for lp in src.layer:
            li = index.get(lp.name)
            if li is None:
                log(f"Ignoring source layer {lp.name}")
                continue
            target = self.layers[li].blobs      # Caffe checks the count even where it is 0
            if len(target) != len(lp.blobs):
                raise ValueError(
                    f"{where}incompatible number of blobs for layer {lp.name!r}: source has "
                    f"{len(lp.blobs)}, target {len(target)}")
            for pi, (blob, proto) in enumerate(zip(target, lp.blobs)):
                if not shape_equals(proto, blob.shape):
                    raise ValueError(
                        f"{where}cannot copy param {pi} weights from layer {lp.name!r}; shape "
                        f"mismatch: source param shape is {proto_shape(proto)}, target param "
                        f"shape is {blob.shape}. To learn this layer's parameters from scratch "
                        "rather than copying from a saved net, rename the layer")
                try:
                    blob.check_proto(proto)
                except ValueError as e:
                    raise ValueError(f"{where}cannot copy param {pi} weights from layer "
                                     f"{lp.name!r}: {e}") from None
                copies.append((blob, proto))
            filled.add(li)
        for blob, proto in copies:      # every one checked above
            blob.assign_proto(proto)
        self._log_unfilled(filled, where)
        return self

    def _log_unfilled(self, filled: set, where: str):
        """Warn about the layers with params that the weights did not reach (Caffe is silent):
        renamed layers being fine-tuned, or a model cut short at a layer boundary, which
        still parses.  A param shared with a filled layer counts as filled."""
        roots = {owner if owner != -1 else flat
                 for flat, ((li, _), owner) in enumerate(zip(self.param_layer_index,
                                                             self.param_owner))
                 if li in filled}
        kept = []
        for flat, ((li, _), owner) in enumerate(zip(self.param_layer_index, self.param_owner)):
            name = self.layer_names[li]
            if (owner if owner != -1 else flat) not in roots and name not in kept:
                kept.append(name)
        if kept:
            log(f"{where}{len(kept)} layer(s) with parameters not in the weights, keeping "
                f"their initial values: {', '.join(kept)}", level="W")

    copy_trained_layers_from = copy_from

    def set_input_arrays(self, data, labels):
        """pycaffe's ``net.set_input_arrays``: hand ``data`` (n, C, H, W) and ``labels`` (n,)
        or (n, 1, 1, 1) to the MemoryData layer that must be the net's first.  As pycaffe,
        both must be C-contiguous float32 arrays, and n a multiple of the batch size
        (RuntimeError otherwise).  minicaffe copies them; pycaffe keeps pointing at the
        caller's arrays."""
        if np.ndim(labels) == 1:
            labels = np.ascontiguousarray(np.asarray(labels)[:, None, None, None])
        return self._set_input_arrays(data, labels)

    def _set_input_arrays(self, data, labels):
        """pycaffe's ``net._set_input_arrays`` (Net_SetInputArrays in _caffe.cpp): labels
        already (n, 1, 1, 1); the checks and messages are Caffe's."""
        first = self.layers[0] if self.layers else None
        if first is None or first.type != "MemoryData":
            raise RuntimeError("set_input_arrays may only be called if the first layer is a "
                               f"MemoryData layer (net {self.name!r}: its first layer is "
                               f"{first.type if first is not None else 'missing'})")
        for arr, name, chw in ((data, "data array", (first.channels, first.height, first.width)),
                               (labels, "labels array", (1, 1, 1))):
            if not isinstance(arr, np.ndarray):
                raise TypeError(f"set_input_arrays: the {name} must be a NumPy array, got "
                                f"{type(arr).__name__}")
            if not arr.flags.c_contiguous:
                raise RuntimeError(f"{name} must be C contiguous")
            if arr.ndim != 4:
                raise RuntimeError(f"{name} must be 4-d (got shape {arr.shape})")
            if arr.dtype != np.float32:
                raise RuntimeError(f"{name} must be float32 (got {arr.dtype})")
            for axis, what in ((1, "has wrong number of channels"), (2, "has wrong height"),
                               (3, "has wrong width")):
                if arr.shape[axis] != chw[axis - 1]:
                    raise RuntimeError(f"{name} {what} ({arr.shape[axis]}, layer "
                                       f"{first.name!r} takes {chw[axis - 1]})")
        if data.shape[0] != labels.shape[0]:
            raise RuntimeError("data and labels must have the same first dimension "
                               f"({data.shape[0]} vs {labels.shape[0]})")
        if data.shape[0] % first.batch_size != 0:
            raise RuntimeError("first dimensions of input arrays must be a multiple of batch "
                               f"size ({data.shape[0]}, batch size {first.batch_size})")
        first.reset(data, labels)

    def share_with(self, other: "Net"):
        """pycaffe's ``net.share_with`` (Caffe's ShareTrainedLayersWith)."""
        self.share_trained_layers_with(other)

    def share_trained_layers_with(self, other: "Net"):
        """Share parameter data with ``other`` by layer name (test nets share
        the train net's weights, as in Caffe's solver).  As ShareTrainedLayersWith: each of
        ``other``'s layers goes to the first layer of its name here (a later source layer of
        that name shares over it; other layers of the name keep their own), and the numbers
        of param blobs must agree, none included."""
        first = {}
        for i, n in enumerate(self.layer_names):
            first.setdefault(n, i)
        for name, src in zip(other.layer_names, other.layers):
            li = first.get(name)
            if li is None:
                continue
            layer = self.layers[li]
            if len(src.blobs) != len(layer.blobs):
                raise ValueError(f"layer {name!r}: incompatible number of blobs to share "
                                 f"(source has {len(src.blobs)}, target {len(layer.blobs)})")
            for b, s in zip(layer.blobs, src.blobs):
                if b.shape != s.shape:
                    raise ValueError(
                        f"layer {name!r}: cannot share param of shape {s.shape} into {b.shape}")
                b.share_data(s)

    def all_blobs(self):
        """Every Blob of the net, once: tops and bottoms, layer parameters and internals."""
        seen = set()
        for b in list(self.blobs.values()) + [p for layer in self.layers for p in layer.blobs] \
                + [it.blob for layer in self.layers for it in layer.internals.values()]:
            if id(b) not in seen:
                seen.add(id(b))
                yield b

    def drop_views(self):
        """Drop every blob's cached views (:meth:`Blob.drop_views`): after a memory manager
        gives the net its own arrays back, nothing keeps the manager's buffers alive."""
        for b in self.all_blobs():
            b.drop_views()

    def memory_summary(self) -> dict:
        """Bytes of blob data, blob diffs, params and internals currently allocated."""
        seen = set()
        out = {"data": 0, "diff": 0, "params": 0, "internals": 0}
        for b in self.blobs.values():
            for key, st in (("data", b.data_storage), ("diff", b.diff_storage)):
                if st.array is not None and id(st) not in seen:
                    seen.add(id(st))
                    out[key] += st.array.nbytes
        for p in self.learnable_params:
            out["params"] += 2 * p.nbytes
        for layer in self.layers:
            for it in layer.internals.values():
                if it.blob.has_data:
                    out["internals"] += it.blob.data_storage.array.nbytes
        return out

    def __repr__(self):
        return f"<Net {self.name!r} {len(self.layers)} layers, phase {'TRAIN' if self.phase == TRAIN else 'TEST'}, {self.mode}>"


def blob_data(blob) -> np.ndarray:
    """Host copy of a blob's data (for logging and tests)."""
    return to_numpy(blob.data)
